"""A Slurm allocation as Horovod's hosts: ``-H h2:1,h3:1``, ``-np``, or a hosts file.

Inside a Slurm job (``sbatch``, ``salloc``, ``srun``) the allocated nodes are
in ``SLURM_JOB_NODELIST``, in Slurm's compressed *hostlist* form
(``h[2-3]``, ``a1,b[01-03,7]``, ``rack[1-2]-n[1-2]``), and the tasks on each
node in ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of the first three
nodes, 1 on the fourth). One task is one Horovod worker, so those are the
hosts and slots of ``horovodrun -H`` (:func:`format_horovodrun`), the worker
count of ``-np`` (:func:`worker_count`) and the lines of the hosts file that
``keras-adapt discover --hosts-file`` reads (:func:`format_hostfile`).

Where ``SLURM_TASKS_PER_NODE`` is missing the tasks come from
``SLURM_NTASKS_PER_NODE`` (one number for every node), then from
``SLURM_JOB_CPUS_PER_NODE`` (one worker per CPU). The command
``keras-adapt slurm-hosts`` prints these for a batch script.

Example:

>>> from keras_adapt import slurm
>>> slurm.expand_hostlist("a1,b[01-03,7]")
['a1', 'b01', 'b02', 'b03', 'b7']
>>> slurm.expand_counts("2(x3),1")
[2, 2, 2, 1]
>>> env = {"SLURM_JOB_NODELIST": "h[2-3]", "SLURM_TASKS_PER_NODE": "1(x2)"}
>>> hosts = slurm.allocation_hosts(env)
>>> slurm.format_horovodrun(hosts), slurm.worker_count(hosts)
('h2:1,h3:1', 2)
"""

import os
import re

__all__ = ["COUNT_VARIABLES", "NODELIST_VARIABLES", "NotInAllocation", "allocation_hosts",
           "expand_counts", "expand_hostlist", "format_hostfile", "format_horovodrun",
           "worker_count"]

#: Where the allocated nodes are read from, first found wins (the second is
#: the older name, still set by Slurm).
NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
#: Where the workers per node are read from, first found wins.
COUNT_VARIABLES = ("SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class NotInAllocation(LookupError):
    """Raised by :func:`allocation_hosts` outside a Slurm allocation (no
    ``SLURM_JOB_NODELIST``).

    Example:

    >>> from keras_adapt import slurm
    >>> try:
    ...     slurm.allocation_hosts({})
    ... except slurm.NotInAllocation as exc:
    ...     print(str(exc).split(":")[0])
    SLURM_JOB_NODELIST is not set
    """


def _split_top(text):
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_ranges(inner):
    """``01-03,7`` -> ``['01', '02', '03', '7']`` (the width of a range's start is kept)."""
    out = []
    for item in inner.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"range {item!r} is not N or N-M")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"range {item!r} ends before it starts")
        width = len(first) if first.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    return out


def _expand_name(name):
    """One hostlist item, possibly with several bracket groups (their product)."""
    if "[]" in name:
        raise ValueError("empty '[]'")
    names = [""]
    for text, inner in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
        choices = _expand_ranges(inner) if inner else [""]
        names = [n + text + c for n in names for c in choices]
    return names


