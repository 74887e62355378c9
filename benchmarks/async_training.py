"""Asynchronous training with a slow worker: time to accuracy of S-SGD, local SGD and PairAveraging.

Run from the repository (it launches itself on 2 local workers, Gloo):

    .venv/bin/python benchmarks/async_training.py             # primary stack (~10 min)
    .venv-keras2/bin/python benchmarks/async_training.py      # legacy stack
    .venv/bin/python benchmarks/async_training.py --quick     # smoke run (~1 min)

What it runs
------------
``keras_adapt.data.teacher_student`` (8-dim inputs, 10 classes, 20k train,
5k test samples), an 8-128-128-10 ReLU MLP, SGD with momentum 0.9 at the
small batch's rate of benchmarks/sync_strategies.py (0.05, batch 16 per
worker), three ways in the same two worker processes, from the same initial
weights:

* ``ssgd``      ``AllReduceSGD``;
* ``local_sgd`` ``LocalSGD(period=8)``;
* ``pair``      ``PairAveraging(period=1)`` at its defaults.

Rank 1 is made ``--slow`` (1.5) times slower: after each of its steps it
sleeps (slow - 1) times that step's own duration. Every configuration gets
the same sample budget, ``passes`` (3) over the training set, counted over
both workers: each worker stops once the samples of both reach it, with the
LR x0.1 at 50% and 75% of it. Under the collective strategies the two go in
step (each trains half) and the slow one sets the pace; under PairAveraging
each takes its steps at its own pace and counts the other's samples from
the update counts in the models it receives
(``ExchangeRecord.peer_updates``), so the fast one trains more of them.

What it measures
----------------
Rank 0's model -- the one a job would hand over from rank 0 -- is evaluated
on the test set every ``eval_every`` of its own samples, in its own process
(no collective; the evaluation is not timed). ``wall_to_target`` is rank 0's
training seconds (from its first update, tracing excluded) at the first
evaluation where the mean of the last 3 reaches ``target`` (0.83, as in
benchmarks/sync_strategies.py); ``final`` its accuracy when it stops. The configurations run in turn, in reversed order every other round
(``--rounds``, default 3); medians with [min, max]. ``speedup_vs_ssgd`` is
S-SGD's median wall to target over the configuration's; ``acc_delta_vs_ssgd``
its final minus S-SGD's, in points. For PairAveraging, rank 0's and rank 1's
staleness distributions (``ExchangeRecord.summary()``) are printed.
"""

import json
import os
import time

from _workers import fmt as _fmt, median as _median
from _workers import parser as worker_parser
from _workers import describe_stack, pin_worker, run_on_workers, write_result

CONFIGS = ("ssgd", "local_sgd", "pair")
DECAYS = (0.5, 0.75)
SMOOTH = 3
SETTINGS = {"train": 20_000, "test": 5_000, "teacher": {"dim": 8, "hidden": 32},
            "hidden": 128, "batch": 16, "lr": 0.05, "passes": 3.0, "eval_every": 1_000,
            "target": 0.83, "period": 8}
QUICK = {"train": 2_000, "test": 1_000, "passes": 1.5, "eval_every": 250, "target": 0.5}


def settings_from(args):
    s = json.loads(json.dumps(SETTINGS))
    if args.quick:
        s.update(QUICK)
    s["slow"] = args.slow
    return s


# ---------------------------------------------------------------- launcher
def aggregate(runs):
    table = {}
    for config, rounds in runs.items():
        walls = [r["wall_to_target"] for r in rounds]
        reached = [w for w in walls if w is not None]
        table[config] = {
            "wall_to_target": round(_median(walls), 3) if len(reached) == len(walls) else None,
            "wall_to_target_spread": [round(min(reached), 3), round(max(reached), 3)]
            if reached else None,
            "final": round(_median([r["final"] for r in rounds]), 4),
            "final_spread": [round(min(r["final"] for r in rounds), 4),
                             round(max(r["final"] for r in rounds), 4)],
            "wall": round(_median([r["wall"] for r in rounds]), 3),
            "updates": [r["updates"] for r in rounds],
            "samples": [r["samples"] for r in rounds],
            "peer_updates": [r["peer_updates"] for r in rounds],
            "exchange": rounds[-1]["exchange"], "peer_exchange": rounds[-1]["peer_exchange"],
        }
    base = table.get("ssgd")
    for config, row in table.items():
        ok = base is not None and base["wall_to_target"] and row["wall_to_target"]
        row["speedup_vs_ssgd"] = round(base["wall_to_target"] / row["wall_to_target"], 3) \
            if ok else None
        row["acc_delta_vs_ssgd"] = round(100 * (row["final"] - base["final"]), 2) \
            if base is not None else None
    return table


