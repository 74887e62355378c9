"""Time to accuracy: adaptive batch size vs fixed small and fixed large batches.

Run from the repository (it launches itself on 2 local workers, Gloo):

    .venv/bin/python benchmarks/time_to_accuracy.py          # primary stack
    .venv-keras2/bin/python benchmarks/time_to_accuracy.py   # legacy stack
    .venv/bin/python benchmarks/time_to_accuracy.py --quick  # smoke run (~1 min, two tasks)
    .venv/bin/python benchmarks/time_to_accuracy.py --tune   # the LR grids
    .venv/bin/python benchmarks/time_to_accuracy.py --tasks digits --configs goodput --repeats 3
    .venv/bin/python benchmarks/time_to_accuracy.py --tasks classification --seeds 0 1 2
    .venv/bin/python benchmarks/time_to_accuracy.py --configs gns goodput --budget samples

How to read it
--------------
Four tasks, each trained several ways in the same two worker processes,
one after the other (Keras' state cleared before each run; the order of
the runs reversed on odd seeds and odd repeats, so that no configuration
is always the first or the last), from the same initial weights and the
same seeded, sharded data stream (``keras_adapt.data.AdaptiveBatchDataset``); a
2 x 128 ReLU MLP (2 x 1024 on ``teacher_student_wide``), SGD with momentum 0.9:

* ``small``   fixed small global batch (2 workers x 16), LR tuned;
* ``large``   fixed global batch = ``max_batch``, LR tuned on a grid of the
  same size (the best equals the linearly scaled LR on teacher_student and
  is far below it on digits, where the scaled one diverges);
* ``fixed``   the sweep: every power-of-two global batch between the two,
  each at the learning rates lr_small x k^e, k = batch / min_batch, e in
  {0, 1/4, 1/2, 3/4, 1} (from the small batch's rate unchanged, through
  square-root, to linear scaling). Per batch the best rate (final accuracy)
  is reported with the measured training time per update. The **best fixed
  batch in hindsight** is, of all fixed runs (small, large, sweep) that
  reach the target and end within 0.5 points of the most accurate fixed
  run, the fastest to the target: the batch and rate a user would have
  tuned;
* ``gns``     ``GNSBatchSizePolicy`` with the library's defaults (batch ->
  2 x the measured noise scale, the LR scaled linearly with it; with
  ``--budget samples`` only while 300 updates remain in the sample budget,
  which it is told): starts at the small batch with the small batch's LR;
  the batch grows through the dataset's micro-batch;
* ``goodput`` ``GoodputBatchSizePolicy`` with the library's defaults (no
  per-task setting): same start, its default AdaScale rule; up to the
  batch with the most goodput while every sample keeps efficiency
  phi / (phi + M) >= the floor (1/3 on progress epochs, M <= 2 phi; 2/3
  with ``--budget samples``, M <= phi / 2), step
  times from its throughput model or flat before it has a fit
  (docs/policies.md).

Tasks: ``teacher_student`` (``keras_adapt.data.teacher_student``, 8-dim
inputs, 10 classes, 5% label noise; 50k train, 10k test; its noise scale
grows from about 150 to 450 within the budget), ``teacher_student_wide``
(the same teacher, 20k train, 5k test, a 2 x 1024 MLP: compute-bound, its
step time grows with the batch, as on an accelerator once it is full; the
sweep's table shows it), scikit-learn ``digits`` (1300 train, 497 test;
noise scale about 25 -> 70); ``classification``, added after the
policies' defaults were chosen on the other three, to see whether they
carry over (scikit-learn's ``make_classification``: 32 features, 10
classes of two Gaussian clusters each, 5% flipped labels; 20k train, 5k
test, 5 passes).

Protocol. Every fixed configuration gets the same number of training
samples (``passes`` over the training set), and for all runs the LR drops
10x for the last 20% of their budget, so the final accuracy is a trained
model's and not a snapshot of SGD noise. The held-out test set is
evaluated every ``eval_every`` training samples (at the first update after
it), the same grid for all; evaluation time is not counted (nor by the
policies' step timers: it runs inside ``keras_adapt.monitors.paused()``). Wall time
starts after the first update, so nobody pays for graph tracing.

* ``updates``/``wall`` to target: optimizer updates and training seconds
  at the first evaluation where the mean of the last 3 evaluations is >=
  the task's ``target`` (smoothed, so one lucky evaluation does not count;
  None if never reached). The targets were fixed from the small batch
  alone: about what it holds at two thirds of its budget, before the decay
  (teacher_student 0.83, digits 0.975);
* ``final``: test accuracy at the end of the budget.

The policies' budget (``--budget``) is by default AdaptDL's: their
statistical progress (``TrainingProgress``: each update adds B x E(B)
from the measured noise scale against the start batch), not their samples.
That is what AdaptDL's ``AdaptiveDataLoader`` does whenever adaptive batch
size is on (an epoch ends after "enough statistical progress roughly
equivalent to one pass over the dataset with non-adaptive batch size"), so
it is the protocol on which Pollux's results, and this benchmark's bars,
are judged. Each policy run is ``fit`` over 10 epochs that the policy ends
(``epoch_end="progress"``, a tenth of the budget each), the LR drops from
the 9th, and the run ends with the 10th; so a policy at a batch beyond the
noise scale trains on more samples than the fixed runs (the ``passes``
column). The fixed runs keep their sample budget (at a fixed batch
AdaptDL's epochs are passes). At the start batch progress equals samples,
so a policy that never grows trains exactly as the small batch. The GNS
policy gets no ``sample_budget`` there (it refuses one on progress epochs:
an update adds at most B_simple + B0 progress, so the end of the schedule
keeps its updates without the budget's cap).

``--budget samples`` gives the policies the fixed runs' sample budget
instead: a policy that grows then trains on fewer updates' worth of
progress, and McCandlish et al.'s efficiency says what that costs near the
noise scale (docs/policies.md, "Where the accuracy goes" and "The goodput
policy's accuracy: no single default meets the 0.5-point bar", measure it).

``speedup_vs_X`` = wall_X / wall_gns to the target (> 1: the adaptive
policy is faster; null when one of them never reached it);
``acc_delta_vs_X`` = final_gns - final_X in accuracy points (percent);
``update_ratio_vs_X``: the same ratio in updates (steadier than wall time on
a busy machine; with the 2 x 128 MLP the step time barely depends on the
batch, so the two agree; not on the wide task). X is ``small``, ``large``
or ``best_fixed`` (the best fixed batch in hindsight, also given as
``best_fixed``: the fastest to the target of the fixed runs within 0.5 pt
of the most accurate, the more accurate of one batch's rates that need the
same updates; ``fixed_sweep`` lists each batch at its best rate with its
step time in ms). The ``goodput_*`` fields give the same for the goodput
policy. ``met`` is the target: speedup_vs_small >= 1.5 with
acc_delta_vs_small >= -0.5 and acc_delta_vs_large > 0; ``met_vs_best_fixed``
the stricter one: speedup_vs_best_fixed >= 1.0 with
acc_delta_vs_best_fixed >= -0.5, and speedup_vs_small >= 2.

LR tuning (``--tune``): each fixed baseline runs a 5-point grid and keeps
the best final accuracy. Found: teacher_student small 0.02 (grid 0.005-0.1),
large 1.28 (grid 0.16-2.56; 2.56 and 5.12 diverge); teacher_student_wide
small 0.05 (grid 0.005-0.1), large not yet tuned (0.4, the square-root
scaled rate; the sweep tries five rates at 2048 anyway); digits small 0.1
(grid 0.01-0.2), large 0.2 (grid 0.1-1.6). The policies reuse the small
batch's LR untouched. ``GNSBatchSizePolicy`` gets only what the benchmark
must give (bounds, dataset, largest micro-batch, the sample budget): every other setting is the
library's default, the same on every task (docs/policies.md, "When adaptive
batch size pays off", says how they were chosen). ``GoodputBatchSizePolicy``
runs the library's defaults too (how they were chosen: below), its
learning rate following AdaScale's gain (Pollux's pairing; linear scaling
diverged for the earlier policy on digits when it jumped to 512: 16 x 0.1).

Baselines run ``keras_adapt.DistributedOptimizer(gradient_stats=False)``
(no monitoring cost); the policies pay for their statistics. Each worker is
pinned to its own core with one TensorFlow thread. On a shared machine the
wall times move by several percent between runs: ``--repeats N`` runs
every configuration N times (N rounds of all runs, alternately forward and
reversed) and reports the run with the median wall time
to the target, every run's wall time (``wall_to_target_runs``) and, for
the policies, every run's decisions (``trajectory_runs``: the batch
trajectory) and whether they were the same each time
(``same_decisions``): timing noise must not change them. Each seed's raw
results stay in a temporary directory ``time_to_accuracy_*`` (its
``rank0.json``): per run also every ``batch_size`` decision with its reason
and, for a policy that times its updates, ``model_step_ms``: the median ms
per update and the observations its throughput model kept, per global batch.

A seed (``--seeds``, default 0, recorded as ``seed``) draws the initial
weights and the order of the training samples; the data themselves stay
the task's. With several seeds every run is made once per seed and the
report is of the means over seeds (to the target: only when every seed
reached it), with every seed's final accuracy and, against the best fixed
batch (chosen on the means), every seed's ``acc_delta_vs_best_fixed_seeds``
and ``update_ratio_vs_best_fixed_seeds``. One seed's final accuracy moves
by several tenths of a point from seed to seed, as much as the 0.5-point
tolerance (docs/policies.md): a comparison at that tolerance needs several.

How the goodput policy's defaults were chosen (updates to the target and
final accuracy; the fixed runs from one sweep): pure goodput with flat
step times went to the largest batch (teacher_student 32 -> 64 -> 2048,
final 0.822 against 0.870 for the small batch). With the efficiency floor
at 0.7 and a 5% dead band it oscillated with the noise scale (32 -> 64 ->
128 -> 64 -> 128 -> 256 -> 128 -> 256 -> 512) and ended 0.95 points below
the small batch; at 0.75 with a 25% dead band: teacher_student 32 -> 64 ->
128 -> 256, 941 updates, 0.8643; digits 32 -> 64, 218, 0.9779; the wide
task 32 -> 64 -> 128, 685, 0.8550; at 0.8 the same to 0.05 points on the
teacher-student tasks (961 and 695 updates) but digits stayed at 32 until
update 751 (569 updates, as the small batch). Hence 0.75 on samples (those
runs grew one doubling per decision; the policy now moves to its best
batch at once, which changed seed 1 of the teacher-student tasks only). On
progress epochs the floor is 1/3 (docs/policies.md, "Moving to the best
batch at once"). Those floors were on Pollux's E(M) against the small
batch; they are now on phi / (phi + M), 2/3 and 1/3, which bounds the
batch by the noise scale alone (docs/policies.md, "The floor against the
noise scale alone").
"""

