"""keras-adapt on Slurm: the allocation helper (``keras_adapt.slurm``,
``keras-adapt slurm-hosts``) and real batch jobs of examples/slurm/train.sbatch
on a Slurm cluster of two emulated hosts (tools/emulated_slurm.py: slurmctld
on the launcher, one slurmd per host namespace, munge), with Gloo and MPI.

The jobs run tests/workers/preemption_checks.py (Adam, keras-adapt's
statistics, PreemptionCheckpoint) for 3 epochs of 40 steps: an uninterrupted
job gives the reference weights; in another, the test sends SIGTERM to the
batch shell once training passed step 30 (``scancel --batch --signal=TERM``,
what ``--signal=B:TERM@60`` does at the time limit): the script forwards it,
every worker stops at the same step and checkpoints, the script requeues
the job, and the rerun resumes at that step and ends with the reference's
weights. Skips the jobs, saying why, without root, sshd or Slurm.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import BIN, JOB_MARK, WORKERS, _env, controllers, kill_job
from keras_adapt import slurm

pytestmark = pytest.mark.primary_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "slurm", "train.sbatch")
EPOCHS, SAMPLES, BATCH = 3, 640, 8  # 640 / (2 workers x 8) = 40 steps per epoch
TOTAL = EPOCHS * SAMPLES // (2 * BATCH)


# -- the allocation helper ----------------------------------------------------
HOSTLISTS = ["h[2-3]", "a1,b[01-03,7]", "rack[1-2]-n[1-2]", "n[8-10]", "n[098-101]",
             "gpu07", "n[1-2],n1"]


def test_hostlists_expand_as_hand_computed():
    assert slurm.expand_hostlist("h[2-3]") == ["h2", "h3"]
    assert slurm.expand_hostlist("a1,b[01-03,7]") == ["a1", "b01", "b02", "b03", "b7"]
    assert slurm.expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert slurm.expand_hostlist("n[098-101]") == ["n098", "n099", "n100", "n101"]
    assert slurm.expand_hostlist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1",
                                                         "rack2-n2"]
    assert slurm.expand_hostlist(" gpu07 ") == ["gpu07"]


def test_hostlists_expand_as_scontrol_does(tmp_path):
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (Debian slurm-client; make setup installs it)")
    # `scontrol show hostnames` expands locally; it only needs a configuration file.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlists\nSlurmctldHost=localhost\n")
    for text in HOSTLISTS:
        done = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                              text=True, timeout=30, env=dict(os.environ, SLURM_CONF=str(conf)))
        assert done.returncode == 0, done.stderr
        assert slurm.expand_hostlist(text) == done.stdout.split(), text


@pytest.mark.parametrize("text,fragment", [
    ("h[3-2]", "ends before it starts"), ("h[]", "empty"), ("h[1-2", "'[' without ']'"),
    ("h[a-b]", "is not N or N-M"), ("h[1[2]]", "nested"), ("", "is empty")])
def test_a_malformed_hostlist_names_the_variable_and_the_problem(text, fragment):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST=") as info:
        slurm.expand_hostlist(text)
    assert fragment in str(info.value)


def test_counts_and_the_allocation():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("1(x2)") == [1, 1]
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1",
           "SLURM_NTASKS_PER_NODE": "9", "SLURM_JOB_CPUS_PER_NODE": "9(x3)"}
    hosts = slurm.allocation_hosts(env)  # the tasks win over the other counts
    assert hosts == [("n1", 2), ("n2", 2), ("n3", 1)]
    assert (slurm.format_horovodrun(hosts), slurm.worker_count(hosts)) == ("n1:2,n2:2,n3:1", 5)
    assert slurm.format_hostfile(hosts) == "n1:2\nn2:2\nn3:1\n"
    assert slurm.allocation_hosts({"SLURM_NODELIST": "a[1-2]", "SLURM_JOB_CPUS_PER_NODE":
                                   "4(x2)"}) == [("a1", 4), ("a2", 4)]
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='2\(x3\)' gives 3 node\(s\) "
                                         r"but SLURM_JOB_NODELIST='n\[1-2\]' lists 2"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x3)"})
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='2x' is not a list"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2x"})
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE='0' gives a node no task"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "0"})
    with pytest.raises(slurm.NotInAllocation, match="SLURM_JOB_NODELIST is not set"):
        slurm.allocation_hosts({"SLURM_TASKS_PER_NODE": "1"})


def _cli(env_update, *args):
    """``keras-adapt slurm-hosts ARGS`` through the installed entry point
    (``python -m keras_adapt`` without it) with no SLURM_* but ``env_update``."""
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    env.update(env_update)
    entry = os.path.join(BIN, "keras-adapt")
    cmd = [entry] if os.path.exists(entry) else [sys.executable, "-m", "keras_adapt"]
    return subprocess.run([*cmd, "slurm-hosts", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_command_prints_the_allocation_and_exits_2_outside_one():
    env = {"SLURM_JOB_NODELIST": "h[2-3]", "SLURM_TASKS_PER_NODE": "2,1"}
    outputs = {fmt: _cli(env, "--format", fmt) for fmt in ("horovodrun", "np", "hostfile")}
    assert {fmt: (d.returncode, d.stdout) for fmt, d in outputs.items()} == {
        "horovodrun": (0, "h2:2,h3:1\n"), "np": (0, "3\n"), "hostfile": (0, "h2:2\nh3:1\n")}
    assert _cli(env).stdout == "h2:2,h3:1\n"  # the default format
    outside = _cli({})
    assert outside.returncode == 1 and outside.stdout == ""
    assert "SLURM_JOB_NODELIST is not set: run this inside a Slurm allocation" in outside.stderr
    bad = _cli({"SLURM_JOB_NODELIST": "h[2-", "SLURM_TASKS_PER_NODE": "1"})
    assert bad.returncode == 1 and "SLURM_JOB_NODELIST='h[2-' is not a Slurm hostlist" in bad.stderr
    assert _cli(env, "--format", "yaml").returncode == 2  # argparse names the choices


def test_the_command_imports_no_framework():
    # A batch script runs it before the job starts: no TensorFlow import.
    code = ("import os, sys\nfrom keras_adapt import cli\n"
            "os.environ.update(SLURM_JOB_NODELIST='n1', SLURM_TASKS_PER_NODE='1')\n"
            "assert cli.main(['slurm-hosts']) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'horovod')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]", done.stdout


# -- real jobs on emulated hosts ---------------------------------------------
@pytest.fixture(scope="module")
def cluster(emulated_hosts):
    """A Slurm cluster on the session's two emulated hosts."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import emulated_slurm
    finally:
        sys.path.pop(0)
    why = emulated_slurm.unavailable()
    if why:
        pytest.skip(f"Slurm unavailable: {why}")
    with emulated_slurm.slurm_cluster(emulated_hosts) as made:
        yield made


