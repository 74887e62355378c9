"""Stragglers: detection steps, false alarms, and the throughput gain of rebalancing.

Run from the repository (it launches itself on 2 local workers, Gloo, each
pinned to its own core with one TensorFlow thread):

    .venv/bin/python benchmarks/straggler.py            # primary stack (~6 min)
    .venv-keras2/bin/python benchmarks/straggler.py     # legacy stack
    .venv/bin/python benchmarks/straggler.py --quick    # smoke run (< 1 min)
    .venv/bin/python benchmarks/straggler.py --model mlp --batch 256   # the former workload

What it runs
------------
A compute-bound model on seeded synthetic data (mean squared error to 10
outputs): by default (``--model conv``) two 3x3 convolutions of
``--filters`` filters on ``--image`` x ``--image`` x 3 inputs, global
average pooling and a dense layer -- about 10k parameters for 15 MFLOP per
sample, so the allreduce is short next to the compute, as for a slow
accelerator in a real cluster (at 512 samples per worker the compute is
about 8 times the step's fixed cost; at 128 the host's per-step work is as
long as the compute); or (``--model mlp``) an MLP of ``--dim``
inputs and two ReLU layers of ``--hidden`` units, whose 1.6M-parameter
gradient takes about as long to allreduce on Gloo (10.6 ms measured alone)
as 256 samples take to compute (11.9 ms): with that fixed cost f next to
the compute c*b the best gain is (1.5 cb + f) / (1.2 cb + f), about 1.11,
whatever the split. The slow-rank hook stretches everything between two
collectives (the host's callbacks and data too), not the collective. With
``keras_adapt.DistributedOptimizer``, a ``WorkerTimingMonitor`` and a
``StragglerPolicy`` with its defaults but for the warm-up (``--warmup``
seconds), the measurements (every ``--interval`` steps), the noise window
(``--noise-window`` measurements) and the least patience (``--patience``),
fed by an ``AdaptiveBatchDataset`` with ``--batch`` samples per worker
(global batch 2 x batch). Three configurations, interleaved in every round
(``--rounds``), each a fresh model of ``--steps`` steps:

* ``healthy``   no slow-down, ``action="record"``: every ``straggler``
  event is a false alarm (``false_alarms`` over the judged steps, those
  after the warm-up and the noise window);
* ``record``    rank 1 slowed 1.3x (``KERAS_ADAPT_SLOW_RANK=1:1.3``, set
  before the model is traced), ``action="record"``: ``detect_steps`` = the
  steps from the end of the noise window to the first event naming rank 1;
* ``rebalance`` rank 1 slowed 1.5x, ``action="rebalance"``.

Throughput = global samples / wall time. On a shared machine the load
moves step times by tens of percent between runs of a minute, so the
headline compares the two splits *within one run*, finely interleaved:
``alternate`` (rank 1 slowed 1.5x, no policy) switches every ``--block``
steps between the equal split and the split the round's ``rebalance`` run
ended with (``RankBatchSizes``), ``--blocks`` blocks each;
``rebalance_gain`` = median step time of the equal blocks / median step time
of the rebalanced blocks (the first step after a switch left out), per
round. Throughput is measured over the last ``--window`` steps of a
run (after a rebalance has settled). Before the rounds, the step time is
measured at per-worker batches batch/2, batch and 3 batch/2 without
slow-down, to show that the step time grows with the batch (otherwise
rebalancing cannot help). With an ideal linear step time and no fixed
cost the best split is 1.2 : 0.8 and the gain 1.5 / 1.2 = 1.25.

Every target is reported as the median over the rounds with its spread
(smallest and largest) and the value of each round: ``detect_steps``
(target <= 50 in every round), ``false_alarms`` (target 0 in every round)
and ``rebalance_gain`` (target >= 1.2 as the median); ``met`` says which
were met. Prints a table and one JSON line ``{"bench": "straggler",
"detect_steps": ..., "false_alarms": ..., "rebalance_gain": ..., ...}``.
"""

import json
import os
import statistics
import time

from _workers import describe_stack, pin_worker, run_on_workers, write_result
from _workers import parser as worker_parser

CONFIGS = ("healthy", "record", "rebalance")
SLOW = {"record": "1:1.3", "rebalance": "1:1.5"}
TARGETS = {"detect_steps": 50, "false_alarms": 0, "rebalance_gain": 1.2}


