"""``SyncState``: the strategy in use and its parameters, in variables
(``optimizer.adapt_state.sync``), and the one in-graph dispatch on them."""

import numpy as np
import tensorflow as tf

from keras_adapt.sync.allreduce import AllReduceSGD
from keras_adapt.sync.base import SyncContext, SyncStrategy
from keras_adapt.sync.block_momentum import BlockMomentum
from keras_adapt.sync.elastic_averaging import ElasticAveraging
from keras_adapt.sync.local_sgd import LocalSGD
from keras_adapt.sync.model_averaging import ModelAveraging
from keras_adapt.sync.pair_averaging import PairAveraging
from keras_adapt.sync import peer_exchange

#: The strategy classes, by name (``SyncState.set`` accepts a name).
STRATEGIES = {cls.name: cls for cls in (AllReduceSGD, ModelAveraging, LocalSGD,
                                        BlockMomentum, ElasticAveraging, PairAveraging)}

_PARAMETERS = {"period": (tf.int64, 1), "start_after": (tf.int64, 0),
               "alpha": (tf.float32, 0.0), "block_lr": (tf.float32, 0.0),
               "block_momentum": (tf.float32, 0.0), "nesterov": (tf.bool, False),
               "rho": (tf.float32, 0.0), "max_staleness": (tf.float32, 0.0)}


def candidates_from(sync_strategy):
    """The declared strategies, the initial one first, from
    ``DistributedOptimizer(sync_strategy=...)``: None (AllReduceSGD only), a
    strategy, a name, or a list of them. Raises a clear error otherwise.

    Example:

    >>> from keras_adapt.sync import LocalSGD
    >>> from keras_adapt.sync.sync_state import candidates_from
    >>> candidates_from([LocalSGD(4), "allreduce_sgd"])
    (LocalSGD(period=4, start_after=0), AllReduceSGD())
    """
    if sync_strategy is None:
        return (AllReduceSGD(),)
    items = sync_strategy if isinstance(sync_strategy, (list, tuple)) else [sync_strategy]
    out = []
    for item in items:
        if isinstance(item, str):
            if item not in STRATEGIES:
                raise ValueError(
                    f"sync_strategy={item!r} is not a known strategy; use one of "
                    f"{', '.join(sorted(STRATEGIES))} or a keras_adapt.sync strategy object"
                )
            item = STRATEGIES[item]()
        if not isinstance(item, SyncStrategy) or type(item).__name__ not in {
                cls.__name__ for cls in STRATEGIES.values()}:
            raise TypeError(
                f"sync_strategy must be a keras_adapt.sync strategy (AllReduceSGD(), "
                f"LocalSGD(period), ...), its name, or a list of them; got "
                f"{type(item).__name__}: {item!r}"
            )
        if any(type(o) is type(item) for o in out):
            raise ValueError(
                f"sync_strategy lists {type(item).__name__} twice; declare each strategy "
                "once (its parameters can be changed at run time with adapt_state.sync.set)"
            )
        out.append(item)
    if not out:
        raise ValueError("sync_strategy=[] declares no strategy; pass None for AllReduceSGD")
    return tuple(out)


