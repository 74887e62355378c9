"""Run under horovodrun by tests/test_resize_distributed.py; writes <out>/rank<r>.json.

Phases (one launch, 2 workers):
  throughput  ThroughputScalingPolicy on the allgathered WorkerTimingMonitor
              measurements: every rank asks for 3 workers at the same update
  gns         GNSWorkerScalingPolicy on the allreduced noise scale
Each rank gets its own target file (<out>/<phase>_target_rank<r>): only
rank 0 may write one. Events go to <out>/<phase>_logs (rank 0 writes).
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import keras
import numpy as np

import keras_adapt
from keras_adapt.actuators import GradientAccumulation
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, WorkerTimingMonitor
from keras_adapt.policies import GNSWorkerScalingPolicy, ThroughputScalingPolicy

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}


def build(lr, stats):
    keras.utils.set_random_seed(100 + rank)  # different per rank: the broadcast fixes it
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr),
                                                   gradient_stats=stats), "mse")
    return model


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8))
    y = x @ np.linspace(-1, 1, 8) + rng.normal(scale=2.0, size=n)
    # Each rank trains on its own shard.
    return x[rank::size], y[rank::size]


class LoggedThroughput(keras.callbacks.Callback):
    """The throughput in each batch's logs (the monitor's latest measurement)."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(logs.get("throughput"))


def portable(policy):
    return [{k: v for k, v in e.items() if k not in ("wall_time", "rank")} for e in policy.events]


# -- throughput -----------------------------------------------------------------
model = build(0.05, stats=False)
monitor = WorkerTimingMonitor(interval=5, batch_size=16)
target = os.path.join(args.out, f"throughput_target_rank{rank}")
policy = ThroughputScalingPolicy(1, 3, monitor, warmup_measurements=1, patience=2,
                                 target_file=target,
                                 log_dir=os.path.join(args.out, "throughput_logs"))
x, y = data(2 * 16 * 30, 0)
logged = LoggedThroughput()
model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
          callbacks=[BroadcastGlobalVariablesCallback(0), monitor, policy, logged])
results["throughput"] = {"events": portable(policy), "logged": logged.values,
                         "weights": [w.tolist() for w in model.get_weights()]}

# -- gns --------------------------------------------------------------------------
model = build(0.05, stats=True)
GradientAccumulation(model, steps=2)
policy = GNSWorkerScalingPolicy(1, 6, hysteresis=0.25, patience=2, warmup_updates=10, interval=5,
                                target_file=os.path.join(args.out, f"gns_target_rank{rank}"),
                                log_dir=os.path.join(args.out, "gns_logs"))
x, y = data(2 * 8 * 2 * 100, 1)
model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
          callbacks=[BroadcastGlobalVariablesCallback(0), policy])
results["gns"] = {"events": portable(policy),
                  "weights": [w.tolist() for w in model.get_weights()]}

with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
