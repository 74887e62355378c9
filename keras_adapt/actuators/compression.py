"""GradientCompression: float32 or float16 gradients in the allreduce, switched without retracing."""

from keras_adapt.actuators._common import distributed_optimizer, retrace


class GradientCompression:
    """Sends the gradients as float32 (``"none"``) or float16 (``"fp16"``,
    Horovod's ``Compression.fp16``), changeable between any two updates.

    Making it enables the optimizer's
    :class:`~keras_adapt.optimizer.CompressionSwitch` (both reductions are
    traced under one ``tf.cond``, so :meth:`set` never retraces); make it
    before ``fit`` traces its train function (a policy makes it in
    ``on_attach``). It starts from the optimizer's ``compression``. Every
    worker must call :meth:`set` with the same mode at the same update.

    Example:

    >>> import keras, keras_adapt
    >>> from keras_adapt.actuators import GradientCompression
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    >>> compression = GradientCompression(model)
    >>> compression.mode, compression.set("fp16"), compression.mode
    ('none', True, 'fp16')
    """

    def __init__(self, model):
        optimizer = distributed_optimizer(model, "GradientCompression")
        self.switch = optimizer.adapt_state.compression
        if self.switch.enable():
            retrace(model, "GradientCompression")  # a train function traced before has one path

    @property
    def mode(self):
        """``"none"`` or ``"fp16"``: what the next update sends."""
        return self.switch.mode

    def set(self, mode):
        """Sends ``mode`` (``"none"`` or ``"fp16"``) from the next update on;
        True if that changed anything."""
        return self.switch.set(mode)
