"""Builds Horovod 0.28.1, patched for current TensorFlow, into an environment.

:func:`plan_build` looks at the environment (its TensorFlow, ``mpicc``,
``cmake``, a CUDA toolkit and NCCL) and decides what to build: Gloo always,
MPI when ``mpicc`` is found, TensorFlow as the only framework, and NCCL's
GPU operations when TensorFlow is a CUDA build and a toolkit of its CUDA
major version and NCCL are found. :meth:`BuildPlan.describe` says all of
it without doing anything (``--dry-run``); :func:`run_build` does it:
checks that TensorFlow's headers and C++ ABI work with this compiler
(a tiny op is compiled and loaded), downloads the sdist, applies the
patches shipped in ``keras_adapt/horovod_build/patches/``, builds with
``pip install --no-build-isolation``, runs ``horovodrun --check-build`` and
a one-process allreduce, and records what it built in
``<prefix>/share/keras-adapt/horovod-build.json``. A second run with the
same TensorFlow, patches and options finds that record and does nothing.

Example:

>>> import sys
>>> from keras_adapt.horovod_build import build
>>> build.HOROVOD_VERSION
'0.28.1'
>>> [p.split("-")[0] for p in build.patch_names()]
['0001', '0002', '0003']
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from keras_adapt.horovod_build import toolchain

__all__ = ["HOROVOD_VERSION", "BuildError", "BuildPlan", "GpuChoice", "cccl_wheel",
           "choose_gpu_operations", "patch_names", "plan_build",
           "read_record", "run_build", "verify"]

HOROVOD_VERSION = "0.28.1"
#: Horovod's runtime dependencies, installed before it is built without them.
RUNTIME_REQUIREMENTS = ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi")
#: Build variables that ask for GPU operations; a CPU build unsets them.
_GPU_VARIABLES = ("HOROVOD_GPU", "HOROVOD_CUDA", "HOROVOD_NCCL", "HOROVOD_ROCM")
PATCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "patches")
RECORD = os.path.join("share", "keras-adapt", "horovod-build.json")

_ABI_PROBE = r"""
#include <string>
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

// A std::string crosses from TensorFlow's library into this one: with a
// C++ ABI other than TensorFlow's, loading or running this op fails.
REGISTER_OP("KerasAdaptAbiProbe")
    .Attr("text: string")
    .Output("length: int32")
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

class KerasAdaptAbiProbe : public tensorflow::OpKernel {
 public:
  explicit KerasAdaptAbiProbe(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("text", &text_));
  }
  void Compute(tensorflow::OpKernelContext* c) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, tensorflow::TensorShape({}), &out));
    out->scalar<int>()() = static_cast<int>(text_.size());
  }
 private:
  std::string text_;
};
REGISTER_KERNEL_BUILDER(Name("KerasAdaptAbiProbe").Device(tensorflow::DEVICE_CPU),
                        KerasAdaptAbiProbe);
