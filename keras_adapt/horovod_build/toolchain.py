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
           "find_nvcc", "join_cuda_tree", "probe_python"]

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
               cxx11_abi=int(tf.sysconfig.CXX11_ABI_FLAG),
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
    """A CUDA toolkit, or the CUDA runtime of NVIDIA's wheels, and where it was found.

    ``version`` is the runtime's CUDA version (``"12.9"``). A system toolkit
    has a ``home`` with ``bin/nvcc``; NVIDIA's wheels in an environment
    (``source="pip"``) have ``pieces`` instead (``nvidia/cuda_runtime``, and
    ``nvidia/cuda_cccl`` when installed) and, on Linux, no ``nvcc``: the build
    then compiles with the ``nvcc`` of another toolkit (:func:`find_nvcc`).

    Example:

    >>> from keras_adapt.horovod_build.toolchain import CudaToolkit
    >>> cuda = CudaToolkit("13.0", "system", home="/usr/local/cuda", nvcc="/usr/local/cuda/bin/nvcc")
    >>> cuda.major, cuda.describe()
    (13, 'CUDA 13.0 (system: /usr/local/cuda)')
    """

    version: str
    source: str
    home: str = None
    nvcc: str = None
    pieces: tuple = ()

    @property
    def major(self):
        """The CUDA major version (``12``)."""
        return int(self.version.split(".")[0])

    def describe(self):
        """``CUDA 12.9 (pip: .../nvidia/cuda_runtime)`` for messages."""
        return f"CUDA {self.version} ({self.source}: {self.home or self.pieces[0]})"

    def include_dirs(self):
        """The directories that hold this toolkit's headers."""
        if self.home is not None:
            return [_toolkit_include(self.home)]
        return [os.path.join(p, "include") for p in self.pieces]

    def cccl_include(self):
        """The include directory with CCCL (``nv/target``, cub, thrust), or ``None``.

        The CUDA 12 runtime wheel's ``cuda_fp16.h`` includes ``<nv/target>``,
        which a toolkit ships and the runtime wheel does not
        (``nvidia-cuda-cccl-cu12`` does).
        """
        for include in self.include_dirs():
            if os.path.exists(os.path.join(include, "nv", "target")):
                return include
        return None


def _toolkit_include(root):
    """``targets/x86_64-linux/include`` of a toolkit (or of NVIDIA's compiler wheels), else ``include``."""
    target = os.path.join(root, "targets", "x86_64-linux", "include")
    return target if os.path.isdir(target) else os.path.join(root, "include")


def join_cuda_tree(runtime, compiler_root, cccl_include, directory):
    """One toolkit tree of symlinks at ``directory`` for Horovod's CMake; returns it.

    ``runtime`` (a pip :class:`CudaToolkit`) gives the CUDA headers and
    ``libcudart`` of TensorFlow's CUDA version; ``compiler_root`` (a toolkit,
    or NVIDIA's compiler wheels: ``bin/nvcc``, ``nvvm``) the compiler, with
    the headers tied to its version (``crt/``, ``fatbinary_section.h``);
    ``cccl_include`` the CCCL headers. ``nvcc`` finds its tools relative to
    the path it is called by, so links are enough. The wheels ship versioned
    libraries only (``libcudart.so.12``): an unversioned name is added.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.horovod_build.toolchain import CudaToolkit, join_cuda_tree
    >>> root = tempfile.mkdtemp()
    >>> for d in ("rt/include", "rt/lib", "cc/bin", "cc/include/crt", "cc/nvvm", "cccl/nv"):
    ...     os.makedirs(os.path.join(root, d))
    >>> open(os.path.join(root, "rt/lib/libcudart.so.12"), "w").close()
    >>> runtime = CudaToolkit("12.9", "pip", pieces=(os.path.join(root, "rt"),))
    >>> tree = join_cuda_tree(runtime, os.path.join(root, "cc"), os.path.join(root, "cccl"),
    ...                       os.path.join(root, "cuda"))
    >>> sorted(os.listdir(os.path.join(tree, "lib64"))), os.path.isdir(os.path.join(tree, "include", "nv"))
    (['libcudart.so', 'libcudart.so.12'], True)
    """
    include = os.path.join(directory, "include")
    lib = os.path.join(directory, "lib64")
    for sub in (os.path.join(directory, "bin"), include, lib):
        os.makedirs(sub, exist_ok=True)
    for name in os.listdir(os.path.join(compiler_root, "bin")):
        _link(os.path.join(compiler_root, "bin", name), os.path.join(directory, "bin", name))
    _link(os.path.join(compiler_root, "nvvm"), os.path.join(directory, "nvvm"))
    compiler_include = _toolkit_include(compiler_root)
    # the compiler's own headers first: they must match its cudafe++
    for name in ("crt", "fatbinary_section.h"):
        if os.path.exists(os.path.join(compiler_include, name)):
            _link(os.path.join(compiler_include, name), os.path.join(include, name))
    for source in runtime.include_dirs() + [cccl_include]:
        for name in os.listdir(source):
            if not name.startswith("__"):
                _link(os.path.join(source, name), os.path.join(include, name))
    for piece in runtime.pieces:
        for sub in ("lib", "lib64"):
            if os.path.isdir(os.path.join(piece, sub)):
                for name in os.listdir(os.path.join(piece, sub)):
                    _link(os.path.join(piece, sub, name), os.path.join(lib, name))
    _unversioned_links(lib)
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

    def home_tree(self, directory):
        """``directory`` with ``include`` and ``lib/libnccl.so`` for ``HOROVOD_NCCL_HOME``.

        Links to this NCCL; the unversioned ``libnccl.so`` the linker asks for
        is added where only ``libnccl.so.2`` exists (the pip wheel).
        """
        os.makedirs(os.path.join(directory, "lib"), exist_ok=True)
        _link(self.include, os.path.join(directory, "include"))
        for name in os.listdir(self.lib):
            if name.startswith("libnccl"):
                _link(os.path.join(self.lib, name), os.path.join(directory, "lib", name))
        _unversioned_links(os.path.join(directory, "lib"))
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
    """A toolkit at ``home``: ``bin/nvcc`` that runs, ``nvvm`` and the runtime's headers."""
    nvcc = os.path.join(home, "bin", "nvcc")
    if not (os.access(nvcc, os.X_OK) and os.path.isdir(os.path.join(home, "nvvm"))
            and os.path.exists(os.path.join(_toolkit_include(home), "cuda_runtime.h"))):
        return None
    version = _nvcc_version(nvcc)
    return CudaToolkit(version, source, home=home, nvcc=nvcc) if version else None


