"""The ``keras-adapt`` command through its real entry points (``python -m keras_adapt``
and the installed ``keras-adapt`` script): quiet start-up, ``--version``, and the
exit codes -- 0 done, 1 the work failed, 2 the command line is wrong -- with a
message that names the bad value and the fix and never a traceback for an
expected error.
"""

import os
import shutil
import subprocess
import sys

import pytest

from keras_adapt.record import events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "keras-adapt")
COMMANDS = "report, plan, discover, build-horovod or slurm-hosts"


def _env(shim=None):
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CPP_MIN_LOG_LEVEL" and not k.startswith(("SLURM_", "KERAS_ADAPT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [shim, ROOT, os.path.join(ROOT, "plugins"),
                                                      env.get("PYTHONPATH")]))
    return env


def _run(code_or_args, module=False):
    cmd = [sys.executable, "-m", "keras_adapt", *code_or_args] if module else \
        [sys.executable, "-c", code_or_args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)


def _cli(*args, script=False, shim=None, prefix=()):
    """``keras-adapt ARGS`` as a user runs it: the installed script or ``python -m``."""
    if script and not os.path.exists(SCRIPT):
        pytest.skip(f"{SCRIPT} is not installed (pip install -e . installs it)")
    cmd = [SCRIPT] if script else [sys.executable, "-m", "keras_adapt"]
    return subprocess.run([*prefix, *cmd, *map(str, args)], env=_env(shim), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Runs a, b and c with adapt data (one event each), without step times."""
    path = tmp_path_factory.mktemp("logs")
    for name in ("a", "b", "c"):
        events.emit("batch_size", 10, 0, "demo", f"grew in {name}", {"batch_size": 32},
                    {"batch_size": 64}, log_dir=str(path / name), rank=0)
    return path


def test_help_prints_usage_only():
    proc = _run(["--help"], module=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: keras-adapt")
    assert "report" in proc.stdout and "plan" in proc.stdout
    # TensorFlow's start-up lines ("oneDNN custom operations ...",
    # "cpu_feature_guard") would land on stderr.
    assert proc.stderr == ""


def test_importing_the_package_does_not_import_tensorflow():
    proc = _run("import sys, keras_adapt, keras_adapt.cli; "
                "print('tensorflow' in sys.modules, keras_adapt.__version__)")
    assert proc.returncode == 0, proc.stderr
    imported, version = proc.stdout.split()
    assert imported == "False" and version == __import__("keras_adapt").__version__


def test_public_names_resolve_lazily():
    import keras_adapt

    assert keras_adapt.DistributedOptimizer is keras_adapt.optimizer.DistributedOptimizer
    assert keras_adapt.callbacks.GradientStatsMonitor.__name__ == "GradientStatsMonitor"
    assert set(keras_adapt.__all__) <= set(dir(keras_adapt))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        keras_adapt.nonexistent  # noqa: B018


@pytest.mark.parametrize("script", [False, True], ids=["python -m", "script"])
def test_version_and_the_bare_command(script):
    version = _cli("--version", script=script)
    assert (version.returncode, version.stdout, version.stderr) == (
        0, f"keras-adapt {__import__('keras_adapt').__version__}\n", "")
    bare = _cli(script=script)
    assert (bare.returncode, bare.stdout) == (2, "")
    assert bare.stderr == ("usage: keras-adapt [-h] [--version] COMMAND ...\n"
                           f"keras-adapt: error: name a command: {COMMANDS} "
                           "(keras-adapt --help says what each does)\n")


@pytest.mark.parametrize("args, message", [
    (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
    (["report", "{logdir}", "--bogus"], "unrecognized arguments: --bogus"),
    (["plan", "{logdir}"], "the following arguments are required: --samples"),
    (["plan", "{logdir}", "--samples", "many"], "argument --samples: invalid float value: 'many'"),
    (["plan", "{logdir}", "--samples", "-1"], "--samples=-1.0 is not valid; pass a finite number > 0"),
    (["plan", "{logdir}", "--samples", "1e6", "--price-preemptible", "1"],
     "--price-preemptible needs --revocations-per-hour, --checkpoint-seconds and "
     "--restart-seconds"),
    (["plan", "{logdir}", "--samples", "1e6", "--run", "a", "--run", "b"],
     "--run a --run b: a plan is made from one run; pass one --run"),
    (["plan", "{tmp}/missing", "--samples", "1e6"],
     "LOGDIR='{tmp}/missing' is not a directory; pass the folder given to AdaptTensorBoard's "
     "log_dir"),
    (["report", "{tmp}/missing"], "LOGDIR='{tmp}/missing' is not a directory"),
    (["report", "{logdir}", "--max-points", "1"],
     "argument --max-points: '1' is not valid; pass an integer >= 2"),
    (["report", "{logdir}", "-o", "{tmp}/r.pdf"], "-o '{tmp}/r.pdf' is not valid; end it in .png "
     "or .html"),
    (["discover", "--hosts", "a:1", "--slots-per-pod", "2"],
     "the --kubernetes-* options and --slots-per-pod need --kubernetes-selector LABELS"),
    (["discover"], "give the hosts either as a file (--hosts-file F"),
    (["slurm-hosts", "--format", "yaml"], "argument --format: invalid choice: 'yaml'"),
])
def test_usage_errors_exit_2_naming_the_value_and_the_fix(logdir, tmp_path, args, message):
    args = [a.format(logdir=logdir, tmp=tmp_path) for a in args]
    proc = _cli(*args)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith("usage: keras-adapt")
    assert message.format(logdir=logdir, tmp=tmp_path) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("first, second", [("--hosts-file", "--hosts"),
                                           ("--hosts", "--kubernetes-selector"),
                                           ("--hosts-file", "--kubernetes-selector")])
def test_discover_sources_exclude_each_other_and_print_no_stale_answer(tmp_path, first, second):
    hosts, target = tmp_path / "hosts", tmp_path / "target"
    hosts.write_text("node-a:2\nnode-b:2\n")
    target.write_text("3\n")
    good = _cli("discover", "--hosts-file", hosts, "--target-file", target)
    assert (good.returncode, good.stdout, good.stderr) == (0, "node-a:2\nnode-b:1\n", "")
    value = {"--hosts-file": hosts, "--hosts": "node-c:1", "--kubernetes-selector": "app=x"}
    both = _cli("discover", first, value[first], second, value[second], "--target-file", target)
    # The last good answer above is cached; a usage error must not print it.
    assert (both.returncode, both.stdout) == (2, "")
    assert f"argument {second}: not allowed with argument {first}" in both.stderr, both.stderr


def test_discover_without_a_last_good_answer_exits_1_and_with_one_prints_it(tmp_path):
    hosts, target = tmp_path / "hosts", tmp_path / "target"
    hosts.write_text("node-a:2\n")
    target.write_text("many\n")
    bad = _cli("discover", "--hosts-file", hosts, "--target-file", target)
    assert (bad.returncode, bad.stdout) == (1, "")
    assert "'many' is not a worker count" in bad.stderr
    assert "keras-adapt discover: no last good answer to print" in bad.stderr
    target.write_text("1\n")
    assert _cli("discover", "--hosts-file", hosts, "--target-file", target).stdout == "node-a:1\n"
    target.write_text("many\n")
    again = _cli("discover", "--hosts-file", hosts, "--target-file", target)
    assert (again.returncode, again.stdout) == (0, "node-a:1\n")
    assert "printing the last good answer" in again.stderr


def test_slurm_hosts_outside_an_allocation_exits_1():
    proc = _cli("slurm-hosts", script=True)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("keras-adapt slurm-hosts: SLURM_JOB_NODELIST is not set")


def test_an_unknown_run_is_named_alike_in_report_and_plan(logdir, tmp_path):
    expected = f"no run 'typo' under '{logdir}'; runs with adapt data: a, b, c"
    report = _cli("report", logdir, "--run", "a", "--run", "typo", "-o", tmp_path / "r.png",
                  script=True)
    plan = _cli("plan", logdir, "--samples", "1e6", "--run", "typo")
    for command, proc in (("report", report), ("plan", plan)):
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert f"keras-adapt {command}: {expected}\n" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r.png").exists()
    # A run that exists but cannot give a plan is a runtime error too.
    timeless = _cli("plan", logdir, "--samples", "1e6", "--run", "b")
    assert (timeless.returncode, timeless.stdout) == (1, "")
    assert "keras-adapt plan: run 'b' recorded no step times" in timeless.stderr


def test_report_draws_exactly_the_repeated_runs(logdir, tmp_path):
    out = tmp_path / "two.html"
    proc = _cli("report", logdir, "--run", "a", "--run", "c", "-o", out, script=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"keras-adapt report: wrote {out}\n")
    page = out.read_text()
    assert "grew in a" in page and "grew in c" in page and "grew in b" not in page
    empty = _cli("report", tmp_path, "-o", tmp_path / "r.png")
    assert (empty.returncode, empty.stdout) == (1, "")
    assert f"keras-adapt report: no run under '{tmp_path}' has adapt data; train with " \
        "keras_adapt.callbacks.AdaptTensorBoard" in empty.stderr


def _without_root_powers():
    """The command's prefix that makes a root user obey file permissions (none otherwise)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("as root, a read-only folder needs setpriv (util-linux) to be read-only")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]


@pytest.mark.parametrize("where", ["missing folder", "a directory", "no permission"])
def test_an_unwritable_output_exits_1_before_any_log_is_read(tmp_path, where):
    # tmp_path holds no adapt data: had the logs been read first, the error
    # would be "no run ... has adapt data".
    kwargs = {}
    if where == "missing folder":
        output, message = tmp_path / "nowhere" / "r.png", (
            f"cannot write '{tmp_path}/nowhere/r.png': the folder '{tmp_path}/nowhere' does not "
            "exist; create it or pass another path")
    elif where == "a directory":
        (tmp_path / "out.png").mkdir()
        output, message = tmp_path / "out.png", (
            f"cannot write '{tmp_path}/out.png': it is a directory; pass a file name in it, e.g. "
            f"{tmp_path}/out.png/report.png")
    else:
        kwargs = {"prefix": _without_root_powers()}
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0o555)
        output, message = locked / "r.png", (
            f"cannot write '{locked}/r.png': Permission denied; pass a path you may write")
    proc = _cli("report", tmp_path, "-o", output, **kwargs)
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr.startswith(f"keras-adapt report: {message}"), proc.stderr
    assert os.path.isdir(output) == (where == "a directory")


