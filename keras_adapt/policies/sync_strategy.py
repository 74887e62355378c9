"""SyncStrategyPolicy: chooses the synchronisation period H (H = 1: AllReduceSGD) from measurements."""

import math

from keras_adapt.checks import check_float, check_int
from keras_adapt.optimizer import base_learning_rate
from keras_adapt.policies.base import AdaptationPolicy
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


def period_level(ratio, current, max_period, hysteresis):
    """The synchronisation period H for a noise-scale ratio: the largest power
    of two at most ``ratio``, within [1, ``max_period``], moved away from
    ``current`` only when ``ratio`` passes the boundary by the factor
    ``1 + hysteresis`` (up: ``ratio / (1 + hysteresis)`` reaches the new
    level; down: ``ratio x (1 + hysteresis)`` falls below ``current``).

    ``ratio`` is ``noise_scale x B_noise / B`` (see :class:`SyncStrategyPolicy`).

    Example:

    >>> from keras_adapt.policies.sync_strategy import period_level
    >>> period_level(2.5, 1, 8, 0.25), period_level(2.2, 1, 8, 0.25)  # 2.5 / 1.25 = 2
    (2, 1)
    >>> period_level(1.7, 2, 8, 0.25), period_level(1.5, 2, 8, 0.25)  # 1.7 x 1.25 > 2
    (2, 1)
    >>> period_level(100.0, 1, 8, 0.25), period_level(0.1, 4, 8, 0.25)
    (8, 1)
    """
    def level(r):
        h = 1
        while 2 * h <= min(r, max_period):
            h *= 2
        return h

    up, down = level(ratio / (1 + hysteresis)), level(ratio * (1 + hysteresis))
    if up > current:
        return up
    if down < current:
        return down
    return min(current, max_period)