import argparse
import gc
import json
import time

from _workers import parser as worker_parser
from _workers import pin_worker, run_on_workers, write_result

CONFIGS = ("small", "large", "fixed", "gns", "goodput")
#: The learning rates each fixed batch B of the sweep tries: lr_small x k**e
#: for these e, k = B / min_batch (0: the small batch's rate unchanged, 0.5:
#: square-root scaling, 1: linear scaling).
SWEEP_LR_EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: A fixed batch counts as "as accurate" as the best fixed one when its final
#: accuracy is within this of the best (the target's +-0.5 pt).
EQUAL_ACCURACY = 0.005
DECAY_AT, DECAY = 0.8, 0.1  # the LR drops 10x for the last 20% of the sample budget
#: With ``--budget progress`` a policy's run is this many fit epochs, each a
#: tenth of the budget's progress, ended by the policy (epoch_end="progress");
#: the LR drops from epoch DECAY_AT x POLICY_EPOCHS on.
POLICY_EPOCHS = 10
SMOOTH = 3  # the target counts as reached when the mean of the last 3 evaluations reaches it

# The policies' settings on every task. GNSBatchSizePolicy runs with the
# library's defaults (its learning-rate rule included): only the bounds,
# the data and the largest micro-batch are given.
GNS_SETTINGS = {}
GOODPUT_SETTINGS = {}  # GoodputBatchSizePolicy: the library's defaults too
TEACHER = {"dim": 8, "hidden": 32}  # keras_adapt.data.teacher_student's teacher

