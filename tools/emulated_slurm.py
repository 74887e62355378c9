"""A Slurm cluster on the emulated hosts: the controller on the launcher, one slurmd per host.

Built on tools/emulated_hosts.py: each emulated host (network namespace
``ka-hN``, hostname ``hN``, address ``10.213.0.N``) runs its own ``slurmd -N
hN`` in its namespaces, with its own spool directory, log and pid file;
``slurmctld`` runs in the root namespace (the launcher) and is reached by the
nodes on the bridge address ``10.213.0.1``. ``munged`` authenticates them all
with a throwaway key; its socket is a file, so every namespace reaches it.
A batch job then runs its script in the first allocated host's namespace,
where ``horovodrun`` starts the workers on the other hosts over ssh (or
``mpirun`` through ``srun``), exactly as on a cluster.

Everything (``slurm.conf``, the munge key and socket, the controller's state,
the nodes' spools and logs) lives in one scratch directory that ``down``
removes after stopping every daemon it started, and the jobs' processes with
them. Nothing is written under /etc and no service is started.

Command line (as root; ``up`` makes the emulated hosts too)::

    python tools/emulated_slurm.py up --hosts 2      # prints the SLURM_CONF line
    export SLURM_CONF=/tmp/keras-adapt-slurm/slurm.conf
    sbatch examples/slurm/train.sbatch
    python tools/emulated_slurm.py down

From Python (the tests)::

    with emulated_slurm(2) as cluster:
        job = cluster.sbatch(["--chdir", str(tmp), "examples/slurm/train.sbatch"])
        cluster.wait_for(job, lambda state: state["JobState"] == "COMPLETED")
"""

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulated_hosts  # noqa: E402  (beside this file)

SCRATCH = "/tmp/keras-adapt-slurm"
CONF = os.path.join(SCRATCH, "slurm.conf")
MUNGE_SOCKET = os.path.join(SCRATCH, "munge", "munge.socket")
#: The controller's address: the bridge's, in the root namespace.
CONTROLLER_ADDRESS = f"{emulated_hosts.SUBNET}.1"
PARTITION = "emulated"
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd"}
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun")


def unavailable():
    """Why a Slurm cluster cannot be made here, or None when it can."""
    why = emulated_hosts.unavailable()
    if why:
        return why
    for name, path in DAEMONS.items():
        if not os.access(path, os.X_OK):
            return (f"{path} is not installed (Debian slurmctld, slurmd, slurm-client and "
                    "munge; `make setup` installs them as root)")
    for tool in CLIENTS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian slurm-client)"
    return None


def slurm_conf(names, addresses, cpus, controller):
    """The text of ``slurm.conf`` for nodes ``names`` at ``addresses`` with
    ``cpus`` CPUs each, the controller named ``controller`` (the launcher's
    host name) at :data:`CONTROLLER_ADDRESS`."""
    nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN\n"
                    for n, a in zip(names, addresses))
    return f"""\
# Written by tools/emulated_slurm.py; removed by its `down`.
ClusterName=kaemulated
SlurmctldHost={controller}({CONTROLLER_ADDRESS})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again
# (default 120 s)
AuthInfo=socket={MUNGE_SOCKET},cred_expire=10
# no cgroups: processes are tracked by their parents, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# a requeued job becomes eligible by time, which only a periodic pass sees
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
JobRequeue=1
ReturnToService=2
# finished jobs stay visible to `scontrol show job` for 10 minutes (no slurmdbd)
MinJobAge=600
KillWait=30
InactiveLimit=0
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={SCRATCH}/state
SlurmctldPidFile={SCRATCH}/slurmctld.pid
SlurmctldLogFile={SCRATCH}/slurmctld.log
SlurmdSpoolDir={SCRATCH}/%n/spool
SlurmdPidFile={SCRATCH}/%n/slurmd.pid
SlurmdLogFile={SCRATCH}/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
{nodes}PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP
"""


def _run(*cmd, check=True, env=None, timeout=60):
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


def parse_show(text):
    """``scontrol show ... -o`` output (``Key=Value`` pairs on one line) as a dict."""
    pairs = re.findall(r"(\w+(?::\w+)?)=(\S*)", text)
    return dict(pairs)


