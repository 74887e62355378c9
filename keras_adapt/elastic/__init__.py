"""Elastic ``model.fit`` on Horovod Elastic: workers may come and go.

Horovod's names, for keras-adapt on Keras 3 and tf.keras 2 (see
docs/elastic.md): :class:`KerasState`, :func:`run`,
:class:`CommitStateCallback`, :class:`UpdateBatchStateCallback`,
:class:`UpdateEpochStateCallback`; plus :class:`LeaveOnSignalCallback`
(a signalled worker leaves, the others go on without rollback),
:class:`ResizeRule` (how the batch and the learning rate follow the worker
count) and :func:`fit` (resumes mid-epoch at the committed step).

Example:

>>> import keras_adapt.elastic as elastic
>>> elastic.ResizeRule("keep", global_batch=64).per_worker_batch(2)
32
"""

from keras_adapt.elastic.state_callbacks import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from keras_adapt.elastic.fit import fit
from keras_adapt.elastic.leave_on_signal import LeaveOnSignalCallback
from keras_adapt.elastic.resize_rule import ResizeRule
from keras_adapt.elastic.run import is_collective_failure, run
from keras_adapt.elastic.keras_state import KerasState

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "LeaveOnSignalCallback",
    "ResizeRule",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "fit",
    "is_collective_failure",
    "run",
]
