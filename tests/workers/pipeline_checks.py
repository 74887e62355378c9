"""Run under horovodrun by tests/test_pipeline_distributed.py; writes <out>/rank<r>.json.

Each rank writes its own TFRecord shards (files per worker) and reads them
through a user-style pipeline: TFRecordDataset -> map(parse) -> seeded
shuffle -> prefetch. Phases (one launch):
  rebatch     AdaptiveBatchPipeline + GNSBatchSizePolicy (micro-batch, then k)
  accumulate  the same files, .batch(8, drop_remainder=True); ScheduledBatchSizePolicy
              changes only k
  guard       rank 1 prefetches batches after the pipeline; a change must then
              fail on both ranks with a clear error instead of diverging
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback
from keras_adapt.data import AdaptiveBatchPipeline, teacher_student
from keras_adapt.policies import GNSBatchSizePolicy, ScheduledBatchSizePolicy

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}
DIM, SHARDS = 16, 4

# Files per worker: rank r writes (and later reads) shards r, r + size, ...
x, y = teacher_student(8192, dim=DIM, num_classes=4, hidden=32, seed=3)
data_dir = os.path.join(args.out, "data")
os.makedirs(data_dir, exist_ok=True)
files = []
for shard in range(rank, SHARDS, size):
    path = os.path.join(data_dir, f"part-{shard}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(shard, len(x), SHARDS):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[i]])),
            }))
            writer.write(example.SerializeToString())
    files.append(path)

FEATURES = {"x": tf.io.FixedLenFeature([DIM], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}


def examples():
    ds = tf.data.TFRecordDataset(files)
    ds = ds.map(lambda r: tf.io.parse_single_example(r, FEATURES), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.map(lambda e: (e["x"], e["y"]))
    return ds.shuffle(1024, seed=100 + rank).prefetch(tf.data.AUTOTUNE)


def build():
    keras.utils.set_random_seed(100 + rank)  # the broadcast aligns the ranks
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Steps(keras.callbacks.Callback):
    """Per micro-step: updates and batches formed when it begins (after the
    policies acted), and the batch size the step used (from the graph)."""

    def __init__(self, pipeline=None):
        super().__init__()
        self.pipeline = pipeline
        self.updates, self.formed, self.sizes = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.updates.append(int(self.model.optimizer.iterations.numpy()))
        if self.pipeline is not None:
            self.formed.append(self.pipeline.batches)

    def on_train_batch_end(self, batch, logs=None):
        self.sizes.append(int(self.model.optimizer.gradient_statistics.batch_size.numpy()))


def plain(events):
    return [{k: v for k, v in e.items() if k not in ("wall_time", "rank")} for e in events]


def run(name, model, policy, data, steps, **fit_kwargs):
    model.fit(data, callbacks=[BroadcastGlobalVariablesCallback(0), policy, steps],
              verbose=0, **fit_kwargs)
    results[name] = {
        "events": plain(policy.events),
        "weights": [w.tolist() for w in model.get_weights()],
        "updates": int(model.optimizer.iterations.numpy()),
        "step_updates": steps.updates,
        "step_formed": steps.formed,
        "step_sizes": steps.sizes,
        "k": policy.batch.accumulation.steps,
    }


# rebatch: the policy grows the micro-batch of the user's pipeline, then k
pipeline = AdaptiveBatchPipeline(examples(), micro_batch_size=8, prefetch=64)
# (straight to each target, max_growth=None: the switching is what is checked,
# and every decision then falls on an update some step begins at)
policy = GNSBatchSizePolicy(min_batch=16, max_batch=512, dataset=pipeline, max_micro_batch_size=64,
                            scaling_rule="sqrt", warmup_updates=20, min_change_interval=20,
                            interval=10, max_growth=None)
steps = Steps(pipeline)
run("rebatch", build(), policy, pipeline.dataset, steps, steps_per_epoch=60, epochs=3)
results["rebatch"]["changes"] = pipeline.changes
results["rebatch"]["initial"] = pipeline.initial_micro_batch_size

# accumulate: a plain batched pipeline; only k changes
batched = examples().batch(8, drop_remainder=True).repeat()
policy = ScheduledBatchSizePolicy({1: 32, 2: 64}, dataset=batched)
run("accumulate", build(), policy, batched, Steps(), steps_per_epoch=40, epochs=3)

# guard: batches formed ahead on rank 1 only -> both ranks refuse the change
pipeline = AdaptiveBatchPipeline(examples(), micro_batch_size=4)
stream = pipeline.dataset.prefetch(3) if rank == 1 else pipeline.dataset
it = iter(stream)
next(it)
deadline = time.time() + 20
while rank == 1 and pipeline.batches < 4 and time.time() < deadline:
    time.sleep(0.01)
try:
    pipeline.micro_batch_size = 16
    results["guard"] = {"error": None}
except RuntimeError as exc:
    results["guard"] = {"error": str(exc)}
results["guard"].update(formed=pipeline.batches, changes=pipeline.changes,
                        micro_batch_size=pipeline.micro_batch_size)

with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