def report(result, elapsed):
    s = result["settings"]
    table = aggregate(result["runs"])
    print(f"\nasync training, teacher_student, stack={result['stack']} ({result['versions']}), "
          f"2 workers, Gloo, rank 1 {s['slow']:g}x slow; {s['passes']:g} passes of {s['train']} "
          f"over both workers, batch {s['batch']} each, target {s['target']:.3f}, "
          f"{result['rounds']} rounds; load average before/after {result['load']}")
    print(f"{'config':10s} {'updates 0/1':>11s} {'wall':>7s} {'wall@tgt':>9s} {'[min, max]':>16s} "
          f"{'final':>7s} {'[min, max]':>17s} {'speedup':>8s} {'acc d':>6s}")
    for config, r in table.items():
        sp, fs = r["wall_to_target_spread"], r["final_spread"]
        spread = "-" if sp is None else f"[{sp[0]:.2f}, {sp[1]:.2f}]"
        updates = f"{_median(r['updates']):.0f}/{_median(r['peer_updates']):.0f}"
        print(f"{config:10s} {updates:>11s} {r['wall']:6.2f}s {_fmt(r['wall_to_target'], '8.2f')}s "
              f"{spread:>16s} {r['final']:7.4f} [{fs[0]:.4f}, {fs[1]:.4f}] "
              f"{_fmt(r['speedup_vs_ssgd'], '7.3f')}x {_fmt(r['acc_delta_vs_ssgd'], '+6.2f')}")
    if "pair" in table:
        for who, key in (("rank 0", "exchange"), ("rank 1", "peer_exchange")):
            e = table["pair"][key]
            print(f"pair averaging, {who} (last round): averaged {e['averaged']}, "
                  f"sent {e['sent']}, dropped {e['dropped']}, refused {e['refused']}, "
                  f"empty {e['empty']}; staleness mean {_fmt(e['staleness_mean'], '.2f')}, "
                  f"median {_fmt(e['staleness_median'], '.2f')}, "
                  f"p95 {_fmt(e['staleness_p95'], '.2f')}, max {_fmt(e['staleness_max'], '.2f')} "
                  f"updates")
    pair = table.get("pair", {})
    line = {"bench": "async_training", "stack": result["stack"], "slow": s["slow"],
            "target": s["target"], "rounds": result["rounds"], "load": result["load"],
            "pair_speedup_vs_ssgd": pair.get("speedup_vs_ssgd"),
            "pair_acc_delta_vs_ssgd": pair.get("acc_delta_vs_ssgd"),
            "met": None, "configs": table}
    if pair.get("speedup_vs_ssgd") is not None:
        line["met"] = pair["speedup_vs_ssgd"] >= 1.3 and pair["acc_delta_vs_ssgd"] >= -0.5
    print(f"met: {line['met']}  (pair speedup_vs_ssgd {line['pair_speedup_vs_ssgd']} >= 1.3, "
          f"acc_delta_vs_ssgd {line['pair_acc_delta_vs_ssgd']} >= -0.5)")
    print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


def launch(args):
    extra = ["--rounds", args.rounds, "--slow", args.slow] + (["--quick"] if args.quick else [])
    if args.configs:
        extra += ["--configs", *args.configs]
    t0 = time.perf_counter()
    result = run_on_workers(__file__, extra, "async_training_")
    report(result, time.perf_counter() - t0)


