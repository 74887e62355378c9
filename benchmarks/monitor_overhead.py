"""Step-time overhead of keras-adapt's DistributedOptimizer vs plain Horovod.

Run from the repository (it launches itself on 2 local workers):

    .venv/bin/python benchmarks/monitor_overhead.py          # primary stack
    .venv-keras2/bin/python benchmarks/monitor_overhead.py   # legacy stack
    python benchmarks/monitor_overhead.py --np 1 --gpu       # one GPU (tools/gpu_check.sh)

Each worker is pinned to its own core. Configurations are timed in the same
processes, interleaved in rounds of alternating order:

* ``baseline``: on tf.keras 2, Horovod's own ``hvd.DistributedOptimizer``; on
  Keras 3, where that cannot run, the minimal pattern that does: a Keras
  optimizer subclass whose ``apply_gradients`` averages with
  ``hvd.grouped_allreduce``;
* ``off``: ``keras_adapt.DistributedOptimizer(gradient_stats=False)``;
* ``on``: with gradient statistics at the defaults (``stats_interval``, no
  non-finite check; the C++ op);
* ``on_skip``: as ``on`` with ``skip_nonfinite=True`` (a pass over the local
  gradient and a guarded update on every update), for reference;
* ``on_every``: with gradient statistics on every update (``stats_interval=1``);
* ``on_twin``: as ``on_every`` with the pure-TF twin of the op;
* ``baseline_again``: a second ``baseline``, built last. The graph is the
  baseline's, so its ratio to ``baseline`` (``ratio_aa``, an A/A
  comparison) is what this run cannot resolve: the build order, where the
  models sit in memory, the machine. A ratio within ``ratio_aa``'s distance
  of 1 is not a measured cost.

Three clocks per step: wall time; this process's CPU time
(``time.process_time``, all threads); and the CPU time of its compute threads
(``compute``: every thread but those ``hvd.init()`` started, read from
``/proc/self/task/*/schedstat`` in nanoseconds). On a shared machine other
processes stretch the wall time but not the CPU time a step needs, so the CPU
ratios resolve small overheads that the wall ratios cannot. Horovod's
background thread polls on a timer, so its CPU time grows with the wall time
and carries the wall time's noise into ``cpu``; ``compute`` leaves it out (the
work that differs between the configurations -- the graph -- runs on the
compute threads; our one extra 12-byte tensor in the allreduce of measured
updates is the only difference on Horovod's side). Per round and configuration the mean over the round's
steps is taken (a mean, not a median: with ``stats_interval`` N only one
step in N does the measurement), the ratio to the baseline is taken within
the round (same machine state), then the median over rounds; ``spread_*``
gives the smallest and largest round ratio.

Prints a table and one JSON line:
``{"bench": "monitor_overhead", "stack": ..., "stats_interval": ..., "ratio_off": ...,
"ratio_on": ..., "ratio_on_skip": ..., "ratio_on_every": ..., ...}`` where ``ratio_*`` are
compute-thread CPU-time ratios, ``cpu_ratio_*`` process CPU-time ratios and
``wall_ratio_*`` wall-time ones (ours / baseline, averaged over the two models
within a round); ``ratio_aa`` = baseline_again / baseline, the run's A/A resolution;
op_vs_twin = on_every / on_twin (compute CPU).
"""

import json
import os
import statistics
import time

from _workers import parser as worker_parser
from _workers import describe_stack, pin_worker, run_on_workers, write_result

MODELS = ("mlp", "cnn")
CONFIGS = ("baseline", "off", "on", "on_skip", "on_every", "on_twin", "baseline_again")
CLOCKS = ("compute", "cpu", "wall")


def launch(args):
    report(run_on_workers(__file__, ["--rounds", args.rounds, "--steps", args.steps,
                                     *(["--gpu"] if args.gpu else [])],
                          "monitor_overhead_", np=args.np))


