"""Synchronisation strategies: time to accuracy, final accuracy and collectives per sample.

Run from the repository (it launches itself on 2 local workers, Gloo):

    .venv/bin/python benchmarks/sync_strategies.py            # primary stack (~20-25 min)
    .venv-keras2/bin/python benchmarks/sync_strategies.py     # legacy stack
    .venv/bin/python benchmarks/sync_strategies.py --quick    # smoke run (~2 min)
    .venv/bin/python benchmarks/sync_strategies.py --task digits   # the other task (~10 min)
    .venv/bin/python benchmarks/sync_strategies.py --configs ssgd_small adaptive   # a subset

What it runs
------------
One task (``--task``), trained seven ways in the same two worker
processes, from the same initial weights, on the same seeded, sharded data
stream (``keras_adapt.data.AdaptiveBatchDataset``), each with the same
sample budget (``passes`` over the training set), SGD with momentum 0.9:

* ``teacher_student`` (the default): ``keras_adapt.data.teacher_student``
  (8-dim inputs, 10 classes, 5% label noise; 20k train, 5k test samples), a
  8-128-128-10 ReLU MLP, 3 passes. Its noise scale (about 60-300 during the
  first half of the budget) is several times the global batch of 32: the
  case where the workers can take several local steps between averagings
  at little cost in progress;
* ``digits``: scikit-learn's digits (1300 train, 497 test samples, shipped
  with scikit-learn, no download), a 64-128-128-10 ReLU MLP, 30 passes. Its
  noise scale (about 20-80) stays near the global batch: every local step
  costs progress there.

The configurations:

* ``ssgd_small``  ``AllReduceSGD``, 2 workers x 16 (global batch 32);
* ``ssgd_large``  ``AllReduceSGD``, 2 workers x ``large`` (256 on
  teacher_student, 128 on digits), LR tuned on a grid (``--tune``);
* ``sma``         ``ModelAveraging(alpha=0.1)`` (KungFu's SMA), 2 x 16;
* ``local_sgd``   ``LocalSGD(period=8)``, 2 x 16;
* ``post_local``  ``LocalSGD(period=8, start_after=...)``: AllReduceSGD
  until the first learning-rate decay, then local SGD (Lin et al.);
* ``block_momentum`` ``BlockMomentum(period=8)`` (BMUF, block momentum
  0.5 = 1 - 1/N, Nesterov), 2 x 16;
* ``adaptive``    ``SyncStrategyPolicy`` at its defaults choosing the period
  H in 1 (``AllReduceSGD``), 2, 4, 8 of ``LocalSGD`` from its measurements
  (the noise scale against the global batch, the schedule, and the
  communication fraction of a ``WorkerTimingMonitor``), 2 x 16.

The local strategies' period is the setting ``period`` (8; e.g.
``--set period=4`` runs ``local_sgd`` with H = 4, and makes 4 the adaptive
policy's largest H).

The per-worker batch is 16 everywhere but in ``ssgd_large``; every
configuration but ``ssgd_large`` uses the small batch's LR. The LR drops
10x at 50% and again at 75% of the sample budget (a step schedule, as in
Lin et al.), so the final accuracy is a trained model's.

Each configuration runs twice: without delay and with a simulated slow
network, ``KERAS_ADAPT_COLLECTIVE_DELAY_MS`` (``--delay-ms``, default 20 ms
before every collective). The variable is read when a collective is built,
i.e. when a train function is traced (and at each host-side collective),
so one process can switch it between configurations: every configuration
builds a new model and optimizer and traces its own train function. The
order alternates delay / no delay and is reversed every round
(``--rounds``, default 2), so slow phases of a shared machine spread over
all configurations; wall times are reported as the median over rounds
with their [min, max] spread.

What it measures
----------------
* ``wall_to_target``: training seconds (evaluation excluded; the clock
  starts after the first update, so tracing is not counted) at the first
  evaluation where the mean of the last 3 evaluations reaches ``target``
  (null if never). The held-out accuracy is evaluated every ``eval_every``
  training samples, on the *average of the two workers' models* (the model
  a local strategy would hand over; identical to each worker's under
  AllReduceSGD). That averaging is neither timed nor counted.
* ``final``: test accuracy of that averaged model at the end of the budget.
* ``collectives_per_sample``: the collectives the configuration really
  issued during training, counted as they run (each
  ``horovod.tensorflow`` allreduce / grouped allreduce executed, in the
  graph or on the host: gradient allreduces, model averagings, statistics
  allreduces, the averaging of a strategy switch), divided by the global
  samples trained. The broadcasts of ``BroadcastGlobalVariablesCallback``
  are counted apart (``broadcasts``; fewer under the strategies local from
  the first update, whose first update averages the optimizer slots),
  and so are allgathers (``gathers``: the adaptive configuration's
  ``WorkerTimingMonitor``, one per 10 steps; none elsewhere).
  Under the delay the slow-network hook counts the collectives it delayed
  (``delayed``); it must equal allreduces + broadcasts + gathers.
* ``adaptive_acc_gap_vs_best``: best final accuracy (over every
  configuration and delay) minus the adaptive one's, in points (target
  <= 0.5); ``adaptive_speedup_vs_ssgd_delay``: ``ssgd_small``'s wall to
  target under the delay / the adaptive one's (same per-worker batch;
  target >= 1.5); ``met`` for each and both.

Baselines run ``gradient_stats=False`` (no monitoring cost); the adaptive
configuration pays for the statistics and timings its policy reads.

Task choice: under a fixed sample budget a large global batch clearly
hurts on both tasks, at its best learning rate on the grid (``--tune``):
on teacher_student the global batch of 512 ends at 0.823 and never reaches
the target, against 0.843 for the batch of 32; on digits 256 ends about
one point below 32. Both train in seconds to a minute per configuration on
one core per worker, so the delay, not the compute, decides the wall time
under a slow network, as on a real slow network.
"""

