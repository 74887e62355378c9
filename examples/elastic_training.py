"""Elastic training on digits: workers come and go while model.fit runs.

On one machine, two "hosts" (``localhost`` and ``127.0.0.1``, both started
without ssh) and a discovery script that prints a hosts file:

    printf 'localhost:1\\n127.0.0.1:1\\n' > /tmp/hosts
    printf '#!/bin/sh\\nexec cat /tmp/hosts\\n' > /tmp/discover.sh && chmod +x /tmp/discover.sh
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script /tmp/discover.sh \\
        --network-interface lo --gloo python examples/elastic_training.py --logdir runs/elastic

While it trains, remove a worker with ``printf 'localhost:1\\n' > /tmp/hosts``
and bring it back with ``printf 'localhost:1\\n127.0.0.1:1\\n' > /tmp/hosts``
(or kill one worker: the other goes on from the last commit). ``--hosts
/tmp/hosts --shrink-at 40 --grow-after 60`` makes rank 0 do both itself.
The global batch stays 64 (``ResizeRule("keep")``); each change is a
``resize`` event in ``runs/elastic/adapt_events.jsonl`` with the pause it
cost (``keras-adapt report runs/elastic -o report.png`` draws them).
"""

import argparse
import os
import time

import numpy as np

import keras
import tensorflow as tf

import keras_adapt
from keras_adapt import elastic

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--logdir", default="runs/elastic")
parser.add_argument("--hosts", help="the discovery script's hosts file (for --shrink-at)")
parser.add_argument("--shrink-at", type=int, help="rank 0 removes 127.0.0.1 after this step")
parser.add_argument("--grow-after", type=int, help="... and adds it back this many steps later")
parser.add_argument("--pace", type=float, default=0.03, help="sleep per step (s), to watch it")
args = parser.parse_args()

from sklearn.datasets import load_digits  # noqa: E402 - after argparse, for a fast --help

digits = load_digits()
x_all = (digits.data / 16.0).astype("float32")
y_all = digits.target.astype("int64")
x_train, y_train, x_test, y_test = x_all[:1280], y_all[:1280], x_all[1280:], y_all[1280:]
GLOBAL_BATCH = 64
STEPS = len(x_train) // GLOBAL_BATCH  # 20 steps per epoch, whatever the worker count

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(2e-3)),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

# Before run(): the optimizer's slots are built here, without collectives,
# so a worker that joins later meets the others in the first sync.
state = elastic.KerasState(model, rule=elastic.ResizeRule("keep", global_batch=GLOBAL_BATCH),
                           log_dir=args.logdir, shrunk_at=-1, grown=False)


def data(epoch, batch):
    """This worker's samples from step ``batch`` of epoch ``epoch`` on: step s
    of an epoch takes the global batch perm[s*64:(s+1)*64] of a permutation
    seeded by the epoch, and worker r of n its r-th slice."""
    b, r = state.batch_size, keras_adapt.rank()
    idx = []
    for e in range(epoch, args.epochs):
        perm = np.random.default_rng(e).permutation(len(x_train))
        for s in range(batch if e == epoch else 0, STEPS):
            idx.append(perm[s * GLOBAL_BATCH + r * b: s * GLOBAL_BATCH + (r + 1) * b])
    idx = np.concatenate(idx)
    return tf.data.Dataset.from_tensor_slices((x_train[idx], y_train[idx])).batch(b).repeat()


class Membership(keras.callbacks.Callback):
    """Rank 0 rewrites the hosts file at --shrink-at and --grow-after; every
    step sleeps --pace seconds so there is time to watch. Every rank keeps
    what was done in the elastic state (``shrunk_at``, ``grown``), at the
    same step: whichever worker Horovod removes, the others know."""

    def on_train_batch_end(self, batch, logs=None):
        step = state.epoch * STEPS + state.batch
        if args.hosts and args.shrink_at is not None:
            if state.shrunk_at < 0 and step >= args.shrink_at and keras_adapt.size() == 2:
                state.shrunk_at = step
                write_hosts("localhost:1\n")
            elif (state.shrunk_at >= 0 and args.grow_after is not None and not state.grown
                  and keras_adapt.size() == 1 and step >= state.shrunk_at + args.grow_after):
                state.grown = True
                write_hosts("localhost:1\n127.0.0.1:1\n")
        time.sleep(args.pace)


def write_hosts(text):
    if keras_adapt.rank() != 0:
        return
    with open(args.hosts + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.hosts + ".tmp", args.hosts)  # the discovery script never reads half a file


membership = Membership()


@elastic.run
def train(state):
    elastic.fit(state, data, epochs=args.epochs, steps_per_epoch=STEPS,
                callbacks=[membership], verbose=2 if keras_adapt.rank() == 0 else 0)


train(state)
if keras_adapt.rank() == 0:
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    for event in state.resizes:
        print(f"resize at step {event['step']}: {event['reason']}, per-worker batch "
              f"{event['before']['batch_size']} -> {event['after']['batch_size']}, "
              f"pause {event['after']['pause_s']:.2f} s")
    print(f"{keras_adapt.size()} worker(s) at the end, {int(model.optimizer.iterations.numpy())} "
          f"steps, test accuracy {accuracy:.3f}")
