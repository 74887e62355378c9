"""Run under horovodrun by tests/test_rebalance.py; writes <out>/rank<r>.json.

The test sets KERAS_ADAPT_SLOW_RANK (rank 1 slowed) for the job; the script
unsets it after the rebalance phase (the gns phase needs no slow rank).

Phases:
  rebalance  linear regression fed by an AdaptiveBatchDataset, SGD with a
             learning rate, StragglerPolicy(action="rebalance"): every step's
             indices, batch size and weights before and after, so the test can
             check each update against numpy's mean gradient over the
             global batch (both ranks' samples), and the events
  gns        lr = 0 at fixed weights, stats_interval=1: the noise scale with
             equal micro-batches, then with unequal ones set by RankBatchSizes
             ([48, 16], the same global batch), against the data's own truth
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.actuators import RankBatchSizes
from keras_adapt.callbacks import (
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    WorkerTimingMonitor,
)
from keras_adapt.data import AdaptiveBatchDataset, linear_regression
from keras_adapt.policies import StragglerPolicy

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}

DIM, NOISE, SAMPLES = 64, 1.0, 16384
rng = np.random.default_rng(3)
w_true = rng.standard_normal(DIM)
w0 = w_true + rng.standard_normal(DIM) / np.sqrt(DIM)
# The same data on every rank: the dataset shares it out.
x, y = linear_regression(SAMPLES, DIM, w_true, noise_std=NOISE, seed=11)


class RecordedDataset(AdaptiveBatchDataset):
    """Keeps the indices of every micro-batch it hands out, in order."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.handed_out = []

    def next_indices(self):
        idx = super().next_indices()
        self.handed_out.append(idx.tolist())
        return idx


def linear_model(weights):
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([np.asarray(weights, np.float32).reshape(DIM, 1)])
    return model


class Weights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.after = []

    def on_train_begin(self, logs=None):
        self.initial = self.model.get_weights()[0].ravel().tolist()

    def on_train_batch_end(self, batch, logs=None):
        self.after.append(self.model.get_weights()[0].ravel().tolist())


# -- probe: the weighting is in the update's graph only once enabled ---------
def captures_reference(optimizer):
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    optimizer.build(layer.trainable_weights)

    @tf.function
    def update():
        optimizer.apply_gradients([(tf.ones(w.shape), w) for w in layer.trainable_weights])

    handle = optimizer.adapt_state.batch_weighting.reference.handle
    return any(t is handle for t in update.get_concrete_function().captured_inputs)


plain = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
weighted = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1))
weighted.adapt_state.batch_weighting.enable()
results["probe"] = {"plain": captures_reference(plain), "enabled": captures_reference(weighted)}

LR = 0.01


class SetSizes(keras.callbacks.Callback):
    """Sets the per-rank sizes at given steps (between two steps, on every rank)."""

    def __init__(self, batches, plan):
        super().__init__()
        self.batches, self.plan, self.step = batches, plan, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.step in self.plan:
            self.batches.set(self.plan[self.step])
        self.step += 1


def run(name, steps, make_callbacks):
    ds = RecordedDataset(x, y, micro_batch_size=32, seed=5)
    model = linear_model(w0 + 0.1 * rank)  # the broadcast makes them equal
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(LR)), "mse")
    weights = Weights()
    extra = make_callbacks(model, ds)
    model.fit(ds.dataset, steps_per_epoch=steps // 2, epochs=2, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0), GradientStatsMonitor(10),
                         *extra, weights])
    results[name] = {
        "initial": weights.initial,
        "after": weights.after,
        "indices": ds.handed_out[: len(weights.after)],
        "final_sizes": ds.rank_micro_batch_sizes,
        "lr": LR,
        "weighting_enabled": model.optimizer.adapt_state.batch_weighting.enabled,
    }
    return extra


# -- fixed: sizes set by the actuator at known steps ------------------------
run("fixed", 80, lambda model, ds: [SetSizes(RankBatchSizes(model, ds),
                                             {10: [44, 20], 35: [7, 57], 60: [32, 32]})])


# -- rebalance: decided by the policy from the measured times ---------------
def with_policy(model, ds):
    monitor = WorkerTimingMonitor(interval=5)
    return [monitor, StragglerPolicy(monitor, warmup_s=1.0, patience=2, action="rebalance",
                                     dataset=ds, log_dir=args.log_dir)]


policy = run("rebalance", 300, with_policy)[1]
results["rebalance"]["events"] = policy.events
# The slow rank matters only to the policy's phase; the hook is read when a
# train function is traced, so the models below run at full speed.
del os.environ["KERAS_ADAPT_SLOW_RANK"]


# -- gns: equal, then unequal micro-batches, lr = 0 -------------------------
def noise_scale(sizes, steps=1500):
    data = AdaptiveBatchDataset(x, y, micro_batch_size=32, seed=7)
    m = linear_model(w0)
    opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.0), ema_decay=0.9985,
                                           stats_interval=1)
    m.compile(opt, "mse")
    if sizes is not None:
        RankBatchSizes(m, data).set(sizes)
    m.fit(data.dataset, steps_per_epoch=steps, epochs=1, verbose=0,
          callbacks=[GradientStatsMonitor(interval=50)])
    return {"measured": opt.gradient_statistics.result(), "sizes": data.rank_micro_batch_sizes,
            "weights_unchanged": bool(np.allclose(m.get_weights()[0].ravel(), w0, atol=0))}


per_sample = 2.0 * x.astype(np.float64) * (x.astype(np.float64) @ w0 - y[:, 0])[:, None]
g_mean = per_sample.mean(axis=0)
truth = {"grad_sqr": float(g_mean @ g_mean),
         "grad_var": float(per_sample.var(axis=0, ddof=1).sum())}
truth["gns"] = truth["grad_var"] / truth["grad_sqr"]
results["gns"] = {"equal": noise_scale(None), "unequal": noise_scale([48, 16]), "truth": truth}

os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
