"""Run under horovodrun by tests/test_adapt_tensorboard.py.

Every rank trains the same small model with AdaptTensorBoard on one shared
log directory and emits the same two adaptation events (as policies do:
every rank decides alike), two at each epoch end. Only rank 0 may write the shared series and the
events; the step times of every rank must reach rank 0's file, and the
host metrics (SystemMonitor) every rank's logs. Every rank switches the
synchronisation strategy at the same steps (SWITCHES), which rank 0's
adapt/sync_strategy series must show.
Writes <out>/rank<r>.json with what each rank saw.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import numpy as np

import keras
import keras_adapt
from keras_adapt.callbacks import (
    AdaptTensorBoard,
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    SystemMonitor,
)
from keras_adapt.record import events
from keras_adapt.sync import AllReduceSGD, LocalSGD

#: Before the update that takes the step count from s to s + 1.
SWITCHES = {10: "local_sgd", 31: "allreduce_sgd"}

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()


class EmitAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        for kind in ("batch_size", "lr"):
            events.emit(kind, step=step, epoch=epoch,
                        policy="TestPolicy", reason=f"epoch {epoch} ended",
                        before={"epoch": epoch}, after={"epoch": epoch + 1}, log_dir=args.log_dir)


class SwitchStrategy(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step in SWITCHES:
            self.model.optimizer.adapt_state.sync.set(SWITCHES[step])


keras.utils.set_random_seed(1 + rank)
x = np.random.rand(16 * 24, 8).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(keras_adapt.DistributedOptimizer(
    keras.optimizers.SGD(0.01), sync_strategy=[AllReduceSGD(), LocalSGD(period=3)]), "mse")
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=[
    BroadcastGlobalVariablesCallback(0),
    GradientStatsMonitor(interval=4),
    SystemMonitor(interval=3),
    SwitchStrategy(),
    AdaptTensorBoard(args.log_dir, update_freq=6),
    EmitAtEpochEnd(),
])
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "gns": history.history["gns"],
               "system": {k: v for k, v in history.history.items() if k.startswith("system/")},
               "steps": int(model.optimizer.iterations.numpy()),
               "switches": SWITCHES}, f)
