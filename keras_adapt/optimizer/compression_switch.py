"""Compression switch: the gradients travel as float32 or float16, chosen
while training runs (``optimizer.adapt_state.compression``).

Horovod's ``Compression.fp16`` is fixed when the optimizer is made. Once
this switch is enabled (by :class:`keras_adapt.policies.CommunicationPolicy`,
before the train function is traced), the update traces both reductions,
float32 and float16, under one ``tf.cond`` on a boolean variable, so
:meth:`CompressionSwitch.set` changes what travels at the next update
without a new trace. Every worker must hold the same value at the same
update (the policy decides on measurements all workers share); only the
branch taken runs, so the other's collectives are never submitted.
Nothing of this is traced while it is off, nor in a job of one worker.
"""

import tensorflow as tf

from keras_adapt._traced_option import TracedOption
from keras_adapt.checks import check_choice
from keras_adapt.record.metadata import COMPRESSIONS

#: The modes, by the value of :attr:`CompressionSwitch.fp16` (False, True).
MODES = COMPRESSIONS


class CompressionSwitch(TracedOption):
    """Switches the gradients' allreduce between float32 and float16 in-graph.

    Attributes:
        enabled: whether both reductions are traced into the update (set by
            :meth:`enable`; a train function traced before must be traced again).
        fp16: boolean variable, True while floating gradients travel as float16.

    Example:

    >>> from keras_adapt.optimizer import CompressionSwitch
    >>> switch = CompressionSwitch()
    >>> switch.enable(), switch.mode
    (True, 'none')
    >>> switch.set("fp16"), switch.mode
    (True, 'fp16')
    >>> switch.set("fp16")   # already so: nothing changed
    False
    """

    def __init__(self):
        super().__init__()
        self.fp16 = tf.Variable(False, dtype=tf.bool, trainable=False, name="compression_fp16")

    @property
    def index(self):
        """The mode's index in :data:`MODES` (the ``adapt/compression`` value; a host read)."""
        return int(bool(self.fp16.numpy()))

    @property
    def mode(self):
        """``"none"`` or ``"fp16"``: what the next update sends (a host read)."""
        return MODES[self.index]

    def get_state(self):
        """The mode while enabled, else None: what a checkpoint or an elastic
        commit saves beside the checkpoint variables."""
        return self.mode if self.enabled else None

    def set_state(self, state):
        """Applies :meth:`get_state` output; True when that enabled the
        switch (a train function traced before must then be traced again).
        A worker that joins or resumes must trace the same reductions as the
        others, so a saved mode enables the switch.

        Example:

        >>> from keras_adapt.optimizer import CompressionSwitch
        >>> saved = CompressionSwitch(); saved.enable(); saved.set("fp16")
        True
        True
        >>> switch = CompressionSwitch()
        >>> switch.set_state(saved.get_state()), switch.mode, switch.set_state(None)
        (True, 'fp16', False)
        """
        if state is None:
            return False
        enabled = self.enable()
        self.set(state)
        return enabled

    def set(self, mode):
        """Sends the gradients as ``mode`` (one of :data:`MODES`) from the next
        update on; True if that changed anything."""
        check_choice("mode", mode, MODES)
        if mode == self.mode:
            return False
        self.fp16.assign(mode == "fp16")
        return True
