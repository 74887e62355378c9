"""Run under horovodrun by tests/test_distributed.py; writes <out>/rank<r>.json.

Phases (all in one launch, to keep the suite fast):
  gns      fixed weights (lr=0) on linear regression: EMA estimates vs truth
  train    ranks start from different weights; BroadcastGlobalVariablesCallback,
           monitoring on; loss trajectory and final weights
  train_off  the same with gradient_stats=False (trajectory must match)
  nan      rank 1 gets a NaN sample in one batch: the step is skipped on all
           ranks, counted, EMAs unchanged, training continues
  remainder  fit(x, y, batch_size=32, shuffle=True) with a last batch of 5
           samples on rank 0 and 9 on rank 1, lr=0: EMA estimates vs the
           data's brute-force truth, and the batch behind grad_snr
  interval  stats_interval=4 at fixed weights: one update in four measured,
           estimates vs truth; then set_interval(1) without a retrace
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import socket

import numpy as np
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.callbacks import (
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    MetricAverageCallback,
)
from keras_adapt.data import linear_regression, linear_regression_gradient_stats
from keras_adapt.optimizer import DEFAULT_STATS_INTERVAL

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size, "ops": keras_adapt.ops.implementation(),
           "host": socket.gethostname()}


def linear_model(dim, weights):
    model = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([np.asarray(weights, np.float32).reshape(dim, 1)])
    return model


# -- gns: analytic truth at fixed weights --------------------------------
dim, noise, batch, steps = 16, 1.0, 32, 600
rng = np.random.default_rng(7)
w_true = rng.standard_normal(dim)
w0 = w_true + rng.standard_normal(dim) / np.sqrt(dim)
x, y = linear_regression(steps * batch, dim, w_true, noise_std=noise, seed=100 + rank)
model = linear_model(dim, w0)
# the default stats_interval: one update in DEFAULT_STATS_INTERVAL measured
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.995)
model.compile(opt, "mse")
monitor = GradientStatsMonitor(interval=50)
model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
measured = opt.gradient_statistics.result()
results["gns"] = {
    "measured": measured,
    "expected_updates": -(-steps // DEFAULT_STATS_INTERVAL),
    "truth": linear_regression_gradient_stats(w0, w_true, noise),
    "weights_unchanged": bool(np.allclose(model.get_weights()[0].ravel(), w0, atol=0)),
}


# -- train: broadcast + monitoring on vs off -----------------------------
def mlp(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="tanh"),
        keras.layers.Dense(1),
    ])


def train(gradient_stats, x, y, epochs=3):
    model = mlp(seed=1234 + rank)  # different start on each rank on purpose
    opt = keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), gradient_stats=gradient_stats
    )
    model.compile(opt, "mse")
    losses = []
    cbs = [BroadcastGlobalVariablesCallback(0)]
    if gradient_stats:
        cbs.append(GradientStatsMonitor(interval=5))
    cbs += [MetricAverageCallback(),
            keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))]
    hist = model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=cbs)
    return model, opt, losses, hist.history


x, y = linear_regression(512, 16, np.linspace(-1, 1, 16), seed=200 + rank)
m_on, opt_on, losses_on, hist_on = train(True, x, y)
m_off, _, losses_off, _ = train(False, x, y)
results["train"] = {
    "weights_on": [w.ravel().tolist() for w in m_on.get_weights()],
    "weights_off": [w.ravel().tolist() for w in m_off.get_weights()],
    "optimizer_vars": [np.asarray(v).ravel().tolist() for v in opt_on.variables],
    "losses_on": losses_on,
    "losses_off": losses_off,
    "history": hist_on,
    "stats": opt_on.gradient_statistics.result(),
}

# -- nan: a NaN input on rank 1 only, in batch 3 of 10 ----------------------
x, y = linear_regression(160, 16, np.linspace(-1, 1, 16), seed=300 + rank)
if rank == 1 or size == 1:
    x[3 * 16 + 5, 2] = np.nan
model = mlp(seed=99)
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), stats_interval=1,
                                       skip_nonfinite=True)
model.compile(opt, "mse")
stats = opt.gradient_statistics
snapshots = []


class Snapshot(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        averages = stats.read_averages()
        snapshots.append({
            "batch": batch,
            "ema_grad_sqr": averages["ema_grad_sqr"],
            "ema_grad_var": averages["ema_grad_var"],
            "updates": int(averages["updates"]),
            "nonfinite": int(averages["nonfinite"]),
            "skipped": int(opt.skipped_steps.numpy()),
            "iterations": int(opt.iterations.numpy()),
        })


model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
          callbacks=[BroadcastGlobalVariablesCallback(0), GradientStatsMonitor(interval=1), Snapshot()])
results["nan"] = {
    "snapshots": snapshots,
    "weights": [w.ravel().tolist() for w in model.get_weights()],
    "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
}

# -- remainder: unequal last batches on the two ranks ----------------------
# Both ranks shuffle the same samples (rank 1 has 4 more), independently:
# the truth is the data's own |G|^2 and tr(Sigma), from per-sample gradients.
full, rest = 100, (5, 9)[rank % 2]
epochs = 8
x_all, y_all = linear_regression(full * 32 + 9, dim, w_true, noise_std=noise, seed=400)
x, y = x_all[: full * 32 + rest], y_all[: full * 32 + rest]
per_sample = 2.0 * x_all[: full * 32 + 5].astype(np.float64) * (
    x_all[: full * 32 + 5].astype(np.float64) @ w0 - y_all[: full * 32 + 5, 0])[:, None]
g_mean = per_sample.mean(axis=0)
brute = {"grad_sqr": float(g_mean @ g_mean), "grad_var": float(per_sample.var(axis=0, ddof=1).sum())}
brute["gns"] = brute["grad_var"] / brute["grad_sqr"]
model = linear_model(dim, w0)
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.998,
                                       stats_interval=1)
model.compile(opt, "mse")
tf.random.set_seed(None)  # a global seed makes Keras draw the same last batches each epoch
hist = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=True, verbose=0,
                 callbacks=[GradientStatsMonitor(interval=50)])
results["remainder"] = {
    "measured": opt.gradient_statistics.result(),
    "truth": brute,
    "history_grad_snr": hist.history["grad_snr"],
    "steps_per_epoch": full + 1,
    "epochs": epochs,
    "last_batch": 5 + 9,
}

# -- interval: one update in four measured ----------------------------------
x, y = linear_regression(steps * batch, dim, w_true, noise_std=noise, seed=500 + rank)
model = linear_model(dim, w0)
# ema_decay is per update: 0.995 per update is 0.98 per measurement here
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.995,
                                       stats_interval=4)
model.compile(opt, "mse")
model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
          callbacks=[GradientStatsMonitor(interval=50)])
first = opt.gradient_statistics.result()
traces = model.train_function
opt.gradient_statistics.set_interval(1)
model.fit(x[: 40 * batch], y[: 40 * batch], batch_size=batch, epochs=1, shuffle=False, verbose=0,
          callbacks=[GradientStatsMonitor(interval=50)])
results["interval"] = {
    "measured": first,
    "after_set_interval_1": opt.gradient_statistics.result(),
    "same_train_function": model.train_function is traces,
    "truth": linear_regression_gradient_stats(w0, w_true, noise),
}

os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