"""

_COLLECTIVE = (
    "import json, horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); "
    "r = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum); "
    "print('KERAS_ADAPT_COLLECTIVE ' + json.dumps({'size': hvd.size(), 'sum': r.numpy().tolist()}))"
)


class BuildError(RuntimeError):
    """A build that cannot start or did not work; the message says why and what to do.

    Example:

    >>> from keras_adapt.horovod_build.build import BuildError
    >>> str(BuildError("no C++ compiler; install g++"))
    'no C++ compiler; install g++'
    """


def patch_names():
    """The patches applied to Horovod's sdist, in the order they are applied.

    Example:

    >>> from keras_adapt.horovod_build.build import patch_names
    >>> all(name.endswith(".patch") for name in patch_names())
    True
    """
    return sorted(n for n in os.listdir(PATCH_DIR) if n.endswith(".patch"))


def _patches_digest():
    digest = hashlib.sha256()
    for name in patch_names():
        with open(os.path.join(PATCH_DIR, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


@dataclasses.dataclass
class BuildPlan:
    """What :func:`run_build` will build, and why; made by :func:`plan_build`.

    ``controllers`` are ``("gloo",)`` or ``("gloo", "mpi")``; ``gpu`` is
    the :class:`GpuChoice`; ``cmake`` is ``None`` when a CMake 3 is to be installed
    from PyPI into the environment (CMake 4 refuses Gloo's build files).

    Example:

    >>> import sys
    >>> from keras_adapt.horovod_build import build
    >>> plan = build.plan_build(sys.executable, cpu_only=True)  # doctest: +SKIP
    >>> print(plan.describe())                                  # doctest: +SKIP
    """

    env: toolchain.PythonEnv
    controllers: tuple
    cmake: str
    compiler: str
    gpu: "GpuChoice"
    sdist: str
    jobs: int

    @property
    def gpu_operations(self):
        """``"NCCL"`` or ``None``."""
        return self.gpu.operations

    def horovod_env(self, cuda_home=None, nccl_home=None):
        """The build variables; ``cuda_home``/``nccl_home``: the trees a GPU build names."""
        env = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITHOUT_PYTORCH": "1",
               "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITH_GLOO": "1",
               "HOROVOD_WITH_MPI" if "mpi" in self.controllers else "HOROVOD_WITHOUT_MPI": "1",
               "MAKEFLAGS": f"-j{self.jobs}"}
        if self.gpu_operations:
            env.update(HOROVOD_GPU_OPERATIONS=self.gpu_operations,
                       HOROVOD_CUDA_HOME=cuda_home or "<the CUDA tree>",
                       HOROVOD_NCCL_HOME=nccl_home or "<the NCCL tree>",
                       HOROVOD_NCCL_LINK="SHARED")
            if self.gpu.nccl.source == "pip":
                # Horovod's library finds NCCL in the wheel beside it at run
                # time (site-packages/horovod/tensorflow -> nvidia/nccl/lib).
                env["LDFLAGS"] = "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib"
        return env

    def record(self):
        """The fields of the build record that decide whether a build is up to date."""
        return {"horovod": HOROVOD_VERSION, "tensorflow": self.env.tensorflow,
                "python": self.env.python_version, "patches": _patches_digest(),
                "controllers": list(self.controllers), "gpu_operations": self.gpu_operations}

    def summary(self):
        """One line: what is (to be) built, against what."""
        return (f"horovod {HOROVOD_VERSION} for TensorFlow {self.env.tensorflow} "
                f"(Python {self.env.python_version}, C++11 ABI {self.env.cxx11_abi}): "
                f"controllers {'+'.join(self.controllers)}, frameworks tensorflow, "
                f"{self.gpu.describe()}")

    def describe(self):
        """The steps :func:`run_build` takes, with every command and variable (``--dry-run``)."""
        py = self.env.python
        source = self.sdist or f"pip download --no-deps --no-binary :all: horovod=={HOROVOD_VERSION}"
        steps = [
            f"would build {self.summary()}",
            f"into {self.env.prefix} (Python {py})",
            f"1. check TensorFlow's headers and C++ ABI: compile a test op with {self.compiler} "
            "and TensorFlow's compile flags, load it",
            f"2. {py} -m pip install {' '.join(RUNTIME_REQUIREMENTS)}"
            + ("" if self.cmake else " 'cmake>=3.13,<4'  (no CMake 3 found)"),
            f"3. source: {source}",
            f"4. apply {', '.join(patch_names())} (from {PATCH_DIR})",
        ]
        if self.gpu_operations:
            steps += [f"   {line}" for line in self._gpu_steps()]
        env = " ".join(f"{k}={v}" for k, v in self.horovod_env().items())
        if not self.gpu_operations:
            env = f"(HOROVOD_GPU_*, HOROVOD_CUDA_*, HOROVOD_NCCL_* unset) {env}"
        steps += [
            f"5. {env} {py} -m pip install --no-build-isolation --no-cache-dir --no-deps "
            f"--force-reinstall horovod-{HOROVOD_VERSION}/",
            f"6. verify: horovodrun --check-build; a one-process allreduce under "
            f"{' and '.join(self.controllers)}",
            f"7. record the build in {os.path.join(self.env.prefix, RECORD)}",
        ]
        note = self.gpu.driver_note() if self.gpu_operations else ""
        return "\n".join(steps + ([note] if note else []))

    def _gpu_steps(self):
        gpu = self.gpu
        if gpu.cuda.home is not None and gpu.compiler is gpu.cuda:
            lines = [f"CUDA: {gpu.cuda.home}"]
        else:
            lines = []
            if gpu.cuda.cccl_include() is None:
                lines.append(f"install {cccl_wheel(gpu.cuda)} into the build directory "
                             "(CCCL headers the CUDA runtime wheel lacks)")
            if gpu.compiler is None:
                lines.append(f"install {' '.join(NVCC_WHEELS)} into the build directory "
                             "(no CUDA {0} nvcc ships as a wheel on Linux)".format(gpu.cuda.major))
            lines.append("join the CUDA runtime, the compiler and CCCL into one toolkit tree "
                         "for CMake (symlinks)")
        lines.append(f"NCCL: {gpu.nccl.describe()}, linked into a tree with libnccl.so")
        return lines


#: NVIDIA's compiler wheels installed for a build that has the CUDA runtime
#: wheels but no nvcc (none of CUDA 12 ships nvcc on Linux); ``nvidia/cu13``.
NVCC_WHEEL_VERSION = "13.0"
NVCC_WHEELS = tuple(f"{name}=={NVCC_WHEEL_VERSION}.*"
                    for name in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"))


def cccl_wheel(cuda):
    """The CCCL wheel of ``cuda``'s version: ``nvidia-cuda-cccl-cu12==12.9.*``.

    Example:

    >>> from keras_adapt.horovod_build.build import cccl_wheel
    >>> from keras_adapt.horovod_build.toolchain import CudaToolkit
    >>> cccl_wheel(CudaToolkit("12.9", "pip", pieces=("/x",)))
    'nvidia-cuda-cccl-cu12==12.9.*'
    """
    return f"nvidia-cuda-cccl-cu{cuda.major}=={cuda.version}.*"


def plan_build(python=None, *, cpu_only=False, cuda_home=None, nccl_home=None, sdist=None,
               jobs=None):
    """Looks at the environment of ``python`` and decides what to build.

    Raises :class:`BuildError` when nothing can be built (no TensorFlow, no
    C++ compiler, a TensorFlow older than 2.15) and ``ValueError`` for a
    bad argument, each naming the fix.

    Example:

    >>> import sys
    >>> from keras_adapt.horovod_build import build
    >>> build.plan_build(sys.executable, sdist="/nonexistent.tar.gz")
    Traceback (most recent call last):
    ...
    ValueError: sdist='/nonexistent.tar.gz' is not valid; pass the path of horovod-0.28.1.tar.gz, or leave it out to download it
    """
    if sdist is not None and not (os.path.isfile(sdist)
                                  and os.path.basename(sdist) == f"horovod-{HOROVOD_VERSION}.tar.gz"):
        raise ValueError(f"sdist={sdist!r} is not valid; pass the path of "
                         f"horovod-{HOROVOD_VERSION}.tar.gz, or leave it out to download it")
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs={jobs!r} is not valid; use an int >= 1, the compile processes to run at once")
    env = toolchain.probe_python(python or sys.executable)
    if env.tensorflow is None:
        raise BuildError(
            f"TensorFlow does not import in {env.python} ({env.tensorflow_error}); install it "
            "first (pip install tensorflow-cpu==2.21.0, or tensorflow==2.21.0 for GPUs), then "
            "build Horovod against it")
    if env.tf_minor < (2, 15):
        raise BuildError(f"TensorFlow {env.tensorflow} is older than keras-adapt supports; "
                         "install tensorflow>=2.15 (2.15, 2.18 and 2.21 are tested)")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise BuildError("no C++ compiler found (c++, g++ or $CXX); install one "
                         "(Debian/Ubuntu: apt-get install g++), then run again")
    mpicc = shutil.which("mpicc")
    cmake = shutil.which("cmake")
    if cmake:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
        if toolchain.cmake_major(out) != 3:
            cmake = None
    gpu = choose_gpu_operations(env, cpu_only, cuda_home, nccl_home)
    return BuildPlan(env=env, controllers=("gloo", "mpi") if mpicc else ("gloo",),
                     cmake=cmake, compiler=compiler, gpu=gpu, sdist=sdist,
                     jobs=jobs or os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class GpuChoice:
    """Whether GPU operations are built, why, and from what.

    ``operations`` is ``"NCCL"`` or ``None``; ``cuda`` the CUDA runtime of
    TensorFlow's CUDA major version (a toolkit or NVIDIA's wheels);
    ``compiler`` the toolkit whose ``nvcc`` compiles (``None`` with NCCL:
    NVIDIA's compiler wheels are installed for the build); ``nccl`` NCCL.

    Example:

    >>> from keras_adapt.horovod_build.build import GpuChoice
    >>> GpuChoice(None, "--cpu-only").operations is None
    True
    """

    operations: str
    reason: str
    cuda: toolchain.CudaToolkit = None
    compiler: toolchain.CudaToolkit = None
    nccl: toolchain.Nccl = None

    def describe(self):
        """What the GPU operations are built with, or why there are none."""
        if not self.operations:
            return f"no GPU operations ({self.reason})"
        if self.compiler is self.cuda:
            nvcc = "its nvcc"
        elif self.compiler is not None:
            nvcc = f"nvcc {self.compiler.version} ({self.compiler.source}: {self.compiler.home})"
        else:
            nvcc = f"nvcc {NVCC_WHEEL_VERSION} (NVIDIA's wheels, for the build only)"
        return f"GPU operations NCCL ({self.cuda.describe()} with {nvcc}; {self.nccl.describe()})"

    def driver_note(self):
        """A note when the compiler's CUDA is newer than the runtime's, else ``""``."""
        major = self.compiler.major if self.compiler else int(NVCC_WHEEL_VERSION.split(".")[0])
        if not self.operations or major == self.cuda.major:
            return ""
        return (f"note: Horovod's GPU kernels are compiled by a CUDA {major} nvcc (no CUDA "
                f"{self.cuda.major} nvcc found): expect them to need an NVIDIA driver for CUDA "
                f"{major}, and no Pascal or Volta GPUs; a CUDA {self.cuda.major} toolkit "
                "(--cuda-home) avoids both")


def choose_gpu_operations(env, cpu_only=False, cuda_home=None, nccl_home=None):
    """The :class:`GpuChoice` for the environment ``env``.

    NCCL when TensorFlow is a CUDA build and a CUDA runtime of its major
    version (:func:`.toolchain.find_cuda`) and NCCL
    (:func:`.toolchain.find_nccl`) are found; the compiler is that
    toolkit's ``nvcc``, another toolkit's (:func:`.toolchain.find_nvcc`), or
    NVIDIA's compiler wheels.

    Example:

    >>> from keras_adapt.horovod_build.build import choose_gpu_operations
    >>> from keras_adapt.horovod_build.toolchain import PythonEnv
    >>> env = PythonEnv("/v/bin/python", "3.11.7", "/v", "/v/lib/site-packages", tensorflow="2.21.0")
    >>> choose_gpu_operations(env).describe()
    'no GPU operations (TensorFlow is a CPU build)'
    """
    if cpu_only:
        if cuda_home is not None or nccl_home is not None:
            raise ValueError("cpu_only=True with cuda_home or nccl_home is not valid; "
                             "leave out --cpu-only to build the GPU operations")
        return GpuChoice(None, "--cpu-only")
    if env.tf_cuda is None:
        if cuda_home is not None or nccl_home is not None:
            raise BuildError(
                f"TensorFlow {env.tensorflow} in {env.prefix} is a CPU build, so GPU operations "
                "would never run; install the GPU wheel (pip install tensorflow[and-cuda]=="
                f"{env.tensorflow}) or build with --cpu-only")
        return GpuChoice(None, "TensorFlow is a CPU build")
    want = int(env.tf_cuda.split(".")[0])
    cuda, seen = toolchain.find_cuda(cuda_home, env.purelib, want_major=want)
    if cuda_home is not None and cuda.major != want:
        raise BuildError(f"--cuda-home {cuda_home} holds CUDA {cuda.version}, but TensorFlow "
                         f"{env.tensorflow} is built with CUDA {env.tf_cuda}; pass a CUDA {want} "
                         "toolkit")
    if cuda is None:
        found = "; found " + ", ".join(t.describe() for t in seen) if seen else ""
        return GpuChoice(None, f"no CUDA {want} runtime or toolkit (TensorFlow is built with "
                         f"CUDA {env.tf_cuda}{found}; pip install tensorflow[and-cuda]=="
                         f"{env.tensorflow}, or pass --cuda-home)")
    nccl = toolchain.find_nccl(nccl_home, env.purelib)
    if nccl is None:
        return GpuChoice(None, f"no NCCL found (pip install nvidia-nccl-cu{want}, or pass "
                         "--nccl-home)", cuda=cuda)
    return GpuChoice("NCCL", f"TensorFlow is built with CUDA {env.tf_cuda}", cuda=cuda,
                     compiler=toolchain.find_nvcc(cuda, seen), nccl=nccl)


def read_record(prefix):
    """The record of the last build in the environment at ``prefix``, or ``None``.

    Example:

    >>> from keras_adapt.horovod_build.build import read_record
    >>> read_record("/nonexistent") is None
    True
    """
    try:
        with open(os.path.join(prefix, RECORD)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _say(log, text):
    log(f"[build-horovod {time.strftime('%H:%M:%S')}] {text}")


def _run(argv, *, env=None, what):
    """Runs a step; on failure, the end of its output goes into the error."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {proc.returncode}): {' '.join(map(str, argv))}\n"
                         f"{tail}")
    return proc.stdout