def launch(args):
    start = time.perf_counter()
    flags = ["--steps", args.steps, "--window", args.window, "--rounds", args.rounds,
             "--batch", args.batch, "--model", args.model, "--hidden", args.hidden,
             "--dim", args.dim, "--image", args.image, "--filters", args.filters,
             "--interval", args.interval, "--patience", args.patience, "--warmup", args.warmup,
             "--noise-window", args.noise_window, "--block", args.block, "--blocks", args.blocks]
    result = run_on_workers(__file__, flags, "straggler_bench_")
    report(result, time.perf_counter() - start)


def _median_spread(values):
    """(median, [smallest, largest]) of the rounds' values, None for none."""
    if not values:
        return None, None
    return round(statistics.median(values), 4), [round(min(values), 4), round(max(values), 4)]


def summarize(result):
    """The JSON line, from the rank-0 result of the workers."""
    runs = result["runs"]
    gains = [rnd["alternate"]["equal_step"] / rnd["alternate"]["split_step"] for rnd in runs]
    detect = [rnd["record"]["detect_steps"] for rnd in runs]
    alarms = [len(rnd["healthy"]["events"]) for rnd in runs]
    found = [d for d in detect if d is not None]
    line = {"bench": "straggler"}
    for key, values in (("detect_steps", found), ("false_alarms", alarms),
                        ("rebalance_gain", gains)):
        line[key], line[f"{key}_spread"] = _median_spread(values)
    missed = sum(d is None for d in detect)
    line.update({
        "stack": result["stack"],
        "targets": TARGETS,
        "met": {"detect_steps": not missed and max(found) <= TARGETS["detect_steps"],
                "false_alarms": max(alarms) <= TARGETS["false_alarms"],
                "rebalance_gain": line["rebalance_gain"] >= TARGETS["rebalance_gain"]},
        "detect_steps_by_round": detect,
        "missed_detections": missed,
        "false_alarms_by_round": alarms,
        "healthy_steps_by_round": [rnd["healthy"]["judged_steps"] for rnd in runs],
        "rebalance_gain_by_round": [round(g, 4) for g in gains],
        "noise_by_round": {c: [rnd[c]["noise"] for rnd in runs] for c in CONFIGS},
        "judged_threshold_by_round": {c: [rnd[c]["judged_threshold"] for rnd in runs]
                                      for c in CONFIGS},
        "judged_patience_by_round": {c: [rnd[c]["judged_patience"] for rnd in runs]
                                     for c in CONFIGS},
        "alternated_splits": [rnd["alternate"]["split"] for rnd in runs],
        "alternated_step_s": [[rnd["alternate"]["equal_step"], rnd["alternate"]["split_step"]]
                              for rnd in runs],
        "rounds": len(runs),
        "global_batch": 2 * result["settings"]["batch"],
        "step_time_by_batch": result["step_time_by_batch"],
        "throughput": {c: [round(rnd[c]["throughput"], 1) for rnd in runs] for c in CONFIGS},
        "final_split": [rnd["rebalance"]["final_sizes"] for rnd in runs],
        "settings": result["settings"],
        "versions": result["versions"],
        "load": result["load"],
    })
    return line


def describe_model(s):
    """The workload, in words, from the settings."""
    if s["model"] == "conv":
        return (f"conv {s['image']}x{s['image']}x3 -> 2 x conv3x3({s['filters']}) -> "
                f"pool -> 10")
    return f"MLP {s['dim']}-{s['hidden']}-{s['hidden']}-10"