def _pip_runtime(purelib):
    """NVIDIA's CUDA runtime wheel in the environment (``nvidia/cuda_runtime``), with CCCL if there."""
    root = os.path.join(purelib, "nvidia")
    header = os.path.join(root, "cuda_runtime", "include", "cuda_runtime_api.h")
    try:
        with open(header) as f:
            match = re.search(r"#define CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if not match:
        return None
    code = int(match.group(1))  # 12090 -> 12.9
    pieces = tuple(os.path.join(root, n) for n in ("cuda_runtime", "cuda_cccl")
                   if os.path.isdir(os.path.join(root, n)))
    return CudaToolkit(f"{code // 1000}.{code % 1000 // 10}", "pip", pieces=pieces)


def find_cuda(cuda_home, purelib, *, want_major=None, search_system=True):
    """The CUDA runtime to build against, and every toolkit seen: ``(toolkit, seen)``.

    Looks at ``cuda_home`` (an argument: it must hold ``bin/nvcc``), then
    ``HOROVOD_CUDA_HOME``, ``CUDA_HOME``, ``CUDA_PATH``, NVIDIA's runtime
    wheel in ``purelib``, ``nvcc`` on ``PATH`` and ``/usr/local/cuda``. With
    ``want_major`` (TensorFlow's CUDA major version) the first candidate of
    that major version wins; ``toolkit`` is ``None`` when none matches.
    ``seen`` lists every candidate found, for messages and :func:`find_nvcc`.

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
                             "directory (bin/nvcc, nvvm, include/cuda_runtime.h), or leave it "
                             "out to search")
        candidates.append(toolkit)
    for var in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(_toolkit_at(os.environ[var], "environment"))
    candidates.append(_pip_runtime(purelib))
    if search_system:
        on_path = shutil.which("nvcc")  # a link into a toolkit, or a wrapper (then skipped)
        if on_path:
            candidates.append(_toolkit_at(os.path.dirname(os.path.dirname(
                os.path.realpath(on_path))), "system"))
        candidates.append(_toolkit_at("/usr/local/cuda", "system"))
    seen = []
    for toolkit in candidates:
        if toolkit is not None and toolkit not in seen and not any(
                toolkit.home and os.path.realpath(toolkit.home) == os.path.realpath(s.home or "")
                for s in seen):
            seen.append(toolkit)
    if cuda_home is not None:
        return seen[0], tuple(seen)
    for toolkit in seen:
        if want_major is None or toolkit.major == want_major:
            return toolkit, tuple(seen)
    return None, tuple(seen)


def find_nvcc(runtime, seen):
    """The toolkit whose ``nvcc`` compiles for ``runtime``, or ``None``.

    ``runtime``'s own when it has one; else, among ``seen``, one of the same
    major version, else the newest of a higher one (no CUDA 12 wheel ships
    ``nvcc`` on Linux, and a CUDA 13 compiler builds for CUDA 12 headers).
    ``None``: NVIDIA's compiler wheels are to be installed for the build.

    Example:

    >>> from keras_adapt.horovod_build.toolchain import CudaToolkit, find_nvcc
    >>> runtime = CudaToolkit("12.9", "pip", pieces=("/site/nvidia/cuda_runtime",))
    >>> system = CudaToolkit("13.0", "system", home="/usr/local/cuda", nvcc="/usr/local/cuda/bin/nvcc")
    >>> find_nvcc(runtime, (runtime, system)).home, find_nvcc(runtime, (runtime,))
    ('/usr/local/cuda', None)
    """
    if runtime.nvcc is not None:
        return runtime
    compilers = [t for t in seen if t.nvcc is not None and t.major >= runtime.major]
    same = [t for t in compilers if t.major == runtime.major]
    if same:
        return same[0]
    return max(compilers, key=lambda t: tuple(map(int, t.version.split(".")))) if compilers else None


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
