"""Elastic training: training time lost per scale-down and scale-up, and the commit cost.

Run from the repository (it launches itself under ``horovodrun`` elastic,
Gloo, two local "hosts" ``localhost`` and ``127.0.0.1``):

    .venv/bin/python benchmarks/resize_latency.py             # primary stack (~2 min)
    .venv-keras2/bin/python benchmarks/resize_latency.py      # legacy stack
    .venv/bin/python benchmarks/resize_latency.py --quick     # one short repetition

What it runs
------------
A 32-256-256-1 MLP (Adam, ``keras_adapt.DistributedOptimizer``) on a seeded
synthetic regression, global batch 64 kept over the worker count
(``ResizeRule("keep")``), under ``keras_adapt.elastic.run`` with the default
``CommitStateCallback`` (``batches_per_commit="auto"``).

* ``commit``: one job of 2 workers, 2 epochs of 1500 steps, no change
  (long enough for "auto" to settle): ``commit_ratio`` is the
  training wall time over the same time without the commits
  (``wall / (wall - commit_seconds)``, rank 0); ``commit_ratio_cpu`` the
  same with rank 0's CPU time (all its threads, ``time.process_time``),
  which a shared machine disturbs less than the wall time.
* ``off``: the same job with ``batches_per_commit`` beyond the run (a
  commit at each epoch's end only): ``vs_off_wall`` / ``vs_off_cpu`` are
  the commit job's wall / CPU time per step over this one's. They hold
  everything a commit-enabled run pays per step beyond the commits
  themselves (the callbacks' host work, the step after a commit running
  slower), within the noise of two separate jobs. ``commit_schedule``
  lists every commit of the commit job: ``[update, interval then, ms]``.
* ``resize`` (``--repeats`` jobs): 2 workers; rank 0 rewrites the discovery
  file to one host after 50 steps, and back to two hosts 100 steps after
  the job shrank; each step sleeps ``--pace`` seconds so the changes land
  mid-training. ``down_s`` / ``up_s`` are the medians of the ``resize``
  events' ``pause_s`` (end of the last step before the change to the end of
  the first step after it, the new trace included), less the pacing sleep
  of that one step. The scale-up pause includes the start of the new
  worker's process (Python, TensorFlow, the model).

``--quick`` (the test's smoke run): one resize job that commits every 10
steps instead of ``"auto"`` (so each change is noticed within 10 steps)
and ends at the end of the epoch in which the job grew back, and a commit
job of 2 epochs of 150 steps instead of 1500. The pauses are measured the
same way; the commit interval does not enter them.

Prints one JSON line ``{"bench": "resize_latency", "down_s": ..., "up_s": ...,
"commit_ratio": ...}`` (targets: down <= 1 s, up <= 10 s, commit <= 1.01).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _workers import describe_stack, horovodrun, parser

ap = parser(__doc__)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--quick", action="store_true",
                help="one short resize job and a shorter commit job (smoke test)")
ap.add_argument("--pace", type=float, default=0.02, help="sleep per step in the resize jobs (s)")
ap.add_argument("--hosts", help=argparse.SUPPRESS)
ap.add_argument("--commit-only", action="store_true",
                help="only the commit and off jobs (no resize jobs)")
ap.add_argument("--mode", choices=["commit", "off", "resize"], default="resize",
                help=argparse.SUPPRESS)
ap.add_argument("--log-dir", help=argparse.SUPPRESS)
args = ap.parse_args()

TWO_HOSTS, ONE_HOST = "localhost:1\n127.0.0.1:1\n", "localhost:1\n"
GLOBAL_BATCH, DIM = 64, 32


def launch(mode, workdir, timeout=600):
    """One elastic job of this script in ``mode``; returns rank 0's result."""
    hosts = os.path.join(workdir, "hosts")
    with open(hosts, "w") as f:
        f.write(TWO_HOSTS)
    discover = os.path.join(workdir, "discover.sh")
    with open(discover, "w") as f:
        f.write(f"#!/bin/sh\nexec cat '{hosts}'\n")
    os.chmod(discover, 0o755)
    out = os.path.join(workdir, "out")
    cmd = [*horovodrun(), "-np", "2",
           "--min-np", "1", "--max-np", "2", "--host-discovery-script", discover,
           "--network-interface", "lo", "--gloo", sys.executable, os.path.abspath(__file__),
           "--worker", "--out", out, "--mode", mode, "--hosts", hosts,
           "--pace", str(args.pace), "--log-dir", os.path.join(workdir, "log")]
    if args.quick:
        cmd.append("--quick")
    # A scale-up waits in Gloo's rendezvous for the new worker's process to
    # start (Python, TensorFlow): more than Gloo's default 30 s when loaded.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "120")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        sys.exit(f"elastic job timed out after {timeout}s")
    if proc.returncode != 0:
        sys.exit(f"elastic job failed ({proc.returncode}):\n{output[-4000:]}")
    with open(os.path.join(out, "rank0.json")) as f:
        return json.load(f)


