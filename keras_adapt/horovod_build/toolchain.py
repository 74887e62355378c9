"""What a Horovod build can use in an environment: TensorFlow, compilers, MPI, CUDA, NCCL.

:func:`probe_python` asks the environment's Python (in a new process, so
TensorFlow's start-up stays out of the caller) for its TensorFlow build;
:func:`find_cuda` and :func:`find_nccl` look for a CUDA toolkit and NCCL in
the places a user has them: an explicit directory, the usual environment
variables, NVIDIA's pip wheels inside the environment (``nvidia/...`` in
its site-packages), and the system. Nothing here builds or installs.

Example:

>>> import sys
>>> from keras_adapt.horovod_build import toolchain
>>> toolchain.find_nccl(None, purelib="/nonexistent", search_system=False) is None
True
>>> toolchain.cmake_major("cmake version 3.25.1") == 3
True
"""

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess

__all__ = ["CudaToolkit", "Nccl", "PythonEnv", "cmake_major", "find_cuda", "find_nccl",
           "probe_python"]

_PROBE = r"""
import json, platform, sys, sysconfig
out = {"python": sys.executable, "python_version": platform.python_version(),
       "prefix": sys.prefix, "purelib": sysconfig.get_paths()["purelib"]}
try:
    import tensorflow as tf
except Exception as exc:
    out["tensorflow_error"] = f"{type(exc).__name__}: {exc}"
else:
    info = tf.sysconfig.get_build_info()
    out.update(tensorflow=tf.__version__, tf_cuda=info.get("cuda_version") if info.get("is_cuda_build") else None,
               cxx11_abi=int(tf.sysconfig.CXX11_ABI_FLAG), tf_include=tf.sysconfig.get_include(),
               compile_flags=tf.sysconfig.get_compile_flags(), link_flags=tf.sysconfig.get_link_flags())
print("KERAS_ADAPT_PROBE " + json.dumps(out))
"""


@dataclasses.dataclass(frozen=True)
class PythonEnv:
    """The environment a build goes into, as its own Python reports it.

    ``tensorflow`` is ``None`` when TensorFlow does not import there
    (``tensorflow_error`` says why); ``tf_cuda`` is the CUDA version of a
    GPU build of TensorFlow (``"12.5.1"``) and ``None`` for the CPU wheel.

    Example:

    >>> from keras_adapt.horovod_build.toolchain import PythonEnv
    >>> env = PythonEnv("/venv/bin/python", "3.11.7", "/venv", "/venv/lib/site-packages",
    ...                 tensorflow="2.21.0", tf_cuda=None, cxx11_abi=1)
    >>> env.tf_minor
    (2, 21)
    """

    python: str
    python_version: str
    prefix: str
    purelib: str
    tensorflow: str = None
    tensorflow_error: str = None
    tf_cuda: str = None
    cxx11_abi: int = None
    tf_include: str = None
    compile_flags: tuple = ()
    link_flags: tuple = ()

    @property
    def tf_minor(self):
        """TensorFlow's ``(major, minor)``, or ``None`` without TensorFlow."""
        if self.tensorflow is None:
            return None
        major, minor = self.tensorflow.split(".")[:2]
        return int(major), int(minor)


