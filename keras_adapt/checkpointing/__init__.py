"""Stopping a run and resuming it at the same position: the checkpoint
files (:class:`CheckpointFiles`: their directory, format, reading, writing
and loading) and which callback ends the epochs of a resumed ``fit``
(:func:`epoch_ender`). :class:`~keras_adapt.callbacks.PreemptionCheckpoint`
uses them under ``model.fit``, ``keras_adapt.elastic`` under Horovod Elastic.

Example:

>>> import tempfile
>>> from keras_adapt.checkpointing import CheckpointFiles, epoch_ender
>>> CheckpointFiles(tempfile.mkdtemp()).position(), epoch_ender([])
((0, 0), None)
"""

from keras_adapt.checkpointing.epochs import epoch_ender
from keras_adapt.checkpointing.files import CheckpointFiles

__all__ = ["CheckpointFiles", "epoch_ender"]
