"""Run under horovodrun by tests/test_plan.py: a short 2-worker run for ``keras-adapt plan``.

Each rank streams its data through an AdaptiveBatchDataset; a
ScheduledBatchSizePolicy moves the global batch at every epoch (a bigger
micro-batch, then accumulation past the micro-batch cap), so the run
visits several configurations; AdaptTensorBoard records the step times,
workers, batch sizes and noise scale, the policy the batch_size events.
Writes <out>/rank<r>.json with the configurations each rank ran.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import keras
import keras_adapt
from keras_adapt.callbacks import AdaptTensorBoard, BroadcastGlobalVariablesCallback, \
    GradientStatsMonitor
from keras_adapt.data import AdaptiveBatchDataset, teacher_student
from keras_adapt.policies import ScheduledBatchSizePolicy

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()

# Global batches 2 x b x k: b = 64, 8, 512 (the cap), 512 x 2, 32, 256. Far apart, and a
# model big enough that the step time's dependence on them stands out of a loaded
# machine's noise; the first epoch (start-up) is not the only one at its size.
SCHEDULE = {1: 16, 2: 1024, 3: 2048, 4: 64, 5: 512, 6: 128}
x, y = teacher_student(4096, dim=256, hidden=32, num_classes=10, seed=rank)
data = AdaptiveBatchDataset(x, y, micro_batch_size=64, seed=rank)
keras.utils.set_random_seed(rank)
model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(2048, activation="relu"),
                          keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
policy = ScheduledBatchSizePolicy(SCHEDULE, min_batch=16, dataset=data,
                                  max_micro_batch_size=512, log_dir=args.log_dir)
seen = []


class Configurations(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        state = policy.batch.state()
        seen.append([state["micro_batch_size"], state["workers"], state["accumulation"]])


model.fit(data.dataset, steps_per_epoch=24, epochs=len(SCHEDULE) + 1, verbose=0, callbacks=[
    BroadcastGlobalVariablesCallback(0),
    GradientStatsMonitor(interval=4),
    policy,
    AdaptTensorBoard(args.log_dir, update_freq=4),
    Configurations(),
])
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "configurations": seen,
               "steps": int(model.optimizer.iterations.numpy())}, f)
