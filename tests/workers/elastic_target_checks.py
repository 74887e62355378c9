"""Run by tests/test_discover_elastic.py under ``horovodrun`` elastic with
``keras-adapt discover`` as the host discovery script.

Default mode: a loop of allreduces under ``hvd.elastic.run`` (no Keras: this
checks the discovery loop, not the training state). At step ``--request-at``
rank 0 asks for ``--request`` workers through ``WorkerTarget``; Horovod must
then change the membership. Rank 0 holds its steps until the driver has
announced the change (up to ``ANNOUNCE_WAIT_S``), so the membership changes
at the next commit however slow discovery is on a loaded machine. Rank 0
writes the worker count of every step to ``<out>/sizes.json`` at the end.

``--straggler``: an elastic ``fit`` (``keras_adapt.elastic``, rule "keep",
global batch 32) with a ``WorkerTimingMonitor`` and
``StragglerPolicy(action="exclude")`` (and one more with ``min_workers=2``,
which must refuse); the test slows one rank
(``KERAS_ADAPT_SLOW_RANK``), the policy writes its host to the exclusion file
``keras-adapt discover`` reads (``KERAS_ADAPT_EXCLUDE_FILE``), and Horovod
stops that worker. Each process that finishes writes
``<out>/final_<pid>.json``: every step it ran (global id, workers, rank,
host), its position and the policy's events. Rank 0 holds its steps from
the exclusion until the driver has announced the removal, so the job
shrinks at the next commit however slow discovery is on a loaded machine.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

import horovod.tensorflow as hvd
import tensorflow as tf
from hosts_heard import HostsHeard

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--request-at", type=int, default=5)
parser.add_argument("--request", type=int, default=None)
parser.add_argument("--straggler", action="store_true")
parser.add_argument("--log-dir", default=None)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--sleep", type=float, default=0.02)
args = parser.parse_args()
#: The longest rank 0 holds its steps for the driver's announcement of the
#: requested change (the discovery script is a Python process: seconds under load).
ANNOUNCE_WAIT_S = 120.0


def allreduce_loop():
    from keras_adapt.actuators import WorkerTarget

    hvd.init()
    target = WorkerTarget(min_workers=1, max_workers=2)   # the file from KERAS_ADAPT_TARGET_FILE
    state = hvd.elastic.ObjectState(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                                    step=0, sizes=[], requested_at=None, changed_at=None)
    heard = HostsHeard(state)

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy()
            assert total == hvd.size(), (total, hvd.size())
            state.sizes.append(hvd.size())
            if state.step == args.request_at and state.requested_at is None:
                target.request(args.request)   # every rank calls; rank 0 writes
                state.requested_at = time.time()
                if hvd.rank() == 0:
                    heard.wait("any", ANNOUNCE_WAIT_S)  # the others wait in the next allreduce
            if state.changed_at is None and state.requested_at is not None \
                    and hvd.size() == args.request:
                state.changed_at = time.time()
            state.step += 1
            state.commit()   # raises HostsUpdatedInterrupt when Horovod saw new hosts
            time.sleep(0.2)

    train(state)
    if hvd.rank() == 0:
        with open(os.path.join(args.out, "sizes.json"), "w") as f:
            json.dump({"sizes": state.sizes, "seconds": state.changed_at - state.requested_at}, f)


def straggler_fit():
    import keras
    import numpy as np

    import keras_adapt
    from keras_adapt import elastic
    from keras_adapt.callbacks import WorkerTimingMonitor
    from keras_adapt.policies import StragglerPolicy

    host = os.environ["HOROVOD_HOSTNAME"]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2048, 8)).astype(np.float32)
    y = x @ rng.standard_normal((8, 1)).astype(np.float32)
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    state = elastic.KerasState(model, rule=elastic.ResizeRule("keep", global_batch=32),
                               log_dir=args.log_dir)
    monitor = WorkerTimingMonitor(interval=4)
    # Short warm-up, noise window and patience: the slowed rank is flagged
    # within a few measurements. Two policies judge the same measurements:
    # one that must keep two workers (it refuses to exclude), then one that
    # may go down to one (horovodrun --min-np 1) and excludes.
    keep_two, policy = (StragglerPolicy(monitor, warmup_s=0.2, patience=2, noise_window=3,
                                        action="exclude", min_workers=n, log_dir=args.log_dir)
                        for n in (2, 1))

    heard = HostsHeard(state)

    class Recorder(keras.callbacks.Callback):
        """After the elastic callbacks: every executed step's global id;
        on rank 0, once the policy has excluded a host, holds the step
        until the driver announced its removal."""

        def __init__(self):
            super().__init__()
            self.steps = []
            self.held = False

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append({"id": state.epoch * args.steps + state.batch - 1,
                               "workers": keras_adapt.size(), "rank": keras_adapt.rank(),
                               "host": host, "batch_size": state.batch_size,
                               "iterations": int(model.optimizer.iterations.numpy())})
            if policy.exclusion.excluded and keras_adapt.rank() == 0 and not self.held:
                self.held = True
                heard.wait("removed", ANNOUNCE_WAIT_S)
            time.sleep(args.sleep)

    recorder = Recorder()
    callbacks = [elastic.CommitStateCallback(state, batches_per_commit=4),
                 elastic.UpdateBatchStateCallback(state), elastic.UpdateEpochStateCallback(state),
                 monitor, keep_two, policy, recorder]

    def data(epoch, batch):
        n, r, b = keras_adapt.size(), keras_adapt.rank(), state.batch_size
        perm = np.random.default_rng(epoch).permutation(len(x))
        idx = np.concatenate([perm[(s * n * b + r * b + np.arange(b)) % len(x)]
                              for s in range(batch, args.steps)])
        return tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(b).repeat()

    @elastic.run
    def train(state):
        return elastic.fit(state, data, epochs=args.epochs, steps_per_epoch=args.steps,
                           callbacks=callbacks, verbose=0)

    train(state)
    out = {"pid": os.getpid(), "host": host, "rank": keras_adapt.rank(),
           "workers": keras_adapt.size(), "epoch": state.epoch, "batch": state.batch,
           "iterations": int(model.optimizer.iterations.numpy()), "steps": recorder.steps,
           "excluded": policy.exclusion.excluded, "events": policy.events,
           "kept": keep_two.exclusion.excluded, "kept_events": keep_two.events}
    with open(os.path.join(args.out, f"final_{os.getpid()}.json"), "w") as f:
        json.dump(out, f)


if args.straggler:
    straggler_fit()
else:
    allreduce_loop()
