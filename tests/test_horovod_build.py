"""``keras-adapt build-horovod``: what it finds, plans and records.

The build itself runs in ``make setup`` (both stacks use the command) and, in a
fresh environment with only TensorFlow, in tests/test_user_install.py. Here:
the stack's own build record (written by that setup), ``--dry-run`` against the
stack, a second run that finds the build up to date, the errors, and the
search for CUDA and NCCL on toolkit trees laid out as NVIDIA's wheels and a
system toolkit lay them out (a fake ``nvcc`` that prints a version: nothing is
compiled with it).
"""

import hashlib
import os
import shutil
import stat
import subprocess
import sys

import pytest

from keras_adapt.horovod_build import build, toolchain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(*args, python=sys.executable, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([python, "-m", "keras_adapt", "build-horovod", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _tf_version():
    out = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                         capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                         timeout=300).stdout
    return out.strip().splitlines()[-1]


def _tf_is_cuda_build():
    import tensorflow as tf

    return bool(tf.sysconfig.get_build_info().get("is_cuda_build"))


#: The tests that expect TensorFlow's CPU wheel (make test's stacks); the GPU
#: stack (make setup-gpu) has the GPU wheel.
cpu_wheel_only = pytest.mark.skipif(_tf_is_cuda_build(), reason="TensorFlow's GPU wheel")


def test_setup_built_this_stacks_horovod_with_the_command_and_recorded_it():
    record = build.read_record(sys.prefix)
    assert record is not None, "make setup builds Horovod with keras-adapt build-horovod"
    assert record["horovod"] == "0.28.1" and record["tensorflow"] == _tf_version()
    # the digest of the patches shipped in the package, computed here again
    digest = hashlib.sha256()
    for name in sorted(os.listdir(build.PATCH_DIR)):
        if name.endswith(".patch"):
            with open(os.path.join(build.PATCH_DIR, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    assert record["patches"] == digest.hexdigest()[:16]
    mpi = shutil.which("mpicc") is not None
    assert record["controllers"] == (["gloo", "mpi"] if mpi else ["gloo"])
    # NCCL in the GPU stack (make setup-gpu), none with TensorFlow's CPU wheel
    assert record["gpu_operations"] == ("NCCL" if _tf_is_cuda_build() else None)
    assert ("[X] NCCL" in record["check_build"]) == _tf_is_cuda_build()
    assert "[X] Gloo" in record["check_build"] and "[X] TensorFlow" in record["check_build"]
    assert ("[X] MPI" in record["check_build"]) == mpi
    import horovod

    assert horovod.__version__ == "0.28.1"


def test_a_second_run_finds_the_build_up_to_date_and_changes_nothing():
    path = os.path.join(sys.prefix, build.RECORD)
    before = os.stat(path).st_mtime_ns
    proc = _command()
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("keras-adapt build-horovod: up to date: horovod 0.28.1 for "
                           f"TensorFlow {_tf_version()}"), line
    assert "--force builds again" in line
    assert os.stat(path).st_mtime_ns == before


@cpu_wheel_only
def test_dry_run_says_what_would_be_built_with_every_command():
    proc = _command("--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    mpi = shutil.which("mpicc") is not None
    assert lines[0] == (f"would build horovod 0.28.1 for TensorFlow {_tf_version()} (Python "
                        f"{'.'.join(map(str, sys.version_info[:3]))}, C++11 ABI 1): controllers "
                        f"{'gloo+mpi' if mpi else 'gloo'}, frameworks tensorflow, no GPU "
                        "operations (TensorFlow is a CPU build)")
    assert lines[1] == f"into {sys.prefix} (Python {sys.executable})"
    text = proc.stdout
    for name in build.patch_names():
        assert name in text
    assert f"HOROVOD_WITH_{'MPI' if mpi else 'GLOO'}=1" in text
    assert "HOROVOD_WITHOUT_PYTORCH=1" in text and "--no-build-isolation" in text
    assert "HOROVOD_GPU_*, HOROVOD_CUDA_*, HOROVOD_NCCL_* unset" in text
    assert "HOROVOD_GPU_OPERATIONS=" not in text


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs=0 is not valid; use an int >= 1"),
    (["--sdist", "/nonexistent/horovod.tar.gz"],
     "--sdist='/nonexistent/horovod.tar.gz' is not valid; pass the path of horovod-0.28.1.tar.gz"),
    (["--cpu-only", "--nccl-home", "/opt/nccl"],
     "--cpu-only=True with --cuda-home or --nccl-home is not valid; leave out --cpu-only"),
])
def test_bad_options_name_the_value_and_the_fix(args, message):
    proc = _command(*args, "--dry-run")
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr


@cpu_wheel_only
def test_gpu_options_with_the_cpu_wheel_of_tensorflow_say_to_install_the_gpu_wheel():
    proc = _command("--cuda-home", "/usr/local/cuda", "--dry-run")
    assert proc.returncode == 1
    assert "is a CPU build, so GPU operations would never run" in proc.stderr
    assert "pip install tensorflow[and-cuda]==" in proc.stderr and "--cpu-only" in proc.stderr


@pytest.mark.primary_only
def test_an_environment_without_tensorflow_is_told_to_install_it_first(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")],
                   check=True, timeout=300)
    proc = _command("--dry-run", python=str(tmp_path / "env" / "bin" / "python"))
    assert proc.returncode == 1
    assert "TensorFlow does not import in" in proc.stderr
    assert "install it first (pip install tensorflow-cpu==2.21.0" in proc.stderr


# -- finding CUDA and NCCL ----------------------------------------------------------------

def _touch(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _toolkit(root, release):
    """A system toolkit's layout: bin/nvcc (a script that prints the release), nvvm, headers."""
    nvcc = os.path.join(root, "bin", "nvcc")
    _touch(nvcc, f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    os.chmod(nvcc, os.stat(nvcc).st_mode | stat.S_IXUSR)
    for name in ("cudafe++", "ptxas"):
        _touch(os.path.join(root, "bin", name))
    _touch(os.path.join(root, "nvvm", "bin", "cicc"))
    include = os.path.join(root, "targets", "x86_64-linux", "include")
    _touch(os.path.join(include, "cuda_runtime.h"), f"// CUDA {release}")
    _touch(os.path.join(include, "crt", "host_defines.h"), f"// crt of {release}")
    _touch(os.path.join(include, "fatbinary_section.h"))
    return root


def _nccl_header(path, version):
    major, minor, patch = version.split(".")
    _touch(path, f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
                 f"#define NCCL_PATCH {patch}\n")


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """site-packages laid out as tensorflow[and-cuda] lays it out (CUDA 12.9 runtime and
    NCCL, and an nvidia/cuda_nvcc with ptxas only, as on Linux), and a CUDA 13 toolkit."""
    for var in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "HOROVOD_NCCL_HOME", "NCCL_HOME"):
        monkeypatch.delenv(var, raising=False)
    site = tmp_path / "site-packages"
    nvidia = site / "nvidia"
    _touch(str(nvidia / "cuda_nvcc" / "bin" / "ptxas"))
    runtime = nvidia / "cuda_runtime"
    _touch(str(runtime / "include" / "cuda_runtime_api.h"), "#define CUDART_VERSION 12090\n")
    _touch(str(runtime / "include" / "cuda_runtime.h"))
    _touch(str(runtime / "lib" / "libcudart.so.12"))
    _nccl_header(str(nvidia / "nccl" / "include" / "nccl.h"), "2.32.3")
    _touch(str(nvidia / "nccl" / "lib" / "libnccl.so.2"))
    return site, _toolkit(str(tmp_path / "cuda-13.0"), "13.0")


def test_the_runtime_of_tensorflows_cuda_version_is_chosen_among_those_found(wheels, monkeypatch):
    site, cuda13 = wheels
    monkeypatch.setenv("CUDA_HOME", cuda13)  # the environment names CUDA 13 first
    chosen, seen = toolchain.find_cuda(None, str(site), want_major=12, search_system=False)
    assert (chosen.source, chosen.version, chosen.major, chosen.nvcc) == ("pip", "12.9", 12, None)
    assert [os.path.basename(p) for p in chosen.pieces] == ["cuda_runtime"]
    assert chosen.cccl_include() is None  # the runtime wheel has no nv/target
    assert [(t.source, t.version) for t in seen] == [("environment", "13.0"), ("pip", "12.9")]
    # no CUDA 12 nvcc among them: CUDA 13's compiles
    assert toolchain.find_nvcc(chosen, seen).home == cuda13
    assert toolchain.find_nvcc(chosen, (chosen,)) is None  # then NVIDIA's compiler wheels
    chosen13, _ = toolchain.find_cuda(None, str(site), want_major=13, search_system=False)
    assert (chosen13.source, chosen13.home, toolchain.find_nvcc(chosen13, seen)) == (
        "environment", cuda13, chosen13)
    assert toolchain.find_cuda(None, str(site), want_major=11, search_system=False)[0] is None
    with pytest.raises(ValueError, match="cuda_home='/nonexistent' is not valid; pass a CUDA"):
        toolchain.find_cuda("/nonexistent", str(site))
    # a directory with an nvcc but no toolkit beside it (a wrapper script) is not a toolkit
    wrapper = site.parent / "wrapper"
    _touch(str(wrapper / "bin" / "nvcc"), "#!/bin/sh\necho release 13.0,\n")
    os.chmod(wrapper / "bin" / "nvcc", 0o755)
    with pytest.raises(ValueError, match="not valid"):
        toolchain.find_cuda(str(wrapper), str(site))


def test_nccl_is_found_in_the_wheel_with_its_version(wheels, monkeypatch, tmp_path):
    site, _ = wheels
    nccl = toolchain.find_nccl(None, str(site), search_system=False)
    assert (nccl.version, nccl.source) == ("2.32.3", "pip")
    assert nccl.include == str(site / "nvidia" / "nccl" / "include")
    home = tmp_path / "nccl-2.21.5"
    _nccl_header(str(home / "include" / "nccl.h"), "2.21.5")
    _touch(str(home / "lib" / "libnccl.so"))
    assert toolchain.find_nccl(str(home), str(site)).version == "2.21.5"
    monkeypatch.setenv("NCCL_HOME", str(home))  # the environment wins over the wheel
    assert toolchain.find_nccl(None, str(site), search_system=False).source == "environment"
    # the tree HOROVOD_NCCL_HOME names: include, and the unversioned library name
    tree = nccl.home_tree(str(tmp_path / "nccl-tree"))
    assert os.path.realpath(os.path.join(tree, "lib", "libnccl.so")) == str(
        site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    assert os.path.exists(os.path.join(tree, "include", "nccl.h"))


def test_the_wheels_and_a_compiler_are_joined_into_one_toolkit_tree(wheels, tmp_path):
    site, cuda13 = wheels
    runtime, _ = toolchain.find_cuda(None, str(site), want_major=12, search_system=False)
    cccl = tmp_path / "cccl" / "include"
    _touch(str(cccl / "nv" / "target"))
    _touch(str(cccl / "cub" / "cub.cuh"))
    home = toolchain.join_cuda_tree(runtime, cuda13, str(cccl), str(tmp_path / "cuda"))
    real = lambda *p: os.path.realpath(os.path.join(home, *p))  # noqa: E731
    assert real("bin", "nvcc") == os.path.join(cuda13, "bin", "nvcc")
    assert real("bin", "cudafe++") == os.path.join(cuda13, "bin", "cudafe++")
    assert real("nvvm") == os.path.join(cuda13, "nvvm")
    # the compiler's own crt and fatbinary headers, the runtime's headers, CCCL
    include13 = os.path.join(cuda13, "targets", "x86_64-linux", "include")
    assert real("include", "crt") == os.path.join(include13, "crt")
    assert real("include", "fatbinary_section.h") == os.path.join(include13, "fatbinary_section.h")
    runtime_include = site / "nvidia" / "cuda_runtime" / "include"
    assert real("include", "cuda_runtime.h") == str(runtime_include / "cuda_runtime.h")
    assert real("include", "nv") == str(cccl / "nv")
    # the unversioned name the linker asks for, beside the wheel's versioned library
    assert real("lib64", "libcudart.so") == str(site / "nvidia" / "cuda_runtime" / "lib" /
                                                 "libcudart.so.12")


def _env(site, tf_cuda="12.5.1"):
    return toolchain.PythonEnv(sys.executable, "3.11.7", sys.prefix, str(site),
                               tensorflow="2.21.0", tf_cuda=tf_cuda, cxx11_abi=1)


def _plan(gpu):
    return build.BuildPlan(env=_env("/site"), controllers=("gloo",),
                           cmake="/usr/bin/cmake", compiler="/usr/bin/c++", gpu=gpu, sdist=None,
                           jobs=2)


def test_a_gpu_tensorflow_with_the_cuda_wheels_gets_the_nccl_operations(wheels, monkeypatch):
    site, cuda13 = wheels
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvcc on PATH
    monkeypatch.setenv("CUDA_HOME", cuda13)  # a CUDA 13 toolkit, as /usr/local/cuda here
    gpu = build.choose_gpu_operations(_env(site))
    assert (gpu.operations, gpu.reason) == ("NCCL", "TensorFlow is built with CUDA 12.5.1")
    assert (gpu.cuda.version, gpu.compiler.home, gpu.nccl.version) == ("12.9", cuda13, "2.32.3")
    assert "no Pascal or Volta GPUs" in gpu.driver_note()
    plan = _plan(gpu)
    variables = plan.horovod_env("/tmp/cuda", "/tmp/nccl")
    assert (variables["HOROVOD_GPU_OPERATIONS"], variables["HOROVOD_CUDA_HOME"],
            variables["HOROVOD_NCCL_HOME"], variables["HOROVOD_NCCL_LINK"]) == (
        "NCCL", "/tmp/cuda", "/tmp/nccl", "SHARED")
    # the library finds the NCCL wheel beside it at run time
    assert variables["LDFLAGS"] == "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib"
    text = plan.describe()
    assert "install nvidia-cuda-cccl-cu12==12.9.* into the build directory" in text
    assert "nvidia-cuda-nvcc==13.0" not in text  # the CUDA 13 toolkit's nvcc compiles
    assert "GPU operations NCCL (CUDA 12.9 (pip:" in plan.summary()
    # without any nvcc, NVIDIA's compiler wheels are installed for the build
    no_compiler = build.GpuChoice("NCCL", gpu.reason, cuda=gpu.cuda, nccl=gpu.nccl)
    assert ("install nvidia-cuda-nvcc==13.0.* nvidia-cuda-crt==13.0.* nvidia-nvvm==13.0.*"
            in _plan(no_compiler).describe())


def test_without_a_cuda_runtime_of_tensorflows_version_there_are_no_gpu_operations(wheels,
                                                                                   tmp_path):
    _, cuda13 = wheels
    gpu = build.choose_gpu_operations(_env(tmp_path / "empty"))
    assert gpu.operations is None and gpu.reason.startswith("no CUDA 12 runtime or toolkit")
    assert "pip install tensorflow[and-cuda]==2.21.0" in gpu.reason
    with pytest.raises(build.BuildError, match="holds CUDA 13.0, but TensorFlow 2.21.0 is built "
                                               "with CUDA 12.5.1"):
        build.choose_gpu_operations(_env(tmp_path / "empty"), cuda_home=cuda13)
