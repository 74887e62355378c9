"""The learning-rate contract, checked on the rate each update applied.

Imported by tests/test_lr_contract.py for one process, and run under
horovodrun by it (writes <out>/rank<r>.json) for two workers.

The contract, the same on Keras 3 and tf.keras 2: whatever sets the rate
sets the base rate; reading ``optimizer.learning_rate`` gives the base rate;
each update applies base x factor, the factor of keras-adapt's learning-rate
control (set here with ``LearningRateScale``, the actuator the policies use).

How the applied rate is read: a linear model without bias on inputs of ones
with the loss mean(prediction) has the gradient exactly 1 (on every worker,
so its average too); the kernel is reset to 0 before every batch, so after
the update it holds -(the rate the update applied), exactly in float32.
Each scenario's expected base rate per batch is written below by hand from
the documented behaviour of the callback that sets it.
"""

if __name__ == "__main__":
    import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.actuators import LearningRateScale
from keras_adapt.callbacks import LearningRateScheduleCallback, LearningRateWarmupCallback

EPOCHS, STEPS, BATCH = 4, 3, 4
LR0, FACTOR = 0.1, 4.0
#: The logs key Keras' own learning-rate callbacks write the rate they read under.
KERAS_LR_KEY = "learning_rate" if _keras.IS_KERAS3 else "lr"


class SetAt(keras.callbacks.Callback):
    """The user's own setter: ``how(optimizer)`` before batch ``batch`` of ``epoch``."""

    def __init__(self, epoch, batch, how):
        super().__init__()
        self.at, self.how, self.epoch = (epoch, batch), how, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            self.how(self.model.optimizer)


def _set_attribute(optimizer):
    optimizer.learning_rate = 0.03


def _assign(optimizer):
    optimizer.learning_rate.assign(0.03)


def _warmup_base(e, b):
    if e >= 2:  # after the warm-up its last rate stays: lr
        return LR0
    n = keras_adapt.size()
    return LR0 / n * (1 + (n - 1) * (e + (b + 1) / STEPS) / 2)


def _constant_factor(i):
    return FACTOR


def _ramped_factor(i):  # from 1 to FACTOR over 4 updates from update 0
    return 1.0 + (FACTOR - 1.0) * min(i / 4.0, 1.0)


#: name -> (callbacks maker, base rate before batch b of epoch e, factor at
#: update i, what the history's learning-rate key holds at an epoch end:
#: (key, "base" or "effective") or None). Warm-up values are Horovod's:
#: lr / N x (1 + (N - 1) x (e + (b + 1) / s) / warmup_epochs), then lr.
SCENARIOS = {
    "scheduler_absolute": (
        lambda: [keras.callbacks.LearningRateScheduler(lambda epoch: 0.002 if epoch >= 1 else 0.02)],
        lambda e, b: 0.02 if e < 1 else 0.002, _constant_factor, (KERAS_LR_KEY, "base")),
    "scheduler_relative": (
        lambda: [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.1)],
        lambda e, b: LR0 * 0.1 ** (e + 1), _constant_factor, (KERAS_LR_KEY, "base")),
    "scheduler_absolute_under_a_ramp": (
        lambda: [keras.callbacks.LearningRateScheduler(lambda epoch: 0.002 if epoch >= 1 else 0.02)],
        lambda e, b: 0.02 if e < 1 else 0.002, _ramped_factor, (KERAS_LR_KEY, "base")),
    # min_delta=1e9: no epoch improves on the first, so the rate halves at
    # the end of every epoch from the second on.
    "reduce_on_plateau": (
        lambda: [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=1e9)],
        lambda e, b: LR0 * 0.5 ** max(0, e - 1), _constant_factor, (KERAS_LR_KEY, "base")),
    "set_attribute": (
        lambda: [SetAt(1, 1, _set_attribute)],
        lambda e, b: LR0 if (e, b) < (1, 1) else 0.03, _constant_factor, None),
    "assign": (
        lambda: [SetAt(1, 1, _assign)],
        lambda e, b: LR0 if (e, b) < (1, 1) else 0.03, _constant_factor, None),
    "keras_adapt_schedule": (
        lambda: [LearningRateScheduleCallback(initial_lr=LR0, multiplier=lambda e: 1.0 / (1.0 + e),
                                              start_epoch=1, staircase=False)],
        lambda e, b: LR0 if e < 1 else LR0 / (1.0 + e + b / STEPS), _constant_factor,
        ("lr", "effective")),
    "keras_adapt_warmup": (
        lambda: [LearningRateWarmupCallback(initial_lr=LR0, warmup_epochs=2)],
        _warmup_base, _constant_factor, ("lr", "effective")),
}


class Applied(keras.callbacks.Callback):
    """Before every batch (after the callbacks that set the rate): reads
    ``optimizer.learning_rate`` and resets the kernel to 0; after it: the
    rate the update applied, -kernel."""

    def __init__(self):
        super().__init__()
        self.read, self.applied = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.read.append(float(np.asarray(self.model.optimizer.learning_rate)))
        self.model.layers[0].kernel.assign(tf.zeros((1, 1)))

    def on_train_batch_end(self, batch, logs=None):
        self.applied.append(-float(np.asarray(self.model.layers[0].kernel)[0, 0]))


def sgd_classes():
    """The SGD classes of this stack: tf.keras 2 also has its legacy OptimizerV2."""
    out = [keras.optimizers.SGD]
    if not _keras.IS_KERAS3:
        out.append(keras.optimizers.legacy.SGD)
    return out


def run(name, sgd=keras.optimizers.SGD, extra_callbacks=(), run_eagerly=False):
    """Trains scenario ``name`` (compiled with ``run_eagerly``); returns what
    was measured and what the contract says, per update (``applied``,
    ``read``) and per epoch (``logged``)."""
    make_callbacks, base, factor, logged = SCENARIOS[name]
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(keras_adapt.DistributedOptimizer(sgd(LR0)), loss=lambda y, p: tf.reduce_mean(p),
                  run_eagerly=run_eagerly)
    scale = LearningRateScale(model)
    if factor is _ramped_factor:
        scale.set(FACTOR, warmup_steps=4)
    else:
        scale.set(FACTOR)
    applied = Applied()
    x, y = np.ones((STEPS * BATCH, 1), np.float32), np.zeros((STEPS * BATCH, 1), np.float32)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[*make_callbacks(), *extra_callbacks, applied])
    batches = [(e, b) for e in range(EPOCHS) for b in range(STEPS)]
    out = {"applied": applied.applied, "read": applied.read,
           "expected_applied": [base(e, b) * factor(i) for i, (e, b) in enumerate(batches)],
           "expected_read": [base(e, b) for e, b in batches]}
    if logged is not None:
        key, which = logged
        last = [(e, STEPS - 1) for e in range(EPOCHS)]
        # At an epoch end the factor is the one of the next update.
        out["logged"] = [float(v) for v in history.history[key]]
        out["expected_logged"] = [base(e, b) * (factor((e + 1) * STEPS) if which == "effective" else 1)
                                  for e, b in last]
    return out


def check(name, result, rtol=1e-6):
    """Asserts that ``result`` (from :func:`run`) keeps the contract."""
    for measured in ("applied", "read", "logged"):
        if measured in result:
            np.testing.assert_allclose(result[measured], result[f"expected_{measured}"], rtol=rtol,
                                       err_msg=f"{name}: {measured}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = {name: run(name) for name in SCENARIOS}
    with open(os.path.join(args.out, f"rank{keras_adapt.rank()}.json"), "w") as f:
        json.dump({"rank": keras_adapt.rank(), "size": keras_adapt.size(), "results": results}, f)
