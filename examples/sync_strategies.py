"""Synchronisation strategies on two workers: a policy switches them while training runs.

Launch:

    horovodrun -np 2 -H localhost:2 --gloo python examples/sync_strategies.py

The optimizer declares AllReduceSGD (averaged gradients every update) and
LocalSGD (local steps, models averaged every --period updates).
SyncStrategyPolicy chooses the period H (H = 1: AllReduceSGD, up to
--period) from the gradient noise scale against the global batch
(H x B <= B_noise) and, after the learning rate decays halfway through,
at least --period: post-local SGD. Every switch is printed, written to
<logdir>/adapt_events.jsonl and, through AdaptTensorBoard, shown in
TensorBoard's "Adapt" tab. With --delay-ms each collective waits that long
first, as on a slow network: the local steps then save most of that time.
"""

import argparse
import os
import time

import numpy as np


def load_digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--period", type=int, default=8, help="LocalSGD's H")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="simulated network delay per collective")
    parser.add_argument("--logdir", default="runs/sync_strategies")
    args = parser.parse_args()
    if args.delay_ms > 0:  # read when the train function is traced
        os.environ["KERAS_ADAPT_COLLECTIVE_DELAY_MS"] = str(args.delay_ms)

    import keras
    import keras_adapt
    from keras_adapt.callbacks import (
        AdaptTensorBoard,
        BroadcastGlobalVariablesCallback,
        GradientStatsMonitor,
        MetricAverageCallback,
    )
    from keras_adapt.policies import SyncStrategyPolicy
    from keras_adapt.sync import AllReduceSGD, LocalSGD

    rank, size = keras_adapt.rank(), keras_adapt.size()
    (x, y), (x_test, y_test) = load_digits_split()
    x, y = x[rank::size], y[rank::size]  # each worker its own shard
    updates_per_epoch = -(-len(x) // args.batch)  # the last batch is smaller
    total = updates_per_epoch * args.epochs
    # The learning rate drops 5x halfway: the policy's post-local rule follows it.
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [total // 2], [args.lr, args.lr / 5])
    local = LocalSGD(period=args.period)
    optimizer = keras_adapt.DistributedOptimizer(
        keras.optimizers.SGD(schedule, momentum=0.9), stats_interval=5,
        sync_strategy=[AllReduceSGD(), local])
    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    policy = SyncStrategyPolicy(local=local, interval=10, warmup_updates=50,
                                min_switch_interval=50, log_dir=args.logdir, verbose=1)

    def report(epoch, logs):
        if rank == 0:
            name = optimizer.adapt_state.sync.strategy.name
            print(f"epoch {epoch + 1:2d}  loss {logs['loss']:.4f}  acc {logs['accuracy']:.4f}  "
                  f"gns {logs['gns']:7.1f}  strategy {name}", flush=True)

    callbacks = [
        BroadcastGlobalVariablesCallback(root_rank=0),
        GradientStatsMonitor(interval=10),
        policy,
        MetricAverageCallback(),
        AdaptTensorBoard(args.logdir, update_freq=10, batch_size=args.batch),
        keras.callbacks.LambdaCallback(on_epoch_end=report),
    ]
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=callbacks)
    seconds = time.perf_counter() - start
    # The workers' models differ between averagings: evaluate their average.
    optimizer.adapt_state.sync.set(AllReduceSGD())
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        path = " -> ".join([AllReduceSGD.name] + [e["after"]["sync_strategy"]
                                                  for e in policy.events
                                                  if e["kind"] == "sync_strategy"])
        print(f"\nsummary: {size} workers, {seconds:.1f} s, "
              f"{int(optimizer.iterations.numpy())} updates, test accuracy {acc:.4f}")
        print(f"strategies: {path}")
        print(f"events: {os.path.join(os.path.abspath(args.logdir), 'adapt_events.jsonl')}")


if __name__ == "__main__":
    main()