# Per task: data, model, batch bounds, sample budget, evaluation grid,
# target, and the learning rates found by ``--tune`` (SGD, momentum 0.9).
TASKS = {
    "teacher_student": {
        "data": "teacher_student",
        "train": 50_000, "test": 10_000, "teacher": TEACHER,
        "hidden": 128,
        "min_batch": 32, "max_batch": 2048,
        "passes": 3.0, "eval_every": 5_000,
        "target": 0.83,
        "lr_small": 0.02, "lr_large": 1.28,
        "gns": GNS_SETTINGS,
        "goodput": GOODPUT_SETTINGS,
        "lr_grid": {"small": [0.005, 0.01, 0.02, 0.05, 0.1], "large": [0.16, 0.32, 0.64, 1.28, 2.56]},
    },
    # The compute-bound task: the same teacher, a 2 x 1024 MLP whose step
    # time grows with the batch on a CPU core (as on an accelerator once it
    # is full), so fewer, costlier updates are a real trade-off.
    "teacher_student_wide": {
        "data": "teacher_student",
        "train": 20_000, "test": 5_000, "teacher": TEACHER,
        "hidden": 1024,
        "min_batch": 32, "max_batch": 2048,
        "passes": 3.0, "eval_every": 2_000,
        "target": 0.83,
        # lr_small from --tune (grid below: 0.8282, 0.8380, 0.8494, 0.8600,
        # 0.8504); lr_large is the square-root-scaled rate, not yet tuned.
        "lr_small": 0.05, "lr_large": 0.4,
        "gns": GNS_SETTINGS,
        "goodput": GOODPUT_SETTINGS,
        "lr_grid": {"small": [0.005, 0.01, 0.02, 0.05, 0.1], "large": [0.2, 0.4, 0.8, 1.6, 3.2]},
    },
    # A fourth task, added to check that the GNS policy's defaults (chosen
    # on the three above) carry over: another data generator (scikit-learn's
    # make_classification: 10 classes of Gaussian clusters, 5% flipped
    # labels), a longer budget in updates (5 passes of 20k: 3125 updates at
    # the small batch).
    "classification": {
        "data": "classification",
        "train": 20_000, "test": 5_000,
        "hidden": 128,
        "min_batch": 32, "max_batch": 2048,
        "passes": 5.0, "eval_every": 2_000,
        # lr from --tune (small 0.005..0.1: 0.7934, 0.8168, 0.8066, 0.5614,
        # 0.2196; large 0.16..2.56: 0.6432, 0.6264, 0.1318, 0.1000, 0.0956)
        "target": 0.79,
        "lr_small": 0.01, "lr_large": 0.16,
        "gns": GNS_SETTINGS,
        "goodput": GOODPUT_SETTINGS,
        "lr_grid": {"small": [0.005, 0.01, 0.02, 0.05, 0.1], "large": [0.16, 0.32, 0.64, 1.28, 2.56]},
    },
    "digits": {
        "data": "digits",
        "test": 497,
        "hidden": 128,
        "min_batch": 32, "max_batch": 512,
        "passes": 30.0, "eval_every": 1_300,
        "target": 0.975,
        "lr_small": 0.1, "lr_large": 0.2,
        "gns": GNS_SETTINGS,
        "goodput": GOODPUT_SETTINGS,
        "lr_grid": {"small": [0.01, 0.02, 0.05, 0.1, 0.2], "large": [0.1, 0.2, 0.4, 0.8, 1.6]},
    },
}

QUICK = {  # smoke mode: the same code paths on a fraction of the data
    "teacher_student": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "teacher_student_wide": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "classification": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "digits": {"passes": 3.0, "eval_every": 1_300},
}
#: The tasks of a smoke run unless --tasks says otherwise.
QUICK_TASKS = ("teacher_student", "digits")
#: Smoke mode's sweep: one batch between the bounds, linear scaling.
QUICK_SWEEP = {"lr_exponents": (1.0,)}


