"""Host time the batch-size policies add per optimizer update, against training without one.

Run from the repository (it launches itself on 2 local workers):

    .venv/bin/python benchmarks/policy_overhead.py            # primary stack
    .venv-keras2/bin/python benchmarks/policy_overhead.py     # legacy stack
    .venv/bin/python benchmarks/policy_overhead.py --quick    # smoke run (seconds)

A policy works on the host between two steps: every update it counts
(host arithmetic), every ``interval`` updates (10) it reads the gradient
statistics and the learning rate, agrees its timings over the workers (the
goodput policy), fits its throughput model and decides. On a large model
that is nothing; on a small one it is a visible part of a step, which is
where adaptive batch sizes are compared with fixed ones
(``benchmarks/time_to_accuracy.py``: the digits MLP steps in 3-7 ms here).

The task is that digits MLP (64-128-128-10, scikit-learn's digits), a
global batch of 32 (16 per worker) from an ``AdaptiveBatchDataset``, SGD
with momentum and gradient statistics on in every configuration:

* ``baseline``: no policy;
* ``gns``: ``GNSBatchSizePolicy`` at its defaults (linear learning-rate rule);
* ``goodput``: ``GoodputBatchSizePolicy`` at its defaults (AdaScale, the
  throughput model);
* ``baseline_again``: a second ``baseline``, built last; its ratio to
  ``baseline`` (``ratio_aa``) is what the run cannot resolve.

Both policies have ``min_batch = max_batch = 32``: they do all their work
but never change the batch, so every configuration trains the same steps
(the goodput policy's choice then ends at "32 is the largest candidate",
after its fit; pricing the candidates is a few predictions more).
Configurations run in the same two processes, interleaved in rounds of
alternating order. Per round and configuration: the mean wall and process
CPU time per step (ratios to ``baseline`` taken within the round, then the
median over rounds, with the smallest and largest round ratio) and the host
time inside the policy's own Keras hooks per update (``host_ms``, timed
around each hook on rank 0: the resolving number, since the step-time
ratios carry the machine's noise).

Prints a table and one JSON line:
``{"bench": "policy_overhead", "stack": ..., "host_ms_gns": ..., "host_ms_goodput": ...,
"wall_ratio_gns": ..., "cpu_ratio_gns": ..., ..., "ratio_aa": ...}``.
"""

import json
import os
import statistics
import time

from _workers import parser as worker_parser
from _workers import describe_stack, pin_worker, run_on_workers, write_result

CONFIGS = ("baseline", "gns", "goodput", "baseline_again")
POLICIES = ("gns", "goodput")
HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end",
         "on_epoch_end", "on_train_end")


def launch(args):
    rounds, steps = (2, 60) if args.quick else (args.rounds, args.steps)
    report(run_on_workers(__file__, ["--rounds", rounds, "--steps", steps], "policy_overhead_"))


def report(result):
    rounds = result["rounds"]
    n = len(rounds["wall"]["baseline"])

    def round_ratios(clock, a, b):
        return [rounds[clock][a][i] / rounds[clock][b][i] for i in range(n)]

    def ratio(clock, a, b="baseline"):
        return round(statistics.median(round_ratios(clock, a, b)), 4)

    def spread(clock, a, b="baseline"):
        rr = round_ratios(clock, a, b)
        return [round(min(rr), 4), round(max(rr), 4)]

    host = {p: statistics.median(result["host_ms"][p]) for p in POLICIES}
    print(f"\npolicy overhead, stack={result['stack']} ({result['versions']}), 2 workers, "
          f"Gloo, digits MLP, global batch 32, {n} rounds x {result['steps']} steps; load "
          f"average before/after: {result['load']}")
    print(f"{'configuration':15s} {'wall ms/step':>12s} {'cpu ms/step':>12s} "
          f"{'wall ratio':>18s} {'cpu ratio':>18s} {'host ms/update':>15s}")
    for c in CONFIGS:
        wall = statistics.median(rounds["wall"][c])
        cpu = statistics.median(rounds["cpu"][c])
        cells = ["", ""] if c == "baseline" else [
            f"{ratio('wall', c):.3f} {spread('wall', c)}", f"{ratio('cpu', c):.3f} {spread('cpu', c)}"]
        extra = f"{host[c]:.3f}" if c in host else ""
        print(f"{c:15s} {wall:12.3f} {cpu:12.3f} {cells[0]:>18s} {cells[1]:>18s} {extra:>15s}")
    line = {"bench": "policy_overhead", "stack": result["stack"], "rounds": n,
            "steps": result["steps"]}
    for p in POLICIES:
        line[f"host_ms_{p}"] = round(host[p], 4)
        line[f"host_ms_{p}_spread"] = [round(min(result["host_ms"][p]), 4),
                                       round(max(result["host_ms"][p]), 4)]
        for clock in ("wall", "cpu"):
            line[f"{clock}_ratio_{p}"] = ratio(clock, p)
            line[f"{clock}_spread_{p}"] = spread(clock, p)
    line["ratio_aa"] = ratio("wall", "baseline_again")
    line["cpu_ratio_aa"] = ratio("cpu", "baseline_again")
    line["baseline_ms"] = round(statistics.median(rounds["wall"]["baseline"]), 4)
    line["changes"] = result["changes"]
    line["load"] = result["load"]
    print(json.dumps(line))


