"""``TracedOption``: a part of the optimizer's update that is traced only
once something turns it on."""


class TracedOption:
    """Off until :meth:`enable`; while off, nothing of it is in the graph.

    Subclasses (``BatchWeighting``, ``CollectiveTiming``) trace their ops
    into the update only when :attr:`enabled`; turning one on after the
    train function was traced needs a new trace, which :meth:`enable` says.

    Example:

    >>> from keras_adapt._traced_option import TracedOption
    >>> option = TracedOption()
    >>> option.enabled, option.enable(), option.enable(), option.enabled
    (False, True, False, True)
    """

    def __init__(self):
        self.enabled = False

    def enable(self):
        """Turns it on; True if it was off (a train function traced before
        then lacks it and must be traced again)."""
        was_off = not self.enabled
        self.enabled = True
        return was_off