import json
import os
import time

from _workers import fmt as _fmt, median as _median
from _workers import parser as worker_parser
from _workers import describe_stack, pin_worker, run_on_workers, write_result

CONFIGS = ("ssgd_small", "ssgd_large", "sma", "local_sgd", "post_local", "block_momentum",
           "adaptive")
DECAYS = (0.5, 0.75)  # fractions of the sample budget where the LR drops 10x
DECAY = 0.1
SMOOTH = 3  # the target counts as reached when the mean of the last 3 evaluations reaches it

SETTINGS = {
    "small": 16,  # per-worker batch of every configuration but ssgd_large
    "alpha": 0.1,
    "period": 8,  # H of the local strategies (the adaptive policy's largest)
    "bmuf": {"block_lr": 1.0, "block_momentum": 0.5, "nesterov": True},
    "policy": {},  # SyncStrategyPolicy's defaults
}

# Per task: data, model width, budget, evaluation grid, target, and the
# learning rates found by ``--tune`` (SGD, momentum 0.9).
TASKS = {
    "digits": {
        "test": 497, "hidden": 128,
        "large": 128,  # per-worker batch of ssgd_large
        "passes": 30.0, "eval_every": 1297,
        "target": 0.975,
        "lr_small": 0.1, "lr_ssgd_large": 0.4, "lr_block_momentum": 0.05,
        "lr_grid": {"ssgd_small": [0.02, 0.05, 0.1, 0.2], "ssgd_large": [0.1, 0.2, 0.4, 0.8]},
    },
    "teacher_student": {
        "train": 20_000, "test": 5_000, "teacher": {"dim": 8, "hidden": 32}, "hidden": 128,
        "large": 256,
        "passes": 3.0, "eval_every": 2_000,
        "target": 0.83,
        # --tune: ssgd_small 0.01..0.1: 0.8252, 0.8344, 0.8432, 0.8356;
        # ssgd_large 0.16..1.28: 0.8216, 0.8152, 0.8234, 0.7922 (never 0.83)
        "lr_small": 0.05, "lr_ssgd_large": 0.64, "lr_block_momentum": 0.025,
        "lr_grid": {"ssgd_small": [0.01, 0.02, 0.05, 0.1], "ssgd_large": [0.16, 0.32, 0.64, 1.28]},
    },
}

