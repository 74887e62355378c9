"""Finds and loads the compiled op library for the running TensorFlow.

Chosen by the environment variable ``KERAS_ADAPT_OPS``:

* ``auto`` (default): the compiled library for tensors on the CPU, if it
  loads (otherwise the pure-TensorFlow twin, with one warning that says why);
  the twin for tensors on any other device (GPU, TPU), so a gradient is
  never copied off its device -- the compiled kernel is CPU-only;
* ``native``: the compiled library wherever the tensors are (off the CPU
  TensorFlow copies them to the host), or an ``ImportError`` if it does not
  load (for CI and benchmarks that must not silently measure the twin);
* ``twin``: always the pure-TensorFlow twin.

Where the tensors are is decided when a function is traced: from the
tensors' devices; for a tensor not yet placed (inside ``tf.function`` a
tensor's device is often still empty) from the enclosing ``tf.device`` scope,
and without one from the visible devices -- TensorFlow places ops on a GPU
when one is visible.

``KERAS_ADAPT_OPS_LIBRARY`` points at a library file explicitly.
"""

import contextlib
import glob
import os
import warnings

import tensorflow as tf

from keras_adapt.checks import check_choice

ENV_IMPL = "KERAS_ADAPT_OPS"
ENV_LIBRARY = "KERAS_ADAPT_OPS_LIBRARY"
_CHOICES = ("auto", "native", "twin")

_state = {"module": None, "resolved": False, "reason": None}


def _library_path():
    explicit = os.environ.get(ENV_LIBRARY)
    if explicit:
        return explicit
    major, minor = tf.__version__.split(".")[:2]
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, f"_keras_adapt_ops_tf{major}_{minor}*.so")))
    if not found:
        raise FileNotFoundError(
            f"no op library for TensorFlow {major}.{minor} in {here}; build it with "
            "`pip install --no-build-isolation -e .` (or `make setup`)"
        )
    return found[0]


def requested_implementation():
    """The implementation asked for by ``KERAS_ADAPT_OPS`` (validated)."""
    choice = os.environ.get(ENV_IMPL, "auto").strip().lower() or "auto"
    return check_choice(ENV_IMPL, choice, _CHOICES, fix=f"use one of {', '.join(_CHOICES)}")


def load():
    """Returns the loaded op module, or None when the twin is to be used."""
    if _state["resolved"]:
        return _state["module"]
    choice = requested_implementation()
    module = None
    if choice == "twin":
        _state["reason"] = f"{ENV_IMPL}=twin"
    else:
        try:
            module = tf.load_op_library(_library_path())
        except (OSError, FileNotFoundError, tf.errors.NotFoundError) as exc:
            if choice == "native":
                raise ImportError(
                    f"{ENV_IMPL}=native but the keras-adapt op library cannot be "
                    f"loaded: {exc}"
                ) from exc
            _state["reason"] = str(exc)
            warnings.warn(
                "keras-adapt: the compiled op library could not be loaded "
                f"({exc}); using the pure-TensorFlow twin (same results, slower). "
                f"Set {ENV_IMPL}=twin to silence this warning.",
                RuntimeWarning,
                stacklevel=3,
            )
    _state["module"] = module
    _state["resolved"] = True
    return module


def _device_type(name):
    """``"CPU"``, ``"GPU"``, ... of a device string, or None if it names no device."""
    if not name:
        return None
    return tf.DeviceSpec.from_string(name).device_type or None


def native_fits(device_names, scope_device="", gpus_visible=None):
    """Whether the compiled (CPU-only) kernel should run on tensors placed there.

    Args:
        device_names: the tensors' device strings ("" for not yet placed).
        scope_device: the device of the enclosing ``tf.device`` scope ("" for none).
        gpus_visible: whether TensorFlow sees a GPU (default: asks it).

    With ``KERAS_ADAPT_OPS=native`` always True; otherwise True only if
    every tensor is (or will be placed) on the CPU.

    Example:

    >>> from keras_adapt.ops import _loader
    >>> gpu = "/job:localhost/replica:0/task:0/device:GPU:0"
    >>> _loader.native_fits([gpu], gpus_visible=True), _loader.native_fits(["/device:CPU:0"])
    (False, True)
    """
    if requested_implementation() == "native":
        return True
    types = {_device_type(name) for name in device_names}
    if None in types:
        scope = _device_type(scope_device)
        if scope is None:
            if gpus_visible is None:
                gpus_visible = bool(tf.config.list_logical_devices("GPU"))
            scope = "GPU" if gpus_visible else "CPU"
        types.discard(None)
        types.add(scope)
    return types == {"CPU"}


@contextlib.contextmanager
def forced(name):
    """Within the block, ``load()`` answers as if ``KERAS_ADAPT_OPS=name``."""
    if name not in ("native", "twin"):
        raise ValueError(f"use_implementation({name!r}): use 'native' or 'twin'")
    if name == "native" and load() is None:
        raise ImportError(f"the native op library is not loaded: {_state['reason']}")
    saved = dict(_state)
    if name == "twin":
        _state.update(module=None, resolved=True, reason="use_implementation('twin')")
    try:
        yield
    finally:
        _state.clear()
        _state.update(saved)