def report(result, elapsed):
    s = result["settings"]
    print(f"\nstragglers, stack={result['stack']} ({result['versions']}), 2 workers, Gloo, "
          f"rank 1 slowed {SLOW['record'].split(':')[1]}x (record), "
          f"{SLOW['rebalance'].split(':')[1]}x (rebalance, alternate); per-worker batch "
          f"{s['batch']}, {describe_model(s)}, "
          f"{s['steps']} steps per run, window the "
          f"last {s['window']}; load average before/after {result['load']}")
    print("step time without slow-down, by per-worker batch:",
          ", ".join(f"{b}: {t * 1000:.1f} ms" for b, t in result["step_time_by_batch"].items()))
    print(f"{'round':>5s} {'config':10s} {'samples/s':>10s} {'step ms':>8s} {'events':>6s} "
          f"{'detect':>6s} {'noise':>6s} {'thresh':>6s} {'pat':>3s} {'split at end':>14s}")
    for i, rnd in enumerate(result["runs"]):
        for c in CONFIGS:
            r = rnd[c]
            detect = "-" if r.get("detect_steps") is None else str(r["detect_steps"])
            noise, thr, pat = (("-" if v is None else f"{v:.3f}" if isinstance(v, float)
                                else str(v))
                               for v in (r["noise"], r["judged_threshold"], r["judged_patience"]))
            print(f"{i:5d} {c:10s} {r['throughput']:10.1f} {r['step_time'] * 1000:8.2f} "
                  f"{len(r['events']):6d} {detect:>6s} {noise:>6s} {thr:>6s} {pat:>3s} "
                  f"{str(r['final_sizes']):>14s}")
        a = rnd["alternate"]
        print(f"{i:5d} alternate  equal {a['equal_step'] * 1000:.2f} ms vs {a['split']} "
              f"{a['split_step'] * 1000:.2f} ms per step (medians of {a['blocks']} blocks each)")
    line = summarize(result)
    print(f"{'target':16s} {'median':>8s} {'spread':>18s} {'by round':>24s} {'goal':>6s} met")
    for key, by_round, goal in (
            ("detect_steps", line["detect_steps_by_round"], f"<= {TARGETS['detect_steps']}"),
            ("false_alarms", line["false_alarms_by_round"], f"{TARGETS['false_alarms']}"),
            ("rebalance_gain", line["rebalance_gain_by_round"],
             f">= {TARGETS['rebalance_gain']}")):
        print(f"{key:16s} {str(line[key]):>8s} {str(line[key + '_spread']):>18s} "
              f"{str(by_round):>24s} {goal:>6s} {line['met'][key]}")
    print(f"healthy steps judged by round {line['healthy_steps_by_round']}")
    print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