# smoke mode: the same code paths on a fraction of the budget; the policy
# may switch after 10 measured updates, so its post-local rule fires at the
# first decay
QUICK_POLICY = {"warmup_updates": 10, "min_switch_interval": 20}
QUICK = {
    "digits": {"passes": 3.0, "eval_every": 1297, "target": 0.8, "policy": QUICK_POLICY},
    "teacher_student": {"train": 2_000, "test": 1_000, "passes": 1.5, "eval_every": 500,
                        "target": 0.5, "policy": QUICK_POLICY},
}


def settings_from(args):
    s = json.loads(json.dumps(SETTINGS))
    s["task"] = args.task
    s.update(json.loads(json.dumps(TASKS[args.task])))
    if args.quick:
        s.update(json.loads(json.dumps(QUICK[args.task])))
    for item in args.set or []:  # key=json, for experiments
        key, value = item.split("=", 1)
        s[key] = json.loads(value)
    return s


# ---------------------------------------------------------------- launcher
def launch(args):
    extra = ["--task", args.task, "--rounds", args.rounds, "--delay-ms", args.delay_ms]
    extra += [f"--{flag}" for flag in ("quick", "tune") if getattr(args, flag)]
    for item in args.set or []:
        extra += ["--set", item]
    if args.configs:
        extra += ["--configs", *args.configs]
    t0 = time.perf_counter()
    result = run_on_workers(__file__, extra, "sync_strategies_")
    if args.tune:
        report_tuning(result)
    else:
        report(result, time.perf_counter() - t0, args.curves)


def report_tuning(result):
    print(f"\nLR grids ({result['versions']})")
    for config, rows in result["tuning"].items():
        best = max(rows, key=lambda r: (r["final"], -(r["wall_to_target"] or 1e9)))
        for r in rows:
            print(f"  {config:10s} lr={r['lr']:<6g} final={r['final']:.4f} "
                  f"to_target={_fmt(r['wall_to_target'], '.2f')}s"
                  f"{'  <- best' if r is best else ''}")


def aggregate(runs):
    """Per configuration and delay: the rounds' medians and spreads."""
    out = {}
    for key, rounds in runs.items():
        walls = [r["wall_to_target"] for r in rounds]
        reached = [w for w in walls if w is not None]
        first = rounds[0]
        out[key] = {
            "config": first["config"], "delay_ms": first["delay_ms"],
            "wall_to_target": None if len(reached) < len(walls) else round(_median(walls), 3),
            "wall_to_target_spread": [round(min(reached), 3), round(max(reached), 3)]
            if reached else None,
            "updates_to_target": first["updates_to_target"],
            "final": round(_median([r["final"] for r in rounds]), 4),
            "final_spread": [round(min(r["final"] for r in rounds), 4),
                             round(max(r["final"] for r in rounds), 4)],
            "wall": round(_median([r["wall"] for r in rounds]), 3),
            "lr": first["lr"], "global_batch": first["global_batch"],
            "updates": first["updates"], "samples": first["samples"],
            "collectives": first["collectives"],
            "collectives_per_sample": round(first["collectives"] / first["samples"], 6),
            "broadcasts": first["broadcasts"], "gathers": first["gathers"],
            "delayed": first["delayed"],
            "strategies": first["strategies"], "events": first["events"],
        }
        if any(r["collectives"] != first["collectives"] for r in rounds):
            out[key]["collectives_spread"] = [min(r["collectives"] for r in rounds),
                                              max(r["collectives"] for r in rounds)]
    return out


