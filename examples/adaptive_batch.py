"""Adaptive batch size on two workers: the batch follows the gradient noise scale.

Launch (what `make demo` does):

    horovodrun -np 2 -H localhost:2 --gloo python examples/adaptive_batch.py

Each worker streams its own shard through an AdaptiveBatchDataset. The
DistributedOptimizer averages gradients with Horovod's core collectives and
measures the gradient noise scale in the same step; GNSBatchSizePolicy grows
the global batch toward it (a bigger micro-batch per worker, then gradient
accumulation beyond --max-micro-batch) and moves the learning rate with the
square-root rule. Every decision is printed as it happens, written to
<logdir>/adapt_events.jsonl and, through AdaptTensorBoard, to TensorBoard's
"Adapt" tab.
"""

import argparse
import os
import time

import numpy as np

import keras
import keras_adapt
from keras_adapt.callbacks import (
    AdaptTensorBoard,
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    MetricAverageCallback,
)
from keras_adapt.data import AdaptiveBatchDataset, teacher_student
from keras_adapt.policies import GNSBatchSizePolicy


def load(task):
    if task == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = (x / 16.0).astype("float32")
        order = np.random.default_rng(0).permutation(len(x))
        x, y = x[order], y[order]
        split = int(0.8 * len(x))
        return (x[:split], y[:split]), (x[split:], y[split:])
    # The task of benchmarks/time_to_accuracy.py: a small teacher, 5% label noise.
    return (teacher_student(60000, dim=8, hidden=32, num_classes=10, seed=0),
            teacher_student(10000, dim=8, hidden=32, num_classes=10, seed=0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["synthetic", "digits"], default="synthetic")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--micro-batch", type=int, default=16, help="initial, per worker")
    parser.add_argument("--max-batch", type=int, default=2048, help="global")
    parser.add_argument("--max-micro-batch", type=int, default=512, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="for the initial global batch")
    parser.add_argument("--gns-multiple", type=float, default=None,
                        help="target global batch = this x the noise scale "
                             "(default: the policy's own, 2)")
    parser.add_argument("--logdir", default="runs/adaptive_batch")
    args = parser.parse_args()

    rank, size = keras_adapt.rank(), keras_adapt.size()
    (x, y), (x_test, y_test) = load(args.task)
    data = AdaptiveBatchDataset(x, y, micro_batch_size=args.micro_batch, seed=0)
    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([
        keras.Input(x.shape[1:]),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    policy = GNSBatchSizePolicy(
        min_batch=size * args.micro_batch, max_batch=args.max_batch, dataset=data,
        max_micro_batch_size=args.max_micro_batch, scaling_rule="sqrt",
        **({} if args.gns_multiple is None else {"gns_multiple": args.gns_multiple}),
        warmup_updates=30, min_change_interval=50, interval=10,
        log_dir=args.logdir, verbose=1)

    def report(epoch, logs):
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  loss {logs['loss']:.4f}  acc {logs['accuracy']:.4f}  "
                  f"gns {logs['gns']:8.1f}  batch {int(logs['batch_size']):5d}  "
                  f"lr {logs['lr']:.4f}  passes {data.passes:5.1f}", flush=True)

    callbacks = [
        BroadcastGlobalVariablesCallback(root_rank=0),
        GradientStatsMonitor(interval=10),
        policy,
        MetricAverageCallback(),
        AdaptTensorBoard(args.logdir, update_freq=10),
        keras.callbacks.LambdaCallback(on_epoch_end=report),
    ]
    start = time.perf_counter()
    # An epoch here is an eighth of a pass at the initial micro-batch; the
    # stream shuffles itself (shuffle=False only silences Keras' notice).
    model.fit(data.dataset, steps_per_epoch=data.steps_per_epoch // 8, epochs=args.epochs,
              shuffle=False, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        changes = [e for e in policy.events if e["kind"] == "batch_size"]
        path = " -> ".join([str(changes[0]["before"]["batch_size"])] +
                           [str(e["after"]["batch_size"]) for e in changes]) if changes else "-"
        print(f"\nsummary: {size} workers, {seconds:.1f} s, "
              f"{int(optimizer.iterations.numpy())} updates, {data.passes:.1f} passes over the data, "
              f"test accuracy {acc:.4f}")
        print(f"global batch: {path} ({len(changes)} changes, "
              f"{len(policy.events) - len(changes)} learning-rate changes)")
        print(f"events: {os.path.join(os.path.abspath(args.logdir), 'adapt_events.jsonl')}")


if __name__ == "__main__":
    main()
