"""Emulated hosts on one machine: network namespaces joined by a bridge, one sshd each.

``horovodrun -H h2:1,h3:1`` then starts its workers over ssh exactly as on a
cluster: each worker runs in its own network namespace (own address, own
interface, own hostname), reached from the launcher over a veth link.

Layout (all private, nothing leaves the machine)::

    root namespace: bridge  kanet0  10.213.0.1/24   (the launcher, horovodrun)
    namespace ka-h2: veth   kanet0  10.213.0.2/24   hostname h2, sshd on :22
    namespace ka-h3: veth   kanet0  10.213.0.3/24   hostname h3, sshd on :22

Every interface is called ``kanet0`` because Horovod looks the name given to
``--network-interface`` up on the launcher too. The sshds run in their own UTS
namespace with their own hostname, mapped to the address in ``/etc/hosts`` (a
shared hostname makes Gloo advertise 127.0.0.1 and the job dies). They accept
one throwaway key, written with the host keys and pid files into a scratch
directory, and only root (the tests run as root). Lines marked as ours in
``~/.ssh/config`` make every ssh to those names (horovodrun's, mpirun's) use
the key and trust the throwaway host key without recording it. ``down``
removes the namespaces, the bridge, the marked lines and the scratch
directory.

Command line (as root)::

    python tools/emulated_hosts.py up --hosts 2      # prints the horovodrun flags
    horovodrun -np 2 -H h2:1,h3:1 --gloo --network-interface kanet0 \\
        --ssh-identity-file /tmp/keras-adapt-hosts/id_ed25519 python train.py
    python tools/emulated_hosts.py down

From Python (the tests)::

    with emulated_hosts(2) as hosts:
        subprocess.run(["horovodrun", *hosts.horovodrun_args(), "python", "train.py"])
"""

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time

BRIDGE = "kanet0"
SUBNET = "10.213.0"
PREFIX = "ka-"
#: The name of a host's veth end between its creation and its move into the host.
VETH_TMP = "kaveth-tmp"
SCRATCH = "/tmp/keras-adapt-hosts"
LOCK = "/tmp/keras-adapt-hosts.lock"
HOSTS_MARK = "# keras-adapt emulated host"
SSHD = "/usr/sbin/sshd"
SSH_CONFIG = os.path.expanduser("~/.ssh/config")


