"""epoch_ender: which callback, if any, ends the epochs of a resumed ``fit`` on its own count."""


def epoch_ender(callbacks):
    """The callback among ``callbacks`` that ends ``fit``'s epochs itself (a
    batch-size policy with ``epoch_end``), or None; a ``ValueError`` when
    several would.

    A run that resumes at a saved position (:class:`~keras_adapt.callbacks.PreemptionCheckpoint`,
    :func:`keras_adapt.elastic.fit`) then runs one ``model.fit`` over an
    endless stream, and that callback ends each epoch where an
    uninterrupted run ends it.

    Example:

    >>> from keras_adapt.checkpointing import epoch_ender
    >>> from keras_adapt.policies import GNSBatchSizePolicy
    >>> epoch_ender([GNSBatchSizePolicy(16, 64, micro_batch_size=16)]) is None
    True
    >>> policy = GNSBatchSizePolicy(16, 64, micro_batch_size=16, epoch_end="samples",
    ...                             samples_per_epoch=1000)
    >>> epoch_ender([policy]) is policy
    True
    """
    enders = [cb for cb in callbacks if getattr(cb, "epoch_end", None) is not None]
    if len(enders) > 1:
        names = ", ".join(f"{type(cb).__name__}(epoch_end={cb.epoch_end!r})" for cb in enders)
        raise ValueError(f"{len(enders)} callbacks end the epochs on their counts ({names}); "
                         "give epoch_end to one of them and None to the others")
    return enders[0] if enders else None