def _shim(tmp_path, package, body):
    """A folder for PYTHONPATH whose ``package`` replaces the installed one."""
    (tmp_path / "shim" / package).mkdir(parents=True)
    (tmp_path / "shim" / package / "__init__.py").write_text(body)
    return str(tmp_path / "shim")


def test_a_missing_optional_dependency_prints_the_install_hint(logdir, tmp_path):
    gone = 'raise ModuleNotFoundError("No module named {0!r}", name={0!r})\n'
    mpl = _cli("report", logdir, "-o", tmp_path / "r.png",
               shim=_shim(tmp_path / "m", "matplotlib", gone.format("matplotlib")))
    assert (mpl.returncode, mpl.stdout, mpl.stderr) == (
        1, "", "keras-adapt report: keras-adapt report needs matplotlib, which is not installed "
        "here; pip install 'keras-adapt[report]'\n")
    tb = _cli("plan", logdir, "--samples", "1e6",
              shim=_shim(tmp_path / "t", "tensorboard", gone.format("tensorboard")))
    assert (tb.returncode, tb.stdout) == (1, "")
    assert tb.stderr.endswith("keras-adapt plan: reading TensorBoard logs (keras-adapt report, "
                              "plan) needs tensorboard, which is not installed here; pip install "
                              "'keras-adapt[report]'\n"), tb.stderr


def test_an_unexpected_error_keeps_its_traceback(logdir, tmp_path):
    broken = _cli("report", logdir, "-o", tmp_path / "r.png",
                  shim=_shim(tmp_path, "matplotlib", "raise RuntimeError('broken install')\n"))
    assert (broken.returncode, broken.stdout) == (1, "")
    assert "Traceback (most recent call last)" in broken.stderr
    assert broken.stderr.endswith("RuntimeError: broken install\n")
