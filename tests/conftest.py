"""Shared test helpers: running real multi-process Horovod jobs."""

import atexit
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
BIN = os.path.dirname(sys.executable)

#: The launcher the suite's jobs run: ``horovodrun``, with its build checks
#: (a TensorFlow import each) asked once per session; see
#: tests/horovodrun_checked_once.py. tests/test_examples.py runs the
#: ``horovodrun`` script itself, as a user would.
HOROVODRUN = [sys.executable, os.path.join(HERE, "horovodrun_checked_once.py")]
#: This session's answers to the launcher's build checks.
_LAUNCHER_ANSWERS = os.path.join(tempfile.mkdtemp(prefix="keras-adapt-tests-"), "built.json")
atexit.register(shutil.rmtree, os.path.dirname(_LAUNCHER_ANSWERS), True)


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # OpenMPI refuses to start as root unless told that is intended.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # Gloo's rendezvous waits 30 s by default for every worker; a worker that
    # joins an elastic job must first start Python and TensorFlow, which takes
    # longer than that on a loaded 2-core machine (seen: the job then fails).
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
    # A worker that dies of a signal (SIGABRT from an uncaught C++
    # exception, SIGSEGV) prints the Python stack of every thread first;
    # worker_failures() finds it in the job's output.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    # OpenMPI's workers poll while they wait, unless told to yield: with
    # more processes than the two cores (both lanes run jobs at once) the
    # polling ones take CPU from the ones that compute. Measured on the MPI
    # preemption jobs beside two busy loops: 113 and 110 s wall (123 s CPU)
    # polling, 83 and 97 s (88 and 96 s CPU) yielding.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("KERAS_ADAPT_TEST_HOROVOD_BUILT", _LAUNCHER_ANSWERS)
    # The benchmarks' launcher (benchmarks/_workers.py).
    env.setdefault("KERAS_ADAPT_HOROVODRUN", shlex.join(HOROVODRUN))
    if os.environ.get("KERAS_ADAPT_TEST_INSTALLED") != "1":
        # Workers import this checkout (tools/check_install.sh tests the
        # installed wheel instead and sets KERAS_ADAPT_TEST_INSTALLED=1).
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                          env.get("PYTHONPATH")]))
    return env


#: A checkout of Horovod 0.28.1's source: the tests that run Horovod's own
#: files (its Keras test file, its elastic Keras example) read them there;
#: the PyPI sdist that make setup builds from has neither, and nothing is
#: fetched by the tests.
HOROVOD_SOURCE_ENV = "KERAS_ADAPT_HOROVOD_SOURCE"


def horovod_source_file(relative, what):
    """The path of ``relative`` in the Horovod source named by
    :data:`HOROVOD_SOURCE_ENV`; skips the test, saying why, without it."""
    source = os.environ.get(HOROVOD_SOURCE_ENV)
    if not source:
        pytest.skip(f"{what} is not in Horovod's PyPI sdist; set {HOROVOD_SOURCE_ENV} to a "
                    f"checkout of Horovod 0.28.1's source (it must hold {relative})")
    path = os.path.join(source, relative)
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist; {HOROVOD_SOURCE_ENV} must point at Horovod "
                    "0.28.1's source")
    return path


#: ``KERAS_ADAPT_TEST_MPI=all`` runs every 2-worker job under MPI too (see
#: :func:`controllers`): for a change to how jobs are launched or negotiated.
TEST_MPI_ENV = "KERAS_ADAPT_TEST_MPI"


def controllers(mpi="opt_in"):
    """Horovod controllers to run a 2-worker job under: Gloo always, and MPI
    (when Horovod has it and mpirun exists) where ``mpi`` says:

    - ``"every_stack"``: on both stacks (the basic distributed checks:
      start-up, every collective, training);
    - ``"primary"``: on the primary stack (jobs whose launch differs under
      mpirun: signals forwarded by it, workers started over ssh);
    - ``"legacy"``: on the legacy stack (the basic checks on localhost,
      which the primary stack runs under MPI on the emulated hosts);
    - ``"opt_in"`` (the rest): only with ``KERAS_ADAPT_TEST_MPI=all``.

    The controller only negotiates which tensors are ready; every other
    distributed feature runs the same code of ours under both, so ``make
    test`` keeps its time for what differs."""
    from keras_adapt import _keras

    if mpi not in ("every_stack", "primary", "legacy", "opt_in"):
        raise ValueError(f"mpi={mpi!r}; use 'every_stack', 'primary', 'legacy' or 'opt_in'")
    wanted = (mpi == "every_stack" or (mpi == "primary" and _keras.IS_KERAS3)
              or (mpi == "legacy" and not _keras.IS_KERAS3)
              or os.environ.get(TEST_MPI_ENV) == "all")
    out = ["gloo"]
    if not wanted:
        return out
    try:
        import horovod.tensorflow as hvd

        if hvd.mpi_built() and shutil.which("mpirun"):
            out.append("mpi")
    except ImportError:
        pass
    return out


