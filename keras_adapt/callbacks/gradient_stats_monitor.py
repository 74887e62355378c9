"""GradientStatsMonitor: puts the in-graph gradient statistics into Keras logs."""

import warnings

import keras

from keras_adapt import _hvd, _train_step
from keras_adapt.checks import check_interval
from keras_adapt.optimizer import require_distributed

#: Log keys written by this monitor (docs/design.md#logs-keys).
LOG_KEYS = ("gns", "grad_sqr", "grad_var", "grad_snr")


class GradientStatsMonitor(keras.callbacks.Callback):
    """Writes the gradient noise scale, |G|^2, tr(Sigma) and the SNR into the logs.

    The statistics are computed inside the train step by
    ``keras_adapt.DistributedOptimizer`` and are identical on every worker
    (they derive from allreduced values). This callback only reads them:
    every ``interval`` steps and at the end of each epoch, with no collective
    and no per-step host sync (it is async-safe, so Keras 3 can keep
    dispatching steps without waiting for the host). In between, the last
    values read are repeated so every batch's logs carry the same keys;
    ``interval`` counts steps within an epoch.

    Keys: ``gns`` (B_simple, the critical batch size in samples),
    ``grad_sqr`` (|G|^2), ``grad_var`` (tr Sigma, per sample) and
    ``grad_snr`` (B / B_simple). They reach ``History``, the progress bar,
    ``CSVLogger`` and ``TensorBoard`` when those come after this callback
    (History and, on Keras 3, the progress bar always do).

    It also makes the train step record the per-worker batch size that the
    estimators need (unless the optimizer was given ``batch_size=``).

    Args:
        interval: steps between reads of the statistics (positive int).

    Example:

    >>> import numpy as np, keras, keras_adapt
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    >>> x, y = np.random.rand(256, 4), np.random.rand(256, 1)
    >>> h = model.fit(x, y, batch_size=32, epochs=2, verbose=0,
    ...               callbacks=[keras_adapt.callbacks.GradientStatsMonitor(interval=4)])
    >>> sorted(k for k in h.history if k.startswith(("gns", "grad")))
    ['gns', 'grad_snr', 'grad_sqr', 'grad_var']
    """

    def __init__(self, interval=10):
        super().__init__()
        self.interval = check_interval("interval", interval, "reads of the statistics")
        # Keras 3 forces a host sync after every step (to turn the logs into
        # python numbers) as soon as one callback has a batch hook that is not
        # async-safe; tf.keras 2 does the same for callbacks that do not take
        # tensor logs. This monitor only copies cached floats into the logs
        # and reads variables, so it is safe to run off the training thread
        # and must not be the reason for a per-step sync.
        self.async_safe = True
        self._supports_tf_logs = True
        self._values = None
        self._stats = None

    def set_model(self, model):
        super().set_model(model)
        stats = require_distributed(model, "GradientStatsMonitor", statistics=True).gradient_statistics
        self._stats = stats
        if stats.fixed_batch_size is None:
            _train_step.record_batch_size(model, stats)

    def _read(self):
        result = self._stats.result()
        self._values = {k: result[k] for k in LOG_KEYS}
        return result

    def on_train_begin(self, logs=None):
        self._values = None
        if _hvd.size() == 1:
            warnings.warn(
                "keras-adapt: one worker, so the noise scale comes from the "
                "difference of consecutive steps' gradients; it is biased while "
                "the weights move. Use 2+ workers for unbiased estimates.",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_train_batch_end(self, batch, logs=None):
        # `batch` rather than a counter of our own: with async dispatch
        # Keras may run batch hooks of different steps concurrently.
        if self._values is None or (batch + 1) % self.interval == 0:
            self._read()
        if logs is not None:
            logs.update(self._values)

    def on_epoch_end(self, epoch, logs=None):
        self._read()
        if logs is not None:
            logs.update(self._values)

    @property
    def values(self):
        """The statistics last read (a dict with :data:`LOG_KEYS`), or None."""
        return None if self._values is None else dict(self._values)
