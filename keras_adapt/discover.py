"""Host discovery for Horovod Elastic, capped by a target worker count.

``horovodrun --host-discovery-script S`` runs ``S`` about once a second and
reads one ``host:slots`` line per host from its standard output. This module
produces those lines from a hosts file (one ``host[:slots]`` per line,
``#`` comments and blank lines allowed), a fixed list (``h1:2,h2:2``), or
the ready pods of a label selector read from the Kubernetes API
(:class:`keras_adapt.kubernetes_pods.KubernetesPods`: on Kubernetes with
Kubeflow's MPI Operator, the job's worker pods), *capped* by a target worker count that a policy writes into a small file
(:class:`keras_adapt.actuators.WorkerTarget`): the total slots are trimmed
from the end of the list, so hosts ``a:2,b:2`` with target 3 give ``a:2``
and ``b:1``. A target of 0, or no target file, means no cap. This is the
configuration operator of KungFu, on Horovod: a job asks for more or fewer
workers by writing a number, and Horovod's elastic driver starts or stops
workers to match.

A third, optional input is the *exclusion file*: one host name per line
(``#`` comments and blank lines allowed) that is left out of the answer
before the cap, whatever the hosts file says. ``StragglerPolicy(...,
action="exclude")`` adds the host of a persistently slow worker to it
(:func:`exclude_host`), so Horovod stops the workers there. A host stays
excluded until someone removes its line (or the file).

Files are replaced atomically (:func:`write_atomic`: a temporary file in the
same directory, then ``os.replace``), so a reader sees the old content or the
new, never a part. Each answer is also cached next to the target file (or
the hosts file; for pods without either, in the temporary directory) as
``<file>.last``: when the input is missing or malformed, or the Kubernetes
API fails (unreachable, an HTTP error, no pod ready), :func:`discover` raises, and ``keras-adapt discover`` prints the error on
stderr and the last good answer with exit code 0, because Horovod treats a
failing script as a transient error but empty output as "no hosts" (every
worker would be stopped). With no last good answer it exits 1, a runtime
error like any other command's (2 is for a wrong command line).

Example:

>>> import os, tempfile
>>> from keras_adapt import discover
>>> d = tempfile.mkdtemp()
>>> hosts = os.path.join(d, "hosts"); target = os.path.join(d, "target")
>>> discover.write_atomic(hosts, "# the machines\\nnode-a:2\\nnode-b:2\\n")
>>> discover.write_target(target, 3)
>>> print(discover.discover(hosts_file=hosts, target_file=target))
node-a:2
node-b:1
>>> excluded = os.path.join(d, "excluded")
>>> discover.exclude_host(excluded, "node-a")
True
>>> print(discover.discover(hosts_file=hosts, target_file=target, exclude_file=excluded))
node-b:2
"""

import os
import re
import tempfile
import warnings

from keras_adapt.checks import check_int

__all__ = [
    "ENV_EXCLUDE_FILE", "ENV_HOSTS", "ENV_HOSTS_FILE", "ENV_TARGET_FILE", "LAST_SUFFIX",
    "cap_hosts", "discover", "exclude_host", "format_hosts", "last_good_path", "parse_excluded",
    "parse_hosts", "read_excluded", "read_last_good", "read_target", "write_atomic",
    "write_target",
]

#: Environment variable naming the hosts file (``keras-adapt discover`` without options).
ENV_HOSTS_FILE = "KERAS_ADAPT_HOSTS_FILE"
#: Environment variable holding a fixed host list such as ``h1:2,h2:2``.
ENV_HOSTS = "KERAS_ADAPT_HOSTS"
#: Environment variable naming the target worker count file (read by
#: ``keras-adapt discover``, written by the resize policies).
ENV_TARGET_FILE = "KERAS_ADAPT_TARGET_FILE"
#: Environment variable naming the exclusion file (hosts left out; read by
#: ``keras-adapt discover``, written by ``StragglerPolicy(action="exclude")``).
ENV_EXCLUDE_FILE = "KERAS_ADAPT_EXCLUDE_FILE"
#: Suffix of the file caching the last good answer.
LAST_SUFFIX = ".last"