# ------------------------------------------------------------------ worker
def worker(args):
    pin_worker()
    import numpy as np

    import keras
    import keras_adapt
    from keras_adapt.actuators import RankBatchSizes
    from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, WorkerTimingMonitor
    from keras_adapt.data import AdaptiveBatchDataset
    from keras_adapt.monitors.worker_timing import SLOW_RANK_ENV
    from keras_adapt.policies import StragglerPolicy

    rank = keras_adapt.rank()
    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    shape = (args.image, args.image, 3) if args.model == "conv" else (args.dim,)
    x = rng.standard_normal((8192, *shape)).astype("float32")
    y = rng.standard_normal((8192, 10)).astype("float32")

    class Clock(keras.callbacks.Callback):
        """The host time at the start of every step (and at the end of the last)."""

        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.times.append(time.perf_counter())

        def on_train_end(self, logs=None):
            self.times.append(time.perf_counter())

    def build():
        keras.utils.set_random_seed(1)
        if args.model == "conv":
            model = keras.Sequential([
                keras.Input((args.image, args.image, 3)),
                keras.layers.Conv2D(args.filters, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(args.filters, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10)])
        else:
            model = keras.Sequential([
                keras.Input((args.dim,)),
                keras.layers.Dense(args.hidden, activation="relu"),
                keras.layers.Dense(args.hidden, activation="relu"),
                keras.layers.Dense(10)])
        model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(1e-4)), "mse")
        return model

    class Alternate(keras.callbacks.Callback):
        """Switches between two splits every `block` steps."""

        def __init__(self, batches, splits, block):
            super().__init__()
            self.batches, self.splits, self.block, self.step = batches, splits, block, 0

        def on_train_batch_begin(self, batch, logs=None):
            if self.step % self.block == 0:
                self.batches.set(self.splits[(self.step // self.block) % 2])
            self.step += 1

    def alternate(split):
        """Step times of the equal split and `split`, interleaved in one run."""
        os.environ[SLOW_RANK_ENV] = SLOW["rebalance"]
        model = build()
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=args.batch, seed=2)
        equal = [args.batch, args.batch]
        clock = Clock()
        # two blocks of warm-up (tracing), then blocks of each split in turn
        steps = (2 * args.blocks + 2) * args.block
        model.fit(ds.dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[
            BroadcastGlobalVariablesCallback(0),
            Alternate(RankBatchSizes(model, ds), [equal, split], args.block), clock])
        os.environ.pop(SLOW_RANK_ENV, None)
        t = clock.times
        per_block = {0: [], 1: []}
        for k in range(2, 2 * args.blocks + 2):
            start, end = k * args.block + 1, (k + 1) * args.block  # the switch step left out
            per_block[k % 2].append((t[end] - t[start]) / (end - start))
        return {"split": split, "blocks": args.blocks,
                "equal_step": statistics.median(per_block[0]),
                "split_step": statistics.median(per_block[1]),
                "equal_blocks": per_block[0], "split_blocks": per_block[1]}

    def run(config, steps, batch=args.batch, window=args.window):
        if config == "healthy":
            os.environ.pop(SLOW_RANK_ENV, None)
        else:
            os.environ[SLOW_RANK_ENV] = SLOW[config]  # read when the train function is traced
        model = build()
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=batch, seed=2)
        monitor = WorkerTimingMonitor(interval=args.interval)
        policy = StragglerPolicy(
            monitor, warmup_s=args.warmup, patience=args.patience, noise_window=args.noise_window,
            action="rebalance" if config == "rebalance" else "record",
            dataset=ds if config == "rebalance" else None)
        clock = Clock()
        model.fit(ds.dataset, steps_per_epoch=steps, epochs=1, verbose=0,
                  callbacks=[BroadcastGlobalVariablesCallback(0), monitor, policy, clock])
        os.environ.pop(SLOW_RANK_ENV, None)
        t = clock.times
        seconds = t[-1] - t[-1 - window]
        out = {"throughput": window * 2 * batch / seconds, "step_time": seconds / window,
               "events": [{k: e[k] for k in ("step", "reason", "after")} for e in policy.events],
               "final_sizes": ds.rank_micro_batch_sizes,
               "warmup_end_step": policy.warmup_end_step, "noise": policy.noise,
               "judged_threshold": policy.judged_threshold,
               "judged_patience": policy.judged_patience}
        if config == "record":
            flagged = [e["step"] for e in policy.events if e["after"]["straggler_rank"] == 1]
            out["detect_steps"] = (flagged[0] - policy.warmup_end_step
                                   if flagged and policy.warmup_end_step is not None else None)
        if config == "healthy":
            out["judged_steps"] = (steps - policy.warmup_end_step
                                   if policy.warmup_end_step is not None else 0)
        return out

    # Step time by batch, no slow-down (the first 5 steps, tracing included, left out).
    by_batch = {}
    for b in (args.batch // 2, args.batch, 3 * args.batch // 2):
        r = run("healthy", 45, batch=b, window=40)
        by_batch[str(b)] = r["step_time"]

    runs = []
    for i in range(args.rounds):
        order = CONFIGS[i % 3:] + CONFIGS[: i % 3]  # rotate, so drifts touch all alike
        rnd = {c: run(c, args.steps) for c in order}
        rnd["alternate"] = alternate(rnd["rebalance"]["final_sizes"])
        runs.append(rnd)
        if rank == 0:
            print(f"round {i}: " + ", ".join(f"{c} {rnd[c]['throughput']:.0f}/s" for c in CONFIGS),
                  flush=True)
    result = {"runs": runs, "step_time_by_batch": by_batch,
              "settings": {k: getattr(args, k) for k in (
                  "steps", "window", "batch", "model", "image", "filters", "hidden", "dim",
                  "interval", "patience", "noise_window", "warmup", "block", "blocks")}}
    result.update(describe_stack(load_before))
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="steps per run")
    parser.add_argument("--window", type=int, default=200,
                        help="the last steps of a run whose throughput is compared")
    parser.add_argument("--batch", type=int, default=512, help="per-worker batch")
    parser.add_argument("--model", choices=("conv", "mlp"), default="conv",
                        help="conv: two 3x3 convolutions (few parameters per FLOP); mlp: "
                             "two dense layers (the allreduce about as long as the compute)")
    parser.add_argument("--image", type=int, default=16, help="conv: image side")
    parser.add_argument("--filters", type=int, default=32, help="conv: filters per layer")
    parser.add_argument("--hidden", type=int, default=1024, help="mlp: hidden units")
    parser.add_argument("--dim", type=int, default=512, help="mlp: inputs")
    parser.add_argument("--interval", type=int, default=10, help="timing monitor interval")
    parser.add_argument("--patience", type=int, default=3, help="the policy's least patience")
    parser.add_argument("--warmup", type=float, default=3.0, help="policy warm-up (s)")
    parser.add_argument("--noise-window", type=int, default=10,
                        help="measurements after the warm-up that measure the noise")
    parser.add_argument("--block", type=int, default=10, help="steps per alternated block")
    parser.add_argument("--blocks", type=int, default=15, help="alternated blocks per split")
    args = parser.parse_args()
    if args.quick and not args.worker:
        args.rounds, args.steps, args.window, args.batch = 1, 80, 30, 64
        args.hidden, args.dim, args.interval, args.patience, args.warmup = 256, 128, 5, 2, 0.3
        args.noise_window = 3
        args.image, args.filters = 8, 16
        args.block, args.blocks = 5, 3
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
