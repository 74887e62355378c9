"""``PeerExchange``: the point-to-point transport of :class:`PairAveraging`.

Horovod's collectives are synchronous: every worker must join them. Pair
averaging needs the opposite, a worker sending its model to one peer and
taking whatever model a peer has sent it, without waiting for anyone. The
transport is ZeroMQ (``pyzmq``): a mature, widely packaged message library
whose sockets queue and deliver in background I/O threads, reconnect on
their own, and never block a sender that is told not to (``zmq.NOBLOCK``). Each worker binds one PULL socket on its own host's
address and connects one PUSH socket to every other worker's:

* a send is dropped (and counted) when the queue towards the peer is full
  (``queue`` models: a slow peer, or one that is gone); the sender never
  waits;
* a receive drains what arrived since the last exchange and keeps, per
  peer, only the newest model.

The addresses are exchanged once per *entry* into the strategy (a switch,
the first update, an elastic re-form), in the one collective all workers
join then (see :class:`keras_adapt.sync.SyncState`).

Models carry a *version*: the number of updates the model reflects. A
local update adds one; averaging two models averages their versions. The
staleness of a peer's model is how many updates older it is than this
worker's own: ``own version - peer version`` (negative when the peer's is
newer). Averaging pulls the versions together, so a peer that runs 1.5x
slower stays a bounded number of updates behind; a model more than
``max_staleness`` updates older than the worker's own is not averaged with
(counted as refused), so a peer that stalls cannot drag the others back.
"""

import json
import os
import socket
import time

import numpy as np

from keras_adapt.extras import require

#: The endpoint's bytes in the gathered tensor (``SyncState`` allgathers them).
ENDPOINT_BYTES = 128
#: A worker's address is read from this variable first (``host`` or
#: ``host:port``); else from Horovod's ``HOROVOD_HOSTNAME``; else loopback.
ADDRESS_ENV = "KERAS_ADAPT_EXCHANGE_ADDRESS"


def worker_address():
    """The address this worker's exchange binds: ``$KERAS_ADAPT_EXCHANGE_ADDRESS``,
    else the address ``$HOROVOD_HOSTNAME`` (the host's name in ``horovodrun
    -H``) resolves to, else ``127.0.0.1``. The exchange binds this address
    only, never every interface.

    Example:

    >>> import os
    >>> from keras_adapt.sync.peer_exchange import worker_address
    >>> os.environ["KERAS_ADAPT_EXCHANGE_ADDRESS"] = "127.0.0.1"
    >>> worker_address()
    '127.0.0.1'
    >>> del os.environ["KERAS_ADAPT_EXCHANGE_ADDRESS"]
    """
    explicit = os.environ.get(ADDRESS_ENV, "").strip()
    if explicit:
        return explicit
    host = os.environ.get("HOROVOD_HOSTNAME", "").strip()
    if not host:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise RuntimeError(
            f"PairAveraging: HOROVOD_HOSTNAME={host!r} does not resolve ({exc}); set "
            f"{ADDRESS_ENV} to the address other workers reach this one at") from exc


