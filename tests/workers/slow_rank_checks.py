"""Run under horovodrun by tests/test_worker_timing.py.

What the slow-rank hook (KERAS_ADAPT_SLOW_RANK=1:<factor>, given as
--factor) injects, with and without a WorkerTimingMonitor timing the
collectives: four models of a small convolution whose forward pass also
sleeps SLEEP_S (a computation of known least length), plain and slowed,
each without and with the monitor, each traced in its own fit, then
trained in blocks. Records every step's host time (the first two steps of
each block left out), the monitor's measurements and the seconds the hook
slept on this rank in the blocks (read back from the timing object).
Writes <out>/rank<r>.json.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

# Each worker on its own core with one TensorFlow thread, as in
# benchmarks/straggler.py: unpinned, the two workers' threads compete for
# the same cores and one worker's sleep speeds the other up.
if hasattr(os, "sched_setaffinity"):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % len(cores)]})
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import numpy as np  # noqa: E402

import keras  # noqa: E402
import keras_adapt  # noqa: E402
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, WorkerTimingMonitor
from keras_adapt.monitors.worker_timing import SLOW_RANK_ENV  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--factor", type=float, required=True)
parser.add_argument("--blocks", type=int, default=3)
parser.add_argument("--block", type=int, default=12)
args = parser.parse_args()
rank = keras_adapt.rank()
BATCH = 64
SLEEP_S = 0.02  # in every forward pass: the computation lasts at least this


class Busy(keras.layers.Layer):
    """Passes its input on after sleeping SLEEP_S in the graph."""

    def call(self, inputs):
        done = tf.py_function(lambda: time.sleep(SLEEP_S) or 0, [], tf.int32)
        with tf.control_dependencies([done]):
            return tf.identity(inputs)

rng = np.random.default_rng(0)
x = rng.standard_normal((BATCH * args.block, 16, 16, 3)).astype("float32")
y = rng.standard_normal((BATCH * args.block, 10)).astype("float32")


class Clock(keras.callbacks.Callback):
    """Host time of every step of a fit but its first two (the first
    stretches the time since the model's previous fit)."""

    def __init__(self):
        super().__init__()
        self.begins, self.steps = [], []  # steps: one list per fit

    def on_train_begin(self, logs=None):
        self.begins = []

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_train_end(self, logs=None):
        t = self.begins + [time.perf_counter()]
        self.steps.append([b - a for a, b in zip(t[2:-1], t[3:])])


class Measurements(keras.callbacks.Callback):
    """Every new measurement of the monitor but the first of each fit."""

    def __init__(self, monitor):
        super().__init__()
        self.monitor, self.seen, self.results, self.first = monitor, 0, [], True

    def on_train_begin(self, logs=None):
        self.first = True

    def on_train_batch_end(self, batch, logs=None):
        new = self.monitor.new_measurement(self.seen)
        if new is not None:
            self.seen, result = new
            if not self.first:
                self.results.append(result)
            self.first = False


def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), Busy(), keras.layers.Dense(10)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(1e-4)), "mse")
    return model


runs = {}
for timed in (False, True):
    for slow in (False, True):
        if slow:
            os.environ[SLOW_RANK_ENV] = f"1:{args.factor}"  # read when the step is traced
        else:
            os.environ.pop(SLOW_RANK_ENV, None)
        run = {"model": build(), "clock": Clock(), "monitor": None}
        callbacks = [BroadcastGlobalVariablesCallback(0), run["clock"]]
        if timed:
            run["monitor"] = WorkerTimingMonitor(interval=4)
            run["measurements"] = Measurements(run["monitor"])
            callbacks += [run["monitor"], run["measurements"]]
        run["callbacks"] = callbacks
        run["model"].fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=4, verbose=0,
                         callbacks=callbacks)  # traced here
        run["clock"].steps = []
        runs[(timed, slow)] = run
os.environ.pop(SLOW_RANK_ENV, None)

def slept(run):
    return float(run["model"].optimizer.adapt_state.timing.slept_seconds.numpy())


before = {key: slept(run) for key, run in runs.items()}
for _ in range(args.blocks):
    for run in runs.values():
        run["model"].fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=args.block,
                         verbose=0, callbacks=run["callbacks"])

out = {"rank": rank, "sleep_s": SLEEP_S, "runs": []}
for (timed, slow), run in runs.items():
    out["runs"].append({"timed": timed, "slow": slow, "steps": run["clock"].steps,
                        "slept": slept(run) - before[timed, slow],
                        "measurements": run["measurements"].results if timed else []})
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
