"""Run under horovodrun by tests/test_revocation_notices.py.

Two workers train a small model with Adam through ``PreemptionCheckpoint.fit``
over seeded arrays; with ``--provider`` each watches that cloud's metadata
service at ``--endpoint`` (an emulated one, tools/metadata_server.py, on the
127.0.0.1 of one emulated host's namespace: the other worker's 127.0.0.1 has
none), so the notice on one "VM" stops both at the same step, and the same
command resumes.

Writes into --out:
  progress               the optimizer step reached (rank 0, every step)
  begin<r>.json          state when training begins (after any restore)
  stop<r>.json           state when the workers stopped for a notice
  final<r>.json          state when training finished
Each state: host, iterations, weights, optimizer variables, the callback's
notice-to-disk seconds and time left.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import socket
import time

import numpy as np

import keras
import keras_adapt
from keras_adapt import _hvd
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, PreemptionCheckpoint
from keras_adapt.coordination import RevocationNotices

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True, help="checkpoint directory")
parser.add_argument("--out", required=True)
parser.add_argument("--provider", default=None)
parser.add_argument("--endpoint", default=None)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=640)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step")
args = parser.parse_args()

rank = keras_adapt.rank()
os.makedirs(args.out, exist_ok=True)


def write(name, obj):
    tmp = os.path.join(args.out, f"{name}.tmp{rank}")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(args.out, f"{name}{rank}.json"))


keras.utils.set_random_seed(1234)
rng = np.random.default_rng(7)
dim = 6
x = rng.standard_normal((args.samples, dim)).astype("float32")
y = (np.tanh(x @ rng.standard_normal((dim, 1))) + 0.1 * rng.standard_normal((args.samples, 1))
     ).astype("float32")
model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01))
model.compile(optimizer, "mse")
notices = None if args.provider is None else RevocationNotices(
    args.provider, endpoint=args.endpoint, poll_s=0.2, timeout_s=1.0)
ckpt = PreemptionCheckpoint(args.dir, max_to_keep=2, log_dir=args.out, notices=notices)


def variables(obj):
    v = getattr(obj, "variables", [])
    return [np.asarray(a).tolist() for a in (v() if callable(v) else v)]


def state():
    return {"host": socket.gethostname(), "iterations": int(optimizer.iterations.numpy()),
            "weights": [w.tolist() for w in model.get_weights()],
            "optimizer": variables(optimizer), "signal_to_disk_s": ckpt.signal_to_disk_s,
            "time_left_s": ckpt.time_left_s, "time": time.time()}


class Probe(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        if not os.path.exists(os.path.join(args.out, f"begin{rank}.json")):
            write("begin", state())

    def on_train_batch_end(self, batch, logs=None):
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0:
            tmp = os.path.join(args.out, "progress.tmp")
            with open(tmp, "w") as f:
                f.write(str(int(optimizer.iterations.numpy())))
            os.replace(tmp, os.path.join(args.out, "progress"))


data = keras_adapt.data.AdaptiveBatchDataset(x, y, micro_batch_size=args.batch, seed=3)
try:
    ckpt.fit(model, data, epochs=args.epochs, verbose=0,
             callbacks=[BroadcastGlobalVariablesCallback(0), Probe()])
except SystemExit:
    write("stop", state())
    # Every rank's record is on disk before any exits.
    _hvd.host_allreduce_mean([0.0], "test_stop_written")
    raise
write("final", state())