def probe_python(python):
    """Asks ``python`` (a path) for its prefix, site-packages and TensorFlow build.

    Raises ``RuntimeError`` naming the interpreter when it cannot be run.

    Example:

    >>> import sys
    >>> from keras_adapt.horovod_build.toolchain import probe_python
    >>> env = probe_python(sys.executable)
    >>> env.python_version == "{}.{}.{}".format(*sys.version_info[:3])
    True
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env,
                              timeout=300)
    except OSError as exc:
        raise RuntimeError(f"python={python!r} cannot be run ({exc}); pass the environment's "
                           "Python, e.g. .venv/bin/python") from None
    for line in proc.stdout.splitlines():
        if line.startswith("KERAS_ADAPT_PROBE "):
            data = json.loads(line[len("KERAS_ADAPT_PROBE "):])
            for key in ("compile_flags", "link_flags"):
                data[key] = tuple(data.get(key, ()))
            return PythonEnv(**data)
    raise RuntimeError(f"{python} did not answer the probe (exit {proc.returncode}): "
                       f"{proc.stderr.strip()[-500:]}")


@dataclasses.dataclass(frozen=True)
class CudaToolkit:
    """A CUDA toolkit: its ``nvcc``, version, and where it was found.

    ``source`` is one of ``"argument"``, ``"environment"`` (``CUDA_HOME`` and
    the like), ``"pip"`` (NVIDIA's wheels in the environment) or
    ``"system"``; ``pieces`` are the wheel directories a pip toolkit is made
    of (``home`` is then ``None``: :mod:`keras_adapt.horovod_build.build`
    joins them into one tree for Horovod's CMake).

    Example:

    >>> from keras_adapt.horovod_build.toolchain import CudaToolkit
    >>> CudaToolkit("/usr/local/cuda/bin/nvcc", "13.0", "system", home="/usr/local/cuda").major
    13
    """

    nvcc: str
    version: str
    source: str
    home: str = None
    pieces: tuple = ()

    @property
    def major(self):
        """The CUDA major version (``12``)."""
        return int(self.version.split(".")[0])

    def describe(self):
        """``CUDA 12.9 (pip: .../nvidia/cuda_nvcc)`` for messages."""
        where = self.home or os.path.dirname(os.path.dirname(self.nvcc))
        return f"CUDA {self.version} ({self.source}: {where})"

    def join(self, directory):
        """Joins a pip toolkit's pieces into one tree at ``directory``; returns it.

        Horovod's CMake looks for one toolkit directory (``bin/nvcc``,
        ``include``, ``lib64``); NVIDIA's wheels split it into parts and ship
        versioned libraries only (``libcudart.so.12``). The tree is made of
        symlinks, with an unversioned name beside each versioned library.
        A toolkit with a ``home`` is returned as it is.
        """
        if self.home is not None:
            return self.home
        for sub in ("bin", "include", "lib64"):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        for piece in self.pieces:
            # nvcc finds cicc and libdevice in ../nvvm, from the nvcc wheel or
            # a wheel of its own (whose directory is the nvvm tree).
            nvvm = piece if os.path.basename(piece) == "nvvm" else os.path.join(piece, "nvvm")
            if os.path.isdir(nvvm):
                _link(nvvm, os.path.join(directory, "nvvm"))
            if nvvm == piece:
                continue
            for sub, dest in (("bin", "bin"), ("include", "include"), ("lib", "lib64"),
                              ("lib64", "lib64")):
                source = os.path.join(piece, sub)
                if os.path.isdir(source):
                    for name in os.listdir(source):
                        _link(os.path.join(source, name), os.path.join(directory, dest, name))
        _unversioned_links(os.path.join(directory, "lib64"))
        return directory


@dataclasses.dataclass(frozen=True)
class Nccl:
    """NCCL headers and library: ``include`` holds ``nccl.h``, ``lib`` ``libnccl.so*``.

    Example:

    >>> from keras_adapt.horovod_build.toolchain import Nccl
    >>> Nccl("/usr/include", "/usr/lib/x86_64-linux-gnu", "2.27.7", "system").describe()
    'NCCL 2.27.7 (system: /usr/lib/x86_64-linux-gnu)'
    """

    include: str
    lib: str
    version: str
    source: str

    def describe(self):
        """``NCCL 2.27.7 (pip: ...)`` for messages."""
        return f"NCCL {self.version} ({self.source}: {self.lib})"

    def linkable_lib(self, directory):
        """A directory with ``libnccl.so`` for the linker: ``lib`` if it has one,
        else ``directory`` made of symlinks (the pip wheel ships ``libnccl.so.2`` only)."""
        if os.path.exists(os.path.join(self.lib, "libnccl.so")):
            return self.lib
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(self.lib):
            _link(os.path.join(self.lib, name), os.path.join(directory, name))
        _unversioned_links(directory)
        return directory


def _link(source, target):
    """A symlink ``target`` -> ``source``, unless ``target`` exists (the first piece wins)."""
    if not os.path.lexists(target):
        os.symlink(source, target)


def _unversioned_links(directory):
    """``libfoo.so`` -> ``libfoo.so.12`` beside each library that has only a versioned name."""
    for name in sorted(os.listdir(directory)):
        match = re.match(r"(lib[\w+-]+\.so)\.\d+$", name)
        if match:
            _link(name, os.path.join(directory, match.group(1)))


def cmake_major(version_text):
    """The major version in ``cmake --version`` output, or ``None``.

    Example:

    >>> from keras_adapt.horovod_build.toolchain import cmake_major
    >>> cmake_major("cmake version 4.1.0"), cmake_major("no")
    (4, None)
    """
    match = re.search(r"version (\d+)\.", version_text)
    return int(match.group(1)) if match else None


def _nvcc_version(nvcc):
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def _toolkit_at(home, source):
    nvcc = os.path.join(home, "bin", "nvcc")
    version = _nvcc_version(nvcc) if os.access(nvcc, os.X_OK) else None
    return CudaToolkit(nvcc, version, source, home=home) if version else None


def _pip_toolkit(purelib):
    """NVIDIA's CUDA wheels in the environment (``nvidia/cuda_nvcc`` and friends)."""
    root = os.path.join(purelib, "nvidia")
    nvcc = os.path.join(root, "cuda_nvcc", "bin", "nvcc")
    runtime = os.path.join(root, "cuda_runtime")
    if not (os.access(nvcc, os.X_OK) and os.path.isdir(runtime)):
        return None
    version = _nvcc_version(nvcc)
    if version is None:
        return None
    pieces = tuple(p for p in (os.path.join(root, n) for n in ("cuda_nvcc", "cuda_runtime",
                                                              "cuda_cccl", "cuda_crt", "nvvm"))
                   if os.path.isdir(p))
    return CudaToolkit(nvcc, version, "pip", pieces=pieces)


def find_cuda(cuda_home, purelib, *, want_major=None, search_system=True):
    """The CUDA toolkit to build with, and the candidates seen: ``(toolkit, seen)``.

    Looks at ``cuda_home`` (an argument: it must hold ``bin/nvcc``), then
    ``HOROVOD_CUDA_HOME``, ``CUDA_HOME``, ``CUDA_PATH``, NVIDIA's pip wheels
    in ``purelib``, ``nvcc`` on ``PATH`` and ``/usr/local/cuda``. With
    ``want_major`` (TensorFlow's CUDA major version) the first candidate of
    that major version wins; ``toolkit`` is ``None`` when none matches, and
    ``seen`` lists every candidate found, for the message.

    Example:

    >>> from keras_adapt.horovod_build.toolchain import find_cuda
    >>> find_cuda(None, "/nonexistent", search_system=False)
    (None, ())
    """
    candidates = []
    if cuda_home is not None:
        toolkit = _toolkit_at(cuda_home, "argument")
        if toolkit is None:
            raise ValueError(f"cuda_home={cuda_home!r} is not valid; pass a CUDA toolkit "
                             "directory that holds bin/nvcc, or leave it out to search")
        candidates.append(toolkit)
    for var in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(_toolkit_at(os.environ[var], "environment"))
    candidates.append(_pip_toolkit(purelib))
    if search_system:
        on_path = shutil.which("nvcc")
        if on_path:
            candidates.append(_toolkit_at(os.path.dirname(os.path.dirname(
                os.path.realpath(on_path))), "system"))
        candidates.append(_toolkit_at("/usr/local/cuda", "system"))
    seen = []
    for toolkit in candidates:
        if toolkit is not None and all(toolkit.nvcc != s.nvcc for s in seen):
            seen.append(toolkit)
    if cuda_home is not None:
        return seen[0], tuple(seen)
    for toolkit in seen:
        if want_major is None or toolkit.major == want_major:
            return toolkit, tuple(seen)
    return None, tuple(seen)


def _nccl_version(header):
    try:
        with open(header) as f:
            text = f.read()
    except OSError:
        return None
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else None


def _nccl_at(include, lib, source):
    header = os.path.join(include, "nccl.h")
    libs = glob.glob(os.path.join(lib, "libnccl.so*"))
    version = _nccl_version(header)
    return Nccl(include, lib, version, source) if version and libs else None


def find_nccl(nccl_home, purelib, *, search_system=True):
    """NCCL's headers and library, or ``None``.

    Looks at ``nccl_home`` (an argument: ``include/nccl.h`` and
    ``lib/libnccl.so*`` below it), ``HOROVOD_NCCL_HOME`` and ``NCCL_HOME``,
    NVIDIA's ``nvidia-nccl`` wheel in ``purelib``, and the system
    (``/usr/include`` with ``/usr/lib/x86_64-linux-gnu``, ``/usr/local/cuda``).

    Example:

    >>> from keras_adapt.horovod_build.toolchain import find_nccl
    >>> find_nccl("/nonexistent", "/nonexistent")
    Traceback (most recent call last):
    ...
    ValueError: nccl_home='/nonexistent' is not valid; pass a directory with include/nccl.h and lib/libnccl.so*, or leave it out to search
    """
    if nccl_home is not None:
        found = _nccl_at(os.path.join(nccl_home, "include"), os.path.join(nccl_home, "lib"),
                         "argument")
        if found is None:
            raise ValueError(f"nccl_home={nccl_home!r} is not valid; pass a directory with "
                             "include/nccl.h and lib/libnccl.so*, or leave it out to search")
        return found
    places = [(os.path.join(os.environ[v], "include"), os.path.join(os.environ[v], "lib"),
               "environment") for v in ("HOROVOD_NCCL_HOME", "NCCL_HOME") if os.environ.get(v)]
    wheel = os.path.join(purelib, "nvidia", "nccl")
    places.append((os.path.join(wheel, "include"), os.path.join(wheel, "lib"), "pip"))
    if search_system:
        places += [("/usr/include", "/usr/lib/x86_64-linux-gnu", "system"),
                   ("/usr/local/cuda/include", "/usr/local/cuda/lib64", "system")]
    for include, lib, source in places:
        found = _nccl_at(include, lib, source)
        if found is not None:
            return found
    return None
