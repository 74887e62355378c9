"""GoodputBatchSizePolicy: the batch that maximises throughput x statistical efficiency."""

import math
import time

import numpy as np

from keras_adapt import _hvd
from keras_adapt.policies.base import _check_positive_int
from keras_adapt.policies.batch_size_policy import BatchSizePolicy


def statistical_efficiency(batch, base_batch, gns):
    """Pollux's statistical efficiency E(M) = (phi + M0) / (phi + M), phi = B_simple.

    The progress one sample makes at batch M relative to the base batch M0:
    1 at M0, falling toward M0 / M once M is far beyond the noise scale.

    Example:

    >>> from keras_adapt.policies.goodput_batch_size import statistical_efficiency
    >>> statistical_efficiency(96, 32, 32.0)
    0.5
    """
    return (gns + base_batch) / (gns + batch)


class GoodputBatchSizePolicy(BatchSizePolicy):
    """Chooses the global batch with the highest goodput (Pollux, OSDI'21).

    goodput(M) = throughput(M) x E(M): samples per second, discounted by how
    much each sample is worth at batch M given the noise scale phi
    (:func:`statistical_efficiency`, relative to ``min_batch``).

    Throughput comes from the step times this job measured (from one step's
    begin to the next, the time training really takes; the median ignores
    the odd slow step, such as one with an evaluation): the time per update
    at each global batch it ran (median, averaged over the workers so
    every rank decides alike), fitted with T(M) = alpha + beta x M by least
    squares (Pollux and CM-DARE use the same linear compute model). With
    only one batch size measured the policy explores the next candidate
    once. Candidates are ``min_batch x 2^i`` up to ``max_batch``.

    It changes the batch when the best candidate's predicted goodput beats
    the current one's by more than ``hysteresis``, at most every
    ``min_change_interval`` updates, once the statistics cover
    ``warmup_updates`` optimizer updates.

    Args:
        min_batch, max_batch: bounds of the global batch.
        hysteresis: relative goodput gain required for a change (>= 0).
        min_change_interval: updates between changes.
        warmup_updates: optimizer updates the statistics must cover before
            the first decision (independent of ``stats_interval``).
        measure_updates: timed updates needed at a batch before it counts.
        explore: try a second batch size when only one was measured.
        **kwargs: see :class:`BatchSizePolicy`.

    Example:

    >>> from keras_adapt.policies import GoodputBatchSizePolicy
    >>> policy = GoodputBatchSizePolicy(min_batch=32, max_batch=512, micro_batch_size=32)
    >>> policy.candidates()
    [32, 64, 128, 256, 512]
    >>> policy.best_batch({32: 0.010, 64: 0.012}, gns=200.0)   # time/update at two sizes
    128
    """

    needs_statistics = True

    def __init__(self, min_batch, max_batch, hysteresis=0.05, min_change_interval=50,
                 warmup_updates=50, measure_updates=10, explore=True, **kwargs):
        super().__init__(min_batch, max_batch, **kwargs)
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, (int, float)) \
                or not math.isfinite(hysteresis) or hysteresis < 0:
            raise ValueError(f"hysteresis={hysteresis!r} is not valid; use a float >= 0")
        self.hysteresis = float(hysteresis)
        self.min_change_interval = _check_positive_int("min_change_interval", min_change_interval, 0)
        self.warmup_updates = _check_positive_int("warmup_updates", warmup_updates, 0)
        self.measure_updates = _check_positive_int("measure_updates", measure_updates)
        if not isinstance(explore, bool):
            raise TypeError(f"explore must be True or False, got {explore!r}")
        self.explore = explore
        self.update_times = {}  # global batch -> seconds per update (this rank)
        self._t_begin = None  # perf_counter at the current step's begin
        self._t_sum = 0.0  # step time since the last update
        self._explored = False

    def candidates(self):
        """Global batches considered: min_batch x 2^i up to max_batch."""
        out, b = [], self.min_batch
        while b < self.max_batch:
            out.append(b)
            b *= 2
        return out + [self.max_batch]

    # -- measuring -----------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._t_begin = None
        self._t_sum = 0.0
        super().on_train_begin(logs)

    def on_train_batch_begin(self, batch, logs=None):
        # One micro-step's time is begin to next begin: what training
        # actually gets through, including the callbacks' per-step cost.
        now = time.perf_counter()
        if self._t_begin is not None and self._step_running:
            self._t_sum += now - self._t_begin
        self._t_begin = now
        super().on_train_batch_begin(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        # The epoch's last step ends with evaluation and epoch callbacks:
        # do not count it.
        self._t_begin = None
        self._t_sum = 0.0
        super().on_epoch_end(epoch, logs)

    def on_update_end(self):
        if self.batch.value is not None and self._t_sum > 0.0:
            self.update_times.setdefault(self.batch.value, []).append(self._t_sum)
        self._t_sum = 0.0

    def _agreed_times(self):
        """Median time per update for each well-measured batch, averaged over
        the workers (one small collective, same call on every rank)."""
        sizes = sorted(b for b, ts in self.update_times.items() if len(ts) > self.measure_updates)
        if not sizes:
            return {}
        # The first update after a change is dropped: it pays for new shapes.
        local = [float(np.median(self.update_times[b][1:])) for b in sizes]
        agreed = _hvd.host_allreduce_mean(local, name=f"keras_adapt_goodput_{len(sizes)}")
        return dict(zip(sizes, (float(t) for t in agreed)))

    # -- deciding -----------------------------------------------------------
    def throughput_model(self, times):
        """(alpha, beta) of T(M) = alpha + beta x M fitted to ``{M: seconds}``."""
        sizes = np.array(sorted(times), dtype=np.float64)
        t = np.array([times[s] for s in sorted(times)], dtype=np.float64)
        if len(sizes) == 1:
            return 0.0, float(t[0] / sizes[0])  # proportional until we know better
        beta, alpha = np.polyfit(sizes, t, 1)
        if beta <= 0:  # noisy measurements: fall back to the slowest marginal cost seen
            beta = float(np.max(t / sizes)) * 1e-3
        return float(max(alpha, 0.0)), float(beta)

    def goodput(self, batch, gns, model):
        """Predicted goodput of ``batch`` (samples/s x efficiency)."""
        alpha, beta = model
        return batch / (alpha + beta * batch) * statistical_efficiency(batch, self.min_batch, gns)

    def best_batch(self, times, gns):
        """The candidate with the highest predicted goodput."""
        model = self.throughput_model(times)
        return max(self.candidates(), key=lambda b: self.goodput(b, gns, model))

    def decide(self, step, values):
        gns = values.get("gns")
        if gns is None or not math.isfinite(gns) or values.get("covered_updates", 0) < self.warmup_updates:
            return
        if self._last_change is not None and step - self._last_change < self.min_change_interval:
            return
        times = self._agreed_times()
        current = self.batch.value
        if current not in times:
            return
        if len(times) == 1 and self.explore and not self._explored:
            bigger = [b for b in self.candidates() if b > current]
            if bigger:
                self._explored = True
                self.change_batch(bigger[0], f"exploring: only batch {current} measured "
                                  f"({current / times[current]:.0f} samples/s)", values)
            return
        model = self.throughput_model(times)
        best = self.best_batch(times, gns)
        now, then = self.goodput(current, gns, model), self.goodput(best, gns, model)
        if best != current and then > now * (1.0 + self.hysteresis):
            self.change_batch(best, f"goodput {then:.0f} at {best} vs {now:.0f} at {current} "
                              f"(gns {gns:.1f}, T = {model[0]*1e3:.2f} ms + "
                              f"{model[1]*1e6:.2f} us x M)", values)

    def get_state(self):
        state = super().get_state()
        state["update_times"] = {str(b): ts[-200:] for b, ts in self.update_times.items()}
        state["explored"] = self._explored
        return state

    def restore(self, state):
        super().restore(state)
        self.update_times = {int(b): list(ts) for b, ts in state.get("update_times", {}).items()}
        self._explored = bool(state.get("explored", False))

    def get_config(self):
        config = super().get_config()
        config.update(hysteresis=self.hysteresis, min_change_interval=self.min_change_interval,
                      warmup_updates=self.warmup_updates, measure_updates=self.measure_updates,
                      explore=self.explore)
        return config
