"""Run under horovodrun by tests/test_preemption.py and benchmarks/preemption.py.

Trains a small model with Adam (slots) and keras-adapt's statistics on two
workers through ``PreemptionCheckpoint.fit`` over seeded arrays, so a
SIGTERM sent to one worker stops both, and the same command resumes. With
``--progress`` a batch-size policy ends the epochs on its statistical
progress (global batch 2 x --batch, twice that from epoch 1, three times
from epoch 2, through accumulation).

Writes into --out:
  pid<r>                 this worker's process id (the test signals it)
  progress<r>            the optimizer step reached, rewritten every step
  begin<r>.json          state when training begins (after any restore)
  stop<r>.json           state when the workers stopped for a signal
  final<r>.json          state when training finished
Each state: iterations, weights, optimizer variables, keras-adapt variables,
data position, the callback's timing and the flag-check cost; the policy's
progress and the epoch ends of this run so far (epoch, updates, progress).
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

import numpy as np

import keras
import keras_adapt
from keras_adapt import _hvd
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, PreemptionCheckpoint
from keras_adapt.policies import ScheduledBatchSizePolicy

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True, help="checkpoint directory")
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=640)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step")
parser.add_argument("--progress", action="store_true",
                    help="a ScheduledBatchSizePolicy ends the epochs on its progress")
parser.add_argument("--measure-check", type=int, default=0,
                    help="time this many flag agreements before training")
args = parser.parse_args()

rank = keras_adapt.rank()
os.makedirs(args.out, exist_ok=True)


def write(name, obj):
    tmp = os.path.join(args.out, f"{name}.tmp{rank}")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(args.out, f"{name}{rank}.json"))


with open(os.path.join(args.out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))

check_cost = None
if args.measure_check:
    _hvd.host_allreduce_mean([0.0], "keras_adapt_preempt")  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.measure_check):
        _hvd.host_allreduce_mean([0.0], "keras_adapt_preempt")
    check_cost = (time.perf_counter() - t0) / args.measure_check

keras.utils.set_random_seed(1234)
rng = np.random.default_rng(7)
dim = 6
x = rng.standard_normal((args.samples, dim)).astype("float32")
y = (np.tanh(x @ rng.standard_normal((dim, 1))) + 0.1 * rng.standard_normal((args.samples, 1))
     ).astype("float32")
model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01), stats_interval=1)
model.compile(optimizer, "mse")
ckpt = PreemptionCheckpoint(args.dir, max_to_keep=2, deadline_s=60, log_dir=args.out)


def variables(obj):
    v = getattr(obj, "variables", [])
    return [np.asarray(a).tolist() for a in (v() if callable(v) else v)]


def state():
    adapt = optimizer.adapt_state.checkpoint_variables()
    return {
        "iterations": int(optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
        "optimizer": variables(optimizer),
        "adapt": {k: np.asarray(v.numpy()).tolist() for k, v in adapt.items()},
        "produced": DATA.produced,
        "check_cost_s": check_cost,
        "signal_to_disk_s": ckpt.signal_to_disk_s,
        "progress": POLICY.progress.count("progress") if POLICY else None,
        "epoch_ends": ENDS,
        "time": time.time(),
    }


class Probe(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        if not os.path.exists(os.path.join(args.out, f"begin{rank}.json")):
            write("begin", state())

    def on_epoch_end(self, epoch, logs=None):
        ENDS.append([epoch, int(optimizer.iterations.numpy()),
                     POLICY.progress.count("progress") if POLICY else None])

    def on_train_batch_end(self, batch, logs=None):
        if args.sleep:
            time.sleep(args.sleep)
        with open(os.path.join(args.out, f"progress{rank}.tmp"), "w") as f:
            f.write(str(int(optimizer.iterations.numpy())))
        os.replace(os.path.join(args.out, f"progress{rank}.tmp"),
                   os.path.join(args.out, f"progress{rank}"))


DATA = keras_adapt.data.AdaptiveBatchDataset(x, y, micro_batch_size=args.batch, seed=3)
ENDS = []
POLICY = None
if args.progress:
    base = keras_adapt.size() * args.batch
    POLICY = ScheduledBatchSizePolicy({1: 2 * base, 2: 3 * base}, dataset=DATA,
                                      max_micro_batch_size=args.batch, epoch_end="progress")
try:
    ckpt.fit(model, DATA, epochs=args.epochs, verbose=0,
             callbacks=[BroadcastGlobalVariablesCallback(0), *([POLICY] if POLICY else []),
                        Probe()])
except SystemExit:
    write("stop", state())
    # Every rank's record is on disk before any exits (with MPI the first
    # exit ends the job at once).
    _hvd.host_allreduce_mean([0.0], "test_stop_written")
    raise
write("final", state())
