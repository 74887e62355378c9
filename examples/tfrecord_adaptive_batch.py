"""Adaptive batch size with your own tf.data pipeline reading TFRecord files, on two workers.

Launch:

    horovodrun -np 2 -H localhost:2 --gloo python examples/tfrecord_adaptive_batch.py

The script first writes the seeded synthetic teacher-student data as a few
TFRecord shards into <logdir>/data (a stand-in for your files). Each worker
then reads its own shards with an ordinary tf.data pipeline -- files per
worker, parse with map, cache, seeded shuffle, prefetch -- and hands the
*unbatched* examples to AdaptiveBatchPipeline, which batches them with a
micro-batch that GNSBatchSizePolicy grows with the gradient noise scale
(then gradient accumulation beyond --max-micro-batch). Every rank prints
the batch numbers at which its micro-batch changed: they are identical.
"""

import argparse
import os
import time

import tensorflow as tf

import keras
import keras_adapt
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback
from keras_adapt.data import AdaptiveBatchPipeline, teacher_student
from keras_adapt.policies import GNSBatchSizePolicy

FEATURES = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}


def write_shards(data_dir, x, y, num_shards, rank, size):
    """Writes shard i (every num_shards-th example) for the shards this rank reads."""
    os.makedirs(data_dir, exist_ok=True)
    mine = []
    for shard in range(rank, num_shards, size):  # files per worker: shard i -> rank i % size
        path = os.path.join(data_dir, f"train-{shard:02d}-of-{num_shards:02d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(shard, len(x), num_shards):
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[i]]))}
                writer.write(tf.train.Example(
                    features=tf.train.Features(feature=features)).SerializeToString())
        mine.append(path)
    return mine


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--examples", type=int, default=32000, help="training examples written")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=16, help="initial, per worker")
    parser.add_argument("--max-micro-batch", type=int, default=256, help="per worker")
    parser.add_argument("--max-batch", type=int, default=2048, help="global")
    parser.add_argument("--logdir", default="runs/tfrecord_adaptive_batch")
    args = parser.parse_args()

    rank, size = keras_adapt.rank(), keras_adapt.size()
    x, y = teacher_student(args.examples, dim=8, hidden=32, num_classes=10, seed=0)
    x_test, y_test = teacher_student(10000, dim=8, hidden=32, num_classes=10, seed=0)
    files = write_shards(os.path.join(args.logdir, "data"), x, y, args.shards, rank, size)

    # The user's pipeline, on single examples. Prefetch goes here, before
    # the adaptive batching; nothing after it reads ahead.
    examples = (tf.data.TFRecordDataset(files)
                .map(lambda record: tf.io.parse_single_example(record, FEATURES),
                     num_parallel_calls=tf.data.AUTOTUNE)
                .map(lambda e: (e["x"], e["y"]))
                .cache()
                .shuffle(4096, seed=rank)
                .prefetch(tf.data.AUTOTUNE))
    pipeline = AdaptiveBatchPipeline(examples, micro_batch_size=args.micro_batch)

    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.9))
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    policy = GNSBatchSizePolicy(
        min_batch=size * args.micro_batch, max_batch=args.max_batch, dataset=pipeline,
        max_micro_batch_size=args.max_micro_batch, scaling_rule="sqrt",
        warmup_updates=30, min_change_interval=50, interval=10, log_dir=args.logdir, verbose=1)

    # The stream repeats the shards without end: an epoch is a fixed number
    # of micro-steps (a quarter pass at the initial micro-batch).
    steps_per_epoch = args.examples // size // args.micro_batch // 4
    start = time.perf_counter()
    model.fit(pipeline.dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0), policy, MetricAverageCallback()])
    seconds = time.perf_counter() - start
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"rank {rank}: micro-batch changes (from batch, size) {pipeline.changes}", flush=True)
    if rank == 0:
        batches = [e["after"]["batch_size"] for e in policy.events if e["kind"] == "batch_size"]
        print(f"summary: {size} workers, {len(files)} TFRecord shards each, {seconds:.1f} s, "
              f"{int(optimizer.iterations.numpy())} updates, global batch "
              f"{' -> '.join(map(str, [size * args.micro_batch] + batches))}, "
              f"test accuracy {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