class ExchangeRecord:
    """What one worker's exchange did: counts and the staleness of every
    model it averaged with (a public, read-only view for monitors, the
    TensorBoard callback and the benchmarks).

    Attributes:
        sent: models handed to the transport.
        dropped: sends given up at once (the peer's queue full or the peer gone).
        received: models that arrived.
        discarded: models that arrived from an earlier entry (another set of workers).
        averaged: exchanges that averaged with a peer's model.
        refused: peer models not averaged with, being more than
            ``max_staleness`` updates older than this worker's.
        empty: exchanges that found no new model (nothing averaged).
        staleness: the staleness (updates) of each model averaged with, in order.
        peers: of each, in order: the sender's rank, the model's version and
            the sender's update count when it sent it (which names the model).
        peer_updates: per peer rank, the updates it had made when it sent
            its newest model that arrived (how far the others are, without
            asking them).
        ages: the seconds between each such model's send and its use.

    Example:

    >>> from keras_adapt.sync.peer_exchange import ExchangeRecord
    >>> r = ExchangeRecord()
    >>> r.staleness += [0.5, 1.5]
    >>> r.summary()["staleness_mean"]
    1.0
    """

    def __init__(self):
        self.sent = self.dropped = self.received = self.discarded = 0
        self.averaged = self.refused = self.empty = 0
        self.staleness = []
        self.peers = []
        self.peer_updates = {}
        self.ages = []

    def summary(self):
        """The counts, and the staleness's mean, median, 95th percentile and
        maximum (None before any averaging)."""
        s = np.asarray(self.staleness, dtype=float)

        def stat(fn):
            return float(fn(s)) if s.size else None

        return {"sent": self.sent, "dropped": self.dropped, "received": self.received,
                "discarded": self.discarded,
                "averaged": self.averaged, "refused": self.refused, "empty": self.empty,
                "staleness_mean": stat(np.mean), "staleness_median": stat(np.median),
                "staleness_p95": stat(lambda a: np.percentile(a, 95)),
                "staleness_max": stat(np.max),
                "age_seconds_mean": float(np.mean(self.ages)) if self.ages else None}


