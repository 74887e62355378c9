"""Throughput model: predicted vs measured update times on configurations it did not see.

Run from the repository (it launches itself with horovodrun, on 1 and then 2
local workers):

    .venv/bin/python benchmarks/perf_model.py          # primary stack
    .venv-keras2/bin/python benchmarks/perf_model.py   # legacy stack

A small Keras MLP (784-256-256-10) trains with
``keras_adapt.DistributedOptimizer`` over a grid of configurations: per-worker
micro-batch b x accumulation k (``backward_passes_per_step``) in each job,
one job per worker count N (1 and 2; each worker pinned to its own core).
Within a job every configuration has its own compiled model, warmed up
first; then the configurations are timed in rounds of rotating order, a
few dozen updates per visit, so slow drifts of the machine touch them all
alike. An update's time runs from the end of one update's last micro-step to the
end of the next's (k micro-steps and the collective).

The times feed :class:`keras_adapt.formulas.throughput.ThroughputModel` as a job would
(one observation per update; the first 3 updates of each visit are the
model's warm-up discard). Two splits, each a fit on some configurations and a
prediction of the others, which the fit never saw:

* ``batch`` (the headline ``mape``): fit on b in {16, 64, 256}, predict
  b in {32, 128}, at every N and k;
* ``combo``: fit on every configuration except those with N = 2 and k = 2,
  predict those (is the synchronisation priced apart from accumulation?).

The truth for a held-out configuration is its measured mean update time
(the median, for the ``median_*`` keys, where the fits use medians too).
MAPE = mean over the held-out configurations of |predicted - measured| /
measured, in percent (CM-DARE's 3.4% is the target). ``round_mape`` gives
the smallest and largest MAPE when each round's own means are the truth
(the spread that measurement noise alone causes); ``loco_mape`` and
``constant_mape`` are the model's own leave-one-configuration-out errors on
all configurations, for it and for the constant model; ``model`` and
``loco_model`` name the candidate model each fit kept (with or without the
interference terms). About 3 minutes with the defaults; ``--save FILE``
keeps the measured times and ``--load FILE`` reports on them again.

Prints a table and one JSON line
``{"bench": "perf_model", "mape": ..., "target": 3.4, "met": ..., ...}``.
"""

import json
import os
import statistics
import time

from _workers import parser as worker_parser
from _workers import describe_stack, pin_worker, run_on_workers, write_result

from keras_adapt.formulas.throughput import ThroughputModel

BATCHES = (16, 32, 64, 128, 256)
ACCUMULATIONS = (1, 2)
WORKERS = (1, 2)
TARGET_MAPE = 3.4
#: Updates dropped at the start of each visit (measured: +25%, +10%, +4% for
#: the first three after a switch), by the model and by the truth alike.
WARMUP = 3


def launch(args):
    if args.load:
        with open(args.load) as f:
            jobs = json.load(f)
    else:
        worker_args = ["--rounds", args.rounds, "--updates", args.updates,
                       "--batches", args.batches]
        jobs = {str(n): run_on_workers(__file__, worker_args, f"perf_model_np{n}_", np=n)
                for n in WORKERS}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(jobs, f)
    report(jobs)


def _model_fed(jobs, keep, statistic="mean"):
    """A ThroughputModel fed every update time of the configurations ``keep``
    accepts, in the order they were measured (all of them kept)."""
    model = ThroughputModel(warmup=WARMUP, window=1_000_000, statistic=statistic)
    for n, job in sorted(jobs.items()):
        for visit in job["visits"]:
            b, k = visit["batch"], visit["accumulation"]
            if keep(b, int(n), k):
                for seconds in visit["update_seconds"]:
                    model.observe(b, seconds, workers=int(n), accumulation=k)
    return model


def _round_means(jobs):
    """{round: {(b, N, k): mean update seconds}}, the first WARMUP of each visit dropped."""
    out = {}
    for n, job in jobs.items():
        for visit in job["visits"]:
            key = (visit["batch"], int(n), visit["accumulation"])
            out.setdefault(visit["round"], {})[key] = statistics.mean(
                visit["update_seconds"][WARMUP:])
    return out