# A host name or address as Horovod accepts it in host:slots (no colon, no
# whitespace, no comma).
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]%]+$")


def input_file(path, env, who, option):
    """The path of a file ``keras-adapt discover`` reads (its ``option``),
    for a writer named ``who``: ``path`` if given, else the environment
    variable ``env``; else a ValueError that says how to give it.

    Example:

    >>> from keras_adapt import discover
    >>> discover.input_file("/tmp/target", discover.ENV_TARGET_FILE, "WorkerTarget",
    ...                     "--target-file")
    '/tmp/target'
    """
    if path is None:
        path = os.environ.get(env) or None
    if path is None:
        arg = option.lstrip("-").replace("-", "_")
        raise ValueError(
            f"{who} needs the file that keras-adapt discover reads as {option}: pass "
            f"{arg}=PATH or set the environment variable {env} (horovodrun passes it on to "
            f"the workers), and give the same file to keras-adapt discover ({option})")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{option.lstrip('-').replace('-', '_')} must be a path, got {path!r}")
    return os.fspath(path)


def write_atomic(path, text):
    """Replaces ``path`` by a file holding ``text``, atomically.

    The text goes to a temporary file in the same directory, is flushed to
    disk, and the temporary file is renamed over ``path`` (``os.replace``):
    a concurrent reader opens either the old file or the new one.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.discover import write_atomic
    >>> path = os.path.join(tempfile.mkdtemp(), "f")
    >>> write_atomic(path, "2\\n"); open(path).read()
    '2\\n'
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_target(path, workers):
    """Writes the target worker count ``workers`` (0: no cap) to ``path`` atomically.

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.discover import read_target, write_target
    >>> path = os.path.join(tempfile.mkdtemp(), "target")
    >>> write_target(path, 4); read_target(path)
    4
    """
    workers = check_int("workers", workers, 0, fix="use an int >= 0 (0: no cap)")
    write_atomic(path, f"{workers}\n")


def read_target(path):
    """The target worker count in ``path``: an int >= 1, or None for no cap.

    No file, an empty file or ``0`` mean no cap. Whitespace around the number
    is ignored. Anything else raises ``ValueError`` naming the file, the
    content and the fix.

    Example:

    >>> from keras_adapt.discover import read_target
    >>> read_target("/nonexistent/target") is None
    True
    """
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        text = "<not text>"
    value = text.strip()
    if not value:
        return None
    if not re.fullmatch(r"\d+", value):
        raise ValueError(
            f"target file {path}: {value[:40]!r} is not a worker count; it must hold one "
            "int >= 0 (0: no cap), e.g. write it with keras_adapt.discover.write_target(path, 2)")
    return int(value) or None


def parse_hosts(text, source="hosts"):
    """``[(host, slots), ...]`` from ``host[:slots]`` entries.

    Entries are separated by newlines or commas; ``#`` starts a comment;
    blank entries are skipped; ``slots`` defaults to 1. A malformed entry,
    a host listed twice or a list without hosts raises ``ValueError``
    naming ``source``, the line and the fix.

    Example:

    >>> from keras_adapt.discover import parse_hosts
    >>> parse_hosts("a:2, b\\n# spare\\nc:4  # big one")
    [('a', 2), ('b', 1), ('c', 4)]
    """
    hosts, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        for entry in line.split("#", 1)[0].split(","):
            entry = entry.strip()
            if not entry:
                continue
            host, sep, slots = entry.partition(":")
            host, slots = host.strip(), slots.strip()
            if not _HOST.match(host) or (sep and not re.fullmatch(r"[1-9]\d*", slots)):
                raise ValueError(
                    f"{source} line {number}: {entry!r} is not valid; write one host[:slots] "
                    "per line (or comma-separated), slots an int >= 1, e.g. node-1:2")
            if host in seen:
                raise ValueError(f"{source} line {number}: host {host!r} is listed twice; "
                                 "list each host once with its total slots")
            seen.add(host)
            hosts.append((host, int(slots) if sep else 1))
    if not hosts:
        raise ValueError(f"{source} lists no host; write one host[:slots] per line, "
                         "e.g. node-1:2")
    return hosts


def parse_excluded(text, source="exclusion file"):
    """The host names of an exclusion file's text, in order, each once.

    One host name per line (as in the hosts file, without ``:slots``);
    ``#`` starts a comment; blank lines are skipped; a host listed twice
    counts once. Anything else raises ``ValueError`` naming ``source``, the
    line and the fix.

    Example:

    >>> from keras_adapt.discover import parse_excluded
    >>> parse_excluded("# slow since 09:12\\nnode-b\\n\\n10.0.0.7  # flagged twice\\nnode-b\\n")
    ['node-b', '10.0.0.7']
    """
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not _HOST.match(entry):
            raise ValueError(
                f"{source} line {number}: {entry!r} is not a host name; write one host per "
                "line, as the hosts file names it and without :slots, e.g. node-2")
        if entry not in hosts:
            hosts.append(entry)
    return hosts


def read_excluded(path):
    """The hosts excluded by the file ``path`` (a list; empty without a file).

    No file (or ``path`` None) excludes nothing. A malformed file raises
    ``ValueError`` (:func:`parse_excluded`).

    Example:

    >>> from keras_adapt.discover import read_excluded
    >>> read_excluded("/nonexistent/excluded")
    []
    """
    if path is None:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise ValueError(f"exclusion file {path} is not text; write one host name per line, "
                         "e.g. node-2") from None
    return parse_excluded(text, source=f"exclusion file {path}")


def exclude_host(path, host):
    """Adds ``host`` to the exclusion file ``path`` atomically; False when it
    was already there (nothing written).

    The file keeps its lines (comments included); the host is appended.
    Raises ``ValueError`` for a name that is not a host name, or when the
    file is malformed (its content is then left alone).

    Example:

    >>> import os, tempfile
    >>> from keras_adapt.discover import exclude_host, read_excluded
    >>> path = os.path.join(tempfile.mkdtemp(), "excluded")
    >>> exclude_host(path, "node-b"), exclude_host(path, "node-b"), read_excluded(path)
    (True, False, ['node-b'])
    """
    if not isinstance(host, str) or not _HOST.match(host):
        raise ValueError(f"host={host!r} is not a host name; pass a name as the hosts file "
                         "lists it, e.g. 'node-2'")
    if host in read_excluded(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if text and not text.endswith("\n"):
        text += "\n"
    write_atomic(path, f"{text}{host}\n")
    return True


def cap_hosts(hosts, target):
    """The hosts with their slots trimmed from the end to total ``target``.

    ``target`` None or 0 leaves them as they are; a target above the total
    slots too (the job gets what there is). Hosts left with no slot are
    dropped.

    Example:

    >>> from keras_adapt.discover import cap_hosts
    >>> cap_hosts([("a", 2), ("b", 2)], 3), cap_hosts([("a", 2), ("b", 2)], 1)
    ([('a', 2), ('b', 1)], [('a', 1)])
    """
    if not target:
        return list(hosts)
    out, left = [], int(target)
    for host, slots in hosts:
        if left <= 0:
            break
        out.append((host, min(slots, left)))
        left -= slots
    return out


def format_hosts(hosts):
    """The ``host:slots`` lines Horovod reads (no trailing newline).

    Example:

    >>> from keras_adapt.discover import format_hosts
    >>> format_hosts([("a", 2), ("b", 1)])
    'a:2\\nb:1'
    """
    return "\n".join(f"{host}:{slots}" for host, slots in hosts)


def last_good_path(hosts_file=None, target_file=None, exclude_file=None, source_name=None):
    """Where the last good answer is cached: next to the target file, else
    next to the hosts file, else next to the exclusion file, else, for a
    source without a file (the Kubernetes API: ``source_name``, e.g.
    :attr:`KubernetesPods.cache_name <keras_adapt.kubernetes_pods.KubernetesPods.cache_name>`),
    ``keras-adapt-discover-<source_name>.last`` in the temporary directory,
    else None (a fixed list alone cannot fail).

    Example:

    >>> from keras_adapt.discover import last_good_path
    >>> last_good_path("/etc/job/hosts", "/run/job/target")
    '/run/job/target.last'
    """
    base = target_file or hosts_file or exclude_file
    if base is None and source_name is not None:
        base = os.path.join(tempfile.gettempdir(), f"keras-adapt-discover-{source_name}")
    return None if base is None else base + LAST_SUFFIX


def read_last_good(path):
    """The cached last good answer in ``path``, or None (no file, or nothing
    that looks like ``host:slots`` lines).

    Example:

    >>> from keras_adapt.discover import read_last_good
    >>> read_last_good("/nonexistent.last") is None
    True
    """
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
        return format_hosts(parse_hosts(text, source=path))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def discover(hosts_file=None, hosts=None, target_file=None, cache=True, exclude_file=None,
             pods=None):
    """The ``host:slots`` lines for Horovod: the hosts not excluded, capped by the target.

    Args:
        hosts_file: a file with one ``host[:slots]`` per line.
        hosts: a fixed list instead, as text (``"h1:2,h2:2"``) or as
            ``[(host, slots), ...]``.
        pods: the ready pods of a
            :class:`~keras_adapt.kubernetes_pods.KubernetesPods` instead (its
            ``hosts()`` and ``cache_name``), read from the Kubernetes API.
        target_file: the file holding the target worker count (optional).
        cache: write the answer to :func:`last_good_path` when it changed.
        exclude_file: the exclusion file (optional): its hosts are left out
            before the cap (:func:`read_excluded`); names not in the hosts
            are ignored.

    Raises ``ValueError`` (bad hosts, bad target, a bad exclusion file, every
    host excluded, no pod ready, not exactly one of ``hosts_file``, ``hosts``
    and ``pods``) and ``OSError`` (an unreadable hosts file, a failing
    Kubernetes API), each naming the bad value and the fix.

    Example:

    >>> from keras_adapt.discover import discover
    >>> discover(hosts="h1:2,h2:2,h3:1")
    'h1:2\\nh2:2\\nh3:1'
    """
    given = [v is not None for v in (hosts_file, hosts, pods)]
    if sum(given) != 1:
        raise ValueError(
            "give the hosts either as a file (--hosts-file F, or the environment variable "
            f"{ENV_HOSTS_FILE}), as a list (--hosts h1:2,h2:2, or {ENV_HOSTS}) or as "
            "Kubernetes pods (--kubernetes-selector LABELS), not "
            f"{'several' if any(given) else 'neither'}")
    if pods is not None:
        found = pods.hosts()
        parsed = parse_hosts(",".join(f"{h}:{s}" for h, s in found),
                             source=f"pods of {pods.selector}")
    elif hosts_file is not None:
        try:
            with open(hosts_file, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"hosts file {hosts_file} does not exist; create it with one host[:slots] "
                "per line, or point --hosts-file (KERAS_ADAPT_HOSTS_FILE) at it") from None
        parsed = parse_hosts(text, source=f"hosts file {hosts_file}")
    elif isinstance(hosts, str):
        parsed = parse_hosts(hosts, source=f"host list {hosts!r}")
    else:
        parsed = parse_hosts(",".join(f"{h}:{s}" for h, s in hosts), source="host list")
    excluded = read_excluded(exclude_file)
    kept = [(host, slots) for host, slots in parsed if host not in excluded]
    if not kept:
        raise ValueError(
            f"exclusion file {exclude_file} excludes every host ({', '.join(excluded)}); "
            "remove a line from it to bring a host back (keras-adapt's StragglerPolicy never "
            "excludes the last host)")
    answer = format_hosts(cap_hosts(kept, read_target(target_file)))
    path = last_good_path(hosts_file, target_file, exclude_file,
                          None if pods is None else pods.cache_name)
    if cache and path is not None and read_last_good(path) != answer:
        try:
            write_atomic(path, answer + "\n")
        except OSError as exc:  # costs the fallback, never the answer
            warnings.warn(f"keras-adapt discover: cannot cache the answer in {path} ({exc}); "
                          "make its directory writable to get the last good answer on "
                          "bad input", RuntimeWarning, stacklevel=2)
    return answer
