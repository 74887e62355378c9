"""A bandwidth drop mid-run on two emulated hosts: throughput with and without CommunicationPolicy.

Run from the repository, as root (it makes two emulated hosts, network
namespaces on one machine, tools/emulated_hosts.py, and runs one 2-worker
Gloo job per configuration over ssh into them):

    .venv/bin/python benchmarks/communication.py            # ~6 min
    .venv/bin/python benchmarks/communication.py --quick    # smoke run (~2 min)

What it runs
------------
``keras_adapt.data.teacher_student`` (32-dim inputs, 10 classes), a
32-1024-1024-10 ReLU MLP (1.1 M parameters: 4.4 MB of float32 gradients per
update), SGD with momentum 0.9 at 0.02, 512 samples per worker per update,
``updates`` (240) updates. After update ``drop_at`` (80) each worker limits
its own host's link to ``rate`` (``--rate``, default 400 Mbit/s; Linux
``tc`` token bucket on the namespace's interface), so the allreduce, short
before, becomes most of a step. Configurations, each its own job, in turn
and in reversed order every other round (``--rounds``, default 2):

* ``none``      float32 gradients throughout (a ``WorkerTimingMonitor``
                measures the shares, as in the others);
* ``policy``    ``CommunicationPolicy`` at its defaults after that monitor;
* ``autotune``  float32, Horovod's own autotuner (``horovodrun --autotune``:
                fusion buffer and cycle time, searched while the job runs).

What it measures
----------------
Rank 0's step times, as samples per second (1024 / median step) over updates
20-79 (``before``) and over the last 100 updates (``after``, once the
policy had its measurements); the wait share of a step after the drop
(``WorkerTimingMonitor``); the test accuracy of the model at the end.
``recovery`` is a configuration's ``after`` throughput over ``none``'s;
``acc_delta`` its final accuracy minus ``none``'s, in points.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from _workers import median as _median
from _workers import describe_stack, horovodrun, pin_worker, write_result
from _workers import parser as worker_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("none", "policy", "autotune")
SETTINGS = {"train": 20_000, "test": 5_000, "dim": 32, "hidden": 1024, "batch": 512,
            "lr": 0.02, "updates": 240, "drop_at": 80, "before": (20, 80), "after_last": 100}
QUICK = {"train": 4_000, "test": 1_000, "updates": 90, "drop_at": 30, "before": (10, 30),
         "after_last": 40}


def settings_from(args):
    s = dict(SETTINGS, **(QUICK if args.quick else {}))
    s["rate"] = args.rate
    return s


# ---------------------------------------------------------------- launcher
def launch(args):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import emulated_hosts

    why = emulated_hosts.unavailable()
    if why:
        sys.exit(f"benchmarks/communication.py needs emulated hosts: {why}")
    t0 = time.perf_counter()
    runs = {}
    # --hosts-up: h2 and h3 are up already (the test suite's session hosts)
    made = (contextlib.nullcontext(emulated_hosts.EmulatedHosts(2)) if args.hosts_up
            else emulated_hosts.emulated_hosts(2))
    with made as hosts:
        for i in range(args.rounds):
            for config in (CONFIGS if i % 2 == 0 else CONFIGS[::-1]):
                out = tempfile.mkdtemp(prefix=f"communication_{config}_")
                cmd = [*horovodrun(), *hosts.horovodrun_args(), "--gloo"]
                if config == "autotune":
                    cmd += ["--autotune", "--autotune-log-file", os.path.join(out, "autotune.csv")]
                cmd += [sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                        "--config", config, "--rate", str(args.rate)]
                cmd += ["--quick"] if args.quick else []
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                           PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
                               "PYTHONPATH")])))
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
                if proc.returncode != 0:
                    sys.exit(f"{config} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
                with open(os.path.join(out, "rank0.json")) as f:
                    runs.setdefault(config, []).append(json.load(f))
    report(runs, args, time.perf_counter() - t0)


def report(runs, args, elapsed):
    first = next(iter(runs.values()))[0]
    s = first["settings"]
    table = {}
    for config, rounds in runs.items():
        table[config] = {
            "before": round(_median([r["before"] for r in rounds]), 1),
            "after": round(_median([r["after"] for r in rounds]), 1),
            "after_spread": [round(min(r["after"] for r in rounds), 1),
                             round(max(r["after"] for r in rounds), 1)],
            "wait_share_before": round(_median([r["wait_share_before"] for r in rounds]), 3),
            "wait_share_after": round(_median([r["wait_share_after"] for r in rounds]), 3),
            "final": round(_median([r["final"] for r in rounds]), 4),
            "events": rounds[-1]["events"],
        }
    none = table["none"]
    for row in table.values():
        row["recovery"] = round(row["after"] / none["after"], 3)
        row["acc_delta"] = round(100 * (row["final"] - none["final"]), 2)
    print(f"\ncommunication, 2 emulated hosts, Gloo, stack={first['stack']} "
          f"({first['versions']}); {s['updates']} updates of 2 x {s['batch']}, link limited to "
          f"{s['rate']} Mbit/s after update {s['drop_at']}; {args.rounds} rounds")
    print(f"{'config':9s} {'before':>9s} {'after':>9s} {'[min, max]':>16s} {'wait before':>11s} "
          f"{'after':>6s} {'recovery':>9s} {'final':>7s} {'acc d':>6s}")
    for config, r in table.items():
        lo, hi = r["after_spread"]
        print(f"{config:9s} {r['before']:7.1f}/s {r['after']:7.1f}/s [{lo:6.1f}, {hi:6.1f}] "
              f"{r['wait_share_before']:11.3f} {r['wait_share_after']:6.3f} "
              f"{r['recovery']:8.3f}x {r['final']:7.4f} {r['acc_delta']:+6.2f}")
    print("policy's switches (last round):", table["policy"]["events"])
    policy = table["policy"]
    line = {"bench": "communication", "stack": first["stack"], "rate_mbit": s["rate"],
            "rounds": args.rounds, "none_wait_share_after": none["wait_share_after"],
            "policy_recovery": policy["recovery"], "policy_acc_delta": policy["acc_delta"],
            "autotune_recovery": table["autotune"]["recovery"],
            "met": none["wait_share_after"] >= 0.4 and policy["recovery"] >= 1.3
            and policy["acc_delta"] >= -0.5, "configs": table}
    print(f"met: {line['met']}  (none's wait share after the drop "
          f"{none['wait_share_after']} >= 0.4, policy recovery {policy['recovery']} >= 1.3, "
          f"acc_delta {policy['acc_delta']} >= -0.5)")
    print(json.dumps(line))
    print(f"\nbenchmark took {elapsed:.0f} s")


# ------------------------------------------------------------------ worker
def worker(args):
    pin_worker(int(os.environ.get("HOROVOD_RANK", "0")))  # one host each, one core each
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import keras

    import keras_adapt
    from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, WorkerTimingMonitor
    from keras_adapt.data import teacher_student
    from keras_adapt.policies import CommunicationPolicy

    hvd.init()
    s = settings_from(args)
    load_before = os.getloadavg()[0]
    subprocess.run(["tc", "qdisc", "del", "dev", "kanet0", "root"], capture_output=True)
    x, y = teacher_student(s["train"], seed=0, dim=s["dim"], hidden=32)
    xt, yt = teacher_student(s["test"], seed=0, dim=s["dim"], hidden=32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((s["dim"],)),
                              keras.layers.Dense(s["hidden"], activation="relu"),
                              keras.layers.Dense(s["hidden"], activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(s["lr"], momentum=0.9),
                                                   gradient_stats=False),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    monitor = WorkerTimingMonitor(interval=10)
    callbacks = [BroadcastGlobalVariablesCallback(0), monitor]
    policy = None
    if args.config == "policy":
        policy = CommunicationPolicy(monitor)
        callbacks.append(policy)

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.starts, self.waits, self.waits_before, self.seen = [], [], [], 0

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())
            if batch == s["drop_at"]:
                subprocess.run(["tc", "qdisc", "replace", "dev", "kanet0", "root", "tbf",
                                "rate", f"{s['rate']}mbit", "burst", "256kb",
                                "latency", "400ms"], check=True)

        def on_train_batch_end(self, batch, logs=None):
            new = monitor.new_measurement(self.seen)
            if new is not None:
                self.seen, result = new
                if batch >= s["updates"] - s["after_last"]:
                    self.waits.append(result["comm_fraction"])
                elif s["before"][0] <= batch < s["before"][1]:
                    self.waits_before.append(result["comm_fraction"])

    clock = Clock()
    callbacks.append(clock)
    rng = np.random.default_rng(hvd.rank())
    idx = rng.integers(0, len(x), size=(s["updates"], s["batch"]))
    ds = tf.data.Dataset.from_tensor_slices((x[idx.reshape(-1)], y[idx.reshape(-1)])).batch(
        s["batch"])
    model.fit(ds, epochs=1, steps_per_epoch=s["updates"], verbose=0, callbacks=callbacks)
    subprocess.run(["tc", "qdisc", "del", "dev", "kanet0", "root"], capture_output=True)
    steps = np.diff(clock.starts)
    lo, hi = s["before"]
    samples = s["batch"] * hvd.size()
    acc = float(np.mean(np.argmax(model.predict(xt, verbose=0), 1) == yt))
    result = {"config": args.config, "settings": s,
              "before": samples / float(np.median(steps[lo:hi])),
              "after": samples / float(np.median(steps[-s["after_last"]:])),
              "wait_share_after": float(np.median(clock.waits)) if clock.waits else None,
              "wait_share_before": (float(np.median(clock.waits_before)) if clock.waits_before
                                    else None),
              "final": acc,
              "events": [] if policy is None else [
                  (e["step"], e["after"]["compression"]) for e in policy.events]}
    result.update(describe_stack(load_before))
    write_result(args.out, hvd.rank(), result)


def main():
    parser = worker_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--rounds", type=int, default=2, help="repetitions (order reversed)")
    parser.add_argument("--rate", type=float, default=400.0, help="Mbit/s after the drop")
    parser.add_argument("--hosts-up", action="store_true",
                        help="use the emulated hosts h2 and h3 that are up already")
    parser.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