def summary(result, table):
    s = result["settings"]
    line = {"bench": "sync_strategies", "stack": result["stack"],
            "adaptive_acc_gap_vs_best": None, "adaptive_speedup_vs_ssgd_delay": None,
            "met": None, "met_acc": None, "met_speedup": None}
    delayed = [k for k, r in table.items() if r["delay_ms"] > 0]
    if "adaptive@delay" in table or "adaptive@0" in table:
        best = max(r["final"] for r in table.values())
        gaps = [round(100 * (best - table[k]["final"]), 2)
                for k in ("adaptive@0", "adaptive@delay") if k in table]
        line["adaptive_acc_gap_vs_best"] = max(gaps)
        line["met_acc"] = line["adaptive_acc_gap_vs_best"] <= 0.5
        if "adaptive@delay" in table and "ssgd_small@delay" in table:
            a = table["adaptive@delay"]["wall_to_target"]
            b = table["ssgd_small@delay"]["wall_to_target"]
            if a is not None and b is not None:
                line["adaptive_speedup_vs_ssgd_delay"] = round(b / a, 3)
            line["met_speedup"] = (line["adaptive_speedup_vs_ssgd_delay"] or 0) >= 1.5
        line["met"] = bool(line["met_acc"] and line["met_speedup"])
    line.update(task=s["task"], target=s["target"], passes=s["passes"], train_size=result["train_size"],
                budget=int(s["passes"] * result["train_size"]), delay_ms=result["delay_ms"],
                rounds=result["rounds"], load=result["load"], delayed_configs=len(delayed),
                configs=table)
    return line


def report(result, elapsed, curves=False):
    s = result["settings"]
    table = aggregate(result["runs"])
    print(f"\nsync strategies, {s['task']}, stack={result['stack']} ({result['versions']}), 2 workers, "
          f"Gloo; budget {s['passes']:g} passes of {result['train_size']} samples, per-worker "
          f"batch {s['small']} (large {s['large']}), target {s['target']:.3f}, "
          f"{result['rounds']} rounds; load average before/after {result['load']}")
    print(f"{'config':15s} {'delay':>6s} {'updates':>8s} {'wall':>7s} {'upd@tgt':>8s} "
          f"{'wall@tgt':>9s} {'[min, max]':>16s} {'final':>7s} {'coll':>6s} {'coll/sample':>11s}")
    for key, r in table.items():
        sp = r["wall_to_target_spread"]
        spread = "-" if sp is None else f"[{sp[0]:.2f}, {sp[1]:.2f}]"
        print(f"{r['config']:15s} {r['delay_ms']:4g}ms {r['updates']:8d} {r['wall']:6.2f}s "
              f"{_fmt(r['updates_to_target'], '8d')} {_fmt(r['wall_to_target'], '8.2f')}s "
              f"{spread:>16s} {r['final']:7.4f} {r['collectives']:6d} "
              f"{r['collectives_per_sample']:11.5f}")
    if curves:
        for key, rounds in result["runs"].items():
            print(f"  {key} curve (samples, updates, wall, acc, strategy, gns):",
                  " ".join(f"({a},{u},{w:.1f},{acc:.3f},{st},{g})"
                           for a, u, w, acc, st, g in rounds[0]["curve"]))
    line = summary(result, table)
    if line["met"] is not None:
        print(f"met: {line['met']}  (adaptive_acc_gap_vs_best {line['adaptive_acc_gap_vs_best']} "
              f"<= 0.5: {line['met_acc']}; adaptive_speedup_vs_ssgd_delay "
              f"{line['adaptive_speedup_vs_ssgd_delay']} >= 1.5: {line['met_speedup']})")
    print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


