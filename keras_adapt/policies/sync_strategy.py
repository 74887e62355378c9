"""SyncStrategyPolicy: switches between AllReduceSGD and a local strategy from measurements."""

import math

from keras_adapt.optimizer import base_learning_rate
from keras_adapt.policies.base import AdaptationPolicy, _check_positive_int
from keras_adapt.policies.gns_batch_size import _check_nonneg_float
from keras_adapt.sync import STRATEGIES, AllReduceSGD, LocalSGD, SyncStrategy


def strategy_record(strategy):
    """The event's view of a strategy: its name and parameters.

    Example:

    >>> from keras_adapt.policies.sync_strategy import strategy_record
    >>> from keras_adapt.sync import LocalSGD
    >>> strategy_record(LocalSGD(period=8))
    {'sync_strategy': 'local_sgd', 'period': 8, 'start_after': 0}
    """
    return {"sync_strategy": strategy.name, **strategy.params()}


def _strategy_from(value):
    """A strategy from an object, a name or a :func:`strategy_record` dict."""
    if isinstance(value, dict) and value.get("sync_strategy") in STRATEGIES:
        params = {k: v for k, v in value.items() if k != "sync_strategy"}
        return STRATEGIES[value["sync_strategy"]](**params)
    if isinstance(value, str) and value in STRATEGIES:
        return STRATEGIES[value]()
    if isinstance(value, SyncStrategy):
        return value
    raise TypeError(f"local={value!r} is not a synchronisation strategy; use a keras_adapt.sync "
                    "strategy such as LocalSGD(period=8) or ModelAveraging(0.1), or its name")