def sweep_batches(s, quick=False):
    """The fixed global batches of the sweep: powers of two above
    ``min_batch`` up to ``max_batch`` (smoke mode: the middle one)."""
    out, b = [], 2 * s["min_batch"]
    while b <= s["max_batch"]:
        out.append(b)
        b *= 2
    if quick:
        out = [out[len(out) // 2]]
    return out


def sweep_rates(s, batch, quick=False):
    """The learning rates the sweep tries at ``batch`` (see SWEEP_LR_EXPONENTS)."""
    k = batch / s["min_batch"]
    exponents = QUICK_SWEEP["lr_exponents"] if quick else SWEEP_LR_EXPONENTS
    return [float(f"{s['lr_small'] * k ** e:.4g}") for e in exponents]


def task_settings(args):
    out = {}
    for name in args.tasks:
        cfg = json.loads(json.dumps(TASKS[name]))
        if args.quick:
            cfg.update(QUICK[name])
            for key in ("gns", "goodput"):
                cfg[key].update(warmup_updates=10, min_change_interval=20, interval=5)
        for item in args.set or []:  # task.key=json, for experiments
            key, value = item.split("=", 1)
            task, _, field = key.partition(".")
            if task == name:
                target = cfg
                parts = field.split(".")
                for p in parts[:-1]:
                    target = target[p]
                target[parts[-1]] = json.loads(value)
        out[name] = cfg
    return out


# ---------------------------------------------------------------- launcher
def launch(args):
    extra = ["--tasks", *args.tasks]
    extra += [f"--{flag}" for flag in ("quick", "tune") if getattr(args, flag)]
    for item in args.set or []:
        extra += ["--set", item]
    if args.configs:
        extra += ["--configs", *args.configs]
    extra += ["--repeats", args.repeats, "--budget", args.budget]
    t0 = time.perf_counter()
    results = [run_on_workers(__file__, extra + ["--seed", seed], "time_to_accuracy_")
               for seed in args.seeds]
    result = results[0] if len(results) == 1 else over_seeds(results)
    if args.tune:
        report_tuning(result)
    else:
        report(result, time.perf_counter() - t0, args.curves)


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def report_tuning(result):
    for task, runs in result["tuning"].items():
        print(f"\nLR grid, task={task} ({result['versions']})")
        for label, rows in runs.items():
            best = max(rows, key=lambda r: (r["final"], -(r["wall_to_target"] or 1e9)))
            for r in rows:
                mark = "  <- best" if r is best else ""
                print(f"  {label:6s} lr={r['lr']:<8g} final={r['final']:.4f} "
                      f"to_target={_fmt(r['wall_to_target'], '.2f')}s{mark}")


def report(result, elapsed, curves=False):
    for task, res in result["tasks"].items():
        s = res["settings"]
        runs = res["runs"]
        seeds = result["seed"]
        seeds = f"seeds {seeds} (means)" if isinstance(seeds, list) else f"seed {seeds}"
        print(f"\ntime to accuracy, task={task}, stack={result['stack']} ({result['versions']}), "
              f"2 workers, Gloo, {seeds}; budget {s['passes']:g} passes of "
              f"{res['train_size']} samples, "
              f"target {s['target']:.3f}; the policies at the library's defaults, their budget "
              f"in {result['budget']}")
        print(f"{'config':8s} {'lr':>7s} {'batch':>14s} {'updates':>8s} {'passes':>6s} {'wall':>7s} "
              f"{'upd@tgt':>8s} {'wall@tgt':>9s} {'final':>7s}")
        for c, r in runs.items():
            batches = r["batches"]
            span = f"{batches[0]}" if len(set(batches)) == 1 else f"{batches[0]}->{batches[-1]}"
            passes = r["samples"] / res["train_size"] if r.get("samples") else None
            print(f"{c:8s} {r['lr']:7.4g} {span:>14s} {r['updates']:8d} {_fmt(passes, '6.2f')} "
                  f"{r['wall']:6.2f}s "
                  f"{_fmt(r['updates_to_target'], '8d')} {_fmt(r['wall_to_target'], '8.2f')}s "
                  f"{r['final']:7.4f}")
        for c, r in runs.items():
            walls = r.get("wall_to_target_runs") or []
            if len(walls) > 1:
                print(f"  {c} wall@tgt over {len(walls)} runs: "
                      + " ".join(_fmt(w, ".2f") for w in walls)
                      + (f"; same decisions in every run: {r['same_decisions']}"
                         if c in ("gns", "goodput") else ""))
        sweep = res.get("sweep") or []
        if sweep:
            best = best_fixed(res)
            print(f"fixed batches, each at its best LR of {len(SWEEP_LR_EXPONENTS)} "
                  f"(lr_small x k^e, e in {list(SWEEP_LR_EXPONENTS)}, k = batch / {s['min_batch']}); "
                  "step = training seconds per update")
            print(f"{'batch':>6s} {'lr':>7s} {'step':>8s} {'upd@tgt':>8s} {'wall@tgt':>9s} {'final':>7s}")
            for r in per_batch_best(res):
                print(f"{r['batch']:6d} {r['lr']:7.4g} {1000 * r['step_s']:6.2f}ms "
                      f"{_fmt(r['updates_to_target'], '8d')} {_fmt(r['wall_to_target'], '8.2f')}s "
                      f"{r['final']:7.4f}")
            if best:
                print(f"best fixed in hindsight (the fastest to the target within "
                      f"{100 * EQUAL_ACCURACY:g} pt of the most accurate): batch {best['batch']}, "
                      f"lr {best['lr']:g}, {_fmt(best['updates_to_target'], 'd')} updates, "
                      f"{_fmt(best['wall_to_target'], '.2f')} s to the target, final "
                      f"{best['final']:.4f}")
        if curves:
            for c, r in runs.items():
                print(f"  {c} curve (samples, updates, wall, acc, batch, gns):",
                      " ".join(f"({a},{u},{w:.1f},{acc:.3f},{b},{g})" for a, u, w, acc, b, g in r["curve"]))
                for step, before, after, reason in r.get("decisions", []):
                    print(f"    update {step}: batch {before} -> {after} ({reason})")
        line = summary(task, result, res)
        if "gns" in runs:
            print(f"met: {line['met']}  (speedup_vs_small {line['speedup_vs_small']}, "
                  f"acc_delta_vs_small {line['acc_delta_vs_small']}, "
                  f"acc_delta_vs_large {line['acc_delta_vs_large']})")
        for prefix in ("", "goodput_"):
            if prefix + "speedup_vs_best_fixed" in line:
                print(f"{prefix or 'gns_'}vs best fixed: speedup {line[prefix + 'speedup_vs_best_fixed']}"
                      f", updates {line[prefix + 'update_ratio_vs_best_fixed']}, acc_delta "
                      f"{line[prefix + 'acc_delta_vs_best_fixed']}; met "
                      f"{line[prefix + 'met_vs_best_fixed']}")
            if prefix + "acc_delta_vs_best_fixed_seeds" in line:
                print(f"  per seed: acc_delta {line[prefix + 'acc_delta_vs_best_fixed_seeds']}, "
                      f"updates {line[prefix + 'update_ratio_vs_best_fixed_seeds']}")
        print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


def fixed_runs(res):
    """Every fixed-batch run of a task: ``small``, ``large`` and the sweep's,
    each with its global ``batch``."""
    s, runs = res["settings"], res["runs"]
    out = [dict(runs[c], batch=s["min_batch"] if c == "small" else s["max_batch"])
           for c in ("small", "large") if c in runs]
    return out + list(res.get("sweep") or [])


def per_batch_best(res):
    """Per fixed batch, its run at the best learning rate (highest final
    accuracy; of equal ones, the fastest to the target), by batch."""
    best = {}
    for r in fixed_runs(res):
        key = (r["final"], -(r["wall_to_target"] or float("inf")))
        if r["batch"] not in best or key > best[r["batch"]][0]:
            best[r["batch"]] = (key, r)
    return [dict(r, step_s=r["wall"] / max(r["updates"], 1)) for _, (_, r) in sorted(best.items())]


def best_fixed(res):
    """The fixed batch and learning rate a user would have tuned, chosen in
    hindsight: of the fixed runs that reached the target and ended within
    EQUAL_ACCURACY of the most accurate fixed run, the fastest to the
    target; if none of those reached it, the most accurate fixed run.

    Runs of one batch that reach the target in the same number of updates
    differ in wall time only by the machine's noise: of those, only the
    most accurate competes (a user tuning the rate would keep that one).

    >>> row = lambda batch, lr, upd, wall, final: dict(
    ...     batch=batch, lr=lr, updates_to_target=upd, wall_to_target=wall, final=final)
    >>> res = {"settings": {}, "runs": {}, "sweep": [
    ...     row(64, 0.03, 900, 2.0, 0.865), row(64, 0.04, 900, 1.9, 0.870),
    ...     row(128, 0.08, 500, 1.5, 0.850)]}
    >>> best_fixed(res)["lr"]  # 128 is 2 pt less accurate; of 64's tie, the more accurate
    0.04
    >>> res["sweep"][1]["wall_to_target"] = 2.1
    >>> best_fixed(res)["lr"]  # wall noise within the tie does not flip the choice
    0.04
    """
    runs = fixed_runs(res)
    if not runs:
        return None
    top = max(runs, key=lambda r: r["final"])
    eligible = [r for r in runs if r["wall_to_target"] is not None
                and r["final"] >= top["final"] - EQUAL_ACCURACY - 1e-12]
    tied = {}  # (batch, updates to the target) -> its most accurate run
    for r in eligible:
        key = (r["batch"], r["updates_to_target"])
        if key not in tied or r["final"] > tied[key]["final"]:
            tied[key] = r
    return min(tied.values(), key=lambda r: r["wall_to_target"], default=top)


def _speedup(runs, base, ours, key="wall_to_target"):
    if base not in runs:
        return None
    a, b = runs[base][key], runs[ours][key]
    if a is None or b is None:
        return None
    return round(a / b, 3)


def summary(task, result, res):
    runs = res["runs"]

    def delta(ours, base):
        if base not in runs:
            return None
        return round(100 * (runs[ours]["final"] - runs[base]["final"]), 2)

    line = {"bench": "time_to_accuracy", "task": task}
    if "gns" in runs:
        line.update(speedup_vs_small=_speedup(runs, "small", "gns"),
                    acc_delta_vs_small=delta("gns", "small"),
                    speedup_vs_large=_speedup(runs, "large", "gns"),
                    acc_delta_vs_large=delta("gns", "large"))
        line.update(update_ratio_vs_small=_speedup(runs, "small", "gns", "updates_to_target"),
                    update_ratio_vs_large=_speedup(runs, "large", "gns", "updates_to_target"))
    if "goodput" in runs:
        line.update(goodput_speedup_vs_small=_speedup(runs, "small", "goodput"),
                    goodput_acc_delta_vs_small=delta("goodput", "small"),
                    goodput_speedup_vs_large=_speedup(runs, "large", "goodput"),
                    goodput_acc_delta_vs_large=delta("goodput", "large"),
                    goodput_update_ratio_vs_small=_speedup(runs, "small", "goodput",
                                                           "updates_to_target"),
                    goodput_update_ratio_vs_large=_speedup(runs, "large", "goodput",
                                                           "updates_to_target"))

    best = best_fixed(res) if res.get("sweep") else None
    for prefix, config in (("", "gns"), ("goodput_", "goodput")):
        if best is None or config not in runs:
            continue
        ours = runs[config]

        def ratio(key):
            if best[key] is None or ours[key] is None:
                return None
            return round(best[key] / ours[key], 3)

        speedup = ratio("wall_to_target")
        acc = round(100 * (ours["final"] - best["final"]), 2)
        if "seeds" in ours:  # means over seeds: every seed's comparison too
            a, b = ours["seeds"], best["seeds"]
            line[prefix + "acc_delta_vs_best_fixed_seeds"] = [
                round(100 * (x - y), 2) for x, y in zip(a["final"], b["final"])]
            line[prefix + "update_ratio_vs_best_fixed_seeds"] = [
                None if x is None or y is None else round(y / x, 3)
                for x, y in zip(a["updates_to_target"], b["updates_to_target"])]
        small = line.get(prefix + "speedup_vs_small")
        line.update({prefix + "speedup_vs_best_fixed": speedup,
                     prefix + "update_ratio_vs_best_fixed": ratio("updates_to_target"),
                     prefix + "acc_delta_vs_best_fixed": acc,
                     prefix + "met_vs_best_fixed": speedup is not None and speedup >= 1.0
                     and acc >= -100 * EQUAL_ACCURACY and small is not None and small >= 2.0})
    if best is not None:
        line["best_fixed"] = {k: best[k] if not isinstance(best[k], float) else round(best[k], 4)
                              for k in ("batch", "lr", "updates_to_target", "wall_to_target",
                                        "final")}
        line["fixed_sweep"] = [{"batch": r["batch"], "lr": r["lr"],
                                "step_ms": round(1000 * r["step_s"], 3),
                                "updates_to_target": r["updates_to_target"],
                                "wall_to_target": None if r["wall_to_target"] is None
                                else round(r["wall_to_target"], 3),
                                "final": round(r["final"], 4)} for r in per_batch_best(res)]

    def met(prefix):
        sp, ds, dl = (line.get(prefix + k) for k in
                      ("speedup_vs_small", "acc_delta_vs_small", "acc_delta_vs_large"))
        return sp is not None and sp >= 1.5 and ds >= -0.5 and dl is not None and dl > 0

    line["met"] = met("") if "gns" in runs else None
    if "goodput" in runs:
        line["goodput_met"] = met("goodput_")
    s = res["settings"]
    line.update(
        stack=result["stack"], seed=result["seed"], target=s["target"], passes=s["passes"],
        budget=result["budget"],
        configs={c: {"lr": r["lr"], "updates": r["updates"], "wall": round(r["wall"], 3),
                     "samples": r.get("samples"),
                     "updates_to_target": r["updates_to_target"],
                     "wall_to_target": None if r["wall_to_target"] is None
                     else round(r["wall_to_target"], 3),
                     "final": round(r["final"], 4),
                     "wall_to_target_runs": [None if w is None else round(w, 3)
                                             for w in r.get("wall_to_target_runs", [])],
                     "same_decisions": r.get("same_decisions"),
                     "batch_trajectory": r["trajectory"],
                     **({"seeds": r["seeds"]} if "seeds" in r else {}),
                     **({"trajectory_runs": r["trajectory_runs"]}
                        if r.get("same_decisions") is False else {})}
                 for c, r in runs.items()},
    )
    return line


def _mean_or_none(values):
    return None if any(v is None for v in values) else sum(values) / len(values)


def over_seeds(results):
    """One result from the workers' results of several seeds: per run (a
    configuration, or a batch and rate of the sweep), the mean final
    accuracy, updates and wall times over the seeds, and to the target the
    mean only when every seed reached it (else None); every seed's final
    accuracy and updates to the target in ``seeds`` (for repeated policy
    runs also each seed's ``same_decisions`` and ``trajectory_runs``). The
    trajectory and curve are the first seed's.

    >>> one = lambda seed, final, upd: {"stack": "primary", "versions": "v", "seed": seed,
    ...     "tasks": {"t": {"settings": {}, "train_size": 10, "sweep": [], "runs": {"small": {
    ...         "lr": 0.1, "updates": 100, "wall": 1.0, "final": final,
    ...         "updates_to_target": upd, "wall_to_target": upd and upd / 100}}}}}
    >>> merged = over_seeds([one(0, 0.80, 50), one(1, 0.84, 70)])
    >>> run = merged["tasks"]["t"]["runs"]["small"]
    >>> merged["seed"], round(run["final"], 4), run["updates_to_target"], run["seeds"]["final"]
    ([0, 1], 0.82, 60, [0.8, 0.84])
    >>> over_seeds([one(0, 0.80, 50), one(1, 0.84, None)])["tasks"]["t"]["runs"]["small"][
    ...     "updates_to_target"] is None
    True
    """
    def merge(rows):
        out = dict(rows[0])
        out.update(final=sum(r["final"] for r in rows) / len(rows),
                   updates=round(sum(r["updates"] for r in rows) / len(rows)),
                   wall=sum(r["wall"] for r in rows) / len(rows),
                   samples=_mean_or_none([r.get("samples") for r in rows]),
                   wall_to_target=_mean_or_none([r["wall_to_target"] for r in rows]),
                   seeds={"final": [r["final"] for r in rows],
                          "updates_to_target": [r["updates_to_target"] for r in rows]})
        upd = _mean_or_none([r["updates_to_target"] for r in rows])
        out["updates_to_target"] = None if upd is None else round(upd)
        if "trajectory_runs" in out:  # the repeats of every seed
            out["same_decisions"] = all(r["same_decisions"] for r in rows)
            out["wall_to_target_runs"] = [w for r in rows for w in r["wall_to_target_runs"]]
            out["seeds"].update(same_decisions=[r["same_decisions"] for r in rows],
                                trajectory_runs=[r["trajectory_runs"] for r in rows])
        return out

    merged = dict(results[0], seed=[r["seed"] for r in results], tasks={})
    for name, first in results[0]["tasks"].items():
        per_seed = [r["tasks"][name] for r in results]
        merged["tasks"][name] = dict(
            first,
            runs={c: merge([t["runs"][c] for t in per_seed]) for c in first["runs"]},
            sweep=[merge(list(rows)) for rows in zip(*(t["sweep"] for t in per_seed))])
    return merged


def median_run(results):
    """Of one configuration's repeated runs, the one with the median wall
    time to the target (never reached counts as slowest), with every run's
    wall time to the target in ``wall_to_target_runs``; for runs that carry
    a ``trajectory`` (the batch trajectory: a policy's decisions), every
    run's in ``trajectory_runs`` and whether they were all the same in
    ``same_decisions``.

    The runs are seeded alike, so their updates and accuracies agree: the
    repeats measure the spread of the wall times on a busy machine.

    >>> median_run([{"wall_to_target": 3.0}, {"wall_to_target": None}, {"wall_to_target": 2.0}])
    {'wall_to_target': 3.0, 'wall_to_target_runs': [3.0, None, 2.0]}
    """
    walls = [r["wall_to_target"] for r in results]
    ordered = sorted(results, key=lambda r: (r["wall_to_target"] is None,
                                             r["wall_to_target"] or 0.0))
    out = dict(ordered[(len(ordered) - 1) // 2], wall_to_target_runs=walls)
    if all("trajectory" in r for r in results):
        paths = [r["trajectory"] for r in results]
        out.update(trajectory_runs=paths, same_decisions=all(p == paths[0] for p in paths))
    return out


def run_order(jobs, repeats, seed):
    """Every job ``repeats`` times, a round of all jobs per repeat, each
    round in the jobs' order on even ``seed + round`` and reversed on odd:
    a run's wall time depends on what ran before it in the same processes,
    so no configuration is always first (or last) and the repeats of one
    are spread over the whole measurement.

    >>> run_order(["a", "b", "c"], 2, seed=0)
    ['a', 'b', 'c', 'c', 'b', 'a']
    >>> run_order(["a", "b"], 1, seed=1)
    ['b', 'a']
    """
    out = []
    for r in range(repeats):
        out += jobs if (seed + r) % 2 == 0 else jobs[::-1]
    return out


# ------------------------------------------------------------------ worker
def worker(args):
    pin_worker()
    import numpy as np
    import tensorflow as tf

    import horovod
    import horovod.tensorflow as hvd
    import keras

    import keras_adapt
    from keras_adapt import _keras
    from keras_adapt.data import AdaptiveBatchDataset, teacher_student
    from keras_adapt.monitors import paused
    from keras_adapt.policies import GNSBatchSizePolicy, GoodputBatchSizePolicy

    hvd.init()
    rank, workers = hvd.rank(), hvd.size()
    settings = task_settings(args)

    def load(name, s):
        if s["data"] == "teacher_student":
            x, y = teacher_student(s["train"], seed=0, **s["teacher"])
            # another size draws other samples from the same teacher
            xt, yt = teacher_student(s["test"], seed=0, **s["teacher"])
            return x, y, xt, yt
        if s["data"] == "classification":
            from sklearn.datasets import make_classification

            x, y = make_classification(
                n_samples=s["train"] + s["test"], n_features=32, n_informative=16,
                n_redundant=4, n_classes=10, n_clusters_per_class=2, flip_y=0.05,
                class_sep=1.0, random_state=0)
            x, y = x.astype("float32"), y.astype("int64")
            return x[: s["train"]], y[: s["train"]], x[s["train"]:], y[s["train"]:]
        from sklearn.datasets import load_digits

        d = load_digits()
        x = (d.data / 16.0).astype("float32")
        y = d.target.astype("int64")
        order = np.random.default_rng(0).permutation(len(x))
        test, train = order[: s["test"]], order[s["test"]:]
        return x[train], y[train], x[test], y[test]

    class Tracker(keras.callbacks.Callback):
        """Training clock (evaluation excluded), evaluation grid, sample budget."""

        def __init__(self, ds, xt, yt, budget, eval_every, target, policy):
            super().__init__()
            self.decay_at = DECAY_AT * budget
            # With --budget progress the policy ends the epochs: the LR
            # drops at an epoch and the run ends with the last one.
            self.by_epochs = policy is not None and policy.epoch_end is not None
            self.epoch = 0
            self.decayed = False
            self.ds, self.budget, self.eval_every, self.target = ds, budget, eval_every, target
            self.xt, self.yt = tf.constant(xt), yt
            self.policy = policy
            self.excluded = 0.0
            self.t0 = None
            self.next_eval = eval_every
            self.curve = []  # (global samples, updates, train seconds, acc, global batch)
            self.hit = None
            self.trajectory = []  # (updates, global batch) at each change

        def set_model(self, model):
            super().set_model(model)
            self._logits = tf.function(lambda x: model(x, training=False))

        def accuracy(self):
            pred = np.argmax(self._logits(self.xt).numpy(), axis=1)
            return float(np.mean(pred == self.yt))

        def global_batch(self):
            acc = self.model.optimizer.adapt_state.accumulation
            k = 1 if acc is None else int(acc.steps.numpy())
            return workers * self.ds.micro_batch_size * k

        def updates(self):
            return int(self.model.optimizer.iterations.numpy())

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            if self.by_epochs and epoch >= DECAY_AT * POLICY_EPOCHS:
                self.decay()  # before the epoch's first update, as after the crossing one

        def decay(self):
            """Every configuration: LR / 10 for the last part of the budget."""
            if self.decayed:
                return
            self.decayed = True
            # Reads and writes the base rate under the policies' factor (on both
            # stacks): the effective rate x0.1.
            opt = self.model.optimizer
            opt.learning_rate = float(np.asarray(opt.learning_rate)) * DECAY

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.t0 is None:
                self.t0 = now  # the first update pays for tracing: not counted
            acc_state = self.model.optimizer.adapt_state.accumulation
            if acc_state is not None and int(acc_state.count.numpy()) != 0:
                return  # mid-accumulation: not an update boundary
            samples = self.ds.samples * workers
            b = self.global_batch()
            if not self.trajectory or self.trajectory[-1][1] != b:
                self.trajectory.append((self.updates(), b))
            if self.by_epochs:  # the policy set stop_training for an epoch's last step
                done = self.model.stop_training and self.epoch == POLICY_EPOCHS - 1
            else:
                done = samples >= self.budget
                if samples >= self.decay_at:
                    self.decay()
            if samples >= self.next_eval or done:
                wall = now - self.t0 - self.excluded
                with paused():  # not a step's time for the policy's step timer either
                    acc = self.accuracy()
                gns = None
                if self.policy is not None:
                    gns = round(float(self.policy.measurements().get("gns", float("nan"))), 1)
                self.curve.append((samples, self.updates(), wall, acc, b, gns))
                recent = [c[3] for c in self.curve[-SMOOTH:]]
                if self.hit is None and len(recent) == SMOOTH and np.mean(recent) >= self.target:
                    self.hit = (self.updates(), wall)
                while self.next_eval <= samples:
                    self.next_eval += self.eval_every
                self.excluded += time.perf_counter() - now
            if done and not self.by_epochs:
                self.model.stop_training = True

    def run(name, s, data, config, lr, batch=None):
        x, y, xt, yt = data
        # Without this, every run is slower than the one before it in the
        # same processes (measured: up to 40% by the last of a task's runs).
        keras.backend.clear_session()
        gc.collect()
        keras.utils.set_random_seed(args.seed)
        model = keras.Sequential([
            keras.Input((x.shape[1],)),
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(10),
        ])
        adaptive = config in ("gns", "goodput")
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                               gradient_stats=adaptive)
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if batch is None:
            batch = s["max_batch"] if config == "large" else s["min_batch"]
        micro = batch // workers
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=micro, seed=args.seed)
        callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0)]
        budget = int(s["passes"] * len(x))
        policy = None
        if adaptive:
            # Each policy keeps its own (default) learning-rate rule. On the
            # sample budget the GNS policy is told it, as a user would; on
            # progress epochs there is no budget in samples (and no cap).
            if args.budget == "progress":
                extra = {"epoch_end": "progress", "samples_per_epoch": budget // POLICY_EPOCHS}
            else:
                extra = {"sample_budget": budget} if config == "gns" else {}
            cls = GNSBatchSizePolicy if config == "gns" else GoodputBatchSizePolicy
            policy = cls(min_batch=s["min_batch"], max_batch=s["max_batch"], dataset=ds,
                         max_micro_batch_size=s["max_batch"] // workers, **extra, **s[config])
            callbacks.append(policy)
        tracker = Tracker(ds, xt, yt, budget, s["eval_every"], s["target"], policy)
        callbacks.append(tracker)
        if tracker.by_epochs:
            model.fit(ds.dataset, epochs=POLICY_EPOCHS, verbose=0, callbacks=callbacks)
        else:
            max_steps = budget // (workers * micro) + 10
            model.fit(ds.dataset, steps_per_epoch=max_steps, epochs=1, verbose=0,
                      callbacks=callbacks)
        last = tracker.curve[-1][:4]
        return {
            "lr": lr, "updates": last[1], "wall": last[2], "final": last[3],
            "samples": last[0],
            "updates_to_target": tracker.hit and tracker.hit[0],
            "wall_to_target": tracker.hit and tracker.hit[1],
            "batches": [b for _, b in tracker.trajectory],
            "trajectory": tracker.trajectory,
            "curve": tracker.curve,
            "events": len(policy.events) if policy else 0,
            "decisions": [[e["step"], e["before"]["batch_size"], e["after"]["batch_size"],
                           e["reason"]] for e in (policy.events if policy else [])
                          if e["kind"] == "batch_size"],
            # what the policy's throughput model saw: the median update time
            # (ms) and observations kept, per global batch
            "model_step_ms": {
                str(b * k * n): [round(float(np.median(t)) * 1e3, 2), len(t)]
                for (b, n, k), t in (policy.throughput_model.configurations().items()
                                     if policy and policy.throughput_model else [])},
        }

    result = {
        "stack": "primary" if _keras.IS_KERAS3 else "legacy", "seed": args.seed,
        "budget": args.budget,
        "versions": f"tf {tf.__version__}, keras {keras.__version__}, horovod {horovod.__version__}",
    }
    configs = args.configs or CONFIGS
    if args.tune:
        result["tuning"] = {}
        for name, s in settings.items():
            data = load(name, s)
            rows = {}
            for config in [c for c in ("small", "large") if c in configs]:
                rows[config] = []
                for lr in s["lr_grid"][config]:
                    r = run(name, s, data, config, lr)
                    rows[config].append({"lr": lr, "final": r["final"],
                                         "wall_to_target": r["wall_to_target"]})
            result["tuning"][name] = rows
    else:
        result["tasks"] = {}
        for name, s in settings.items():
            data = load(name, s)
            jobs = []  # (config, lr, batch): batch None for the policies and small/large
            for config in configs:
                if config == "fixed":
                    for batch in sweep_batches(s, args.quick):
                        for lr in sweep_rates(s, batch, args.quick):
                            if "large" in configs and (batch, lr) == (s["max_batch"], s["lr_large"]):
                                continue  # that run is "large"
                            jobs.append((config, lr, batch))
                else:
                    jobs.append((config, s["lr_large"] if config == "large" else s["lr_small"], None))
            done = {job: [] for job in jobs}
            for job in run_order(jobs, args.repeats, args.seed):
                done[job].append(run(name, s, data, *job))
            runs = {c: median_run(done[(c, lr, b)]) for c, lr, b in jobs if c != "fixed"}
            sweep = [dict(median_run(done[(c, lr, b)]), batch=b, curve=None)
                     for c, lr, b in jobs if c == "fixed"]
            result["tasks"][name] = {"settings": s, "runs": runs, "sweep": sweep,
                                     "train_size": len(data[0])}
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--tune", action="store_true",
                        help="run the LR grids of the fixed-batch baselines instead")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS),
                        help=f"default: all ({', '.join(TASKS)}); with --quick: "
                             f"{', '.join(QUICK_TASKS)}")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, help="a subset of configurations")
    parser.add_argument("--curves", action="store_true", help="also print the accuracy curves")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every configuration N times (same seeds: the same updates and "
                             "accuracies) and report the median wall time and every run's")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="initial weights and order of the training samples: one run of "
                             "everything per seed, reported as the mean over seeds with every "
                             "seed's final accuracy (default 0)")
    parser.add_argument("--budget", choices=("progress", "samples"), default="progress",
                        help="what the policies' budget counts: statistical progress, "
                             "AdaptDL's epochs (default: epoch_end='progress', so a policy "
                             "may train on more samples), or samples, as the fixed runs")
    parser.add_argument("--set", action="append", metavar="TASK.KEY=JSON",
                        help="override a task setting, e.g. digits.passes=10")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is not valid; use an int >= 1")
    if args.seed and not args.worker:
        parser.error(f"--seed={args.seed} is the workers' own option; use --seeds {args.seed}")
    if min(args.seeds) < 0 or len(set(args.seeds)) < len(args.seeds):
        parser.error(f"--seeds {' '.join(map(str, args.seeds))} is not valid; "
                     "use distinct ints >= 0")
    if args.tune and len(args.seeds) > 1:
        parser.error(f"--tune runs one seed, got --seeds {' '.join(map(str, args.seeds))}; "
                     "tune once per seed")
    if args.tasks is None:
        args.tasks = list(QUICK_TASKS if args.quick else TASKS)
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
