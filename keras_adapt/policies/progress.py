"""TrainingProgress: the samples a batch-size policy trained on and their statistical progress."""

import math

from keras_adapt.formulas.scaling_rules import adascale_gain

#: What an epoch of :class:`TrainingProgress` can count.
COUNTS = ("samples", "progress")


class TrainingProgress:
    """Samples trained and the statistical progress they made, counted on the host.

    Every optimizer update at global batch B adds B to :attr:`samples` and
    ``B0 x r`` to :attr:`progress`, where B0 is the batch the run started
    from (``base_batch``) and r is AdaScale's gain for the scale B / B0
    (:func:`keras_adapt.formulas.scaling_rules.adascale_gain`) from the
    latest gradient statistics. ``B0 x r`` equals ``B x E(B)`` with Pollux's
    statistical efficiency E(B) = (phi + B0) / (phi + B): progress counts
    samples at the value they have at the start batch, so at B0 it equals
    the samples, and a batch far above the noise scale phi adds little more
    than B0 per update. It is AdaScale's scale-invariant iterations times
    B0, and AdaptDL ends its epochs on it: an epoch is one pass's worth of
    progress (``BatchSizePolicy(epoch_end="progress")``).

    The gain is refreshed by the policy whenever it reads the statistics
    (every ``interval`` updates) and when the batch changes; it is 1 until
    statistics exist, and always 1 for a policy that reads none. Every rank
    computes the same values: the statistics are allreduced.

    Example:

    >>> from keras_adapt.policies import TrainingProgress
    >>> p = TrainingProgress()
    >>> p.add_update(32, base_batch=32)                   # at the start batch
    >>> p.set_gain(128, 32, {"grad_sqr": 1.0, "grad_var": 64.0})  # noise scale 64
    >>> p.gain
    2.0
    >>> p.add_update(128, base_batch=32)                  # 128 samples, worth 64
    >>> p.samples, p.progress, p.count("progress")
    (160, 96.0, 96.0)
    """

    def __init__(self):
        #: Global samples of every update so far.
        self.samples = 0
        #: Statistical progress so far, in samples at the start batch.
        self.progress = 0.0
        #: The gain r of the next update (1 until statistics exist).
        self.gain = 1.0

    def set_gain(self, batch, base_batch, stats):
        """Sets the gain for updates at global ``batch`` from ``stats`` (a
        dict with ``grad_sqr`` and ``grad_var``; 1 without them)."""
        gain = adascale_gain(batch / base_batch, stats, base_batch) if base_batch else 1.0
        self.gain = gain if math.isfinite(gain) else 1.0

    def add_update(self, batch, base_batch):
        """Counts one optimizer update at global ``batch``."""
        self.samples += int(batch)
        self.progress += float(base_batch) * self.gain

    def count(self, what):
        """:attr:`samples` or :attr:`progress`, by name (see :data:`COUNTS`)."""
        return float(self.samples) if what == "samples" else self.progress

    def count_after_update(self, what, batch, base_batch):
        """:meth:`count` as it will be after one more update at ``batch``."""
        if what == "samples":
            return float(self.samples + int(batch))
        return self.progress + float(base_batch) * self.gain

    def get_state(self, pending=None):
        """The counts (JSON-able), for a checkpoint; ``pending=(batch,
        base_batch)`` includes one more update, which ran and is not counted yet."""
        samples, progress = self.samples, self.progress
        if pending is not None:
            samples += int(pending[0])
            progress = self.count_after_update("progress", *pending)
        return {"samples": samples, "progress": progress, "gain": self.gain}

    def restore(self, state):
        """Continues from :meth:`get_state` (missing keys keep their values)."""
        self.samples = int(state.get("samples", self.samples))
        self.progress = float(state.get("progress", self.progress))
        self.gain = float(state.get("gain", self.gain))
