"""Adaptation policies: Keras callbacks that read measurements and change the job.

measure (monitors) -> decide (policies) -> act (actuators) -> record (events).
The formulas they decide by live in :mod:`keras_adapt.formulas` (no
TensorFlow); the public ones are exported here too.
"""

from keras_adapt.formulas.goodput import (
    default_min_efficiency,
    examples_efficiency,
    goodput_gain,
    statistical_efficiency,
    step_time_ratio,
)
from keras_adapt.formulas.scaling_rules import (
    AdaScale,
    LinearScaling,
    NoScaling,
    ScalingRule,
    SqrtScaling,
)
from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.batch_size_policy import BatchSizePolicy
from keras_adapt.policies.communication import CommunicationPolicy
from keras_adapt.policies.gns_batch_size import GNSBatchSizePolicy
from keras_adapt.policies.goodput_batch_size import GoodputBatchSizePolicy, GoodputChoice
from keras_adapt.policies.lr_scaling import LRScalingPolicy
from keras_adapt.policies.progress import TrainingProgress
from keras_adapt.policies.scheduled_batch_size import ScheduledBatchSizePolicy
from keras_adapt.policies.straggler import StragglerPolicy
from keras_adapt.policies.sync_strategy import SyncStrategyPolicy
from keras_adapt.policies.timing_driven import TimingDrivenPolicy
from keras_adapt.policies.update_timer import UpdateTimer
from keras_adapt.policies.worker_scaling import (
    GNSWorkerScalingPolicy,
    ResizePolicy,
    ThroughputScalingPolicy,
)

__all__ = [
    "AdaScale",
    "AdaptationPolicy",
    "BatchSizePolicy",
    "CommunicationPolicy",
    "GNSBatchSizePolicy",
    "GNSWorkerScalingPolicy",
    "GoodputBatchSizePolicy",
    "GoodputChoice",
    "LRScalingPolicy",
    "LinearScaling",
    "NoScaling",
    "ResizePolicy",
    "ScalingRule",
    "ScheduledBatchSizePolicy",
    "SqrtScaling",
    "StragglerPolicy",
    "SyncStrategyPolicy",
    "ThroughputScalingPolicy",
    "TimingDrivenPolicy",
    "TrainingProgress",
    "UpdateTimer",
    "default_min_efficiency",
    "examples_efficiency",
    "goodput_gain",
    "statistical_efficiency",
    "step_time_ratio",
]