def _mape(predicted, measured):
    """Mean absolute percentage error (percent) over the keys of ``measured``."""
    return 100.0 * statistics.mean(abs(predicted[c] - measured[c]) / measured[c] for c in measured)


def _splits(jobs):
    """{name: train(b, N, k)}: the configurations each split fits on."""
    train_batches = jobs[str(WORKERS[0])]["batches"][::2]
    return {"batch": lambda b, n, k: b in train_batches,
            "combo": lambda b, n, k: not (n == 2 and k == 2)}


def split(jobs, train, statistic="mean"):
    """Fits on the configurations ``train(b, N, k)`` accepts; predicts the rest.

    Returns (fit, {config: measured seconds}, {config: Prediction}) for the
    held-out configurations (no predictions when the fit is not usable)."""
    reduce = statistics.mean if statistic == "mean" else statistics.median
    fit = _model_fed(jobs, train, statistic).fit()
    measured = {c: reduce(ts) for c, ts in
                _model_fed(jobs, lambda *c: not train(*c)).configurations().items()}
    predicted = {c: fit.predict_step_time(*c) for c in measured} if fit.usable else {}
    return fit, measured, predicted


def report(jobs):
    """Prints the table and the JSON line for ``jobs`` ({"N": a job's result});
    returns the line. Split ``batch`` fits on every other batch size (16, 64,
    256 of the full grid)."""
    first = jobs[str(WORKERS[0])]
    whole = _model_fed(jobs, lambda *c: True)
    all_fit = whole.fit()
    measured_all = {c: statistics.mean(ts) for c, ts in whole.configurations().items()}
    results = {name: split(jobs, train) for name, train in _splits(jobs).items()}

    print(f"\nthroughput model, stack={first['stack']} ({first['versions']}); "
          f"{first['rounds']} rounds x {first['updates']} updates per configuration "
          f"(first {WARMUP} of each visit dropped); load average before/after per job: "
          f"{[jobs[n]['load'] for n in sorted(jobs)]}")
    fit_b, _, pred_b = results["batch"]
    print(f"split 'batch': fit on b in {first['batches'][::2]} ({fit_b.num_configurations} "
          "configurations), predict the rest; mean update time")
    print(f"{'b':>5s} {'N':>2s} {'k':>2s} {'measured':>10s} {'predicted':>16s} {'error':>7s}  role")
    for c, t in measured_all.items():
        if c in pred_b:
            p, role = pred_b[c], "held out" + ("" if pred_b[c].determined else " (not determined)")
        elif fit_b.usable:
            p, role = fit_b.predict_step_time(*c), "fitted"
        else:
            continue
        print(f"{c[0]:5d} {c[1]:2d} {c[2]:2d} {t * 1e3:8.2f}ms {p.value * 1e3:8.2f}"
              f"+-{p.std * 1e3:4.2f}ms {100 * (p.value - t) / t:+6.2f}%  {role}")

    line = {"bench": "perf_model", "stack": first["stack"], "target": TARGET_MAPE}
    for statistic in ("mean", "median"):
        if statistic == "median":
            results = {name: split(jobs, train, "median") for name, train in _splits(jobs).items()}
        for name, (fit, measured, predicted) in results.items():
            prefix = ("" if name == "batch" else f"{name}_") + \
                ("" if statistic == "mean" else "median_")
            if not fit.usable:
                print(f"split '{name}' ({statistic}): fit not usable: {fit.reason}")
                line[f"{prefix}mape"] = None
                continue
            errors = [100 * abs(predicted[c].value - measured[c]) / measured[c] for c in measured]
            line[f"{prefix}mape"] = round(statistics.mean(errors), 3)
            line[f"{prefix}max_error"] = round(max(errors), 3)
            line[f"{prefix}determined"] = all(p.determined for p in predicted.values())
            if name == "batch" and statistic == "mean":
                line["met"] = line["mape"] <= TARGET_MAPE
                line["heldout"] = len(measured)
                line["model"] = fit.model
                # each round's own means as the truth: the spread noise alone causes
                per_round = [_mape({c: predicted[c].value for c in measured},
                                   {c: r[c] for c in measured})
                             for _, r in sorted(_round_means(jobs).items())]
                line["round_mape"] = [round(min(per_round), 3), round(max(per_round), 3)]
            print(f"split '{name}' ({statistic}): held-out MAPE {line[f'{prefix}mape']:.2f}% over "
                  f"{len(measured)} configurations (largest error {max(errors):.2f}%"
                  f"{'' if line[f'{prefix}determined'] else '; not all determined'}); {fit.reason}")
    line["loco_mape"] = round(all_fit.mape, 3)
    line["loco_model"] = all_fit.model
    line["loco_model_mapes"] = {n: round(v, 3) for n, v in all_fit.model_mapes.items()}
    line["constant_mape"] = round(all_fit.constant_mape, 3)
    line["usable"] = all_fit.usable
    line["configs"] = all_fit.num_configurations
    line["observations"] = all_fit.num_observations
    if all_fit.params:
        line["params_us"] = {t: round(v * 1e6, 3) for t, v in all_fit.params.items()
                             if t in all_fit.identified}
        line["stderr_us"] = {t: round(all_fit.stderr[t] * 1e6, 3) for t in all_fit.identified}
        print("fit on all configurations (us): " + ", ".join(
            f"{t} {line['params_us'][t]:.2f}+-{line['stderr_us'][t]:.2f}" for t in all_fit.identified)
            + f"; model {all_fit.model} (held-out MAPE of each: {line['loco_model_mapes']}); "
            f"{all_fit.reason}")
    line["rounds"] = first["rounds"]
    line["load"] = {n: jobs[n]["load"] for n in sorted(jobs)}
    print(json.dumps(line))
    return line


