"""Adaptation policies: Keras callbacks that read measurements and change the job.

measure (monitors) -> decide (policies) -> act (actuators) -> record (events).
"""

from keras_adapt.policies.base import AdaptationPolicy
from keras_adapt.policies.batch_size_policy import BatchSizePolicy
from keras_adapt.policies.gns_batch_size import GNSBatchSizePolicy
from keras_adapt.policies.goodput_batch_size import (
    GoodputBatchSizePolicy,
    GoodputChoice,
    default_min_efficiency,
    examples_efficiency,
    goodput_gain,
    statistical_efficiency,
)
from keras_adapt.policies.lr_scaling import LRScalingPolicy
from keras_adapt.policies.progress import TrainingProgress
from keras_adapt.policies.worker_scaling import (
    GNSWorkerScalingPolicy,
    ResizePolicy,
    ThroughputScalingPolicy,
)
from keras_adapt.policies.scaling_rules import (
    AdaScale,
    LinearScaling,
    NoScaling,
    ScalingRule,
    SqrtScaling,
)
from keras_adapt.policies.scheduled_batch_size import ScheduledBatchSizePolicy
from keras_adapt.policies.straggler import StragglerPolicy
from keras_adapt.policies.sync_strategy import SyncStrategyPolicy
from keras_adapt.policies.update_timer import UpdateTimer, step_time_ratio

__all__ = [
    "AdaScale",
    "AdaptationPolicy",
    "BatchSizePolicy",
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
    "TrainingProgress",
    "UpdateTimer",
    "default_min_efficiency",
    "examples_efficiency",
    "goodput_gain",
    "statistical_efficiency",
    "step_time_ratio",
]