def horovodrun(script, script_args=(), np=2, controller="gloo", timeout=600, hosts=None,
               check=True):
    """Runs ``horovodrun -np N -H localhost:N --<controller> python script ...``.

    With ``hosts`` (the ``emulated_hosts`` fixture) the job runs one worker
    on each emulated host instead, started over ssh. Returns the completed
    process; fails the test with the job's output if the job times out, or
    exits non-zero unless ``check`` is False. Every process of the job is
    killed on timeout and when it ends (see :func:`_run_job`).
    """
    if not os.path.exists(os.path.join(BIN, "horovodrun")):
        pytest.skip("horovodrun is not installed in this environment")
    if hosts is None:
        cmd = [*HOROVODRUN, "-np", str(np), "-H", f"localhost:{np}", f"--{controller}"]
    else:
        assert np == len(hosts.names), (np, hosts.names)
        cmd = [*HOROVODRUN, *hosts.horovodrun_args(), f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe"]
    cmd += [sys.executable, os.path.join(WORKERS, script), *map(str, script_args)]
    return _run_job(cmd, timeout, check=check)


def _run_job(cmd, timeout, extra_env=None, check=True):
    """Runs the launcher ``cmd``; on timeout, and when it ends, every process
    of the job is killed (found by an environment mark: Horovod starts
    workers in sessions of their own). Returns the completed process with
    stdout and stderr, and ``leftover``: how many of the job's processes were
    still alive after it ended. Fails the test with the job's output if it
    times out, or exits non-zero unless ``check`` is False."""
    env = _env()
    env.update(extra_env or {})
    # Every process of the job inherits this mark: cleanup finds them all.
    env[JOB_MARK] = f"{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(env[JOB_MARK])
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n"
                    f"{worker_failures(stdout, stderr)}\n{stdout[-8000:]}\n{stderr[-8000:]}")
    finally:
        leftover = kill_job(env[JOB_MARK])  # workers that outlived the job
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    done.leftover, done.checked = leftover, check
    _JOBS.append(done)
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\n{worker_failures(stdout, stderr)}"
            f"\n--- stdout\n{stdout[-8000:]}\n--- stderr\n{stderr[-8000:]}"
        )
    return done


#: The launcher jobs (completed processes) run by the test running now: when
#: it fails, its report shows why any of their workers died.
_JOBS = []

#: A line a launcher forwards from a worker: ``[rank]<stderr>:text`` (Gloo),
#: ``[job,rank]<stderr>:text`` (mpirun's tagged output).
_FORWARDED = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:(.*)")
#: Lines that start the account of a worker's death on its stderr.
_FATAL = ("Fatal Python error", "terminate called", "Traceback (most recent call last)",
          "Segmentation fault", "Aborted", "Check failed")


def worker_failures(stdout, stderr, lines=80):
    """What a launcher's output says about workers that died: the
    launcher's ``Process N exit with status code C`` lines, then for each
    rank whose stderr holds a fatal error (a Python traceback, an uncaught
    C++ exception, the stack faulthandler prints on SIGABRT or SIGSEGV)
    its stderr from the first such line on (at most ``lines`` lines).
    Empty when the output shows none."""
    exits = [line for line in stdout.splitlines() if "exit with status code" in line]
    by_rank = {}
    for line in stderr.splitlines():
        match = _FORWARDED.search(line)
        if match and match.group(2) == "stderr":
            by_rank.setdefault(int(match.group(1)), []).append(match.group(3))
    parts = ["--- worker exits: " + "; ".join(exits)] if exits else []
    for rank, text in sorted(by_rank.items()):
        first = next((i for i, line in enumerate(text) if line.lstrip().startswith(_FATAL)),
                     None)
        if first is not None:
            parts.append(f"--- rank {rank} stderr from its first fatal line\n"
                         + "\n".join(text[first:first + lines]))
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test starts with no recorded jobs (a module fixture's jobs are
    recorded with the first test that uses it)."""
    _JOBS.clear()
    yield
    _JOBS.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report gets a section per job it ran whose output
    shows dead workers but that did not fail the test itself (an elastic
    job goes on without them, or the test expected the job to stop): their
    exits, stacks and the end of the job's stderr."""
    report = (yield).get_result()
    if not report.failed:
        return
    for i, job in enumerate(_JOBS):
        failures = worker_failures(job.stdout, job.stderr)
        if failures and not (job.checked and job.returncode != 0):
            report.sections.append((f"horovodrun job {i} ({report.when}): dead workers",
                                    f"{' '.join(map(str, job.args))}\n{failures}"
                                    f"\n--- stderr tail\n{job.stderr[-4000:]}"))


