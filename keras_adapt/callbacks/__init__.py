"""Keras callbacks of keras-adapt (one per module); ``SignalAgreement`` and
``broadcast_variables`` are :mod:`keras_adapt.coordination`'s, here too."""

from keras_adapt.callbacks.adapt_tensorboard import AdaptTensorBoard
from keras_adapt.callbacks.best_model_checkpoint import BestModelCheckpoint
from keras_adapt.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from keras_adapt.callbacks.gradient_stats_monitor import LOG_KEYS, GradientStatsMonitor
from keras_adapt.callbacks.learning_rate_schedule import LearningRateScheduleCallback
from keras_adapt.callbacks.learning_rate_warmup import LearningRateWarmupCallback
from keras_adapt.callbacks.metric_average import MetricAverageCallback
from keras_adapt.callbacks.preemption_checkpoint import PreemptionCheckpoint
from keras_adapt.callbacks.system_monitor import SystemMonitor
from keras_adapt.callbacks.worker_timing_monitor import WorkerTimingMonitor
from keras_adapt.coordination import SignalAgreement, broadcast_variables

__all__ = [
    "AdaptTensorBoard",
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "GradientStatsMonitor",
    "LOG_KEYS",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "PreemptionCheckpoint",
    "SignalAgreement",
    "SystemMonitor",
    "WorkerTimingMonitor",
    "broadcast_variables",
]