class SyncState:
    """The synchronisation strategy of an optimizer (``optimizer.adapt_state.sync``).

    The strategies that may be used are declared when the optimizer is made
    (``DistributedOptimizer(..., sync_strategy=[...])``, the first one is
    used from the start); their extra state (BMUF's global model and block
    velocity, EASGD's centre) is made at the first trace. The choice and all
    parameters live in variables: :meth:`set` switches on the host between
    steps and nothing retraces. Every rank must call :meth:`set` at the same
    step (policies do it in ``on_train_batch_begin``, like the batch-size
    policies); every rank then takes the same branch at the same update.

    On every switch to a different strategy :meth:`set` averages the weights
    and optimizer slots over the workers at once, on the host (one grouped
    allreduce), and restarts BMUF's global model and EASGD's centre from that
    average: all ranks start the new strategy from the same model -- in
    particular every switch into AllReduceSGD leaves identical weights and
    slots on all ranks, and the next update is an AllReduceSGD update from
    that model. Before the first trace (nothing trained yet) and for a local
    strategy used from the start, the first update does the same averaging
    in-graph instead, before it applies its gradient.

    Args:
        candidates: the declared strategies, the initial first: what
            :func:`candidates_from` accepts (None: AllReduceSGD only).

    Example:

    >>> from keras_adapt.sync import AllReduceSGD, LocalSGD, SyncState
    >>> sync = SyncState([AllReduceSGD(), LocalSGD(period=4)])
    >>> sync.strategy
    AllReduceSGD()
    >>> sync.set("local_sgd", period=8)
    >>> sync.strategy, int(sync.variables["period"].numpy())
    (LocalSGD(period=8, start_after=0), 8)
    """

    def __init__(self, candidates):
        candidates = candidates_from(candidates)
        self.candidates = {type(s): s for s in candidates}
        with tf.init_scope():
            self.index = tf.Variable(0, dtype=tf.int32, trainable=False, name="sync_strategy")
            self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="sync_updates")
            # False until the first update under a newly selected strategy
            # has averaged the weights and slots.
            self.entered = tf.Variable(True, trainable=False, name="sync_entered")
            # Whether the next update's gradients may be measured: the
            # workers' models agree (after an averaging), or the strategy
            # never makes them agree (SMA, EASGD); and whether a due
            # measurement waits for that (measure_now).
            self.measure_ready = tf.Variable(True, trainable=False, name="sync_measure_ready")
            self.measure_waiting = tf.Variable(False, trainable=False,
                                               name="sync_measure_waiting")
            self.variables = {name: tf.Variable(value, dtype=dtype, trainable=False,
                                                name=f"sync_{name}")
                              for name, (dtype, value) in _PARAMETERS.items()}
        self.extra = {}
        #: PairAveraging's transport (:class:`~keras_adapt.sync.peer_exchange.PeerExchange`)
        #: when it was declared, else None; its ``record`` says what it averaged.
        self.exchange = (peer_exchange.PeerExchange() if PairAveraging in self.candidates
                         else None)
        # What the first trace synchronises: the shared weights, the slots,
        # and the reduction of their mean (set by update()).
        self._synced = None
        self._strategy = None
        self._select(candidates[0], enter=not isinstance(candidates[0], AllReduceSGD))

    @property
    def strategy(self):
        """The strategy in use (a host copy; no device read)."""
        return self._strategy

    @property
    def asynchronous(self):
        """Whether the strategy in use never meets the other workers in a
        collective (:class:`PairAveraging`): a callback that would gather
        from every worker each interval skips that while it runs.

        Example:

        >>> from keras_adapt.sync import AllReduceSGD, PairAveraging, SyncState
        >>> sync = SyncState([AllReduceSGD(), PairAveraging()])
        >>> sync.asynchronous
        False
        """
        return self._strategy.asynchronous

    @property
    def has_local(self):
        """Whether a local strategy was declared (else the train step is the plain one)."""
        return any(s.local for s in self.candidates.values())

    @property
    def averages_next_update(self):
        """Whether the next update first averages the shared weights and the
        optimizer slots over the workers, in-graph, before it applies its
        gradient (a local strategy used from the start, or after
        :meth:`rejoin`). A broadcast after that update would overwrite each
        worker's own first local step, so ``BroadcastGlobalVariablesCallback``
        leaves these variables to the averaging.

        Example:

        >>> from keras_adapt.sync import AllReduceSGD, LocalSGD, SyncState
        >>> SyncState([LocalSGD(period=4)]).averages_next_update
        True
        >>> SyncState([AllReduceSGD(), LocalSGD(period=4)]).averages_next_update
        False
        """
        return self.has_local and not bool(self.entered.numpy())

    def set(self, strategy, **params):
        """Switches to ``strategy`` (an object or a name) and / or changes its
        parameters, between steps, without retracing. The strategy's class
        must have been declared when the optimizer was made.

        Setting the strategy in use again only changes its parameters (the
        count of updates towards the next synchronisation goes on).
        """
        if isinstance(strategy, str):
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown strategy {strategy!r}; use one of "
                                 f"{', '.join(sorted(STRATEGIES))}")
            cls = STRATEGIES[strategy]
            # By name: the parameters in use, else the declared ones, changed by params.
            base = self._strategy if type(self._strategy) is cls else self.candidates.get(cls)
            strategy = (base or cls()).with_params(**params)
        elif isinstance(strategy, SyncStrategy):
            if params:
                strategy = strategy.with_params(**params)
        else:
            raise TypeError(f"set() takes a keras_adapt.sync strategy or its name, got "
                            f"{type(strategy).__name__}: {strategy!r}")
        if type(strategy) not in self.candidates:
            declared = ", ".join(type(s).__name__ for s in self.candidates.values())
            raise ValueError(
                f"{type(strategy).__name__} was not declared when the optimizer was made "
                f"(declared: {declared}); its state is made when the train function is "
                f"traced. Create the optimizer with DistributedOptimizer(..., "
                f"sync_strategy=[..., {type(strategy).__name__}(...)])"
            )
        self._select(strategy, enter=type(strategy) is not type(self._strategy))

    def get_state(self):
        """The choice made on the host: the strategy in use and its
        parameters (JSON-able). The variables behind it (index, count,
        parameters) are in ``adapt_state.checkpoint_variables()``.

        Example:

        >>> from keras_adapt.sync import AllReduceSGD, LocalSGD, SyncState
        >>> sync = SyncState([AllReduceSGD(), LocalSGD(period=4)])
        >>> sync.set("local_sgd", period=8)
        >>> sync.get_state()
        {'strategy': 'local_sgd', 'params': {'period': 8, 'start_after': 0}}
        """
        return {"strategy": self._strategy.name, "params": self._strategy.params()}

    def set_state(self, state):
        """Takes a choice saved by :meth:`get_state` (a commit, or rank 0's
        in an elastic sync) without averaging anything and without
        restarting the count towards the next synchronisation: what a
        restore needs, where the models are about to be overwritten anyway.

        Example:

        >>> from keras_adapt.sync import AllReduceSGD, LocalSGD, SyncState
        >>> a = SyncState([AllReduceSGD(), LocalSGD(period=4)])
        >>> b = SyncState([AllReduceSGD(), LocalSGD(period=4)])
        >>> a.set("local_sgd", period=8)
        >>> b.set_state(a.get_state())
        >>> b.strategy, int(b.index.numpy()) == LocalSGD.index
        (LocalSGD(period=8, start_after=0), True)
        """
        name = state.get("strategy") if isinstance(state, dict) else None
        cls = STRATEGIES.get(name)
        if cls is None or cls not in self.candidates:
            declared = ", ".join(s.name for s in self.candidates.values())
            raise ValueError(
                f"the saved synchronisation strategy {name!r} was not declared by this "
                f"optimizer (declared: {declared}); make the optimizer with the same "
                "DistributedOptimizer(..., sync_strategy=[...]) on every worker and run")
        strategy = self.candidates[cls].with_params(**state["params"])
        for key, value in strategy.params().items():
            self.variables[key].assign(value)
        self.index.assign(strategy.index)
        self._strategy = strategy

    def rejoin(self):
        """After a broadcast made every worker's weights and slots equal (an
        elastic reset): the next update enters the strategy in use again, as
        on a switch into it -- it averages the (equal) models and restarts
        BMUF's global model and EASGD's centre from that model and BMUF's
        block velocity at zero -- and may measure the gradient statistics
        (the models agree). The count towards the next synchronisation and
        the parameters go on unchanged.

        Example:

        >>> from keras_adapt.sync import BlockMomentum, SyncState
        >>> sync = SyncState([BlockMomentum(period=4)])
        >>> sync.rejoin()
        >>> bool(sync.entered.numpy()), bool(sync.measure_ready.numpy())
        (False, True)
        """
        self.entered.assign(False)
        self.measure_ready.assign(True)

    def _select(self, strategy, enter):
        for name, value in strategy.params().items():
            self.variables[name].assign(value)
        if isinstance(strategy, PairAveraging):
            self.exchange.max_staleness = strategy.max_staleness
        if enter:
            self.index.assign(strategy.index)
            self.count.assign(0)
            if self._synced is None:
                self.entered.assign(False)  # the first update averages, in-graph
            else:
                weights, slots, reduction = self._synced
                self._enter(weights, slots, reduction)
                self.measure_ready.assign(True)  # the models agree now
        self._strategy = strategy

    def _enter(self, weights, slots, reduction):
        """Averages the weights and slots over the workers and restarts the
        strategies' own state from the average (BMUF: x_g = mean, v = 0;
        EASGD: centre = mean), and (PairAveraging declared) the workers
        exchange their endpoints and connect. The one rule, run on the host
        by :meth:`set` and in-graph by the first update; returns the
        assignments."""
        shared = list(weights) + list(slots)
        means = reduction.allreduce([tf.convert_to_tensor(v) for v in shared])
        ops = [v.assign(m) for v, m in zip(shared, means)]
        if self.exchange is not None:
            ops.append(self._connect_exchange(reduction))
        for name in ("global_model", "centre"):
            ops += [v.assign(m) for v, m in zip(self.extra.get(name, ()), means)]
        ops += [v.assign(tf.zeros_like(v)) for v in self.extra.get("block_velocity", ())]
        return ops

    def _connect_exchange(self, reduction):
        """The workers allgather their exchange endpoints (one small
        collective) and connect to each other's."""
        from keras_adapt import _hvd

        exchange, width = self.exchange, peer_exchange.ENDPOINT_BYTES

        def encode():
            raw = exchange.endpoint().encode()
            if len(raw) > width:
                raise ValueError(f"PairAveraging: the endpoint {raw!r} is longer than "
                                 f"{width} bytes; set {peer_exchange.ADDRESS_ENV} to a "
                                 "shorter address")
            return np.frombuffer(raw.ljust(width, b"\0"), dtype=np.uint8)

        def connect(gathered, updates):
            rows = gathered.reshape(-1, width)
            # The rank now, not at the trace: an elastic re-form renumbers.
            exchange.connect([bytes(r).rstrip(b"\0").decode() for r in rows],
                             rank=_hvd.rank(), updates=int(updates))
            return np.bool_(True)

        own = tf.numpy_function(encode, [], tf.uint8, stateful=True, name="exchange_endpoint")
        own.set_shape([width])
        gathered = _hvd.allgather(own, name="exchange_endpoints")
        return tf.numpy_function(connect, [gathered, self.count.read_value()],
                                 tf.bool, stateful=True, name="exchange_connect")

    def synchronized_variables(self):
        """``(weights, slots)``: the shared model variables and the optimizer
        slot variables the strategies synchronise, known once the train
        function was traced (else ``([], [])``)."""
        if self._synced is None:
            return [], []
        return list(self._synced[0]), list(self._synced[1])

    # -- in-graph -------------------------------------------------------------
    def measure_now(self, due):
        """In-graph, a local update with two or more workers: whether it
        measures the gradient statistics. ``due``: the statistics' own rule
        (one update in ``stats_interval``). Under LocalSGD and BMUF a due
        measurement waits for the first update after a model averaging,
        where every worker's gradient is taken at the same model, so the
        statistics are those of AllReduceSGD (exact); between averagings the
        workers' gradients also differ by their models' drift, which would
        inflate the variance. Under SMA and EASGD the models never agree,
        and a due update measures (approximate statistics).
        """
        ready = self.measure_ready.read_value()
        if PairAveraging in self.candidates:  # never measured: no collective
            ready = ready & tf.not_equal(self.index.read_value(), PairAveraging.index)
        want = due | self.measure_waiting.read_value()
        with tf.control_dependencies([self.measure_waiting.assign(want & tf.logical_not(ready))]):
            return tf.identity(want & ready)

    def _make_extra(self, weights):
        if self.extra:
            return
        with tf.init_scope():
            for cls in self.candidates:
                for name in getattr(cls, "state_names", lambda: ())():
                    self.extra[name] = [
                        tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False,
                                    name=f"sync_{name}") for w in weights]

    def update(self, allreduce_update, local_update, weights, slots, learning_rate, reduction):
        """In-graph: one optimizer update under the strategy in use.

        ``allreduce_update()`` is the AllReduceSGD update, ``local_update()``
        applies this worker's own gradient; both return a bool tensor.
        ``weights``: the shared model variables; ``slots``: the optimizer's
        slot variables; ``learning_rate()``: the effective learning rate.
        """
        self._make_extra(weights)
        variables = dict(self.variables)
        mean_reduction = _mean_reduction(reduction)
        self._synced = (list(weights), list(slots), mean_reduction)
        count = self.count.read_value()
        context = SyncContext(weights, variables, reduction.size(), learning_rate, self.extra,
                              reduction=mean_reduction, updates=count, exchange=self.exchange)
        index = self.index.read_value()

        def enter():
            with tf.control_dependencies(self._enter(weights, slots, mean_reduction)):
                self.entered.assign(True)
            return tf.constant(True)

        entered = tf.cond(self.entered, lambda: tf.constant(False), enter)
        allreduce_phase = tf.equal(index, AllReduceSGD.index) | (
            tf.equal(index, LocalSGD.index) & (count < variables["start_after"]))

        def local_then_sync():
            applied = local_update()
            branches = []
            for cls in sorted(STRATEGIES.values(), key=lambda c: c.index):
                strategy = self.candidates.get(cls)
                if strategy is None or not strategy.local:
                    branches.append(lambda: tf.constant(False))
                else:
                    branches.append(_sync_branch(strategy, context, variables, count))
            with tf.control_dependencies([applied]):
                ready = tf.switch_case(index, branches)
            with tf.control_dependencies([self.measure_ready.assign(ready)]):
                return tf.identity(applied)

        def allreduce_then_ready():
            applied = allreduce_update()
            with tf.control_dependencies([applied]):  # averaged gradients: models agree
                with tf.control_dependencies([self.measure_ready.assign(True)]):
                    return tf.identity(applied)

        with tf.control_dependencies([entered]):
            done = tf.cond(allreduce_phase, allreduce_then_ready, local_then_sync)
        with tf.control_dependencies([done]):
            self.count.assign_add(1)
            return tf.identity(done)


def _sync_branch(strategy, context, variables, count):
    """The strategy's synchronisation when due; returns whether the next
    update may be measured (``SyncState.measure_now``)."""
    def branch():
        return tf.cond(strategy.sync_due(variables, count),
                       lambda: _run(strategy.synchronize(context)),
                       lambda: tf.constant(not strategy.agrees))
    return branch


def _run(op):
    with tf.control_dependencies([op]):
        return tf.constant(True)


def _mean_reduction(reduction):
    """The reduction of the models' mean: an uncompressed average over the
    gradients' process set, whatever ``op`` and compression the gradients use,
    timed alike (``adapt_state.timing``)."""
    from keras_adapt import _hvd

    return _hvd.Reduction(process_set=reduction.process_set, timing=reduction.timing)