# ------------------------------------------------------------------ worker
def worker(args):
    pin_worker()
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import keras

    import keras_adapt
    from keras_adapt.data import AdaptiveBatchDataset, teacher_student
    from keras_adapt.sync import AllReduceSGD, LocalSGD, PairAveraging

    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    s = settings_from(args)
    load_before = os.getloadavg()[0]
    x, y = teacher_student(s["train"], seed=0, **s["teacher"])
    xt, yt = teacher_student(s["test"], seed=0, **s["teacher"])
    budget = int(s["passes"] * len(x))  # samples, both workers together

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((x.shape[1],)),
                                 keras.layers.Dense(s["hidden"], activation="relu"),
                                 keras.layers.Dense(s["hidden"], activation="relu"),
                                 keras.layers.Dense(10)])

    class Tracker(keras.callbacks.Callback):
        """Rank 0's clock and evaluations; rank 1's slowness; the LR steps."""

        def __init__(self, ds):
            super().__init__()
            self.ds = ds
            self.decay_at = [f * budget for f in DECAYS]
            self.next_eval, self.curve, self.hit = s["eval_every"], [], None
            self.t0 = self.begin = None
            self.excluded, self.updates = 0.0, 0
            self.logits = None

        def on_train_batch_begin(self, batch, logs=None):
            self.begin = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if rank == 1 and s["slow"] > 1 and self.t0 is not None:
                time.sleep((s["slow"] - 1.0) * (now - self.begin))
                now = time.perf_counter()
            if self.t0 is None:
                self.t0 = now  # the first update pays for tracing
            self.updates += 1
            samples = self.samples()
            while self.decay_at and samples >= self.decay_at[0]:
                self.decay_at.pop(0)
                opt = self.model.optimizer
                opt.learning_rate = float(np.asarray(opt.learning_rate)) * 0.1
            done = samples >= budget
            if rank == 0 and (samples >= self.next_eval or done):
                if self.logits is None:
                    self.logits = tf.function(lambda v: self.model(v, training=False))
                acc = float(np.mean(np.argmax(self.logits(tf.constant(xt)).numpy(), 1) == yt))
                wall = now - self.t0 - self.excluded
                self.curve.append((samples, self.updates, round(wall, 3), acc))
                recent = [c[3] for c in self.curve[-SMOOTH:]]
                if self.hit is None and len(recent) == SMOOTH and np.mean(recent) >= s["target"]:
                    self.hit = wall
                while self.next_eval <= samples:
                    self.next_eval += s["eval_every"]
                self.excluded += time.perf_counter() - now
            if done:
                self.model.stop_training = True

        def samples(self):
            """Both workers' samples: twice this one's in step, else this
            one's and the other's last known."""
            exchange = self.model.optimizer.adapt_state.sync.exchange
            if exchange is None:
                return self.ds.samples * workers
            peers = exchange.record.peer_updates.values()
            return self.ds.samples + s["batch"] * int(sum(peers))

    def run(config):
        model = build()
        strategy = {"ssgd": AllReduceSGD(), "local_sgd": LocalSGD(period=s["period"]),
                    "pair": PairAveraging()}[config]
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(s["lr"], momentum=0.9),
                                               sync_strategy=strategy, gradient_stats=False)
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=s["batch"], seed=0)
        tracker = Tracker(ds)
        model.fit(ds.dataset, steps_per_epoch=budget // s["batch"] + 10, epochs=1, verbose=0,
                  callbacks=[keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0),
                             tracker])
        exchange = opt.adapt_state.sync.exchange
        record = None if exchange is None else exchange.record.summary()
        # after the clock: both ranks' update counts and exchange records to rank 0
        gathered = hvd.allgather_object({"updates": tracker.updates, "exchange": record})
        out = {"config": config, "updates": tracker.updates,
               "peer_updates": gathered[1]["updates"], "exchange": record,
               "peer_exchange": gathered[1]["exchange"]}
        if rank == 0:
            out.update(samples=tracker.curve[-1][0], wall=tracker.curve[-1][2],
                       final=tracker.curve[-1][3],
                       wall_to_target=tracker.hit, curve=tracker.curve)
        return out

    configs = args.configs or CONFIGS
    runs = {}
    for i in range(args.rounds):
        for config in (configs if i % 2 == 0 else configs[::-1]):
            runs.setdefault(config, []).append(run(config))
    result = {"settings": s, "rounds": args.rounds, "runs": {c: runs[c] for c in configs}}
    result.update(describe_stack(load_before))
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions (order reversed)")
    parser.add_argument("--slow", type=float, default=1.5, help="rank 1's slowdown factor")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, help="a subset")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
