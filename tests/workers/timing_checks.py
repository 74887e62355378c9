"""Run under horovodrun by tests/test_worker_timing.py.

Every rank trains the same lazily built model with WorkerTimingMonitor
(and AdaptTensorBoard, GradientStatsMonitor, optionally StragglerPolicy)
and records every measurement the monitor made, plus which op types the
optimizer update's graph holds with and without the monitor. The
environment (KERAS_ADAPT_COLLECTIVE_DELAY_MS, KERAS_ADAPT_SLOW_RANK) is set
by the test. Writes <out>/rank<r>.json.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.callbacks import (
    AdaptTensorBoard,
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    WorkerTimingMonitor,
)

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--straggler", default="")  # JSON kwargs of StragglerPolicy, or ""
parser.add_argument("--local_sgd", type=int, default=0)  # LocalSGD(period) without statistics
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
INTERVAL, BATCH, STEPS = 5, 32, 30


def update_op_types(optimizer):
    """Op types of a traced optimizer update (functions in its library included)."""
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    weights = layer.trainable_weights
    optimizer.build(weights)

    @tf.function
    def update():
        optimizer.apply_gradients([(tf.ones(w.shape), w) for w in weights])

    graph = update.get_concrete_function().graph.as_graph_def()
    types = {n.op for n in graph.node}
    for f in graph.library.function:
        types |= {n.op for n in f.node_def}
    return types


# Without the monitor the update holds no timestamp; set on a model, the
# monitor puts them in (the same check, so it can fail).
probe = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
ops_without = update_op_types(probe)
probe_model = keras.Sequential([keras.layers.Dense(1)])
probe_model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
WorkerTimingMonitor(interval=2).set_model(probe_model)
ops_with = update_op_types(probe_model.optimizer)

# A model trained before without the monitor: its train function (traced
# without timestamps) is traced again once the monitor is set, so every
# update of the next fit is timed.
retraced = keras.Sequential([keras.layers.Dense(1)])
retraced.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
xs = np.ones((4 * 8, 3), "float32")
retraced.fit(xs, xs[:, :1], batch_size=8, epochs=1, verbose=0)
before_monitor = retraced.optimizer.adapt_state.timing.read()[1]
retraced.fit(xs, xs[:, :1], batch_size=8, epochs=1, verbose=0,
             callbacks=[WorkerTimingMonitor(interval=2)])
retraced_collectives = [before_monitor, retraced.optimizer.adapt_state.timing.read()[1]]


class Recorder(keras.callbacks.Callback):
    """Every new result of the monitor (and policy), with the step it appeared at."""

    def __init__(self, monitor):
        super().__init__()
        self.monitor = monitor
        self.results = []

    def on_train_batch_end(self, batch, logs=None):
        r = self.monitor.result()
        if r["steps"] > 0 and (not self.results or r != self.results[-1]["result"]):
            self.results.append({"step": int(self.model.optimizer.iterations.numpy()),
                                 "result": r, "logs": {k: float(v) for k, v in logs.items()
                                                       if "/rank_" in k or k in (
                                                           "comm_fraction", "step_time",
                                                           "throughput")}})


keras.utils.set_random_seed(7 + rank)
x = np.random.rand(BATCH * STEPS, 256).astype("float32")
y = x @ np.random.rand(256, 1).astype("float32")
# ~10 ms of computation per step, so that timing noise is small beside it.
model = keras.Sequential([keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
if args.local_sgd:
    from keras_adapt.sync import LocalSGD

    # The models are averaged every `local_sgd` updates, the only collective.
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.001),
                                                   gradient_stats=False,
                                                   sync_strategy=LocalSGD(period=args.local_sgd)),
                  "mse")
    monitor = WorkerTimingMonitor(interval=INTERVAL, batch_size=BATCH)
    callbacks = [BroadcastGlobalVariablesCallback(0), monitor]
else:
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.001)), "mse")
    monitor = WorkerTimingMonitor(interval=INTERVAL)
    callbacks = [BroadcastGlobalVariablesCallback(0), GradientStatsMonitor(interval=4), monitor]
recorder = Recorder(monitor)
policy = None
if args.straggler:
    from keras_adapt.policies import StragglerPolicy

    policy = StragglerPolicy(monitor, log_dir=args.log_dir, **json.loads(args.straggler))
    callbacks.append(policy)
callbacks += [AdaptTensorBoard(args.log_dir, update_freq=INTERVAL), recorder]
start = time.perf_counter()
history = model.fit(x, y, batch_size=BATCH, epochs=args.epochs, verbose=0, shuffle=False,
                    callbacks=callbacks)
elapsed = time.perf_counter() - start
out = {"rank": rank, "size": size, "elapsed": elapsed,
       "steps": int(model.optimizer.iterations.numpy()),
       "timestamp_without": "Timestamp" in ops_without, "timestamp_with": "Timestamp" in ops_with,
       "retraced_collectives": retraced_collectives,
       "results": recorder.results,
       "wait_total": model.optimizer.adapt_state.timing.read()[0],
       "collectives": model.optimizer.adapt_state.timing.read()[1],
       "slept": float(model.optimizer.adapt_state.timing.slept_seconds.numpy()),
       "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}
if policy is not None:
    out["events"] = policy.events
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