class SyncStrategyPolicy(AdaptationPolicy):
    """Chooses how often the workers synchronise -- the period H of a local
    strategy, H = 1 being AllReduceSGD -- from measurements, while training runs.

    Every ``interval`` updates, once the statistics cover ``warmup_updates``
    updates, :meth:`choose` proposes a strategy from the measurements; the
    policy changes it only when the same proposal came ``patience`` times in
    a row and at least ``min_switch_interval`` updates passed since the last
    change. The default rule, for a local strategy with a period (LocalSGD,
    BlockMomentum, ElasticAveraging) whose declared period is the largest,
    H_max:

    1. **Communication** (``comm_fraction``, with ``timing``): local steps
       only pay when the collective is a large part of the step. Until the
       fraction of the step spent in it, as last measured under
       AllReduceSGD, is at least ``comm_fraction``: H = 1 (AllReduceSGD).
       The fraction measured *under* AllReduceSGD is kept, so the lower
       communication of local steps does not switch straight back. Without
       ``timing`` this gate is open.
    2. **Noise scale** (``noise_scale``): H = the largest power of two with
       H x B <= ``noise_scale`` x B_noise, in [1, H_max] (B: the global batch,
       B_noise: the gradient noise scale ``gns``). Between two averagings
       the workers turn H x B samples into one change of the common model;
       McCandlish et al. (2018) find that a step on a batch B' costs about
       1 + B_noise / B' times the minimal number of steps and 1 + B' / B_noise
       times the minimal samples, so at H x B ~ B_noise a round uses at most
       about twice the samples of the most sample-efficient training. The
       noise scale grows as the loss falls, so H grows over training. A
       change needs the ratio beyond the level's boundary by the factor
       ``1 + hysteresis`` (:func:`period_level`).
    3. **Schedule** (``decay_ratio``): once the learning rate the user
       configured (the schedule, without keras-adapt's batch factor) has
       fallen to ``1 / decay_ratio`` of its peak, H >= ``decay_period``
       (default H_max), whatever rules 1 and 2 say: post-local SGD (Lin et
       al., ICLR 2020: local SGD after the first decay keeps small-batch
       accuracy at a fraction of the communication).

    A local strategy without a period (ModelAveraging) is used where the rule
    says H >= 2. Changing only the period keeps the strategy: no averaging,
    the count towards the next averaging goes on (the next one comes at most
    H - 1 updates later), and the statistics keep being measured at the
    first update after an averaging (exact, see docs/sync_strategies.md).

    All inputs are identical on every rank (allreduced statistics, the
    schedule, allgathered timings), so every rank changes at the same
    update; a switch of strategy averages weights and slots
    (``SyncState.set``). Each change records a ``sync_strategy`` event with
    the strategies before and after, their parameters (the period) and the
    reason.

    Write your own rule by overriding :meth:`choose` (see the example).

    Args:
        local: the local strategy (a ``keras_adapt.sync`` strategy, its
            name, or a :func:`strategy_record` dict; default
            ``LocalSGD(period=8)``); its period is H_max. The optimizer must
            declare its class and ``AllReduceSGD`` in ``sync_strategy=[...]``.
        noise_scale: the factor of rule 2 (> 0), None to turn it off (then
            H = H_max wherever rule 1 allows local steps).
        hysteresis: the margin of rule 2 (>= 0).
        comm_fraction: threshold of rule 1 in (0, 1), None to turn it off.
        timing: where rule 1 reads the communication fraction: an object with
            ``result()`` returning ``{"comm_fraction": float, ...}`` identical
            on every rank (``WorkerTimingMonitor``); None turns rule 1 off.
        decay_ratio: rule 3 applies when the configured learning rate is at
            most peak / decay_ratio (> 1); None turns it off.
        decay_period: the smallest H after a decay (>= 2, at most H_max;
            None: H_max).
        warmup_updates: updates the statistics must cover before any change.
        patience: consecutive identical proposals needed to change.
        min_switch_interval: updates between two changes.
        **kwargs: see :class:`AdaptationPolicy` (``interval``, ``log_dir``,
            ``verbose``).

    Example (a rule of your own: local SGD with H = 4 once the loss is below 0.5):

    >>> import numpy as np, keras, keras_adapt
    >>> from keras_adapt.policies import SyncStrategyPolicy
    >>> from keras_adapt.sync import AllReduceSGD, LocalSGD
    >>> class LocalWhenConverging(SyncStrategyPolicy):
    ...     def choose(self, step, values):
    ...         if values.get("loss", 1.0) < 0.5:
    ...             return self.local.with_params(period=4), "loss below 0.5"
    ...         return None
    >>> opt = keras_adapt.DistributedOptimizer(
    ...     keras.optimizers.SGD(0.05), gradient_stats=True,
    ...     sync_strategy=[AllReduceSGD(), LocalSGD(period=8)])
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(opt, "mse")
    >>> policy = SyncStrategyPolicy(local=LocalSGD(period=8), interval=5, warmup_updates=0,
    ...                             patience=1, min_switch_interval=0)
    >>> x = np.random.default_rng(0).normal(size=(256, 4))
    >>> _ = model.fit(x, x.sum(1), batch_size=8, epochs=1, verbose=0, callbacks=[policy])
    >>> opt.adapt_state.sync.strategy.name in ("allreduce_sgd", "local_sgd")
    True
    """

    needs_statistics = True

    def __init__(self, local=None, noise_scale=1.0, hysteresis=0.25, comm_fraction=0.3,
                 timing=None, decay_ratio=2.0, decay_period=None, warmup_updates=50,
                 patience=2, min_switch_interval=100, **kwargs):
        super().__init__(**kwargs)
        local = _strategy_from(LocalSGD(period=8) if local is None else local)
        if not local.local:
            raise TypeError(
                f"local={local!r} is not a local strategy; use a keras_adapt.sync strategy "
                "other than AllReduceSGD, e.g. LocalSGD(period=8) or ModelAveraging(0.1)")
        self.local = local
        #: H_max, the largest period: the local strategy's ``period`` (a strategy
        #: without a period, such as ModelAveraging, counts as 2).
        self.max_period = local.params().get("period", 2)
        if noise_scale is not None:
            noise_scale = check_float("noise_scale", noise_scale, low_open=True)
        self.noise_scale = noise_scale
        self.hysteresis = check_float("hysteresis", hysteresis)
        if comm_fraction is not None:
            comm_fraction = check_float("comm_fraction", comm_fraction, 0.0, 1.0, low_open=True,
                                        high_open=True, fix="use a fraction in (0, 1) or None")
        self.comm_fraction = comm_fraction
        if timing is not None and not callable(getattr(timing, "result", None)):
            raise TypeError(f"timing={timing!r} has no result() method; pass a "
                            "WorkerTimingMonitor (or an object whose result() returns "
                            "{'comm_fraction': ...}) or None")
        self.timing = timing
        if decay_ratio is not None:
            decay_ratio = check_float("decay_ratio", decay_ratio, 1.0, low_open=True,
                                      fix="use a number > 1 (2 = after the learning rate "
                                          "halved) or None")
        self.decay_ratio = decay_ratio
        if decay_period is not None:
            decay_period = check_int("decay_period", decay_period, 2)
            if decay_period > self.max_period:
                raise ValueError(f"decay_period={decay_period!r} exceeds the local strategy's "
                                 f"period {self.max_period} (the largest H); use at most "
                                 f"{self.max_period} or a local strategy with a longer period")
        self.decay_period = decay_period
        self.warmup_updates = check_int("warmup_updates", warmup_updates, 0)
        self.patience = check_int("patience", patience)
        self.min_switch_interval = check_int("min_switch_interval", min_switch_interval, 0)
        self._reset_decisions()

    def _reset_decisions(self):
        self._last_switch = None  # update of the last change
        self._proposal = None  # (strategy, streak)
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
        values["period"] = self.period()
        if self.timing is not None:
            comm = self.timing.result().get("comm_fraction")
            if comm is not None and math.isfinite(comm):
                values["comm_fraction"] = float(comm)
                if self.sync.strategy.name == AllReduceSGD.name:
                    self._sync_comm = float(comm)
        return values

    # -- the rule --------------------------------------------------------------
    def period(self, strategy=None):
        """H of ``strategy`` (default: the one in use): 1 for AllReduceSGD, the
        period of a local strategy, 2 for one without a period."""
        strategy = self.sync.strategy if strategy is None else strategy
        if not strategy.local:
            return 1
        return strategy.params().get("period", 2)

    def with_period(self, period):
        """The strategy for period H: AllReduceSGD for H = 1, else the local
        strategy with period H (a strategy without a period as it is)."""
        if period <= 1:
            return AllReduceSGD()
        if "period" in self.local.params():
            return self.local.with_params(period=int(period))
        return self.local

    def choose(self, step, values):
        """The proposed strategy as ``(strategy, reason)``, or None for no
        opinion. Override it to write your own rule.

        ``values``: the gradient statistics (``gns``, ``grad_snr``, ...),
        ``batch_size`` (global), ``base_lr`` (the configured learning rate)
        and ``peak_lr`` (its largest value so far),
        ``sync_strategy`` (the name in use), ``period`` (H in use, 1 for
        AllReduceSGD), ``comm_fraction`` when a timing source is set, and the
        epoch's logs at epoch end. Return ``AllReduceSGD()`` or a declared
        local strategy, e.g. ``self.with_period(4)`` or ``self.local``.
        """
        current = values.get("period", self.period())
        lr, peak = values.get("base_lr"), values.get("peak_lr")
        floor, floor_reason = 1, ""
        if self.decay_ratio is not None and peak is not None and lr <= peak / self.decay_ratio:
            floor = self.decay_period or self.max_period
            floor_reason = (f"post-local SGD: the learning rate decayed to {lr:.4g} from its "
                            f"peak {peak:.4g}")
        comm = self._sync_comm
        gated = self.timing is not None and self.comm_fraction is not None
        if gated and (comm is None or comm < self.comm_fraction):
            period = 1
            reason = ("communication not measured yet" if comm is None else
                      f"communication {comm:.0%} of the AllReduceSGD step "
                      f"< {self.comm_fraction:.0%}")
        elif self.noise_scale is None:
            period = self.max_period
            reason = (f"communication {comm:.0%} of the AllReduceSGD step "
                      f">= {self.comm_fraction:.0%}") if gated else "the local strategy (no noise rule)"
        else:
            gns, batch = values.get("gns"), values.get("batch_size")
            if gns is None or not math.isfinite(gns) or not batch or batch <= 0:
                period, reason = current, "no noise scale"  # no opinion from rule 2
            else:
                ratio = self.noise_scale * gns / batch
                period = period_level(ratio, current, self.max_period, self.hysteresis)
                reason = (f"noise scale {gns:.4g} x {self.noise_scale:g} = {ratio:.3g} x global "
                          f"batch {batch:g}")
        if floor > period:
            return self.with_period(floor), floor_reason
        if reason == "no noise scale":
            return None
        return self.with_period(period), reason

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
        if strategy == self.sync.strategy:
            self._proposal = None
            return
        streak = self._proposal[1] + 1 if self._proposal and self._proposal[0] == strategy else 1
        self._proposal = (strategy, streak)
        if streak < self.patience:
            return
        if self._last_switch is not None and step - self._last_switch < self.min_switch_interval:
            return
        if not strategy.local or "period" in strategy.params():
            reason = f"{reason}: period {self.period(strategy)}"
        self.switch(strategy, reason)
        self._last_switch = step
        self._proposal = None

    def switch(self, strategy, reason):
        """Switches to ``strategy`` (or changes its period) now -- every rank
        must call it at the same step -- and records a ``sync_strategy`` event."""
        before = strategy_record(self.sync.strategy)
        self.sync.set(strategy)
        self.record("sync_strategy", reason, before, strategy_record(self.sync.strategy))

    def log_values(self):
        return {"sync_strategy": self.sync.strategy.index}

    # -- state -----------------------------------------------------------------
    def get_state(self):
        kept = self.state_until_attached()
        if kept is not None:
            return kept
        state = super().get_state()
        state.update(last_switch=self._last_switch, peak_lr=self._peak_lr,
                     sync_comm=self._sync_comm)
        if self.model is not None:  # attached: the optimizer's strategy is known
            state.update(strategy=self.sync.strategy.name,
                         strategy_params=self.sync.strategy.params())
        return state

    def restore(self, state):
        if self.keep_until_attached(state):
            return  # no optimizer yet: applied when Keras attaches the policy
        super().restore(state)
        self._last_switch = state.get("last_switch")
        self._peak_lr = state.get("peak_lr")
        self._sync_comm = state.get("sync_comm")
        name = state.get("strategy")
        if name is not None and name != self.sync.strategy.name:
            self.sync.set(name, **state.get("strategy_params", {}))

    def get_config(self):
        config = super().get_config()
        config.update(local=strategy_record(self.local), noise_scale=self.noise_scale,
                      hysteresis=self.hysteresis, comm_fraction=self.comm_fraction,
                      decay_ratio=self.decay_ratio, decay_period=self.decay_period,
                      warmup_updates=self.warmup_updates, patience=self.patience,
                      min_switch_interval=self.min_switch_interval)
        return config
