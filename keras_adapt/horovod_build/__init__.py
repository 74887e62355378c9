"""Horovod 0.28.1 built into the active environment, against its TensorFlow.

Horovod's last release does not compile against TensorFlow 2.19 or newer;
keras-adapt ships the patches that make it compile (``patches/``, each
explained in its README) and the command that builds it:
``keras-adapt build-horovod`` (``--dry-run`` prints what it would do,
``--cpu-only`` leaves out the GPU operations). :mod:`.toolchain` finds
what the environment has; :mod:`.build` plans, builds, verifies and
records the build.

Example:

>>> from keras_adapt import horovod_build
>>> horovod_build.HOROVOD_VERSION
'0.28.1'
>>> horovod_build.read_record("/nonexistent") is None
True
"""

from keras_adapt.horovod_build.build import (
    HOROVOD_VERSION,
    BuildError,
    BuildPlan,
    patch_names,
    plan_build,
    read_record,
    run_build,
    verify,
)

__all__ = ["HOROVOD_VERSION", "BuildError", "BuildPlan", "patch_names", "plan_build",
           "read_record", "run_build", "verify"]