def _check_abi(plan, work):
    env = plan.env
    source = os.path.join(work, "abi_probe.cc")
    library = os.path.join(work, "abi_probe.so")
    with open(source, "w") as f:
        f.write(_ABI_PROBE)
    flags = [f for f in env.compile_flags if not f.startswith("--std")]
    _run([plan.compiler, "-std=c++17", "-shared", "-fPIC", "-O0", source, "-o", library, *flags,
          *env.link_flags], what="compiling a test op against TensorFlow's headers")
    code = (f"import tensorflow as tf; ops = tf.load_op_library({library!r}); "
            "print('KERAS_ADAPT_ABI', int(ops.keras_adapt_abi_probe(text='keras-adapt')))")
    out = _run([env.python, "-c", code], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
               what=f"loading the test op (C++11 ABI {env.cxx11_abi}) into TensorFlow")
    if "KERAS_ADAPT_ABI 11" not in out:
        raise BuildError(f"the test op built against TensorFlow {env.tensorflow} returned the "
                         f"wrong answer ({out.strip()!r}): this compiler and TensorFlow's ABI "
                         "disagree; use the compiler TensorFlow documents for its version")


def _gpu_trees(plan, work, log):
    """The CUDA and NCCL trees a GPU build names; installs the build-only wheels it needs."""
    gpu, py = plan.gpu, plan.env.python
    if gpu.cuda.home is not None and gpu.compiler is gpu.cuda:
        cuda_home = gpu.cuda.home
    else:
        cccl = gpu.cuda.cccl_include()
        if cccl is None:
            _say(log, f"installing {cccl_wheel(gpu.cuda)} into the build directory")
            _run([py, "-m", "pip", "install", "-q", "--no-deps", "--target",
                  os.path.join(work, "cccl"), cccl_wheel(gpu.cuda)], what="installing CCCL")
            cccl = os.path.join(work, "cccl", "nvidia", "cuda_cccl", "include")
        if gpu.compiler is not None:
            compiler_root = gpu.compiler.home
        else:
            _say(log, f"installing {' '.join(NVCC_WHEELS)} into the build directory")
            # one pip call: a second --target install into nvidia/ would be skipped
            _run([py, "-m", "pip", "install", "-q", "--no-deps", "--target",
                  os.path.join(work, "nvcc"), *NVCC_WHEELS], what="installing nvcc")
            compiler_root = os.path.join(work, "nvcc", "nvidia",
                                         f"cu{NVCC_WHEEL_VERSION.split('.')[0]}")
        cuda_home = toolchain.join_cuda_tree(gpu.cuda, compiler_root, cccl,
                                             os.path.join(work, "cuda"))
    note = gpu.driver_note()
    if note:
        _say(log, note)
    return cuda_home, gpu.nccl.home_tree(os.path.join(work, "nccl"))


