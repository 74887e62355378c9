"""Optional dependencies: each feature that needs one names the extra that installs it.

``pip install keras-adapt`` brings the library; the extras bring what a
feature needs besides TensorFlow and Horovod:

=============  ==========================================  =====================================
extra          installs                                    for
=============  ==========================================  =====================================
tensorboard    tensorboard                                 ``AdaptTensorBoard``, the Adapt tab
report         matplotlib, tensorboard                     ``keras-adapt report``, ``plan``
system         psutil, nvidia-ml-py                        ``SystemMonitor`` (GPUs via NVML)
async          pyzmq                                       ``PairAveraging`` (its transport)
examples       scikit-learn, tensorboard                   ``examples/``
test           pytest, pytest-timeout, playwright, ...     the test suite
=============  ==========================================  =====================================

:func:`require` imports a module or raises :class:`ExtraImportError` (an
``ImportError``) that names the feature, the missing distribution and the
extra; ``keras-adapt`` prints it as the install hint, without a traceback.

Example:

>>> from keras_adapt.extras import require
>>> require("json", "report", "keras-adapt report").__name__
'json'
>>> require("no_such_module_xyz", "report", "keras-adapt report")
Traceback (most recent call last):
...
keras_adapt.extras.ExtraImportError: keras-adapt report needs no_such_module_xyz, which is not installed here; pip install 'keras-adapt[report]'
"""

import importlib

__all__ = ["EXTRAS", "ExtraImportError", "require"]

#: extra -> the distributions it installs (pyproject.toml's optional dependencies).
EXTRAS = {
    "tensorboard": ("tensorboard",),
    "report": ("matplotlib", "tensorboard"),
    "system": ("psutil", "nvidia-ml-py"),
    "async": ("pyzmq",),
    "examples": ("scikit-learn", "tensorboard"),
    "test": ("pytest", "pytest-timeout", "playwright"),
}

#: module -> the distribution that provides it, where the names differ.
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "pynvml": "nvidia-ml-py", "zmq": "pyzmq"}


class ExtraImportError(ImportError):
    """The ``ImportError`` of a feature whose extra is missing; its message is the install hint.

    Example:

    >>> from keras_adapt.extras import ExtraImportError, require
    >>> try:
    ...     require("no_such_module_xyz", "system", "SystemMonitor")
    ... except ExtraImportError as exc:
    ...     print(exc.name, "|", exc)
    no_such_module_xyz | SystemMonitor needs no_such_module_xyz, which is not installed here; pip install 'keras-adapt[system]'
    """


def require(module, extra, feature):
    """Imports ``module``; if it is missing, says which extra installs it.

    Example:

    >>> from keras_adapt.extras import require
    >>> require("os.path", "report", "keras-adapt report").__name__ in ("posixpath", "ntpath")
    True
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        if exc.name is not None and exc.name.split(".")[0] != top:
            raise  # the module is there; something it imports is not
        dist = _DISTRIBUTIONS.get(top, top)
        raise ExtraImportError(f"{feature} needs {dist}, which is not installed here; "
                               f"pip install 'keras-adapt[{extra}]'", name=top) from exc