def worker(args):
    pin_worker()
    import numpy as np

    import horovod.tensorflow as hvd
    import keras

    import keras_adapt

    hvd.init()
    rank = hvd.rank()
    batches = [int(b) for b in args.batches.split(",")]

    class UpdateTimer(keras.callbacks.Callback):
        """The time of each update: between the ends of consecutive updates."""

        def __init__(self, k):
            super().__init__()
            self.k, self.ends = k, []

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % self.k == 0:
                self.ends.append(time.perf_counter())

        def seconds(self):
            return [b - a for a, b in zip(self.ends, self.ends[1:])]

    setups = {}
    for b in batches:
        for k in ACCUMULATIONS:
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((784,)),
                                      keras.layers.Dense(256, activation="relu"),
                                      keras.layers.Dense(256, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9),
                                                   backward_passes_per_step=k)
            model.compile(opt, "sparse_categorical_crossentropy")
            rng = np.random.default_rng(rank)
            # one update more than timed: the first update's end starts the clock
            n = b * k * (args.updates + 1)
            x = rng.standard_normal((n, 784)).astype("float32")
            y = rng.integers(0, 10, n)
            model.fit(x[: b * k * 2], y[: b * k * 2], batch_size=b, epochs=1, verbose=0)  # trace
            setups[(b, k)] = (model, x, y)

    load_before = os.getloadavg()[0]
    visits = []
    order = list(setups.items())
    for r in range(args.rounds):
        # rotate the order so no configuration always runs first or last (and
        # no two visits of one configuration follow each other)
        for (b, k), (model, x, y) in order[r % len(order):] + order[:r % len(order)]:
            timer = UpdateTimer(k)
            model.fit(x, y, batch_size=b, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
            visits.append({"round": r, "batch": b, "accumulation": k,
                           "update_seconds": timer.seconds()})

    result = {
        **describe_stack(load_before),
        "workers": hvd.size(), "batches": batches, "rounds": args.rounds, "updates": args.updates,
        "visits": visits,
    }
    write_result(args.out, rank, result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--updates", type=int, default=30, help="timed updates per visit")
    parser.add_argument("--save", help="also write the measured times (JSON) here")
    parser.add_argument("--load", help="report on times written by --save; measure nothing")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="per-worker micro-batches, comma-separated; split 'batch' fits on "
                             "every other one")
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