class SyncStrategyPolicy(AdaptationPolicy):
    """Switches the workers between AllReduceSGD and a local strategy
    (local SGD, model averaging, BMUF, EASGD) while training runs.

    Every ``interval`` updates, once the statistics cover ``warmup_updates``
    updates, :meth:`choose` proposes a strategy from the measurements; the
    policy switches only when the same proposal came ``patience`` times in
    a row and at least ``min_switch_interval`` updates passed since the last
    switch. The default rules, in this order:

    1. **Post-local SGD** (``decay_ratio``): once the learning rate the user
       configured (the schedule, without keras-adapt's batch factor) has
       fallen to ``1 / decay_ratio`` of its peak, go local, for as long as
       it stays there (Lin et
       al., ICLR 2020: local SGD after the first decay keeps small-batch
       accuracy at a fraction of the communication).
    2. **Noise scale above the global batch** (``noise_high``): when
       ``gns > noise_high x B`` the averaged gradient of the whole global
       batch B is worth its allreduce (B is below the critical batch):
       AllReduceSGD.
    3. **Noise scale below the global batch** (``noise_low``): when
       ``gns < noise_low x B``, B is beyond the critical batch and averaging
       every gradient buys little per sample: go local, where each worker's
       step uses its own batch.
    4. **Communication** (``comm_fraction``, needs ``timing``): when the
       fraction of the step spent in the collective, as last measured under
       AllReduceSGD, is at least ``comm_fraction``, go local (one model
       allreduce per H updates instead of one gradient allreduce per update).
       The fraction measured *under* AllReduceSGD is kept, so the lower
       communication of local steps does not switch straight back.

    The statistics stay available under local strategies (one gradient
    allreduce per ``stats_interval``, see docs/sync_strategies.md). All
    inputs are identical on every rank (allreduced statistics, the
    schedule, allgathered timings), so every rank switches at the same
    update; the switch averages weights and slots (``SyncState.set``).
    Each switch records a ``sync_strategy`` event with the strategies
    before and after, their parameters and the reason.

    Write your own rule by overriding :meth:`choose` (see the example).

    Args:
        local: the local strategy to use (a ``keras_adapt.sync`` strategy;
            its name, or a :func:`strategy_record` dict; default
            ``LocalSGD(period=8)``). The optimizer must declare it and
            ``AllReduceSGD`` in ``sync_strategy=[...]``.
        noise_low, noise_high: the hysteresis band of rules 2 and 3, as
            multiples of the global batch (0 < noise_low < noise_high); None
            turns the noise rules off.
        comm_fraction: threshold of rule 4 in (0, 1), None to turn it off.
        timing: where rule 4 reads the communication fraction: an object with
            ``result()`` returning ``{"comm_fraction": float, ...}`` identical
            on every rank (``WorkerTimingMonitor``); None turns rule 4 off.
        decay_ratio: rule 1 fires when the configured learning rate is at
            most peak / decay_ratio (> 1); None turns it off.
        warmup_updates: updates the statistics must cover before any switch.
        patience: consecutive identical proposals needed to switch.
        min_switch_interval: updates between two switches.
        **kwargs: see :class:`AdaptationPolicy` (``interval``, ``log_dir``,
            ``verbose``).

    Example (a rule of your own: go local once the loss is below 0.5):

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.policies import SyncStrategyPolicy
    >>> from keras_adapt.sync import AllReduceSGD, LocalSGD
    >>> class LocalWhenConverging(SyncStrategyPolicy):
    ...     def choose(self, step, values):
    ...         if values.get("loss", 1.0) < 0.5:
    ...             return self.local, "loss below 0.5"
    ...         return None
    >>> opt = keras_adapt.DistributedOptimizer(
    ...     keras.optimizers.SGD(0.05), gradient_stats=True,
    ...     sync_strategy=[AllReduceSGD(), LocalSGD(period=4)])
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(opt, "mse")
    >>> policy = SyncStrategyPolicy(local=LocalSGD(period=4), interval=5, warmup_updates=0,
    ...                             patience=1, min_switch_interval=0)
    >>> x = np.random.default_rng(0).normal(size=(256, 4))
    >>> _ = model.fit(x, x.sum(1), batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    >>> opt.adapt_state.sync.strategy.name in ("allreduce_sgd", "local_sgd")
    True
    """

    needs_statistics = True

    def __init__(self, local=None, noise_low=0.5, noise_high=2.0, comm_fraction=0.3,
                 timing=None, decay_ratio=2.0, warmup_updates=50, patience=2,
                 min_switch_interval=100, **kwargs):
        super().__init__(**kwargs)
        local = _strategy_from(LocalSGD(period=8) if local is None else local)
        if not local.local:
            raise TypeError(
                f"local={local!r} is not a local strategy; use a keras_adapt.sync strategy "
                "other than AllReduceSGD, e.g. LocalSGD(period=8) or ModelAveraging(0.1)")
        self.local = local
        if (noise_low is None) != (noise_high is None):
            raise ValueError(f"noise_low={noise_low!r}, noise_high={noise_high!r}: give both "
                             "(a band 0 < noise_low < noise_high) or neither (no noise rules)")
        if noise_low is not None:
            noise_low = _check_nonneg_float("noise_low", noise_low, positive=True)
            noise_high = _check_nonneg_float("noise_high", noise_high, positive=True)
            if noise_low >= noise_high:
                raise ValueError(f"noise_low={noise_low!r} must be below noise_high="
                                 f"{noise_high!r} (the band keeps the policy from flapping)")
        self.noise_low, self.noise_high = noise_low, noise_high
        if comm_fraction is not None:
            comm_fraction = _check_nonneg_float("comm_fraction", comm_fraction, positive=True)
            if comm_fraction >= 1:
                raise ValueError(f"comm_fraction={comm_fraction!r} is not valid; use a "
                                 "fraction in (0, 1) or None")
        self.comm_fraction = comm_fraction
        if timing is not None and not callable(getattr(timing, "result", None)):
            raise TypeError(f"timing={timing!r} has no result() method; pass a "
                            "WorkerTimingMonitor (or an object whose result() returns "
                            "{'comm_fraction': ...}) or None")
        self.timing = timing
        if decay_ratio is not None:
            decay_ratio = _check_nonneg_float("decay_ratio", decay_ratio, positive=True)
            if decay_ratio <= 1:
                raise ValueError(f"decay_ratio={decay_ratio!r} is not valid; use a number > 1 "
                                 "(2 = after the learning rate halved) or None")
        self.decay_ratio = decay_ratio
        self.warmup_updates = _check_positive_int("warmup_updates", warmup_updates, 0)
        self.patience = _check_positive_int("patience", patience)
        self.min_switch_interval = _check_positive_int("min_switch_interval",
                                                       min_switch_interval, 0)
        self._reset_decisions()

    def _reset_decisions(self):
        self._last_switch = None  # update of the last switch
        self._proposal = None  # (strategy name, streak)
        self._peak_lr = None
        self._global_batch = 0.0
        self._sync_comm = None  # comm fraction last measured under AllReduceSGD

    # -- wiring ------------------------------------------------------------
    def on_attach(self, model):
        self.sync = model.optimizer.adapt_state.sync
        missing = [type(s).__name__ for s in (AllReduceSGD(), self.local)
                   if type(s) not in self.sync.candidates]
        if missing:
            raise ValueError(
                f"SyncStrategyPolicy switches between AllReduceSGD and "
                f"{type(self.local).__name__}, but the optimizer does not declare "
                f"{', '.join(missing)}. Create it with DistributedOptimizer(..., "
                f"sync_strategy=[AllReduceSGD(), {self.local!r}])")

    # -- measurements ----------------------------------------------------------
    def measurements(self):
        result = self.model.optimizer.gradient_statistics.result()
        self._global_batch = float(result["batch_size"])
        return super().measurements(result)

    def _inputs(self, values):
        """The values :meth:`choose` reads, completed: the global batch, the
        configured learning rate, the communication fraction and the strategy."""
        values = dict(values)
        values.setdefault("batch_size", self._global_batch)
        lr = base_learning_rate(self.model.optimizer)
        values["base_lr"] = lr
        if math.isfinite(lr):
            self._peak_lr = lr if self._peak_lr is None else max(self._peak_lr, lr)
            values["peak_lr"] = self._peak_lr
        values["sync_strategy"] = self.sync.strategy.name
        if self.timing is not None:
            comm = self.timing.result().get("comm_fraction")
            if comm is not None and math.isfinite(comm):
                values["comm_fraction"] = float(comm)
                if self.sync.strategy.name == AllReduceSGD.name:
                    self._sync_comm = float(comm)
        return values

    # -- the rule --------------------------------------------------------------
    def choose(self, step, values):
        """The proposed strategy as ``(strategy, reason)``, or None for no
        opinion. Override it to write your own rule.

        ``values``: the gradient statistics (``gns``, ``grad_snr``, ...),
        ``batch_size`` (global), ``base_lr`` (the configured learning rate)
        and ``peak_lr`` (its largest value so far),
        ``sync_strategy`` (the name in use), ``comm_fraction`` when a timing
        source is set, and the epoch's logs at epoch end. Return
        ``self.local`` or ``AllReduceSGD()`` (or any declared strategy).
        """
        lr, peak = values.get("base_lr"), values.get("peak_lr")
        if self.decay_ratio is not None and peak is not None and lr <= peak / self.decay_ratio:
            return self.local, (f"post-local SGD: the learning rate decayed to {lr:.4g} "
                                f"from its peak {peak:.4g}")
        gns, batch = values.get("gns"), values.get("batch_size")
        noisy = gns is not None and math.isfinite(gns) and batch and batch > 0
        if self.noise_high is not None and noisy and gns > self.noise_high * batch:
            return AllReduceSGD(), f"gns {gns:.4g} > {self.noise_high:g} x global batch {batch:g}"
        if self.noise_low is not None and noisy and gns < self.noise_low * batch:
            return self.local, f"gns {gns:.4g} < {self.noise_low:g} x global batch {batch:g}"
        comm = self._sync_comm
        if self.comm_fraction is not None and comm is not None and comm >= self.comm_fraction:
            return self.local, (f"communication {comm:.0%} of the AllReduceSGD step "
                                f">= {self.comm_fraction:.0%}")
        return None

    # -- the hooks -------------------------------------------------------------
    def on_adapt_begin(self, values):
        self._proposal = None

    def adapt(self, step, values):
        covered = values.get("covered_updates", 0)
        values = self._inputs(values)
        proposal = self.choose(step, values)
        if covered < self.warmup_updates or proposal is None:
            self._proposal = None
            return
        strategy, reason = proposal
        current = self.sync.strategy
        if type(strategy) is type(current):
            self._proposal = None
            return
        streak = self._proposal[1] + 1 if self._proposal and self._proposal[0] == strategy.name else 1
        self._proposal = (strategy.name, streak)
        if streak < self.patience:
            return
        if self._last_switch is not None and step - self._last_switch < self.min_switch_interval:
            return
        self.switch(strategy, reason)
        self._last_switch = step
        self._proposal = None

    def switch(self, strategy, reason):
        """Switches to ``strategy`` now (every rank must call it at the same
        step) and records a ``sync_strategy`` event."""
        before = strategy_record(self.sync.strategy)
        self.sync.set(strategy)
        self.record("sync_strategy", reason, before, strategy_record(self.sync.strategy))

    def log_values(self):
        return {"sync_strategy": self.sync.strategy.index}

    # -- state -----------------------------------------------------------------
    def get_state(self):
        state = super().get_state()
        state.update(strategy=self.sync.strategy.name, strategy_params=self.sync.strategy.params(),
                     last_switch=self._last_switch, peak_lr=self._peak_lr,
                     sync_comm=self._sync_comm)
        return state

    def restore(self, state):
        super().restore(state)
        self._last_switch = state.get("last_switch")
        self._peak_lr = state.get("peak_lr")
        self._sync_comm = state.get("sync_comm")
        name = state.get("strategy")
        if name is not None and name != self.sync.strategy.name:
            self.sync.set(name, **state.get("strategy_params", {}))

    def get_config(self):
        config = super().get_config()
        config.update(local=strategy_record(self.local), noise_low=self.noise_low, noise_high=self.noise_high,
                      comm_fraction=self.comm_fraction, decay_ratio=self.decay_ratio,
                      warmup_updates=self.warmup_updates, patience=self.patience,
                      min_switch_interval=self.min_switch_interval)
        return config
