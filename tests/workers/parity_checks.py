"""Run under horovodrun by tests/test_horovod_parity.py; writes <out>/rank<r>.json.

Each phase computes its expected values by hand (from every rank's data,
which each rank can regenerate) and records measured and expected values:
  reduce      one step of an embedding model for each reduction setting
              (sparse allgather / dense, Average / Sum, predivide, fp16,
              explicit process set, worker-local layer) vs w - lr * combine(g_r)
  accumulate  backward_passes_per_step=4 (mean and sum) with worker-local
              variables, IndexedSlices gradients: values after each step
  lazy        Sequential without Input, ranks seeded differently, broadcast
              callback: weights after the first step and after training
  refit       six fits of one model in one process, each rank's weights set
              apart before each: the weights the broadcast gives at each fit's
              start, TensorFlow's retracing warnings, the broadcast's traces
  warmup      LR warm-up and schedule callbacks: the rate before each batch
  collectives the Horovod ops (and their tensor counts) per function of one
              traced train step, per setting
  port        a Horovod-style script through keras_adapt.horovod: lazily built
              model, warm-up, metric average, BestModelCheckpoint (rank 0
              writes), load_model of the checkpoint
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
import keras
import keras_adapt
from keras_adapt import _keras
from keras_adapt.actuators import LearningRateScale
from keras_adapt.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
)

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}
LR = 0.5


def data(r):
    rng = np.random.default_rng(100 + r)
    return rng.integers(0, 20, size=(6, 3)), rng.normal(size=(6, 1)).astype(np.float32)


def embedding_model():
    keras.utils.set_random_seed(7)  # same initial weights on every rank
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    return model


def local_gradients(model, r):
    x, y = data(r)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    return [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]


def reduce_phase():
    out = {}
    variants = {
        "default": {},
        "sparse_as_dense": {"sparse_as_dense": True},
        "sum": {"op": hvd.Sum},
        "predivide": {"gradient_predivide_factor": 2.0, "sparse_as_dense": True},
        "fp16": {"compression": hvd.Compression.fp16, "sparse_as_dense": True},
        "process_set": {"process_set": hvd.global_process_set},
        "no_stats": {"gradient_stats": False},
        "local_dense": {"local": True},
    }
    for name, kwargs in variants.items():
        kwargs = dict(kwargs)
        model = embedding_model()
        local = kwargs.pop("local", False)
        if local:
            kwargs["local_layers"] = [model.layers[-1]]
        if kwargs.get("gradient_stats", True):
            kwargs["batch_size"] = 6  # per worker: the statistics update at once
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(LR), **kwargs)
        model.compile(opt, "mse")
        w0 = [w.numpy() for w in model.trainable_variables]
        per_rank = [local_gradients(model, r) for r in range(size)]
        mean = [np.mean([g[i] for g in per_rank], axis=0) for i in range(len(w0))]
        if kwargs.get("op") is hvd.Sum:
            mean = [m * size for m in mean]
        if local:  # the Dense layer's gradient stays local, divided by size
            for i in (1, 2):
                mean[i] = per_rank[rank][i] / size
        expected = [w - LR * m for w, m in zip(w0, mean)]
        x, y = data(rank)
        model.train_on_batch(x, y)
        measured = [w.numpy() for w in model.trainable_variables]
        out[name] = {
            "max_abs_err": max(float(np.max(np.abs(a - b))) for a, b in zip(measured, expected)),
            "max_update": max(float(np.max(np.abs(a - b))) for a, b in zip(measured, w0)),
            "weights": [w.tolist() for w in measured],
        }
        stats = opt.gradient_statistics
        if stats is not None:
            # One update: |G|^2 = (m*total - local)/(m-1), tr(S) = b*m*(local - total)/(m-1)
            # over the shared gradients only (worker-local ones are left out).
            shared = [0] if local else range(len(w0))
            local_sqr = np.mean([sum(float(np.sum(g[i] ** 2)) for i in shared) for g in per_rank])
            total_sqr = sum(float(np.sum(np.mean([g[i] for g in per_rank], axis=0) ** 2))
                            for i in shared)
            m, b = size, 6
            r = stats.result()
            out[name]["stats"] = {"updates": int(r["updates"]), "grad_sqr": r["grad_sqr"],
                                  "grad_var": r["grad_var"]}
            out[name]["stats_expected"] = {"grad_sqr": (m * total_sqr - local_sqr) / (m - 1),
                                           "grad_var": b * m * (local_sqr - total_sqr) / (m - 1)}
    results["reduce"] = out


def variable(value):
    if _keras.IS_KERAS3:
        return keras.Variable(np.asarray(value, np.float32))
    return tf.Variable(np.asarray(value, np.float32))


def accumulate_phase():
    out = {}
    for average in (True, False):
        opt = keras_adapt.DistributedOptimizer(
            keras.optimizers.SGD(1.0), backward_passes_per_step=4,
            average_aggregated_gradients=average)
        xs = [variable([0.0]) for _ in range(4)]
        ys = [variable([1.0, 2.0]) for _ in range(4)]
        for v in xs[:2] + ys[:2]:  # the first two of each are worker-local
            opt.register_local_var(v)
        variables = xs + ys

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(x) - float(rank + 1) * tf.reduce_sum(tf.gather(y, [0]))
                                 for x, y in zip(xs, ys)])
            grads = tape.gradient(loss, variables)
            opt.apply_gradients(zip(grads, variables))

        history = []
        for _ in range(10):
            step()
            history.append({
                "x": [float(np.asarray(v)[0]) for v in xs],
                "y": [np.asarray(v).tolist() for v in ys],
                "iterations": int(np.asarray(opt.iterations)),
                "pending": int(opt.adapt_state.accumulation.count.numpy()),
            })
        out["mean" if average else "sum"] = history
    results["accumulate"] = out


def lazy_phase():
    keras.utils.set_random_seed(1000 + rank)  # different initial weights per rank
    model = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    rng = np.random.default_rng(rank)
    x, y = rng.normal(size=(64, 5)).astype(np.float32), rng.normal(size=(64, 1)).astype(np.float32)
    snaps = []

    class Snap(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                snaps.append([w.tolist() for w in self.model.get_weights()])

    # The broadcast callback first, so the snapshot sees the weights after it.
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0), Snap()])
    results["lazy"] = {"first_step": snaps[0],
                       "final": [w.tolist() for w in model.get_weights()],
                       "optimizer": [np.asarray(v).tolist() for v in model.optimizer.variables]}


def refit_phase():
    import logging

    from keras_adapt.coordination import broadcast

    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            if "retracing" in record.getMessage():
                warnings.append(record.getMessage()[:200])

    handler = Collect()
    logging.getLogger("tensorflow").addHandler(handler)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    x, y = np.ones((8, 5), np.float32), np.ones((8, 1), np.float32)
    starts = []

    class Start(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after the broadcast callback's
            starts.append([w.tolist() for w in self.model.get_weights()])

    traces = []  # the broadcast function's traces so far, after each fit
    for fit in range(6):
        # every rank's own weights: only the broadcast makes them rank 0's
        model.set_weights([np.full(w.shape, 10.0 * fit + rank, np.float32)
                           for w in model.get_weights()])
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[BroadcastGlobalVariablesCallback(0), Start()])
        traces.append(broadcast._broadcast.experimental_get_tracing_count())
    logging.getLogger("tensorflow").removeHandler(handler)
    results["refit"] = {"starts": starts, "warnings": warnings, "traces": traces}


def warmup_phase():
    out = {}
    for compose in (False, True):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        scale = None
        if compose:
            scale = LearningRateScale(model)
            scale.set(2.0)
        seen = []

        class Record(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                effective = scale.current_lr() if scale is not None else float(
                    np.asarray(self.model.optimizer.learning_rate))
                seen.append(effective)

        x, y = np.ones((20, 2), np.float32), np.ones((20, 1), np.float32)
        h = model.fit(x, y, batch_size=4, epochs=5, verbose=0, callbacks=[
            LearningRateWarmupCallback(initial_lr=0.8, warmup_epochs=2),
            LearningRateScheduleCallback(initial_lr=0.8, multiplier=0.5, start_epoch=3),
            Record()])
        out["compose" if compose else "plain"] = {"per_batch": seen, "epoch_lr": h.history["lr"]}
    results["warmup"] = out


def collectives_phase():
    out = {}
    variants = {
        "sparse_as_dense": {"sparse_as_dense": True},
        "allgather": {},
        "fp16": {"sparse_as_dense": True, "compression": hvd.Compression.fp16},
        "no_stats": {"sparse_as_dense": True, "gradient_stats": False},
        "sum": {"sparse_as_dense": True, "op": hvd.Sum},
    }
    for name, kwargs in variants.items():
        model = embedding_model()
        opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(LR), **kwargs)
        x, y = data(rank)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        step()
        graph_def = step.get_concrete_function().graph.as_graph_def()
        # Collectives may sit inside the branch functions of tf.cond: per
        # function (the step itself, then each branch) the collectives and
        # their numbers of tensors, for the functions that hold any.
        functions = [graph_def.node] + [f.node_def for f in graph_def.library.function]
        per_function = []
        for nodes in functions:
            ops = sorted((n.op, sum(1 for i in n.input if not i.startswith("^")))
                         for n in nodes if n.op.startswith("Horovod") and "Size" not in n.op
                         and "Rank" not in n.op)
            if ops:
                per_function.append(ops)
        out[name] = sorted(per_function)
    results["collectives"] = out


def port_phase():
    import keras_adapt.horovod as hvdk

    keras.utils.set_random_seed(50 + rank)
    model = keras.Sequential([keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    opt = hvdk.DistributedOptimizer(keras.optimizers.Adam(0.01 * hvdk.size()))
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    ckpt_dir = os.path.join(args.out, f"ckpt_rank{rank}")
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, "best.keras")
    h = model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[
        hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
        hvdk.callbacks.MetricAverageCallback(),
        hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvdk.size(), warmup_epochs=2),
        hvdk.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)])
    out = {"loss": h.history["loss"], "wrote": os.path.exists(path),
           "weights": [w.tolist() for w in model.get_weights()]}
    # every rank loads rank 0's best checkpoint (the last epoch if the loss kept falling)
    rank0_path = os.path.join(args.out, "ckpt_rank0", "best.keras")
    hvd.allreduce(tf.constant(0.0), name="port_checkpoint_written")  # rank 0 has written
    loaded = hvdk.load_model(rank0_path)
    out["loaded_distributed"] = keras_adapt.optimizer.is_distributed(loaded.optimizer)
    out["loaded_iterations"] = int(np.asarray(loaded.optimizer.iterations))
    out["loaded_weights"] = [w.tolist() for w in loaded.get_weights()]
    results["port"] = out


collectives_phase()
port_phase()
reduce_phase()
accumulate_phase()
lazy_phase()
refit_phase()
warmup_phase()
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