def report(result):
    rounds = result["rounds_ms"]
    n_rounds = len(rounds["wall"][MODELS[0]]["on"])

    def round_ratios(clock, a, b):
        # ratios within a round share the machine's state at that moment, so
        # their median is steadier than a ratio of overall medians
        r = rounds[clock]
        return [statistics.mean(r[m][a][i] / r[m][b][i] for m in MODELS) for i in range(n_rounds)]

    def ratio(clock, a, b):
        return round(statistics.median(round_ratios(clock, a, b)), 4)

    def spread(clock, a, b):
        rr = round_ratios(clock, a, b)
        return [round(min(rr), 4), round(max(rr), 4)]

    med = {c: {m: {k: statistics.median(rounds[c][m][k]) for k in CONFIGS} for m in MODELS}
           for c in CLOCKS}
    print(f"\nmonitor overhead, stack={result['stack']} ({result['versions']}), "
          f"{result['workers']} worker(s) on {result['device']}, Gloo, "
          f"default stats_interval={result['stats_interval']}, {n_rounds} rounds x "
          f"{result['steps']} steps; load average before/after: {result['load']}; "
          f"{result['horovod_threads']} Horovod threads left out of 'compute'")
    print(f"{'clock':7s} {'model':6s} " + " ".join(f"{c:>{max(10, len(c))}s}" for c in CONFIGS)
          + "   off/base    on/base    skip/b  every/base")
    for clock in CLOCKS:
        for m in MODELS:
            row = med[clock][m]
            print(f"{clock:7s} {m:6s} " + " ".join(f"{row[c]:{max(8, len(c) - 2)}.2f}ms" for c in CONFIGS)
                  + f"   {row['off'] / row['baseline']:8.3f}   {row['on'] / row['baseline']:8.3f}"
                  f"   {row['on_skip'] / row['baseline']:8.3f}   {row['on_every'] / row['baseline']:8.3f}")
    print("per-round ratios to baseline (mean of the two models), median [min, max]:")
    for clock in CLOCKS:
        for c in CONFIGS[1:]:
            print(f"  {clock:7s} {c:14s} {ratio(clock, c, 'baseline'):.4f} {spread(clock, c, 'baseline')}")
    k = result["kernel"]
    print(f"squared norms of {k['params'] / 1e6:.1f}M params in {k['tensors']} tensors: "
          f"op {k['op_ms']:.2f} ms, twin {k['twin_ms']:.2f} ms")

    line = {"bench": "monitor_overhead", "stack": result["stack"], "device": result["device"],
            "workers": result["workers"], "stats_interval": result["stats_interval"],
            "rounds": n_rounds}
    for prefix, clock in (("", "compute"), ("cpu_", "cpu"), ("wall_", "wall")):
        for c in ("off", "on", "on_skip", "on_every"):
            line[f"{prefix}ratio_{c}"] = ratio(clock, c, "baseline")
            line[f"{prefix}spread_{c}"] = spread(clock, c, "baseline")
        line[f"{prefix}ratio_aa"] = ratio(clock, "baseline_again", "baseline")
        line[f"{prefix}spread_aa"] = spread(clock, "baseline_again", "baseline")
    line["op_vs_twin"] = ratio("compute", "on_every", "on_twin")
    line["op_vs_twin_kernel"] = round(k["op_ms"] / k["twin_ms"], 4)
    line["per_model_ms"] = {c: {m: {k2: round(v, 4) for k2, v in med[c][m].items()} for m in MODELS}
                            for c in CLOCKS}
    line["load"] = result["load"]
    print(json.dumps(line))