class _Job:
    """One batch job of train.sbatch running tests/workers/preemption_checks.py."""

    def __init__(self, cluster, directory, controller, sleep=0.0):
        self.cluster, self.dir = cluster, directory
        self.out, self.ck, self.log = directory / "out", directory / "ck", directory / "job.out"
        self.env = _env()
        self.mark = self.env[JOB_MARK] = f"slurm-{os.getpid()}-{time.monotonic_ns()}"
        self.env.update(KERAS_ADAPT_PYTHON=sys.executable, KERAS_ADAPT_CONTROLLER=controller,
                        KERAS_ADAPT_HOROVODRUN_ARGS="--network-interface kanet0")
        self.id = cluster.sbatch(
            ["--chdir", str(directory), "--output", str(self.log), SCRIPT, sys.executable,
             os.path.join(WORKERS, "preemption_checks.py"), "--dir", str(self.ck), "--out",
             str(self.out), "--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--batch",
             str(BATCH), "--sleep", str(sleep)], env=self.env)

    def progress(self):
        try:
            with open(self.out / "progress0") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def wait_done(self, timeout=300):
        fields = self.cluster.wait_for(
            self.id, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                 "NODE_FAIL", "OUT_OF_MEMORY"),
            timeout=timeout, what=f"the end of {self.log}")
        assert fields["JobState"] == "COMPLETED", self.output()
        return fields

    def output(self):
        return self.log.read_text() if self.log.exists() else "(no output)"

    def state(self, name, rank):
        with open(self.out / f"{name}{rank}.json") as f:
            return json.load(f)

    def finish(self):
        """Cancels the job if it still runs; returns how many of its processes were left."""
        self.cluster.client("scancel", str(self.id), check=False)
        return kill_job(self.mark)


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The final states of an uninterrupted Gloo job (both ranks)."""
    job = _Job(cluster, tmp_path_factory.mktemp("slurm_reference"), "gloo")
    try:
        fields = job.wait_done()
        return fields, job, [job.state("final", r) for r in (0, 1)]
    finally:
        job.leftover = job.finish()


def test_a_two_node_job_trains_and_the_ranks_end_equal(reference):
    fields, job, finals = reference
    assert fields["NodeList"] == "h[2-3]" and fields["Restarts"] == "0"
    assert fields["ExitCode"] == "0:0"
    assert job.leftover == 0
    assert "2 workers on h2:1,h3:1 (gloo)" in job.output()
    assert [f["iterations"] for f in finals] == [TOTAL, TOTAL]
    for a, b in zip(finals[0]["weights"], finals[1]["weights"]):
        np.testing.assert_array_equal(a, b)


def test_the_example_trainer_runs_on_two_nodes(cluster, tmp_path):
    env = dict(_env(), KERAS_ADAPT_PYTHON=sys.executable,
               KERAS_ADAPT_HOROVODRUN_ARGS="--network-interface kanet0")
    env[JOB_MARK] = mark = f"slurm-{os.getpid()}-{time.monotonic_ns()}"
    log = tmp_path / "job.out"
    job = cluster.sbatch(["--chdir", str(tmp_path), "--output", str(log), SCRIPT, sys.executable,
                          os.path.join(ROOT, "examples", "slurm", "train.py"), "--dir",
                          str(tmp_path / "ck"), "--epochs", "2", "--samples", "1024"], env=env)
    try:
        fields = cluster.wait_for(job, lambda f: f["JobState"] not in (
            "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"), timeout=300)
    finally:
        cluster.client("scancel", str(job), check=False)
        assert kill_job(mark) == 0
    text = log.read_text()
    assert fields["JobState"] == "COMPLETED", text
    assert "rank 0 of 2: starting at epoch 0 step 0" in text and "final loss" in text
    # 1024 samples, 2 workers x 32: 16 updates per epoch, a checkpoint at each epoch's end.
    assert sorted(os.path.basename(p) for p in (tmp_path / "ck").glob("ckpt-*.index")) == [
        "ckpt-16.index", "ckpt-32.index"]


@pytest.mark.parametrize("controller", controllers("primary"))
def test_a_signalled_job_checkpoints_is_requeued_and_resumes_at_the_exact_step(
        cluster, reference, tmp_path, controller):
    from keras_adapt.record.events import read_events

    job = _Job(cluster, tmp_path, controller, sleep=0.1)
    try:
        deadline = time.monotonic() + 180
        while job.progress() < 30:
            assert time.monotonic() < deadline, f"no step 30 in 180 s\n{job.output()}"
            assert cluster.job(job.id)["JobState"] in ("PENDING", "RUNNING"), job.output()
            time.sleep(0.2)
        # What --signal=B:TERM@60 does at the time limit: SIGTERM to the batch shell.
        cluster.client("scancel", "--batch", "--signal=TERM", str(job.id))
        fields = job.wait_done()
    finally:
        leftover = job.finish()
    text = job.output()
    assert fields["Restarts"] == "1", text
    assert leftover == 0
    # --open-mode=append: both runs in one file, the second one a restart.
    assert "restart 0: 2 workers on h2:1,h3:1" in text and "restart 1:" in text, text
    assert "SIGTERM: forwarding it to the workers on h2" in text
    assert f"requeueing job {job.id} after SIGTERM" in text
    stops = [job.state("stop", r) for r in (0, 1)]
    finals = [job.state("final", r) for r in (0, 1)]
    stopped = stops[0]["iterations"]
    assert 30 <= stopped < TOTAL and stops[1]["iterations"] == stopped  # the same step
    kinds = [(e["kind"], e["step"]) for e in read_events(str(job.out))
             if e["kind"] in ("preemption", "resume")]
    assert kinds == [("preemption", stopped), ("resume", stopped)]
    (preemption,) = [e for e in read_events(str(job.out)) if e["kind"] == "preemption"]
    assert preemption["after"]["signalled_ranks"] == [0]  # the batch node's worker
    assert preemption["after"]["exit_code"] == 75
    # Nothing committed was lost and nothing done twice: every update once.
    assert [f["iterations"] for f in finals] == [TOTAL, TOTAL]
    for got, want in zip(finals[0]["weights"], reference[2][0]["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    for a, b in zip(finals[0]["weights"], finals[1]["weights"]):
        np.testing.assert_array_equal(a, b)
    print(f"slurm {controller}: stopped at update {stopped} of {TOTAL}, requeued, resumed")