# ------------------------------------------------------------------ worker
def worker(args):
    pin_worker()
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import keras

    import keras_adapt
    from keras_adapt import _hvd
    from keras_adapt.data import AdaptiveBatchDataset
    from keras_adapt.policies import SyncStrategyPolicy
    from keras_adapt.sync import AllReduceSGD, BlockMomentum, LocalSGD, ModelAveraging

    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    s = settings_from(args)
    load_before = os.getloadavg()[0]

    # Count the collectives as they run: every horovod allreduce and
    # broadcast and allgather keras-adapt issues goes through these module attributes
    # (looked up at call time), in the graph and on the host. A counter
    # increment next to the collective runs exactly when the collective does
    # (inside whichever branch of the strategy's tf.cond is taken).
    counts = {kind: tf.Variable(0, dtype=tf.int64, trainable=False, name=f"count_{kind}")
              for kind in ("allreduce", "broadcast", "allgather")}
    originals = {}

    def counting(name, kind):
        original = originals[name] = getattr(hvd, name)

        def wrapped(*a, **k):
            counts[kind].assign_add(1)
            return original(*a, **k)

        setattr(hvd, name, wrapped)

    for name, kind in (("allreduce", "allreduce"), ("grouped_allreduce", "allreduce"),
                       ("broadcast", "broadcast"), ("allgather", "allgather")):
        counting(name, kind)

    def counted():
        return {k: int(v.numpy()) for k, v in counts.items()}

    if s["task"] == "teacher_student":
        from keras_adapt.data import teacher_student

        x, y = teacher_student(s["train"], seed=0, **s["teacher"])
        xt, yt = teacher_student(s["test"], seed=0, **s["teacher"])  # same teacher, other samples
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x_all = (d.data / 16.0).astype("float32")
        y_all = d.target.astype("int64")
        order = np.random.default_rng(0).permutation(len(x_all))
        test, train = order[: s["test"]], order[s["test"]:]
        x, y, xt, yt = x_all[train], y_all[train], x_all[test], y_all[test]

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((x.shape[1],)),
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(10),
        ])

    eval_model = build()
    eval_logits = tf.function(lambda inputs: eval_model(inputs, training=False))
    xt_tensor = tf.constant(xt)

    def averaged_accuracy(model):
        """Test accuracy of the workers' average model (not timed, not counted)."""
        weights = [tf.constant(w) for w in model.get_weights()]
        mean = originals["grouped_allreduce"](weights, op=hvd.Average)
        eval_model.set_weights([m.numpy() for m in mean])
        return float(np.mean(np.argmax(eval_logits(xt_tensor).numpy(), axis=1) == yt))

    class Tracker(keras.callbacks.Callback):
        """Training clock (evaluation excluded), evaluation grid, LR steps, budget."""

        def __init__(self, ds, budget, policy):
            super().__init__()
            self.ds, self.budget, self.policy = ds, budget, policy
            self.decay_at = [f * budget for f in DECAYS]
            self.excluded = 0.0
            self.t0 = None
            self.next_eval = s["eval_every"]
            self.curve = []  # (global samples, updates, train seconds, acc, strategy, gns)
            self.hit = None
            self.updates = 0
            self.strategies = []  # (update, strategy name, period or None) at each change

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.t0 is None:
                self.t0 = now  # the first update pays for tracing: not counted
            self.updates += 1
            samples = self.ds.samples * workers
            strategy = self.model.optimizer.adapt_state.sync.strategy
            name, period = strategy.name, strategy.params().get("period")
            if not self.strategies or self.strategies[-1][1:] != (name, period):
                self.strategies.append((self.updates, name, period))
            done = samples >= self.budget
            while self.decay_at and samples >= self.decay_at[0]:
                self.decay_at.pop(0)
                # Reads and writes the base rate under a policy's factor (on both
                # stacks): the effective rate x0.1.
                opt = self.model.optimizer
                opt.learning_rate = float(np.asarray(opt.learning_rate)) * DECAY
            if samples >= self.next_eval or done:
                wall = now - self.t0 - self.excluded
                acc = averaged_accuracy(self.model)
                gns = None
                if self.policy is not None:
                    gns = round(float(self.policy.measurements().get("gns", float("nan"))), 1)
                self.curve.append((samples, self.updates, wall, acc, name, gns))
                recent = [c[3] for c in self.curve[-SMOOTH:]]
                if self.hit is None and len(recent) == SMOOTH and np.mean(recent) >= s["target"]:
                    self.hit = (self.updates, wall)
                while self.next_eval <= samples:
                    self.next_eval += s["eval_every"]
                self.excluded += time.perf_counter() - now
            if done:
                self.model.stop_training = True

    def optimizer_setup(config, budget):
        """(sync_strategy, DistributedOptimizer keyword arguments, policy or None)."""
        if config in ("ssgd_small", "ssgd_large"):
            return AllReduceSGD(), {"gradient_stats": False}, None
        if config == "sma":
            return ModelAveraging(alpha=s["alpha"]), {"gradient_stats": False}, None
        if config == "local_sgd":
            return LocalSGD(period=s["period"]), {"gradient_stats": False}, None
        if config == "post_local":
            first_decay = int(np.ceil(DECAYS[0] * budget / (workers * s["small"])))
            return (LocalSGD(period=s["period"], start_after=first_decay),
                    {"gradient_stats": False}, None)
        if config == "block_momentum":
            return BlockMomentum(period=s["period"], **s["bmuf"]), {"gradient_stats": False}, None
        return adaptive_setup()

    def adaptive_setup():
        """The adaptive configuration: both strategies declared, statistics on,
        the policy at its defaults, reading the communication fraction from a
        WorkerTimingMonitor (one small allgather per 10 steps)."""
        local = LocalSGD(period=s["period"])
        timing = keras_adapt.callbacks.WorkerTimingMonitor(interval=10)
        policy = SyncStrategyPolicy(local=local, interval=10, timing=timing, **s["policy"])
        return [AllReduceSGD(), local], {"gradient_stats": True}, policy

    def run(config, delay_ms, lr):
        if delay_ms:
            os.environ[_hvd.DELAY_ENV] = str(delay_ms)
        else:
            os.environ.pop(_hvd.DELAY_ENV, None)
        model = build()
        budget = int(s["passes"] * len(x))
        strategy, kwargs, policy = optimizer_setup(config, budget)
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                               sync_strategy=strategy, **kwargs)
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        micro = s["large"] if config == "ssgd_large" else s["small"]
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=micro, seed=0)
        callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0)]
        if policy is not None:
            if policy.timing is not None:
                callbacks.append(policy.timing)  # measures before the policy reads it
            callbacks.append(policy)
        tracker = Tracker(ds, budget, policy)
        callbacks.append(tracker)
        before, delayed_before = counted(), _hvd.delayed_collectives()
        model.fit(ds.dataset, steps_per_epoch=budget // (workers * micro) + 10, epochs=1,
                  verbose=0, callbacks=callbacks)
        after = counted()
        os.environ.pop(_hvd.DELAY_ENV, None)
        samples, updates, wall, acc = tracker.curve[-1][:4]
        return {
            "config": config, "delay_ms": delay_ms, "lr": lr, "global_batch": workers * micro,
            "samples": samples, "updates": updates, "wall": wall, "final": acc,
            "updates_to_target": tracker.hit and tracker.hit[0],
            "wall_to_target": tracker.hit and tracker.hit[1],
            "collectives": after["allreduce"] - before["allreduce"],
            "broadcasts": after["broadcast"] - before["broadcast"],
            "gathers": after["allgather"] - before["allgather"],
            "delayed": _hvd.delayed_collectives() - delayed_before if delay_ms else None,
            "strategies": tracker.strategies,
            "events": [] if policy is None else [
                {"step": e["step"], "reason": e["reason"], "after": e["after"]["sync_strategy"],
                 "period": e["after"].get("period")}
                for e in policy.events],
            "curve": tracker.curve,
        }

    configs = args.configs or CONFIGS
    result = {"settings": s, "train_size": len(x), "delay_ms": args.delay_ms,
              "rounds": args.rounds}
    if args.tune:
        result["tuning"] = {
            c: [{k: r[k] for k in ("lr", "final", "wall_to_target")}
                for r in (run(c, 0, lr) for lr in s["lr_grid"][c])]
            for c in ("ssgd_small", "ssgd_large") if c in configs}
    else:
        order = [(c, d) for c in configs for d in (0, args.delay_ms)]
        runs = {}
        for i in range(args.rounds):
            # alternate delay / no delay, reversed every other round
            for c, d in (order if i % 2 == 0 else order[::-1]):
                lr = s.get(f"lr_{c}", s["lr_small"])
                runs.setdefault(f"{c}@{'delay' if d else 0}", []).append(run(c, d, lr))
        result["runs"] = {f"{c}@{'delay' if d else 0}": runs[f"{c}@{'delay' if d else 0}"]
                          for c, d in order}
    result.update(describe_stack(load_before))
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--tune", action="store_true",
                        help="run the LR grids of the S-SGD baselines instead")
    parser.add_argument("--task", choices=sorted(TASKS), default="teacher_student",
                        help="the data and model (default: teacher_student)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="repetitions of every configuration (order reversed each round)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="simulated delay before each collective in the delayed runs")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, help="a subset of configurations")
    parser.add_argument("--curves", action="store_true", help="also print the accuracy curves")
    parser.add_argument("--set", action="append", metavar="KEY=JSON",
                        help="override a setting, e.g. passes=10")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
