"""Run under horovodrun by tests/test_sync_strategies.py; writes <out>/rank<r>.json.

Phases (all in one launch, to keep the suite fast):
  strategies  each strategy (SGD with momentum, and Adam) over several
              averaging periods from the same start, with
              BroadcastGlobalVariablesCallback: this rank's weights and
              optimizer slots, and an independent numpy simulation of both
              workers doing the same math
  switches    one model switched LocalSGD -> AllReduceSGD -> BlockMomentum ->
              ModelAveraging -> ElasticAveraging -> AllReduceSGD between
              batches: weights and slots after each switch into AllReduceSGD
              (must be identical on both ranks), the numpy simulation, and
              how many times the train function was traced
  stats       lr=0 on linear regression: the statistics under LocalSGD and
              under AllReduceSGD (same data), and the analytic truth
  measured    lr>0: the updates that measured the statistics under LocalSGD,
              post-local SGD and SMA (stats_interval=2)
  delay       KERAS_ADAPT_COLLECTIVE_DELAY_MS=40: collectives delayed under
              AllReduceSGD and LocalSGD, and the wall time of each fit
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
from keras_adapt import _hvd
from keras_adapt.data import linear_regression, linear_regression_gradient_stats
from keras_adapt.sync import (AllReduceSGD, BlockMomentum, ElasticAveraging, LocalSGD,
                              ModelAveraging)

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}

DIN, DOUT, BATCH = 4, 2, 8
W0 = np.random.default_rng(3).standard_normal((DIN, DOUT)).astype(np.float32)
B0 = np.array([0.1, -0.2], np.float32)


def data(r, steps):
    rng = np.random.default_rng(50 + r)
    x = rng.standard_normal((steps * BATCH, DIN)).astype(np.float32)
    y = (x @ rng.standard_normal((DIN, DOUT)) + [1.0, -2.0]
         + 0.3 * rng.standard_normal((steps * BATCH, DOUT)))
    return x, y.astype(np.float32)


# -- numpy reference: both workers, float64 ------------------------------------
def grad(w, b, x, y):
    resid = x @ w + b - y
    scale = 2.0 / resid.size
    return [scale * x.T @ resid, scale * resid.sum(0)]


class NumpyOptimizer:
    def __init__(self, kind, lr):
        self.kind, self.lr = kind, lr

    def slots(self, params):
        if self.kind == "sgd":
            return [np.zeros_like(p) for p in params]
        return [np.zeros_like(p) for p in params for _ in range(2)]  # m, v interleaved

    def apply(self, params, slots, grads, t):
        if self.kind == "sgd":
            for i, g in enumerate(grads):
                slots[i] = 0.9 * slots[i] - self.lr * g
                params[i] = params[i] + slots[i]
            return
        b1, b2, eps = 0.9, 0.999, 1e-7
        alpha = self.lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for i, g in enumerate(grads):
            m, v = slots[2 * i], slots[2 * i + 1]
            m = m + (g - m) * (1 - b1)
            v = v + (g * g - v) * (1 - b2)
            slots[2 * i], slots[2 * i + 1] = m, v
            params[i] = params[i] - alpha * m / (np.sqrt(v) + eps)


def simulate(schedule, kind, lr, steps):
    """schedule: {batch: strategy} switches (batch 0: the initial strategy)."""
    opt = NumpyOptimizer(kind, lr)
    datasets = [data(r, steps) for r in range(size)]
    params = [[W0.astype(np.float64), B0.astype(np.float64)] for _ in range(size)]
    slots = [opt.slots(p) for p in params]
    strategy, count, entered = schedule[0], 0, isinstance(schedule[0], AllReduceSGD)
    x_g = centre = vel = None
    snapshots = {}
    for step in range(steps):
        if step in schedule and step > 0:
            new = schedule[step]
            if type(new) is not type(strategy):
                count, entered = 0, False
            strategy = new
        if not entered:
            mean_p = [np.mean([p[i] for p in params], 0) for i in range(2)]
            mean_s = [np.mean([s[i] for s in slots], 0) for i in range(len(slots[0]))]
            params = [[m.copy() for m in mean_p] for _ in range(size)]
            slots = [[m.copy() for m in mean_s] for _ in range(size)]
            x_g = [m.copy() for m in mean_p]
            centre = [m.copy() for m in mean_p]
            vel = [np.zeros_like(m) for m in mean_p]
            entered = True
        sl = slice(step * BATCH, (step + 1) * BATCH)
        grads = [grad(p[0], p[1], x[sl], y[sl]) for p, (x, y) in zip(params, datasets)]
        start_after = getattr(strategy, "start_after", 0)
        if isinstance(strategy, AllReduceSGD) or count < start_after:
            mean_g = [np.mean([g[i] for g in grads], 0) for i in range(2)]
            grads = [mean_g] * size
        for r in range(size):
            opt.apply(params[r], slots[r], grads[r], step + 1)
        if not isinstance(strategy, AllReduceSGD) and count >= start_after:
            period = getattr(strategy, "period", 1)
            if (count + 1 - start_after) % period == 0:
                mean_p = [np.mean([p[i] for p in params], 0) for i in range(2)]
                if isinstance(strategy, ModelAveraging):
                    a = strategy.alpha
                    params = [[(1 - a) * p[i] + a * mean_p[i] for i in range(2)] for p in params]
                elif isinstance(strategy, LocalSGD):
                    params = [[m.copy() for m in mean_p] for _ in range(size)]
                elif isinstance(strategy, BlockMomentum):
                    mu, zeta = strategy.block_momentum, strategy.block_lr
                    began = [g + mu * v for g, v in zip(x_g, vel)] if strategy.nesterov else x_g
                    vel = [mu * v + zeta * (m - b) for v, m, b in zip(vel, mean_p, began)]
                    x_g = [g + v for g, v in zip(x_g, vel)]
                    start = [g + mu * v for g, v in zip(x_g, vel)] if strategy.nesterov else x_g
                    params = [[s.copy() for s in start] for _ in range(size)]
                elif isinstance(strategy, ElasticAveraging):
                    a = lr * strategy.rho
                    b = size * a
                    params = [[p[i] - a * (p[i] - centre[i]) for i in range(2)] for p in params]
                    centre = [(1 - b) * c + b * m for c, m in zip(centre, mean_p)]
        count += 1
        snapshots[step] = ([p.tolist() for p in params[rank]],
                           [s.tolist() for s in slots[rank]])
    return snapshots


# -- the same with keras-adapt --------------------------------------------------
traces = [0]


def loss(y_true, y_pred):
    traces[0] += 1  # runs once per trace of the train function
    return tf.reduce_mean(tf.square(y_pred - y_true))


class Record(keras.callbacks.Callback):
    def __init__(self, opt, schedule):
        super().__init__()
        self.opt, self.schedule, self.snapshots = opt, schedule, {}

    def on_train_batch_begin(self, batch, logs=None):
        if batch in self.schedule and batch > 0:
            self.opt.adapt_state.sync.set(self.schedule[batch])

    def on_train_batch_end(self, batch, logs=None):
        self.snapshots[batch] = (
            [np.asarray(w).tolist() for w in self.model.get_weights()],
            [np.asarray(s).tolist() for s in self.opt.adapt_state.sync.synchronized_variables()[1]])


def run(schedule, kind, lr, steps, declared, broadcast=False):
    base = keras.optimizers.SGD(lr, momentum=0.9) if kind == "sgd" else keras.optimizers.Adam(lr)
    opt = keras_adapt.DistributedOptimizer(base, sync_strategy=declared)
    model = keras.Sequential([keras.Input((DIN,)), keras.layers.Dense(DOUT)])
    model.set_weights([W0, B0])
    model.compile(opt, loss)
    record = Record(opt, schedule)
    traces[0] = 0
    x, y = data(rank, steps)
    # Horovod's start-of-training broadcast, as users add it: it must not
    # replace a worker's first local step with rank 0's
    callbacks = [keras_adapt.callbacks.BroadcastGlobalVariablesCallback(0)] if broadcast else []
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks + [record])
    return record.snapshots, traces[0], opt


cases = {
    "model_averaging_sgd": (ModelAveraging(alpha=0.5), "sgd", 0.05),
    "local_sgd_sgd": (LocalSGD(period=3), "sgd", 0.05),
    "post_local_sgd_adam": (LocalSGD(period=3, start_after=4), "adam", 0.02),
    "block_momentum_sgd": (BlockMomentum(period=3, block_lr=1.0, block_momentum=0.5), "sgd", 0.05),
    "block_momentum_adam": (BlockMomentum(period=2, block_lr=0.8, block_momentum=0.3,
                                          nesterov=False), "adam", 0.02),
    "elastic_averaging_sgd": (ElasticAveraging(period=2, rho=2.0), "sgd", 0.05),
}
results["strategies"] = {}
for name, (strategy, kind, lr) in cases.items():
    steps = 12
    got, n_traces, _ = run({0: strategy}, kind, lr, steps, [strategy, AllReduceSGD()],
                           broadcast=True)
    ref = simulate({0: strategy}, kind, lr, steps)
    results["strategies"][name] = {"got": got[steps - 1], "ref": ref[steps - 1],
                                   "got_mid": got[6], "ref_mid": ref[6], "traces": n_traces}

# the plain optimizer (AllReduceSGD only, nothing switched): its trace count
# is what a run that switches must match
results["baseline_traces"] = run({0: AllReduceSGD()}, "sgd", 0.05, 24, None)[1]

# -- switches -------------------------------------------------------------------
schedule = {0: LocalSGD(period=5), 7: AllReduceSGD(), 10: BlockMomentum(period=2),
            14: ModelAveraging(alpha=0.3), 17: ElasticAveraging(period=2, rho=1.0),
            21: AllReduceSGD()}
declared = [LocalSGD(period=5), AllReduceSGD(), BlockMomentum(period=2), ModelAveraging(0.3),
            ElasticAveraging(period=2, rho=1.0)]
for kind, lr in (("sgd", 0.05), ("adam", 0.02)):
    got, n_traces, opt = run(schedule, kind, lr, 24, declared)
    ref = simulate(schedule, kind, lr, 24)
    results[f"switches_{kind}"] = {
        "got": {str(k): v for k, v in got.items()}, "ref": {str(k): v for k, v in ref.items()},
        "traces": n_traces, "final_strategy": opt.adapt_state.sync.strategy.name}

# -- statistics under LocalSGD vs AllReduceSGD -----------------------------------
dim, noise, batch, steps = 16, 1.0, 32, 600
rng = np.random.default_rng(7)
w_true = rng.standard_normal(dim)
w0 = w_true + rng.standard_normal(dim) / np.sqrt(dim)
xs, ys = linear_regression(steps * batch, dim, w_true, noise_std=noise, seed=100 + rank)
stats = {}
for strategy in (AllReduceSGD(), LocalSGD(period=4)):
    m = keras.Sequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])
    m.set_weights([w0.astype(np.float32).reshape(dim, 1)])
    o = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.99,
                                         batch_size=batch, stats_interval=4,
                                         sync_strategy=[strategy, AllReduceSGD()]
                                         if strategy.local else None)
    m.compile(o, "mse")
    m.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    stats[strategy.name] = o.gradient_statistics.result()
results["stats"] = {"measured": stats,
                    "truth": linear_regression_gradient_stats(w0, w_true, noise)}

# -- which updates measure under the local strategies (lr > 0: the models drift) --
class Measured(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.updates, self.seen = [], 0

    def on_train_batch_end(self, batch, logs=None):
        n = self.model.optimizer.gradient_statistics.result()["updates"]
        if n > self.seen:
            self.updates.append(batch)
            self.seen = n


measured = {}
for name, strategy in (("local_sgd", LocalSGD(period=4)),
                       ("post_local_sgd", LocalSGD(period=4, start_after=3)),
                       ("model_averaging", ModelAveraging(alpha=0.5))):
    m = keras.Sequential([keras.Input((DIN,)), keras.layers.Dense(DOUT)])
    m.set_weights([W0, B0])
    o = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05), batch_size=BATCH,
                                         stats_interval=2,
                                         sync_strategy=[strategy, AllReduceSGD()])
    m.compile(o, "mse")
    record = Measured()
    x, y = data(rank, 16)
    m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    measured[name] = record.updates
results["measured_updates"] = measured

# -- delay hook -------------------------------------------------------------------
os.environ[_hvd.DELAY_ENV] = "40"
delay = {}
for strategy in (AllReduceSGD(), LocalSGD(period=4)):
    m = keras.Sequential([keras.Input((DIN,)), keras.layers.Dense(DOUT)])
    o = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), stats_interval=4,
                                         sync_strategy=[strategy, AllReduceSGD()]
                                         if strategy.local else None)
    m.compile(o, "mse")
    x, y = data(rank, 16)
    before = _hvd.delayed_collectives()
    start = time.perf_counter()
    m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    delay[strategy.name] = {"collectives": _hvd.delayed_collectives() - before,
                            "seconds": time.perf_counter() - start}
del os.environ[_hvd.DELAY_ENV]
results["delay"] = delay

os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