def _apply_patches(tree, log):
    tool = shutil.which("patch")
    git = shutil.which("git")
    if not tool and not git:
        raise BuildError("neither patch nor git is installed; install one "
                         "(Debian/Ubuntu: apt-get install patch), then run again")
    for name in patch_names():
        path = os.path.join(PATCH_DIR, name)
        _say(log, f"applying {name}")
        with open(path) as f:
            argv = [tool, "-p1", "--forward", "--quiet"] if tool else [git, "apply", "-p1"]
            proc = subprocess.run(argv, stdin=f, cwd=tree, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"applying {name} to horovod-{HOROVOD_VERSION} failed: "
                             f"{(proc.stdout + proc.stderr).strip()[-800:]}")


def verify(prefix, controllers, python=None):
    """Checks a built Horovod: ``horovodrun --check-build`` and a one-process allreduce.

    Returns ``{"check_build": text, "built": {...}, "allreduce": {controller: sum}}``;
    raises :class:`BuildError` when Horovod lacks TensorFlow or a controller
    in ``controllers``, or the allreduce is wrong.

    Example:

    >>> import sys
    >>> from keras_adapt.horovod_build.build import verify
    >>> result = verify(sys.prefix, ("gloo",))         # doctest: +SKIP
    >>> result["allreduce"]["gloo"]                    # doctest: +SKIP
    [1.0, 2.0]
    """
    python = python or os.path.join(prefix, "bin", "python")
    horovodrun = os.path.join(prefix, "bin", "horovodrun")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    text = _run([horovodrun, "--check-build"], env=env, what="horovodrun --check-build")
    built = {name: bool(re.search(rf"\[X\] {name}\b", text))
             for name in ("TensorFlow", "MPI", "Gloo", "NCCL")}
    missing = [n for n, want in (("TensorFlow", True), ("Gloo", True),
                                 ("MPI", "mpi" in controllers)) if want and not built[n]]
    if missing:
        raise BuildError(f"horovodrun --check-build does not list {', '.join(missing)}:\n{text}")
    sums = {}
    for controller in controllers:
        out = _run([horovodrun, "-np", "1", "-H", "localhost:1", f"--{controller}", python, "-c",
                    _COLLECTIVE], env=env,
                   what=f"a one-process allreduce under {controller}")
        # horovodrun prefixes and interleaves the workers' output: find the object
        match = re.search(r"KERAS_ADAPT_COLLECTIVE (\{[^{}]*\})", out)
        result = json.loads(match.group(1)) if match else None
        if result is None or result["size"] != 1 or result["sum"] != [1.0, 2.0]:
            raise BuildError(f"the one-process allreduce under {controller} returned {result} "
                             f"(expected size 1, sum [1.0, 2.0]):\n{out[-800:]}")
        sums[controller] = result["sum"]
    return {"check_build": text, "built": built, "allreduce": sums}