def _emulated_hosts_tool():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
    try:
        import emulated_hosts as tool
    finally:
        sys.path.pop(0)
    return tool


@pytest.fixture(scope="session")
def emulated_hosts3():
    """Three emulated hosts h2, h3, h4 (network namespaces with their own
    sshd, see tools/emulated_hosts.py) for the session; skips, saying why,
    where they cannot be made (not root, no sshd, no network namespaces).
    One set for the whole session (the tool's lock allows one at a time):
    :func:`emulated_hosts` is its first two."""
    tool = _emulated_hosts_tool()
    why = tool.unavailable()
    if why:
        pytest.skip(f"emulated hosts unavailable: {why}")
    with tool.emulated_hosts(3) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def emulated_hosts(emulated_hosts3):
    """Two emulated hosts, h2 and h3 (the first two of :func:`emulated_hosts3`)."""
    return _emulated_hosts_tool().EmulatedHosts(2)


def load_rank_results(out_dir, np):
    results = []
    for r in range(np):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results


def discovery_script(directory, hosts):
    """A host discovery script for ``horovodrun --host-discovery-script``: it
    prints the file ``<directory>/hosts``, which starts as ``hosts`` (one
    ``host:slots`` per line) and which a test (or a worker) rewrites to add or
    remove workers. Returns ``(script_path, hosts_path)``."""
    hosts_path = os.path.join(str(directory), "hosts")
    with open(hosts_path, "w") as f:
        f.write(hosts)
    script = os.path.join(str(directory), "discover.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\nexec cat '{hosts_path}'\n")
    os.chmod(script, 0o755)
    return script, hosts_path


def horovodrun_elastic(script, script_args, discovery, np=2, min_np=1, max_np=2, timeout=300,
                       extra_env=None, hosts=None, launcher_args=(), check=True):
    """Runs an elastic job of ``script`` (a file in tests/workers, or a path):
    ``horovodrun -np N --min-np .. --max-np ..
    --host-discovery-script S --network-interface lo --gloo python script ...``.

    With ``hosts`` (the ``emulated_hosts`` fixture) the workers are started
    over ssh on the emulated hosts the discovery script lists (their
    interface and ssh key instead of ``lo``). ``launcher_args`` are more
    ``horovodrun`` flags (e.g. ``--blacklist-cooldown-range 1 2``).

    The launcher and every worker it started are killed on timeout (and
    any left when it ends), so no worker outlives the test. Returns the
    completed process, with ``leftover``: how many of the job's processes
    were still alive after it ended (and were killed). Fails the test with
    the job's output if it times out, or exits non-zero unless ``check`` is
    False (a job meant to stop).
    """
    if not os.path.exists(os.path.join(BIN, "horovodrun")):
        pytest.skip("horovodrun is not installed in this environment")
    network = ["--network-interface", "lo"] if hosts is None else hosts.launcher_args()
    cmd = [*HOROVODRUN, "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
           "--host-discovery-script", discovery, *network, *map(str, launcher_args), "--gloo",
           sys.executable, os.path.join(WORKERS, script), *map(str, script_args)]
    return _run_job(cmd, timeout, extra_env, check)


@pytest.fixture(scope="session")
def elastic_reference(tmp_path_factory):
    """``reference(epochs, steps, lr, rule="keep", workers="0:1")``: the
    final weights of tests/workers/elastic_train.py's one-process run
    (``--reference``: the same global batches without elastic machinery;
    with ``rule="scale"`` the global batch and the rate of the worker count
    ``workers`` gives each update, ``"update:workers,..."``), computed once
    per session for each setting and shared by every elastic test file."""
    done = {}

    def reference(epochs, steps, lr, rule="keep", workers="0:1"):
        key = (epochs, steps, lr, rule, workers)
        if key not in done:
            out = tmp_path_factory.mktemp("elastic_reference")
            subprocess.run([sys.executable, os.path.join(WORKERS, "elastic_train.py"),
                            "--out", str(out), "--reference", "--epochs", str(epochs),
                            "--steps", str(steps), "--lr", str(lr), "--rule", rule,
                            "--reference-workers", workers],
                           env=_env(), check=True, capture_output=True, timeout=300)
            with open(out / "reference.json") as f:
                done[key] = json.load(f)
        return done[key]

    return reference


#: Environment variable marking the processes of one test job.
JOB_MARK = "KERAS_ADAPT_TEST_JOB"


def job_processes(mark):
    """The live processes whose environment carries ``JOB_MARK=mark``."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(JOB_MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def kill_job(mark):
    """SIGKILLs every process of the job marked ``mark``; returns how many were left."""
    import psutil

    family = job_processes(mark)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)
    return len(family)
