"""keras-adapt: adaptive distributed training for Keras on Horovod.

Replace ``hvd.DistributedOptimizer(opt)`` with
``keras_adapt.DistributedOptimizer(opt)``, add the callbacks you want from
``keras_adapt.callbacks``, and launch with ``horovodrun`` as before.

The package imports its parts (and with them TensorFlow and Horovod) when
they are first used, so the ``keras-adapt`` command starts quickly and
quietly.

Example:

>>> import keras, keras_adapt
>>> opt = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(1e-3))
>>> callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0),
...              keras_adapt.callbacks.GradientStatsMonitor(interval=10)]
>>> keras_adapt.size() >= 1
True
"""

import importlib

from keras_adapt.version import __version__

#: Subpackages and modules reachable as attributes of the package.
#: Every public one (tests/test_layering.py checks that none is missing);
#: the command line (``cli``, ``__main__``) and ``version`` are not among them.
_MODULES = ("actuators", "callbacks", "checkpointing", "checks", "coordination", "data",
            "discover", "elastic", "extras", "formulas", "horovod", "horovod_build",
            "kubernetes_pods", "monitors", "ops", "optimizer", "plan", "policies", "record",
            "report", "saving", "slurm", "sync")
#: Public names -> the module that defines them.
_NAMES = {
    "DistributedOptimizer": "keras_adapt.optimizer",
    "load_model": "keras_adapt.saving",
    "local_rank": "keras_adapt._hvd",
    "rank": "keras_adapt._hvd",
    "size": "keras_adapt._hvd",
}

__all__ = sorted(("__version__", *_MODULES, *_NAMES))


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"keras_adapt.{name}")
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_adapt' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