def _up_to_date(plan):
    record = read_record(plan.env.prefix)
    if record is None or {k: record.get(k) for k in plan.record()} != plan.record():
        return None
    probe = subprocess.run([plan.env.python, "-c", "import horovod.tensorflow"],
                           capture_output=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return record if probe.returncode == 0 else None


def run_build(plan, *, force=False, log=print):
    """Builds, verifies and records Horovod as ``plan`` says; returns the record.

    Does nothing (and returns the existing record, with ``"up_to_date":
    True``) when the environment's record matches the plan and Horovod
    imports, unless ``force``. Progress lines go to ``log``; a failing step
    raises :class:`BuildError` with the end of its output.

    Example:

    >>> import sys
    >>> from keras_adapt.horovod_build import build
    >>> plan = build.plan_build(sys.executable)           # doctest: +SKIP
    >>> build.run_build(plan)["tensorflow"]               # doctest: +SKIP
    '2.21.0'
    """
    if not force:
        record = _up_to_date(plan)
        if record is not None:
            return dict(record, up_to_date=True)
    started = time.monotonic()
    py = plan.env.python
    with tempfile.TemporaryDirectory(prefix="keras-adapt-horovod-") as work:
        _say(log, f"checking TensorFlow {plan.env.tensorflow}'s headers and C++ ABI "
             f"({plan.env.cxx11_abi}) with {plan.compiler}")
        _check_abi(plan, work)
        requirements = list(RUNTIME_REQUIREMENTS) + ([] if plan.cmake else ["cmake>=3.13,<4"])
        _say(log, f"installing {' '.join(requirements)}")
        _run([py, "-m", "pip", "install", "-q", *requirements],
             what="installing Horovod's runtime requirements")
        sdist = plan.sdist
        if sdist is None:
            _say(log, f"downloading the horovod=={HOROVOD_VERSION} source distribution")
            # --no-cache-dir: a wheel cached from another environment was
            # built against another TensorFlow and must not be reused.
            _run([py, "-m", "pip", "download", "-q", "--no-cache-dir", "--no-deps",
                  "--no-binary", ":all:", "-d", work, f"horovod=={HOROVOD_VERSION}"],
                 what="downloading Horovod's source distribution")
            sdist = os.path.join(work, f"horovod-{HOROVOD_VERSION}.tar.gz")
        with tarfile.open(sdist) as tar:
            # The "data" filter refuses links and paths out of the tree
            # (Python >= 3.11.4, 3.10.12, 3.9.17).
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(work, **kwargs)
        tree = os.path.join(work, f"horovod-{HOROVOD_VERSION}")
        _apply_patches(tree, log)
        # Our choices win over HOROVOD_* variables of the caller's shell
        # (a CPU build unsets its GPU ones); others pass through.
        env = {k: v for k, v in os.environ.items()
               if plan.gpu_operations or not k.startswith(_GPU_VARIABLES)}
        cuda_home = nccl_home = None
        if plan.gpu_operations:
            cuda_home, nccl_home = _gpu_trees(plan, work, log)
        horovod_env = plan.horovod_env(cuda_home, nccl_home)
        env.update(horovod_env)
        if not plan.cmake:
            env["PATH"] = os.path.join(plan.env.prefix, "bin") + os.pathsep + env["PATH"]
        _say(log, f"building {plan.summary()}; this takes a few minutes")
        _run([py, "-m", "pip", "install", "--no-build-isolation", "--no-cache-dir", "--no-deps",
              "--force-reinstall", tree], env=env, what=f"building horovod=={HOROVOD_VERSION}")
    _say(log, "verifying: horovodrun --check-build and a one-process allreduce")
    checked = verify(plan.env.prefix, plan.controllers, python=py)
    if plan.gpu_operations and not checked["built"]["NCCL"]:
        raise BuildError("Horovod was built with HOROVOD_GPU_OPERATIONS=NCCL, but "
                         f"horovodrun --check-build does not list NCCL:\n{checked['check_build']}")
    record = dict(plan.record(), summary=plan.summary(), seconds=round(time.monotonic() - started),
                  gpu=plan.gpu.describe(),
                  build_env={k: v for k, v in horovod_env.items() if k != "MAKEFLAGS"},
                  check_build=checked["check_build"], up_to_date=False)
    path = os.path.join(plan.env.prefix, RECORD)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    return record
