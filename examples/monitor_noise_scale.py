"""Measure the gradient noise scale while training on scikit-learn's digits.

Launch on two local workers:

    horovodrun -np 2 -H localhost:2 --gloo python examples/monitor_noise_scale.py

Each worker trains on its own shard; gradients are averaged with Horovod's
core collectives by keras_adapt.DistributedOptimizer, which also measures the
gradient statistics in the same step. GradientStatsMonitor puts them into
the logs, so the progress bar, History, CSVLogger and TensorBoard all see
`gns`, `grad_sqr`, `grad_var` and `grad_snr`.
"""

import argparse
import os

import numpy as np

import keras
import keras_adapt
from keras_adapt.callbacks import (
    BroadcastGlobalVariablesCallback,
    GradientStatsMonitor,
    MetricAverageCallback,
)
from keras_adapt.data import teacher_student


def load(task, rank, size):
    if task == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = (x / 16.0).astype("float32")
        rng = np.random.default_rng(0)
        order = rng.permutation(len(x))
        x, y = x[order], y[order]
        split = int(0.8 * len(x))
        train, test = (x[:split], y[:split]), (x[split:], y[split:])
    else:
        train = teacher_student(20000, dim=32, num_classes=10, seed=0)
        test = teacher_student(4000, dim=32, num_classes=10, seed=0)
    # every worker takes its own shard of the training set
    return (train[0][rank::size], train[1][rank::size]), test


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["digits", "synthetic"], default="digits")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--logdir", default="runs/monitor_noise_scale")
    args = parser.parse_args()

    rank, size = keras_adapt.rank(), keras_adapt.size()
    (x, y), (x_test, y_test) = load(args.task, rank, size)
    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([
        keras.Input(x.shape[1:]),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    optimizer = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(args.lr * size, momentum=0.9))
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])

    def report(epoch, logs):
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  loss {logs['loss']:.4f}  acc {logs['accuracy']:.4f}  "
                  f"gns {logs['gns']:8.1f}  |G|^2 {logs['grad_sqr']:.4g}  "
                  f"tr(S) {logs['grad_var']:.4g}  snr {logs['grad_snr']:.3g}", flush=True)

    callbacks = [
        BroadcastGlobalVariablesCallback(root_rank=0),
        GradientStatsMonitor(interval=10),
        MetricAverageCallback(),
        keras.callbacks.LambdaCallback(on_epoch_end=report),
    ]
    if rank == 0:
        os.makedirs(args.logdir, exist_ok=True)
        callbacks += [
            keras.callbacks.CSVLogger(os.path.join(args.logdir, "history.csv")),
            keras.callbacks.TensorBoard(os.path.join(args.logdir, "tensorboard")),
        ]
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              callbacks=callbacks)
    loss, acc = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        print(f"test accuracy {acc:.4f} on {size} workers; "
              f"{int(optimizer.skipped_steps.numpy())} non-finite steps skipped")
        print(f"logs: {os.path.abspath(args.logdir)} (history.csv, tensorboard/)")


if __name__ == "__main__":
    main()