def worker():
    import numpy as np

    import keras
    import tensorflow as tf

    import keras_adapt
    from keras_adapt import elastic

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8192, DIM)).astype("float32")
    y = np.sin(x @ rng.standard_normal((DIM, 1))).astype("float32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "mse")
    # `shrank` (committed and synced like the weights): the job ran on one
    # worker, so a job of two that has it set has grown back.
    state = elastic.KerasState(model, rule=elastic.ResizeRule("keep", global_batch=GLOBAL_BATCH),
                               log_dir=args.log_dir, shrank=False)
    resize = args.mode == "resize"
    steps, epochs = (100, 12) if resize else (150 if args.quick else 1500, 2)
    every = 10 if resize and args.quick else steps * epochs + 1 if args.mode == "off" else "auto"
    commit = elastic.CommitStateCallback(state, batches_per_commit=every)
    commit_cpu = []
    state_commit = state.commit

    def timed_commit():  # the commits' CPU time (the callback measures their wall time)
        start, wall = time.process_time(), time.perf_counter()
        try:
            state_commit()
        finally:
            commit_cpu.append(time.process_time() - start)
            schedule.append((int(model.optimizer.iterations.numpy()), commit.interval,
                             round(1e3 * (time.perf_counter() - wall), 2)))

    schedule = []  # (update, interval then, commit ms) of every commit

    state.commit = timed_commit
    marks = {"down": False, "up": False, "shrank_at": None}

    class Pace(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not resize:
                return
            step = state.epoch * steps + state.batch
            if keras_adapt.rank() == 0:
                if not marks["down"] and step >= 50:
                    marks["down"] = True
                    write_hosts(ONE_HOST)
                if marks["down"] and keras_adapt.size() == 1 and marks["shrank_at"] is None:
                    marks["shrank_at"] = step
                    state.shrank = True
                if marks["shrank_at"] is not None and not marks["up"] \
                        and step >= marks["shrank_at"] + 100:
                    marks["up"] = True
                    write_hosts(TWO_HOSTS)
            time.sleep(args.pace)

    def write_hosts(text):
        with open(args.hosts + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.hosts + ".tmp", args.hosts)

    def data(epoch, batch):
        b, r = state.batch_size, keras_adapt.rank()
        start = (epoch * steps + batch) * GLOBAL_BATCH + r * b
        idx = []
        for s in range((epochs - epoch) * steps - batch):
            base = start + s * GLOBAL_BATCH
            idx.append((base + np.arange(b)) % len(x))
        idx = np.concatenate(idx)
        return tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(b).repeat()

    walls, cpus = [], []

    @elastic.run
    def train(state):
        start, cpu = time.perf_counter(), time.process_time()
        end = epochs
        if args.quick and state.shrank and keras_adapt.size() == 2:
            end = state.epoch + 1  # grown back: the rest of this epoch measures the scale-up
        try:
            return elastic.fit(state, data, epochs=end, steps_per_epoch=steps, verbose=0,
                               callbacks=[commit, Pace()])
        finally:
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)

    train(state)
    if keras_adapt.rank() == 0:
        os.makedirs(args.out, exist_ok=True)
        result = {"resizes": state.resizes, "commits": commit.commits,
                  "commit_seconds": commit.commit_seconds, "interval": commit.interval,
                  "wall": sum(walls), "cpu": sum(cpus), "commit_cpu": sum(commit_cpu),
                  "schedule": schedule,
                  "iterations": int(model.optimizer.iterations.numpy()),
                  **describe_stack(os.getloadavg()[0])}
        with open(os.path.join(args.out, "rank0.json"), "w") as f:
            json.dump(result, f)


def main():
    load = os.getloadavg()[0]
    commit = launch("commit", tempfile.mkdtemp(prefix="resize_commit_"))
    off = launch("off", tempfile.mkdtemp(prefix="resize_off_"))
    ratio = commit["wall"] / (commit["wall"] - commit["commit_seconds"])
    ratio_cpu = commit["cpu"] / (commit["cpu"] - commit["commit_cpu"])
    downs, ups = [], []
    for _ in range(0 if args.commit_only else 1 if args.quick else args.repeats):
        run = launch("resize", tempfile.mkdtemp(prefix="resize_job_"))
        for event in run["resizes"]:
            pause = event["after"]["pause_s"] - args.pace
            (downs if event["after"]["workers"] < event["before"]["workers"] else ups).append(pause)

    def per_step(job, key):
        return job[key] / job["iterations"]

    line = {"bench": "resize_latency",
            "down_s": round(statistics.median(downs), 3) if downs else None,
            "up_s": round(statistics.median(ups), 3) if ups else None,
            "commit_ratio": round(ratio, 4), "commit_ratio_cpu": round(ratio_cpu, 4),
            "vs_off_wall": round(per_step(commit, "wall") / per_step(off, "wall"), 4),
            "vs_off_cpu": round(per_step(commit, "cpu") / per_step(off, "cpu"), 4),
            "downs": [round(d, 3) for d in downs], "ups": [round(u, 3) for u in ups],
            "commit_interval": commit["interval"], "commits": commit["commits"],
            "commit_schedule": commit["schedule"],
            "commit_ms": round(1e3 * commit["commit_seconds"] / max(commit["commits"], 1), 2),
            "step_ms": round(1e3 * (commit["wall"] - commit["commit_seconds"])
                             / commit["iterations"], 2),
            "step_cpu_ms": round(1e3 * (commit["cpu"] - commit["commit_cpu"])
                                 / commit["iterations"], 2),
            "off_step_ms": round(1e3 * per_step(off, "wall"), 2),
            "off_step_cpu_ms": round(1e3 * per_step(off, "cpu"), 2),
            **describe_stack(load)}
    print(f"resize latency, stack={line['stack']}: scale-down {line['down_s']} s, scale-up "
          f"{line['up_s']} s (medians of {len(downs)} / {len(ups)}); commits cost "
          f"{line['commit_ratio']}x wall, {line['commit_ratio_cpu']}x CPU ({line['commit_ms']} "
          f"ms each, every {line['commit_interval']} steps of {line['step_ms']} ms); per step "
          f"against commits at epoch ends only: {line['vs_off_wall']}x wall, "
          f"{line['vs_off_cpu']}x CPU")
    print(json.dumps(line))


if __name__ == "__main__":
    if args.worker:
        worker()
    else:
        main()
