"""Run under horovodrun by tests/test_compression.py; writes <out>/rank<r>.json.

The test sets KERAS_ADAPT_COLLECTIVE_DELAY_MS for the job, so every
collective waits that long: the transfer is most of a step, whatever the
machine's load.

Phases:
  switch  a linear model, each rank its own fixed 64 samples every step,
          SGD at 2**-4; GradientCompression set to fp16 before step 3 and
          back to none before step 6: every step's weights, the mode each
          step ran with, and how often the model's call was traced by then
  policy  WorkerTimingMonitor + CommunicationPolicy: the events it recorded
          and the mode at the end
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.actuators import GradientCompression
from keras_adapt.callbacks import WorkerTimingMonitor
from keras_adapt.policies import CommunicationPolicy

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}

DIM, BATCH, STEPS, LR = 32, 64, 10, 2.0 ** -4
TRACES = [0]


class Linear(keras.layers.Layer):
    """x @ w, counting how often its call is traced (Python runs only then)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(DIM, 1), initializer=keras.initializers.Constant(0.5),
                                 name="w")

    def call(self, x):
        TRACES[0] += 1
        return tf.matmul(x, self.w)  # TensorFlow on both stacks


def data(r):
    rng = np.random.default_rng(100 + r)
    x = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    y = (x @ rng.standard_normal((DIM, 1)) + rng.standard_normal((BATCH, 1))).astype(np.float32)
    return x, y


class SwitchAt(keras.callbacks.Callback):
    """fp16 from step 3, none again from step 6; records the weights."""

    def __init__(self, compression, layer):
        super().__init__()
        self.compression, self.layer = compression, layer
        self.modes, self.weights = [], [np.asarray(layer.w.numpy()).ravel().tolist()]
        self.traces = []  # the model's traces so far, after each step

    def on_train_batch_begin(self, batch, logs=None):
        if batch in (3, 6):
            self.compression.set("fp16" if batch == 3 else "none")
        self.modes.append(self.compression.mode)

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.asarray(self.layer.w.numpy()).ravel().tolist())
        self.traces.append(TRACES[0])


# -- switch ------------------------------------------------------------------
layer = Linear()
model = keras.Sequential([keras.Input((DIM,)), layer])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(LR), gradient_stats=False),
              "mse")
compression = GradientCompression(model)
switch = SwitchAt(compression, layer)
x, y = data(rank)
model.fit(np.tile(x, (STEPS, 1)), np.tile(y, (STEPS, 1)), batch_size=BATCH, epochs=1,
          shuffle=False, verbose=0, callbacks=[switch])
results["switch"] = {"modes": switch.modes, "weights": switch.weights,
                     "traces": switch.traces,
                     "saved_state": model.optimizer.adapt_state.compression.get_state()}

# -- policy ------------------------------------------------------------------
model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1, kernel_initializer="zeros")])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01), gradient_stats=False),
              "mse")
monitor = WorkerTimingMonitor(interval=4)
policy = CommunicationPolicy(monitor, patience=2, log_dir=args.log_dir)
model.fit(np.tile(x, (40, 1)), np.tile(y, (40, 1)), batch_size=BATCH, epochs=1, shuffle=False,
          verbose=0, callbacks=[monitor, policy])
results["policy"] = {"events": policy.events, "mode": policy.compression.mode,
                     "weights": model.get_weights()[0].ravel().tolist()}

with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