def worker(args):
    pin_worker()
    import numpy as np
    import tensorflow as tf

    device = "cpu"
    if not args.gpu:  # a GPU build of TensorFlow would otherwise place the models on a GPU
        tf.config.set_visible_devices([], "GPU")
    else:  # one GPU per worker, by local rank, as Horovod's examples pin them
        gpus = tf.config.list_physical_devices("GPU")
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
        if len(gpus) <= local_rank:
            raise SystemExit(f"--gpu: worker {local_rank} has no GPU ({len(gpus)} visible); "
                             "run with --np at most the number of GPUs, or without --gpu")
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
        device = f"gpu {gpus[local_rank].name}"

    import horovod.tensorflow as hvd
    import keras

    import keras_adapt
    from keras_adapt import _keras, ops
    from keras_adapt.callbacks import GradientStatsMonitor
    from keras_adapt.optimizer import DEFAULT_STATS_INTERVAL

    before_init = set(os.listdir("/proc/self/task"))
    hvd.init()
    rank = hvd.rank()
    horovod_threads = set(os.listdir("/proc/self/task")) - before_init

    def compute_seconds():
        """CPU time of this process's threads except Horovod's (ns clock)."""
        total = 0
        for tid in os.listdir("/proc/self/task"):
            if tid in horovod_threads:
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:  # the thread ended meanwhile
                pass
        return total * 1e-9

    def build(kind):
        keras.utils.set_random_seed(0)
        if kind == "mlp":
            return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                                     keras.layers.Dense(512, activation="relu"),
                                     keras.layers.Dense(10, activation="softmax")]), (784,), 64
        return keras.Sequential([
            keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax")]), (28, 28, 1), 32

    def baseline_optimizer():
        if not _keras.IS_KERAS3:
            import horovod.tensorflow.keras as hvd_keras

            return hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))

        class HorovodSGD(keras.optimizers.SGD):  # the minimal working Keras 3 pattern
            def apply_gradients(self, grads_and_vars):
                grads, variables = zip(*grads_and_vars)
                grads = hvd.grouped_allreduce(list(grads), op=hvd.Average)
                return super().apply_gradients(zip(grads, variables))

        return HorovodSGD(0.01, momentum=0.9)

    class StepTimer(keras.callbacks.Callback):
        """Wall and process CPU time from the first step's end to the last's."""

        def __init__(self):
            super().__init__()
            self.first = self.last = None
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            now = (time.perf_counter(), time.process_time(), compute_seconds())
            if self.first is None:
                self.first = now
            else:
                self.steps += 1
            self.last = now

        def per_step(self):
            return {clock: (self.last[i] - self.first[i]) / self.steps
                    for i, clock in enumerate(("wall", "cpu", "compute"))}

    setups = {}
    for kind in MODELS:
        for config in CONFIGS:
            model, shape, batch = build(kind)
            if config.startswith("baseline"):
                opt = baseline_optimizer()
            else:
                interval = DEFAULT_STATS_INTERVAL if config in ("on", "on_skip") else 1
                opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9),
                                                       gradient_stats=config != "off",
                                                       skip_nonfinite=config == "on_skip",
                                                       stats_interval=interval)
            model.compile(opt, "sparse_categorical_crossentropy")
            rng = np.random.default_rng(rank)
            n = batch * args.steps
            x = rng.standard_normal((n,) + shape).astype("float32")
            y = rng.integers(0, 10, n)
            cbs = [GradientStatsMonitor(interval=10)] if config.startswith("on") else []
            impl = "twin" if config == "on_twin" else ops.implementation()
            with ops.use_implementation(impl):  # traced (and warmed up) here
                model.fit(x[: batch * 10], y[: batch * 10], batch_size=batch, epochs=1, verbose=0,
                          callbacks=cbs)
            setups[(kind, config)] = (model, x, y, batch, cbs)

    load_before = os.getloadavg()[0]
    times = {(k, c): [] for k in MODELS for c in CONFIGS}
    order = list(setups.items())
    for r in range(args.rounds):
        # alternate the order so no configuration always runs first or last
        for key, (model, x, y, batch, cbs) in (order if r % 2 == 0 else order[::-1]):
            timer = StepTimer()
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False,
                      callbacks=cbs + [timer])
            times[key].append(timer.per_step())

    # kernel microbenchmark: ResNet-50-sized gradient (25.6M params, 161 tensors)
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(64, 250_000, 160)]
    sizes.append(25_600_000 - sum(sizes))
    tensors = [tf.constant(rng.standard_normal(s).astype("float32")) for s in sizes]

    def timed(fn):
        f = tf.function(fn)
        f(tensors)
        samples = []
        for _ in range(7):
            t0 = time.perf_counter()
            f(tensors)[1].numpy()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3

    kernel = {"params": 25_600_000, "tensors": len(sizes),
              "op_ms": timed(ops.squared_norms), "twin_ms": timed(ops.squared_norms_twin)}

    result = {
        **describe_stack(load_before),
        "stats_interval": DEFAULT_STATS_INTERVAL,
        "steps": args.steps,
        "device": device,
        "workers": hvd.size(),
        "horovod_threads": len(horovod_threads),
        # per clock and round: the mean step time of each configuration
        "rounds_ms": {clock: {k: {c: [t[clock] * 1e3 for t in times[(k, c)]] for c in CONFIGS}
                              for k in MODELS} for clock in CLOCKS},
        "kernel": kernel,
    }
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80, help="timed steps per round")
    parser.add_argument("--np", type=int, default=2, help="workers (default: %(default)s)")
    parser.add_argument("--gpu", action="store_true",
                        help="train on GPUs, one per worker (tools/gpu_check.sh: --np 1 --gpu)")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
