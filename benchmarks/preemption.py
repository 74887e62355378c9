"""Preemption: SIGTERM to one of 2 workers -> checkpoint on disk, and steps lost.

Run from the repository (it launches itself on 2 local workers, Gloo):

    .venv/bin/python benchmarks/preemption.py            # primary stack
    .venv-keras2/bin/python benchmarks/preemption.py     # legacy stack
    .venv/bin/python benchmarks/preemption.py --quick    # one short trial

Each trial trains an MLP (``--width``: about 2*width^2 parameters, Adam, so
the checkpoint holds 3x that many floats) with ``PreemptionCheckpoint.fit``;
once rank 1 reports ``--signal-at`` steps, this driver sends SIGTERM to rank
1 only. Measured per trial, by clocks independent of the callback:

* ``to_disk_s``: from the ``kill`` here to the modification time of the
  ``checkpoint`` file that lists the new checkpoint (written last by
  ``tf.train.CheckpointManager``; same machine, same clock);
* ``callback_s``: the callback's own ``signal_to_disk_s`` (from the signal
  handler on rank 1 to the end of the barrier after the write);
* ``steps_lost``: the optimizer step at which the workers exited minus the
  step stored in the newest checkpoint (target 0);
* ``steps_after_signal``: steps run between the signal and the stop (the
  agreement waits for the step in flight to end);
* ``check_ms`` vs ``step_ms``: one agreement on the flag (a host allreduce of
  one float per worker, timed over 200 calls) against the median step time;
  ``check_interval``: the steps between agreements that ``check_interval=
  "auto"`` chose (in the preemption event), and ``check_overhead`` =
  check_ms / check_interval / step_ms, the agreements' share of step time.

Prints a table and one JSON line ``{"bench": "preemption", "stack": ...,
"to_disk_s": ..., "steps_lost": ..., "check_ratio": ..., ...}`` (medians over
the trials, ``steps_lost`` the largest; ``check_ratio`` = check_ms / step_ms).
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workers import horovodrun, parser  # noqa: E402


def trial(args, index):
    """One preempted job; returns its measurements."""
    base = tempfile.mkdtemp(prefix=f"preempt_bench{index}_")
    out, ckdir = os.path.join(base, "out"), os.path.join(base, "ck")
    cmd = [*horovodrun(), "-np", "2",
           "-H", "localhost:2", "--gloo", sys.executable, os.path.abspath(__file__),
           "--worker", "--out", out, "--dir", ckdir, "--width", str(args.width),
           "--steps", str(args.steps)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        progress = os.path.join(out, "progress1")
        deadline = time.time() + 300
        at = 0
        while time.time() < deadline and proc.poll() is None:
            try:
                with open(progress) as f:
                    at = int(f.read() or 0)
            except (OSError, ValueError):
                at = 0
            if at >= args.signal_at:
                break
            time.sleep(0.01)
        if at < args.signal_at:
            raise RuntimeError(f"rank 1 did not reach step {args.signal_at}: "
                               f"{proc.stderr.read()[-3000:] if proc.poll() is not None else ''}")
        with open(os.path.join(out, "pid1")) as f:
            pid = int(f.read())
        sent = time.time()
        os.kill(pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    with open(os.path.join(out, "stop1.json")) as f:
        stop = json.load(f)
    from keras_adapt.callbacks import PreemptionCheckpoint

    ckpt = PreemptionCheckpoint(ckdir)
    path, meta = ckpt.latest()
    return {
        "to_disk_s": os.path.getmtime(os.path.join(ckdir, "checkpoint")) - sent,
        "callback_s": stop["signal_to_disk_s"],
        "steps_lost": stop["iterations"] - meta["step"],
        "steps_after_signal": stop["iterations"] - at,
        "exit_code_seen": re.search(rf"Exit code:\s+{stop['exit_code']}\n", err) is not None,
        "check_interval": stop["check_interval"],
        "exit_code": stop["exit_code"],
        "check_ms": stop["check_s"] * 1e3,
        "step_ms": stop["step_s"] * 1e3,
        "checkpoint_mb": sum(os.path.getsize(os.path.join(ckdir, f)) for f in os.listdir(ckdir)
                             if f.startswith(os.path.basename(path) + ".")) / 1e6,
        "stack": stop["stack"],
    }


def main():
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="one short trial (smoke test)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=4000, help="steps the job would run")
    p.add_argument("--signal-at", type=int, default=60)
    p.add_argument("--dir", help="checkpoint directory (worker)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.trials, args.width, args.signal_at = 1, 32, 20
    load = os.getloadavg()[0]
    trials = [trial(args, i) for i in range(args.trials)]
    keys = ("to_disk_s", "callback_s", "steps_lost", "steps_after_signal", "check_ms", "step_ms",
            "check_interval", "checkpoint_mb")
    print(f"{'trial':>5} " + " ".join(f"{k:>18}" for k in keys))
    for i, t in enumerate(trials):
        print(f"{i:5d} " + " ".join(f"{t[k]:18.4f}" for k in keys))
    med = {k: statistics.median(t[k] for t in trials) for k in keys}
    line = {"bench": "preemption", "stack": trials[0]["stack"],
            "to_disk_s": round(med["to_disk_s"], 4), "steps_lost": int(max(t["steps_lost"]
                                                                           for t in trials)),
            "steps_lost_target": 0,
            "callback_s": round(med["callback_s"], 4),
            "steps_after_signal": med["steps_after_signal"],
            "check_ms": round(med["check_ms"], 4), "step_ms": round(med["step_ms"], 4),
            "check_ratio": round(med["check_ms"] / med["step_ms"], 4),
            "check_interval": med["check_interval"],
            "check_overhead": round(med["check_ms"] / med["check_interval"] / med["step_ms"], 4),
            "checkpoint_mb": round(med["checkpoint_mb"], 3),
            "exit_code": trials[0]["exit_code"],
            "exit_code_reported": all(t["exit_code_seen"] for t in trials),
            "trials": len(trials), "width": args.width, "load": [round(load, 2),
                                                                 round(os.getloadavg()[0], 2)]}
    print(json.dumps(line))


def worker(args):
    import numpy as np

    import keras
    import keras_adapt
    from keras_adapt import _hvd
    from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, PreemptionCheckpoint

    rank = keras_adapt.rank()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    # The cost of one agreement on the flag, as the callback makes it.
    _hvd.host_allreduce_mean(np.zeros(2), "keras_adapt_preempt")
    t0 = time.perf_counter()
    for _ in range(200):
        _hvd.host_allreduce_mean(np.zeros(2), "keras_adapt_preempt")
    check_s = (time.perf_counter() - t0) / 200

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    dim, batch = 32, 64
    x = rng.standard_normal((batch * 2 * 50, dim)).astype("float32")
    y = rng.standard_normal((len(x), 1)).astype("float32")
    model = keras.Sequential([keras.Input((dim,)),
                              keras.layers.Dense(args.width, activation="relu"),
                              keras.layers.Dense(args.width, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer, "mse")
    ckpt = PreemptionCheckpoint(args.dir, save_freq=None, deadline_s=60)
    times = []

    class Progress(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.t)
            path = os.path.join(args.out, f"progress{rank}")
            with open(path + ".tmp", "w") as f:
                f.write(str(int(optimizer.iterations.numpy())))
            os.replace(path + ".tmp", path)

    try:
        ckpt.fit(model, x, y, batch_size=batch, epochs=args.steps // 50, verbose=0,
                 callbacks=[BroadcastGlobalVariablesCallback(0), Progress()])
    except SystemExit as exc:
        from keras_adapt import _keras

        with open(os.path.join(args.out, f"stop{rank}.json"), "w") as f:
            json.dump({"iterations": int(optimizer.iterations.numpy()),
                       "signal_to_disk_s": ckpt.signal_to_disk_s, "exit_code": exc.code,
                       "check_interval": ckpt.events[-1]["after"]["check_interval"],
                       "check_s": check_s, "step_s": statistics.median(times[5:]),
                       "stack": "primary" if _keras.IS_KERAS3 else "legacy"}, f)
        _hvd.host_allreduce_mean([0.0], "bench_stop_written")
        raise
    raise SystemExit("the job was never signalled")


if __name__ == "__main__":
    main()
