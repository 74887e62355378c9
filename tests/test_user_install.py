"""A user's own environment: TensorFlow alone, then our wheel, then ``keras-adapt build-horovod``.

``tools/check_install.sh VENV --user-env`` (part of ``make test``, primary
stack) builds the wheel and runs this file with ``KERAS_ADAPT_WHEEL`` naming
it; in the ordinary suite it is skipped. The tests run in order and share one
new virtual environment that starts with nothing but the stack's
``tensorflow-cpu`` from PyPI. Each extra is installed into an environment of
its own, chained to that one (a ``.pth`` file), so that what an extra brings
is not there before it is installed.
"""

import json
import os
import subprocess
import sys

import pytest

WHEEL = os.environ.get("KERAS_ADAPT_WHEEL")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(
    WHEEL is None, reason="run by tools/check_install.sh --user-env with the built wheel")


def _run(argv, timeout=900, check=True, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HOROVOD_GLOO_TIMEOUT_SECONDS="120")
    env.pop("PYTHONPATH", None)
    env.update(kwargs.pop("env", {}))
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=kwargs.pop("cwd", "/"), **kwargs)
    if check:
        assert proc.returncode == 0, (argv, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def _tf_version():
    import tensorflow as tf

    return tf.__version__


def _installed(python):
    out = _run([python, "-m", "pip", "list", "--format=json"]).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


class UserEnv:
    def __init__(self, root):
        self.root = root
        self.dir = root / "env"
        self.python = self.dir / "bin" / "python"
        self.bin = self.dir / "bin"

    def site(self, python=None):
        return _run([python or self.python, "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()

    def chained(self, name):
        """A new environment that sees this one's packages and installs its own."""
        path = self.root / name
        _run([sys.executable, "-m", "venv", path])
        python = path / "bin" / "python"
        with open(os.path.join(self.site(python), "user_env.pth"), "w") as f:
            f.write(self.site() + "\n")
        return python


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    env = UserEnv(tmp_path_factory.mktemp("user"))
    _run([sys.executable, "-m", "venv", env.dir])
    _run([env.python, "-m", "pip", "install", "-q", f"tensorflow-cpu=={_tf_version()}"])
    return env


def test_the_wheel_installs_beside_tensorflow_alone(user_env):
    before = _installed(user_env.python)
    assert "tensorflow-cpu" in before and "horovod" not in before and "tensorboard" not in before
    _run([user_env.python, "-m", "pip", "install", "-q", WHEEL])
    after = _installed(user_env.python)
    assert set(after) - set(before) == {"keras-adapt"}  # numpy came with TensorFlow
    import keras_adapt

    out = _run([user_env.bin / "keras-adapt", "--version"]).stdout
    assert out.strip() == f"keras-adapt {keras_adapt.__version__}"


def test_the_build_command_gives_a_working_horovod(user_env):
    proc = _run([user_env.bin / "keras-adapt", "build-horovod"], timeout=1800)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"keras-adapt build-horovod: built horovod 0.28.1 for TensorFlow "
                           f"{_tf_version()}"), proc.stdout[-3000:]
    assert "controllers gloo+mpi" in last and "one-process allreduce under gloo and mpi" in last
    check = _run([user_env.bin / "horovodrun", "--check-build"]).stdout
    for name in ("TensorFlow", "MPI", "Gloo"):
        assert f"[X] {name}" in check, check
    record = json.loads((user_env.dir / "share" / "keras-adapt" / "horovod-build.json").read_text())
    assert record["tensorflow"] == _tf_version() and record["controllers"] == ["gloo", "mpi"]
    again = _run([user_env.bin / "keras-adapt", "build-horovod"], timeout=300)
    assert "up to date" in again.stdout.strip().splitlines()[-1]


def test_a_feature_whose_extra_is_missing_names_the_extra(user_env, tmp_path):
    proc = _run([user_env.python, "-c", "from keras_adapt.callbacks import AdaptTensorBoard; "
                 f"AdaptTensorBoard({str(tmp_path)!r})"], check=False)
    assert proc.returncode == 1
    assert ("ImportError: AdaptTensorBoard needs tensorboard, which is not installed here; "
            "pip install 'keras-adapt[tensorboard]'") in proc.stderr, proc.stderr[-2000:]
    proc = _run([user_env.bin / "keras-adapt", "report", tmp_path, "-o", tmp_path / "r.png"],
                check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("keras-adapt report: keras-adapt report needs matplotlib, which "
                                   "is not installed here; pip install 'keras-adapt[report]'")


@pytest.fixture(scope="module")
def example_run(user_env, tmp_path_factory):
    python = user_env.chained("examples")
    _run([python, "-m", "pip", "install", "-q", f"{WHEEL}[examples]"])
    logdir = tmp_path_factory.mktemp("example")
    proc = _run([user_env.bin / "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", python,
                 os.path.join(ROOT, "examples", "adaptive_batch.py"), "--epochs", "2",
                 "--logdir", logdir], timeout=900)
    return python, logdir, proc


def test_the_examples_extra_runs_the_adaptive_batch_example_on_two_workers(example_run):
    python, logdir, proc = example_run
    assert {"scikit-learn", "tensorboard"} <= set(_installed(python))
    with open(logdir / "adapt_events.jsonl") as f:
        events = [json.loads(line) for line in f]
    printed = [line for line in proc.stdout.splitlines() if "[keras-adapt] step" in line]
    assert len(printed) == len(events) >= 2
    batches = [e["after"]["batch_size"] for e in events if e["kind"] == "batch_size"]
    assert batches == sorted(batches) and batches[-1] > 32
    assert "summary: 2 workers" in proc.stdout
    assert float(proc.stdout.split("test accuracy")[1].split()[0]) > 0.6


def test_the_report_extra_draws_the_examples_run(user_env, example_run, tmp_path):
    _, logdir, _ = example_run
    python = user_env.chained("report")
    assert "matplotlib" not in _installed(python)
    _run([python, "-m", "pip", "install", "-q", f"{WHEEL}[report]"])
    out = tmp_path / "report.png"
    proc = _run([python, "-m", "keras_adapt", "report", logdir, "-o", out])
    assert proc.stdout.startswith(f"keras-adapt report: wrote {out}")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_tensorboard_extra_brings_the_adapt_tab(user_env, tmp_path):
    python = user_env.chained("tensorboard")
    _run([python, "-m", "pip", "install", "-q", f"{WHEEL}[tensorboard]"])
    out = _run([python, "-c", """if True:
        import importlib.metadata
        from tensorboard.plugins import base_plugin
        from keras_adapt.callbacks import AdaptTensorBoard
        AdaptTensorBoard(%r)
        eps = [e for e in importlib.metadata.entry_points(group="tensorboard_plugins")
               if e.name == "adapt"]
        print(eps[0].load()().load(base_plugin.TBContext()).plugin_name)
    """ % str(tmp_path)]).stdout
    assert out.strip().splitlines()[-1] == "adapt"


def test_the_system_extra_samples_the_host(user_env):
    python = user_env.chained("system")
    _run([python, "-m", "pip", "install", "-q", f"{WHEEL}[system]"])
    assert "nvidia-ml-py" in _installed(python)
    out = _run([python, "-c", """if True:
        import json, psutil, pynvml
        from keras_adapt.monitors.system import SystemSampler
        sample = SystemSampler(gpus=True).sample()
        print(json.dumps({"memory": sample["memory_percent"],
                          "total_gb": psutil.virtual_memory().total / 1e9}))
    """]).stdout
    sample = json.loads(out.strip().splitlines()[-1])
    assert 0.0 < sample["memory"] < 100.0 and sample["total_gb"] > 0.5


def test_the_test_extra_runs_a_test_file_against_the_installed_wheel(user_env):
    python = user_env.chained("test")
    _run([python, "-m", "pip", "install", "-q", f"{WHEEL}[test]"])
    proc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300",
                 os.path.join(ROOT, "tests", "test_checks.py")], cwd=str(user_env.root))
    assert " passed" in proc.stdout and "failed" not in proc.stdout