def unavailable():
    """Why emulated hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, a bridge, sshd)"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (Debian openssh-server; `make setup` installs it as root)"
    probe = PREFIX + "probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*cmd, check=True):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class EmulatedHosts:
    """The hosts made by :func:`emulated_hosts`: names, addresses, ssh key."""

    def __init__(self, count):
        if not 1 <= count <= 50:
            raise ValueError(f"count={count} hosts; use 1 to 50")
        self.names = [f"h{i + 2}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 2}" for i in range(count)]
        self.key = os.path.join(SCRATCH, "id_ed25519")

    def horovodrun_args(self, slots=1):
        """``-np``, ``-H``, ``--network-interface`` and ``--ssh-identity-file``
        for a job with ``slots`` workers on every host."""
        return ["-np", str(slots * len(self.names)),
                "-H", ",".join(f"{n}:{slots}" for n in self.names), *self.launcher_args()]

    def launcher_args(self):
        """``--network-interface`` and ``--ssh-identity-file`` alone: for an
        elastic job, whose hosts come from a discovery script instead of ``-H``."""
        return ["--network-interface", BRIDGE, "--ssh-identity-file", self.key]

    def ssh(self, index, command, timeout=30):
        """Runs ``command`` (a string) on host ``index`` over ssh; returns the CompletedProcess."""
        return subprocess.run(
            ["ssh", "-i", self.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             self.names[index], command], capture_output=True, text=True, timeout=timeout)

    def up(self):
        down()  # leftovers of an interrupted run
        os.makedirs(SCRATCH, mode=0o700)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        shutil.copy(self.key + ".pub", os.path.join(SCRATCH, "authorized_keys"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(SCRATCH, "host_key"))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for name, address in zip(self.names, self.addresses):
            ns, outer = PREFIX + name, f"{PREFIX}{name}-br"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", VETH_TMP)
            _run("ip", "link", "set", VETH_TMP, "netns", ns)
            _run("ip", "link", "set", outer, "master", BRIDGE)
            _run("ip", "link", "set", outer, "up")
            _run("ip", "-n", ns, "link", "set", VETH_TMP, "name", BRIDGE)
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", BRIDGE)
            _run("ip", "-n", ns, "link", "set", BRIDGE, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            pid_file = os.path.join(SCRATCH, f"sshd-{name}.pid")
            sshd = (f"hostname {name} && exec {SSHD} -o ListenAddress={address} "
                    f"-o PidFile={pid_file} -h {os.path.join(SCRATCH, 'host_key')} "
                    f"-o AuthorizedKeysFile={os.path.join(SCRATCH, 'authorized_keys')} "
                    "-o PermitRootLogin=prohibit-password -o PasswordAuthentication=no "
                    "-o StrictModes=no -o UsePAM=no -o AcceptEnv=* -o MaxStartups=100 "
                    "-o MaxSessions=100")
            _run("ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", sshd)
        with open("/etc/hosts", "a") as f:
            for name, address in zip(self.names, self.addresses):
                f.write(f"{address} {name} {HOSTS_MARK}\n")
        # Every ssh to these hosts (horovodrun's, mpirun's) uses the key and
        # trusts the throwaway host key without recording it.
        os.makedirs(os.path.dirname(SSH_CONFIG), mode=0o700, exist_ok=True)
        with open(SSH_CONFIG, "a") as f:
            f.write(f"Host {' '.join(self.names)} {HOSTS_MARK}\n"
                    f"    IdentityFile {self.key} {HOSTS_MARK}\n"
                    f"    StrictHostKeyChecking no {HOSTS_MARK}\n"
                    f"    UserKnownHostsFile /dev/null {HOSTS_MARK}\n"
                    f"    LogLevel ERROR {HOSTS_MARK}\n")
        for i in range(len(self.names)):
            deadline = time.monotonic() + 20
            while self.ssh(i, "hostname", timeout=10).stdout.strip() != self.names[i]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on emulated host {self.names[i]} did not answer")
                time.sleep(0.2)
        return self


def down():
    """Removes every emulated host, the bridge, the /etc/hosts lines and the scratch directory."""
    if os.path.isdir(SCRATCH):
        for entry in os.listdir(SCRATCH):
            if entry.startswith("sshd-") and entry.endswith(".pid"):
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(SCRATCH, entry)) as f:
                        os.kill(int(f.read().strip()), signal.SIGTERM)
    namespaces = _run("ip", "netns", "list", check=False).stdout.split("\n")
    for line in namespaces:
        ns = line.split(" ")[0]
        if ns.startswith(PREFIX):
            # whatever still runs in it (sshd sessions, workers) goes first
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", ns, check=False)
    # A deleted namespace lives on while a process killed in it has not yet
    # exited, and its veth pair with it; an interrupted up() leaves pairs in
    # this namespace. Deleting our end removes the pair at once, so an up()
    # right after finds the names free.
    for link in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = link.split(":")[1].strip().split("@")[0] if ":" in link else ""
        if (name.startswith(PREFIX) and name.endswith("-br")) or name == VETH_TMP:
            _run("ip", "link", "del", name, check=False)
    _run("ip", "link", "del", BRIDGE, check=False)
    for path in ("/etc/hosts", SSH_CONFIG):
        with contextlib.suppress(FileNotFoundError):
            with open(path) as f:
                lines = f.readlines()
            kept = [line for line in lines if HOSTS_MARK not in line]
            if path == SSH_CONFIG and not kept:
                os.remove(path)  # only ours was in it
            elif kept != lines:
                with open(path, "w") as f:  # /etc/hosts is often bind-mounted: rewrite in place
                    f.writelines(kept)
    shutil.rmtree(SCRATCH, ignore_errors=True)


@contextlib.contextmanager
def emulated_hosts(count=2):
    """``count`` emulated hosts for the duration of the ``with`` block, torn
    down after. The names and addresses are fixed, so a second user (another
    test session) waits on a lock until the first is done."""
    hosts = EmulatedHosts(count)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield hosts.up()
        finally:
            down()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the hosts and print horovodrun's flags for them")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--slots", type=int, default=1)
    sub.add_parser("down", help="remove them")
    args = parser.parse_args(argv)
    if args.command == "down":
        down()
        return 0
    why = unavailable()
    if why:
        print(f"emulated_hosts: {why}", file=sys.stderr)
        return 1
    hosts = EmulatedHosts(args.hosts).up()
    print(" ".join(hosts.horovodrun_args(args.slots)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