def expand_hostlist(text, variable="SLURM_JOB_NODELIST"):
    """The host names in Slurm's compressed hostlist ``text``, in order (as
    ``scontrol show hostnames`` prints them). ``variable`` names the source
    in the error on malformed input.

    Example:

    >>> from keras_adapt.slurm import expand_hostlist
    >>> expand_hostlist("gpu[08-10],login1")
    ['gpu08', 'gpu09', 'gpu10', 'login1']
    >>> expand_hostlist("rack[1-2]-n[1-2]")
    ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{variable}={text!r} is empty; it should list the allocated nodes, "
                         "e.g. node[01-04]")
    try:
        hosts = [h for item in _split_top(text.strip()) if item.strip()
                 for h in _expand_name(item.strip())]
    except ValueError as exc:
        raise ValueError(f"{variable}={text!r} is not a Slurm hostlist ({exc}); expected "
                         "names with optional [ranges], e.g. a1,b[01-03,7]") from None
    if not hosts:
        raise ValueError(f"{variable}={text!r} lists no host")
    return hosts


def expand_counts(text, variable="SLURM_TASKS_PER_NODE"):
    """Slurm's per-node counts (``2(x3),1``) as one int per node.

    Example:

    >>> from keras_adapt.slurm import expand_counts
    >>> expand_counts("4"), expand_counts("1(x2),3")
    ([4], [1, 1, 3])
    """
    counts = []
    for item in str(text).split(","):
        match = _COUNT.match(item.strip())
        if not match:
            raise ValueError(f"{variable}={text!r} is not a list of per-node counts; expected "
                             "e.g. 2(x3),1 (2 on each of three nodes, then 1)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if min(counts) < 1:
        raise ValueError(f"{variable}={text!r} gives a node no task; every count must be >= 1")
    return counts


def allocation_hosts(environ=None):
    """``[(host, workers), ...]`` of the Slurm allocation described by
    ``environ`` (default ``os.environ``): the nodes of ``SLURM_JOB_NODELIST``
    with the tasks of ``SLURM_TASKS_PER_NODE`` (else ``SLURM_NTASKS_PER_NODE``,
    else ``SLURM_JOB_CPUS_PER_NODE``). Raises :class:`NotInAllocation`
    without a node list and ValueError, naming the variable, on malformed
    values or counts that do not match the nodes.

    Example:

    >>> from keras_adapt.slurm import allocation_hosts
    >>> allocation_hosts({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"})
    [('n1', 2), ('n2', 2), ('n3', 1)]
    >>> allocation_hosts({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4"})
    [('n1', 4), ('n2', 4)]
    """
    env = os.environ if environ is None else environ
    source = next((v for v in NODELIST_VARIABLES if env.get(v)), None)
    if source is None:
        raise NotInAllocation(
            "SLURM_JOB_NODELIST is not set: run this inside a Slurm allocation (a batch script "
            "of sbatch, salloc, or srun), where Slurm sets it")
    hosts = expand_hostlist(env[source], source)
    variable = next((v for v in COUNT_VARIABLES if env.get(v)), None)
    if variable is None:
        raise ValueError(f"none of {', '.join(COUNT_VARIABLES)} is set: Slurm sets "
                         "SLURM_TASKS_PER_NODE in every allocation; pass --ntasks-per-node")
    counts = expand_counts(env[variable], variable)
    if variable == "SLURM_NTASKS_PER_NODE" and len(counts) == 1:
        counts = counts * len(hosts)
    if len(counts) != len(hosts):
        raise ValueError(f"{variable}={env[variable]!r} gives {len(counts)} node(s) but "
                         f"{source}={env[source]!r} lists {len(hosts)}; the two must describe "
                         "the same allocation")
    return list(zip(hosts, counts))


def format_horovodrun(hosts):
    """``host:workers`` pairs joined by commas, for ``horovodrun -H``.

    Example:

    >>> from keras_adapt.slurm import format_horovodrun
    >>> format_horovodrun([("n1", 2), ("n2", 2)])
    'n1:2,n2:2'
    """
    return ",".join(f"{host}:{count}" for host, count in hosts)


def format_hostfile(hosts):
    """One ``host:workers`` line per host: the hosts file of ``keras-adapt
    discover --hosts-file`` (and ``horovodrun --hostfile`` takes
    ``host slots=N``; use :func:`format_horovodrun` with ``-H`` there).

    Example:

    >>> from keras_adapt.slurm import format_hostfile
    >>> print(format_hostfile([("n1", 2), ("n2", 1)]), end="")
    n1:2
    n2:1
    """
    return "".join(f"{host}:{count}\n" for host, count in hosts)


def worker_count(hosts):
    """The workers of ``hosts`` in all: ``horovodrun -np``.

    Example:

    >>> from keras_adapt.slurm import worker_count
    >>> worker_count([("n1", 2), ("n2", 1)])
    3
    """
    return sum(count for _, count in hosts)