class HookClock:
    """Wraps one callback object's Keras hooks (on the object, not its
    class) and adds up the wall time spent inside them."""

    def __init__(self, callback):
        self.seconds = 0.0
        for name in HOOKS:
            setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


def worker(args):
    pin_worker()
    import keras
    from sklearn.datasets import load_digits

    import keras_adapt
    from keras_adapt.data import AdaptiveBatchDataset
    from keras_adapt.policies import GNSBatchSizePolicy, GoodputBatchSizePolicy

    rank, size = keras_adapt.rank(), keras_adapt.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")

    class StepClock(keras.callbacks.Callback):
        """Wall and CPU time from the end of the first step to the last."""

        def on_train_batch_end(self, batch, logs=None):
            now = (time.perf_counter(), time.process_time())
            if batch == 0:
                self.first, self.steps = now, 0
            else:
                self.last, self.steps = now, self.steps + 1

        def per_step(self):
            return {clock: (self.last[i] - self.first[i]) / self.steps
                    for i, clock in enumerate(("wall", "cpu"))}

    setups = {}
    for config in CONFIGS:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                       gradient_stats=True),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=32 // size, seed=0)
        callbacks, clock = [], None
        if config in POLICIES:
            cls = GNSBatchSizePolicy if config == "gns" else GoodputBatchSizePolicy
            policy = cls(32, 32, dataset=ds)
            clock = HookClock(policy)
            callbacks.append(policy)
        # traced and past the policies' warm-up here, not in the rounds
        model.fit(ds.dataset, steps_per_epoch=60, epochs=1, verbose=0, callbacks=callbacks)
        setups[config] = (model, ds, callbacks, clock)

    load_before = os.getloadavg()[0]
    times = {c: [] for c in CONFIGS}
    host_ms = {c: [] for c in POLICIES}
    for r in range(args.rounds):
        for config in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
            model, ds, callbacks, clock = setups[config]
            timer = StepClock()
            updates = int(model.optimizer.iterations.numpy())
            if clock is not None:
                clock.seconds = 0.0
            model.fit(ds.dataset, steps_per_epoch=args.steps, epochs=1, verbose=0,
                      callbacks=callbacks + [timer])
            times[config].append(timer.per_step())
            if clock is not None:
                updates = int(model.optimizer.iterations.numpy()) - updates
                host_ms[config].append(clock.seconds / updates * 1e3)
    changes = {c: sum(e["kind"] == "batch_size" for e in setups[c][2][0].events)
               for c in POLICIES}
    result = {
        **describe_stack(load_before),
        "steps": args.steps,
        "rounds": {clock: {c: [t[clock] * 1e3 for t in times[c]] for c in CONFIGS}
                   for clock in ("wall", "cpu")},
        "host_ms": host_ms,
        "changes": changes,
    }
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400, help="timed steps per round")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds x 60 steps")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