class PeerExchange:
    """One worker's end of the pair-averaging transport (host side).

    :meth:`endpoint` binds it, :meth:`connect` joins the others' endpoints,
    :meth:`exchange` sends this worker's model to one peer and returns the
    average with the newest peer model not yet used (or None). Peers are
    taken in turn, starting after this worker's rank.

    Args:
        max_staleness: peer models more than this many updates older than
            this worker's own are refused.
        queue: models queued per peer connection before sends are dropped.

    Example (two exchanges in one process, on loopback):

    >>> import numpy as np
    >>> from keras_adapt.sync.peer_exchange import PeerExchange
    >>> a, b = PeerExchange(), PeerExchange()
    >>> ends = [a.endpoint(), b.endpoint()]
    >>> a.connect(ends, rank=0); b.connect(ends, rank=1)
    >>> a.exchange(1, [np.array([1.0])]) is None   # sent; nothing received yet
    True
    >>> b.receive(5.0)
    1
    >>> [w.tolist() for w in b.exchange(1, [np.array([3.0])])]
    [[2.0]]
    >>> a.close(); b.close()
    """

    def __init__(self, max_staleness=16.0, queue=2):
        self.rank = None
        self.max_staleness = float(max_staleness)
        self.queue = int(queue)
        self.record = ExchangeRecord()
        self._zmq = require("zmq", "async", "PairAveraging")
        self._context = self._zmq.Context.instance()
        self._pull = None
        self._endpoint = None
        self._pushes = {}
        self._turn = 0
        self._version = 0.0
        self._last_updates = 0
        self._latest = {}
        self._generation = None

    @property
    def version(self):
        """The number of updates this worker's model reflects (see the module docstring)."""
        return self._version

    def endpoint(self):
        """Binds the receiving socket (once) on :func:`worker_address`, a free
        port; returns ``tcp://address:port``."""
        if self._pull is None:
            zmq = self._zmq
            pull = self._context.socket(zmq.PULL)
            pull.setsockopt(zmq.LINGER, 0)
            pull.setsockopt(zmq.RCVHWM, self.queue)
            address = worker_address()
            host, _, port = address.partition(":")
            if port:
                pull.bind(f"tcp://{host}:{port}")
                self._endpoint = f"tcp://{host}:{port}"
            else:
                bound = pull.bind_to_random_port(f"tcp://{host}")
                self._endpoint = f"tcp://{host}:{bound}"
            self._pull = pull
        return self._endpoint

    def connect(self, endpoints, rank, updates=0):
        """Connects to the other workers' ``endpoints`` (indexed by rank;
        ``rank`` is this worker's, whose own endpoint is skipped), replacing
        earlier connections (an elastic re-form changes them). All workers
        enter with the same averaged model: its version restarts at 0, after
        ``updates`` updates (the count :meth:`exchange` is given)."""
        zmq = self._zmq
        self.rank = int(rank)
        for push in self._pushes.values():
            push.close(linger=0)
        self._pushes = {}
        for peer, endpoint in enumerate(endpoints):
            if peer == self.rank:
                continue
            push = self._context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.setsockopt(zmq.SNDHWM, self.queue)
            push.connect(endpoint)
            self._pushes[peer] = push
        # Models sent before this entry (another set of workers) are discarded.
        self._generation = "|".join(endpoints)
        self._latest = {}
        self._turn = 0
        self._version = 0.0
        self._last_updates = float(updates)

    def exchange(self, updates, arrays):
        """Sends ``arrays`` (this worker's model after ``updates`` updates in
        all) to the next peer and returns the average with the newest unused
        peer model at most ``max_staleness`` updates older than this one, or
        None. Never waits for a peer."""
        self._version += float(updates) - self._last_updates
        self._last_updates = float(updates)
        self._send(arrays)
        self._drain()
        return self._average(arrays)

    def _send(self, arrays):
        if not self._pushes:
            return
        peers = sorted(self._pushes)
        start = next((i for i, r in enumerate(peers) if r > self.rank), 0)
        peer = peers[(start + self._turn) % len(peers)]
        self._turn += 1
        header = {"rank": self.rank, "generation": self._generation,
                  "version": self._version, "updates": self._last_updates, "time": time.time(),
                  "arrays": [[str(a.dtype), list(a.shape)] for a in arrays]}
        parts = [json.dumps(header).encode()] + [np.ascontiguousarray(a) for a in arrays]
        try:
            self._pushes[peer].send_multipart(parts, flags=self._zmq.NOBLOCK, copy=False)
            self.record.sent += 1
        except self._zmq.Again:
            self.record.dropped += 1

    def _drain(self):
        taken = 0
        while self._pull is not None:
            try:
                parts = self._pull.recv_multipart(flags=self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            taken += 1
            header = json.loads(parts[0])
            if header.get("generation") != self._generation:
                self.record.discarded += 1
                continue
            arrays = [np.frombuffer(p, dtype=d).reshape(s)
                      for p, (d, s) in zip(parts[1:], header["arrays"])]
            self.record.received += 1
            self.record.peer_updates[header["rank"]] = header["updates"]
            self._latest[header["rank"]] = (header, arrays)
        return taken

    def _average(self, arrays):
        usable = []
        for rank, (header, peer) in list(self._latest.items()):
            staleness = self._version - header["version"]
            if staleness > self.max_staleness:
                self.record.refused += 1
                del self._latest[rank]
            elif len(peer) == len(arrays) and all(
                    p.shape == a.shape for p, a in zip(peer, arrays)):
                usable.append((staleness, rank))
            else:
                raise ValueError(
                    f"PairAveraging: rank {rank} sent a model of shapes "
                    f"{[p.shape for p in peer]}, this worker's is {[a.shape for a in arrays]}; "
                    "every worker must train the same model")
        if not usable:
            self.record.empty += 1
            return None
        staleness, rank = min(usable)  # the freshest peer model
        header, peer = self._latest.pop(rank)
        self.record.averaged += 1
        self.record.staleness.append(staleness)
        self.record.peers.append((rank, header["version"], header["updates"]))
        self.record.ages.append(max(0.0, time.time() - header["time"]))
        self._version = (self._version + header["version"]) / 2.0
        return [((a + p) / 2).astype(a.dtype) for a, p in zip(arrays, peer)]

    def receive(self, timeout):
        """Takes every peer model that has arrived, waiting up to ``timeout``
        seconds for one if none has; returns how many it took (counting
        those of an earlier entry, discarded). :meth:`exchange` does this
        without waiting; for tests and examples."""
        taken = self._drain()
        if taken == 0 and self._pull is not None and self._pull.poll(timeout * 1000):
            taken = self._drain()
        return taken

    def close(self):
        """Closes the sockets (nothing queued is kept)."""
        for sock in [self._pull, *self._pushes.values()]:
            if sock is not None:
                sock.close(linger=0)
        self._pull, self._endpoint, self._pushes = None, None, {}
