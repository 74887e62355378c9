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
    assert record["gpu_operations"] is None  # the CPU wheel of TensorFlow
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

def _nvcc(path, release):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def _touch(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _nccl_header(path, version):
    major, minor, patch = version.split(".")
    _touch(path, f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
                 f"#define NCCL_PATCH {patch}\n")


@pytest.fixture
def wheels(tmp_path):
    """site-packages laid out as NVIDIA's CUDA 12 wheels lay it out, and a CUDA 13 system toolkit."""
    site = tmp_path / "site-packages"
    nvidia = site / "nvidia"
    _nvcc(str(nvidia / "cuda_nvcc" / "bin" / "nvcc"), "12.9")
    _touch(str(nvidia / "cuda_nvcc" / "bin" / "ptxas"))
    _touch(str(nvidia / "cuda_nvcc" / "nvvm" / "bin" / "cicc"))
    _touch(str(nvidia / "cuda_runtime" / "include" / "cuda_runtime.h"))
    _touch(str(nvidia / "cuda_runtime" / "lib" / "libcudart.so.12"))
    _touch(str(nvidia / "cuda_cccl" / "include" / "cub" / "cub.cuh"))
    _nccl_header(str(nvidia / "nccl" / "include" / "nccl.h"), "2.27.7")
    _touch(str(nvidia / "nccl" / "lib" / "libnccl.so.2"))
    system = tmp_path / "cuda-13"
    _nvcc(str(system / "bin" / "nvcc"), "13.0")
    return site, system


def test_the_toolkit_of_tensorflows_cuda_version_is_chosen_among_those_found(wheels, monkeypatch):
    site, system = wheels
    monkeypatch.setenv("CUDA_HOME", str(system))  # the environment names CUDA 13 first
    for var in ("HOROVOD_CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    chosen, seen = toolchain.find_cuda(None, str(site), want_major=12, search_system=False)
    assert (chosen.source, chosen.version, chosen.major) == ("pip", "12.9", 12)
    assert [t.version for t in seen] == ["13.0", "12.9"]
    names = [os.path.basename(p) for p in chosen.pieces]
    assert names == ["cuda_nvcc", "cuda_runtime", "cuda_cccl"]
    chosen, _ = toolchain.find_cuda(None, str(site), want_major=13, search_system=False)
    assert (chosen.source, chosen.home) == ("environment", str(system))
    assert toolchain.find_cuda(None, str(site), want_major=11, search_system=False)[0] is None
    with pytest.raises(ValueError, match="cuda_home='/nonexistent' is not valid; pass a CUDA"):
        toolchain.find_cuda("/nonexistent", str(site))


def test_nccl_is_found_in_the_wheel_with_its_version(wheels, monkeypatch, tmp_path):
    site, _ = wheels
    for var in ("HOROVOD_NCCL_HOME", "NCCL_HOME"):
        monkeypatch.delenv(var, raising=False)
    nccl = toolchain.find_nccl(None, str(site), search_system=False)
    assert (nccl.version, nccl.source) == ("2.27.7", "pip")
    assert nccl.include == str(site / "nvidia" / "nccl" / "include")
    home = tmp_path / "nccl-2.21.5"
    _nccl_header(str(home / "include" / "nccl.h"), "2.21.5")
    _touch(str(home / "lib" / "libnccl.so"))
    assert toolchain.find_nccl(str(home), str(site)).version == "2.21.5"
    monkeypatch.setenv("NCCL_HOME", str(home))  # the environment wins over the wheel
    assert toolchain.find_nccl(None, str(site), search_system=False).source == "environment"


def test_the_wheels_are_joined_into_one_toolkit_tree_for_cmake(wheels, tmp_path):
    site, _ = wheels
    cuda, _ = toolchain.find_cuda(None, str(site), want_major=12, search_system=False)
    home = cuda.join(str(tmp_path / "cuda"))
    nvidia = site / "nvidia"
    assert os.path.realpath(os.path.join(home, "bin", "nvcc")) == str(nvidia / "cuda_nvcc" / "bin" / "nvcc")
    assert os.path.realpath(os.path.join(home, "nvvm")) == str(nvidia / "cuda_nvcc" / "nvvm")
    assert os.path.exists(os.path.join(home, "include", "cuda_runtime.h"))
    assert os.path.exists(os.path.join(home, "include", "cub", "cub.cuh"))
    # the unversioned name the linker asks for, beside the wheel's versioned library
    assert os.path.realpath(os.path.join(home, "lib64", "libcudart.so")) == str(
        nvidia / "cuda_runtime" / "lib" / "libcudart.so.12")
    nccl = toolchain.find_nccl(None, str(site), search_system=False)
    lib = nccl.linkable_lib(str(tmp_path / "nccl-lib"))
    assert os.path.realpath(os.path.join(lib, "libnccl.so")) == str(nvidia / "nccl" / "lib" / "libnccl.so.2")


def test_a_gpu_tensorflow_with_toolkit_and_nccl_gets_the_nccl_operations(wheels, monkeypatch,
                                                                        tmp_path):
    site, system = wheels
    for var in ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "HOROVOD_NCCL_HOME", "NCCL_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvcc on PATH
    env = toolchain.PythonEnv(sys.executable, "3.11.7", sys.prefix, str(site), tensorflow="2.21.0",
                              tf_cuda="12.5.1", cxx11_abi=1)
    gpu, why, cuda, nccl = build.choose_gpu_operations(env)
    assert gpu == "NCCL" and why == "TensorFlow is built with CUDA 12.5.1"
    assert (cuda.version, nccl.version) == ("12.9", "2.27.7")
    plan = build.BuildPlan(env=env, controllers=("gloo",), mpicc=None, cmake="/usr/bin/cmake",
                           compiler="/usr/bin/c++", gpu_operations=gpu, gpu_reason=why, cuda=cuda,
                           nccl=nccl, sdist=None, jobs=2)
    variables = plan.horovod_env(str(tmp_path))
    assert variables["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert variables["HOROVOD_CUDA_HOME"] == str(tmp_path / "cuda")
    assert os.path.exists(os.path.join(variables["HOROVOD_NCCL_LIB"], "libnccl.so"))
    assert variables["HOROVOD_NCCL_INCLUDE"] == nccl.include
    assert "GPU operations NCCL (CUDA 12.9 (pip:" in plan.summary()
    # no CUDA 12 toolkit anywhere: no GPU operations, and the reason names what to install
    bare = toolchain.PythonEnv(sys.executable, "3.11.7", sys.prefix, str(tmp_path / "empty"),
                               tensorflow="2.21.0", tf_cuda="12.5.1", cxx11_abi=1)
    gpu, why, _, _ = build.choose_gpu_operations(bare)
    assert gpu is None and "no CUDA 12 toolkit" in why and "nvidia-cuda-nvcc-cu12" in why
    with pytest.raises(build.BuildError, match="holds CUDA 13.0, but TensorFlow 2.21.0 is built "
                                               "with CUDA 12.5.1"):
        build.choose_gpu_operations(env, cuda_home=str(system))