class EmulatedSlurm:
    """The cluster made by :func:`emulated_slurm`: its hosts, configuration
    and the client commands, run with ``SLURM_CONF`` pointing at it."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.conf = CONF
        self.env = dict(os.environ, SLURM_CONF=CONF)

    def client(self, *args, check=True, env=None, timeout=60):
        """Runs a Slurm client command (``sbatch``, ``scontrol``, ...) against this cluster."""
        merged = dict(self.env, **(env or {}))
        merged["SLURM_CONF"] = CONF
        return _run(*args, check=check, env=merged, timeout=timeout)

    def sbatch(self, args, env=None):
        """Submits a batch job (``sbatch --parsable ARGS``); returns its id."""
        out = self.client("sbatch", "--parsable", *args, env=env).stdout.strip()
        return int(out.split(";")[0])

    def job(self, job_id):
        """The job's fields from ``scontrol show job -o`` (``JobState``, ``Restarts``, ...)."""
        return parse_show(self.client("scontrol", "show", "job", "-o", str(job_id)).stdout)

    def wait_for(self, job_id, predicate, timeout=300, what="the job"):
        """Polls :meth:`job` every 0.5 s until ``predicate(fields)``; returns the fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if predicate(fields):
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} (job {job_id}) not reached in {timeout} s; "
                                   f"last state {fields.get('JobState')}: {fields}")
            time.sleep(0.5)

    def node_states(self):
        """``{node: state}`` from ``sinfo`` (e.g. ``idle``, ``alloc``, ``down*``)."""
        out = self.client("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def up(self, timeout=60):
        _stop_daemons()
        shutil.rmtree(SCRATCH, ignore_errors=True)
        os.makedirs(os.path.join(SCRATCH, "munge"), mode=0o700)
        os.makedirs(os.path.join(SCRATCH, "state"), mode=0o700)
        for name in self.hosts.names:
            os.makedirs(os.path.join(SCRATCH, name, "spool"), mode=0o700)
        key = os.path.join(SCRATCH, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        _run(DAEMONS["munged"], "--force", f"--socket={MUNGE_SOCKET}", f"--key-file={key}",
             f"--pid-file={SCRATCH}/munge/munged.pid", f"--log-file={SCRATCH}/munge/munged.log",
             f"--seed-file={SCRATCH}/munge/munged.seed")
        controller = socket.gethostname().split(".")[0]
        with open(CONF, "w") as f:
            f.write(slurm_conf(self.hosts.names, self.hosts.addresses, os.cpu_count() or 1,
                               controller))
        with open(os.path.join(SCRATCH, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        _run(DAEMONS["slurmctld"], "-f", CONF, env=self.env)
        for name in self.hosts.names:
            # `ip netns exec` mounts a fresh /sys for the namespace, without
            # the cgroup hierarchies slurmd checks for at start-up (it uses
            # none of them here: see slurm.conf); mount two again there.
            slurmd = (f"hostname {name} && mount -t tmpfs cgroups /sys/fs/cgroup && "
                      "for c in freezer cpuset; do mkdir /sys/fs/cgroup/$c && "
                      "mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || exit 1; done && "
                      f"exec {DAEMONS['slurmd']} -f {CONF} -N {name}")
            _run("ip", "netns", "exec", emulated_hosts.PREFIX + name, "unshare", "--uts",
                 "sh", "-c", slurmd, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                states = self.node_states()
                if all(states.get(n) == "idle" for n in self.hosts.names):
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm nodes are not idle after {timeout} s: "
                                   f"{_read_tail(os.path.join(SCRATCH, 'slurmctld.log'))}")
            time.sleep(0.5)


def _read_tail(path, chars=3000):
    with contextlib.suppress(OSError):
        with open(path) as f:
            return f.read()[-chars:]
    return f"({path} missing)"


def _cancel_jobs():
    """Cancels every job the controller still knows (Slurm stops their
    processes), then SIGKILLs the job step daemons (``slurmstepd``, which
    outlive their slurmd) left in the namespaces of the hosts that ran a
    slurmd."""
    if not os.path.exists(CONF):
        return
    env = dict(os.environ, SLURM_CONF=CONF)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = _run("squeue", "-h", "-o", "%i", check=False, env=env, timeout=10).stdout.split()
        if listed:
            _run("scancel", *listed, check=False, env=env, timeout=10)
            time.sleep(1)
    for entry in sorted(os.listdir(SCRATCH)):
        if not os.path.isfile(os.path.join(SCRATCH, entry, "slurmd.pid")):
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            pids = _run("ip", "netns", "pids", emulated_hosts.PREFIX + entry, check=False,
                        timeout=10).stdout.split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "slurmstepd":
                        os.kill(int(pid), signal.SIGKILL)


def _stop_daemons():
    """Cancels the jobs, then SIGTERMs, then SIGKILLs, the daemons whose pid
    files are in the scratch directory."""
    pid_files = []
    if os.path.isdir(SCRATCH):
        _cancel_jobs()
        for entry in sorted(os.listdir(SCRATCH)):
            if os.path.isfile(os.path.join(SCRATCH, entry, "slurmd.pid")):
                pid_files.append(os.path.join(SCRATCH, entry, "slurmd.pid"))
        pid_files += [os.path.join(SCRATCH, "slurmctld.pid"),
                      os.path.join(SCRATCH, "munge", "munged.pid")]
    pids = []
    for path in pid_files:
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    return False


def down():
    """Stops the daemons and removes the scratch directory (not the hosts)."""
    _stop_daemons()
    shutil.rmtree(SCRATCH, ignore_errors=True)


@contextlib.contextmanager
def slurm_cluster(hosts):
    """A Slurm cluster on ``hosts`` (an up :class:`emulated_hosts.EmulatedHosts`,
    e.g. the tests' ``emulated_hosts`` fixture) for the duration of the
    ``with`` block; the daemons and every file of it go after."""
    try:
        yield EmulatedSlurm(hosts).up()
    finally:
        down()


@contextlib.contextmanager
def emulated_slurm(count=2):
    """``count`` emulated hosts (tools/emulated_hosts.py, under its lock)
    running a Slurm cluster for the duration of the ``with`` block; the
    daemons, the jobs' processes on the hosts and every file go after."""
    with emulated_hosts.emulated_hosts(count) as hosts, slurm_cluster(hosts) as cluster:
        yield cluster


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the hosts and the cluster; print SLURM_CONF=...")
    up.add_argument("--hosts", type=int, default=2)
    sub.add_parser("down", help="stop the cluster and remove the hosts")
    args = parser.parse_args(argv)
    if args.command == "down":
        down()
        emulated_hosts.down()
        return 0
    why = unavailable()
    if why:
        print(f"emulated_slurm: {why}", file=sys.stderr)
        return 1
    hosts = emulated_hosts.EmulatedHosts(args.hosts).up()
    EmulatedSlurm(hosts).up()
    print(f"SLURM_CONF={CONF}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
