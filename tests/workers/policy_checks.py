"""Run under horovodrun by tests/test_policies_distributed.py; writes <out>/rank<r>.json.

Phases (one launch):
  rebatch   GNSBatchSizePolicy through an AdaptiveBatchDataset (micro-batch
            changes) with sqrt LR scaling; events to <out>/rebatch_logs
  accumulate  GNSBatchSizePolicy through gradient accumulation (k changes)
            plus LRScalingPolicy following it
  goodput   GoodputBatchSizePolicy (host-side timings agreed by allreduce)
  goodput_fine  the same with candidates_per_doubling=2: batches between the
            doublings, made as two workers can
  epochs    GNSBatchSizePolicy(epoch_end="progress") with AdaScale: fit without
            steps_per_epoch, each epoch one pass's worth of statistical progress
  sync      SyncStrategyPolicy: a scripted rule (LocalSGD H = 2 from 30, H = 4
            from 50, AllReduceSGD from 70) and the default post-local floor
            after a learning-rate decay at 80
Each phase records its events (without wall time), the final weights, the
batch-size trajectory and the micro-batch every step actually used.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os


import keras
import keras_adapt
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback
from keras_adapt.data import AdaptiveBatchDataset, teacher_student
from keras_adapt.policies import (
    GNSBatchSizePolicy,
    GoodputBatchSizePolicy,
    LRScalingPolicy,
    SyncStrategyPolicy,
)
from keras_adapt.sync import AllReduceSGD, LocalSGD

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
x, y = teacher_student(8192, dim=16, num_classes=4, hidden=32, seed=3)
results = {"rank": rank, "size": size}


def build(lr=0.05):
    # Different initial weights per rank: the broadcast must fix that.
    keras.utils.set_random_seed(100 + rank)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class StepSizes(keras.callbacks.Callback):
    """The micro-batch every step used, read from the in-graph record, and
    the accumulation it counted toward."""

    def __init__(self):
        super().__init__()
        self.sizes, self.configurations = [], []

    def on_train_batch_end(self, batch, logs=None):
        b = int(self.model.optimizer.gradient_statistics.batch_size.numpy())
        self.sizes.append(b)
        actuator = self.model.optimizer.adapt_state.batch_size_actuator
        if actuator is not None:
            self.configurations.append([b, actuator.accumulation.steps])


def plain(events):
    return [{k: v for k, v in e.items() if k not in ("wall_time", "rank")} for e in events]


def run(name, model, policies, fit_kwargs):
    sizes = StepSizes()
    after = fit_kwargs.pop("callbacks_after", [])
    history = model.fit(callbacks=[BroadcastGlobalVariablesCallback(0), *policies, sizes, *after],
                        verbose=0, **fit_kwargs)
    results[name] = {
        "events": [e for p in policies for e in plain(p.events)],
        "weights": [w.tolist() for w in model.get_weights()],
        "batch_size": history.history["batch_size"],
        "step_sizes": sizes.sizes,
        "step_configurations": sizes.configurations,
        "updates": int(model.optimizer.iterations.numpy()),
        "bounds": [[p.min_batch, p.max_batch] for p in policies if hasattr(p, "max_batch")],
    }


# rebatch: the micro-batch grows through the adaptive dataset
ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, seed=1)
model = build()
gns = GNSBatchSizePolicy(min_batch=16, max_batch=512, dataset=ds, max_micro_batch_size=256,
                         scaling_rule="sqrt", warmup_updates=20, min_change_interval=20,
                         interval=10, log_dir=os.path.join(args.out, "rebatch_logs"))
run("rebatch", model, [gns], dict(x=ds.dataset, steps_per_epoch=60, epochs=3))
results["rebatch"]["changes"] = ds.changes

# accumulate: k grows; LRScalingPolicy follows every batch event
model = build()
# max_batch=120 is no multiple of 2 workers x 8: the batch stops at 112, not 128
gns = GNSBatchSizePolicy(min_batch=16, max_batch=120, micro_batch_size=8, warmup_updates=20,
                         min_change_interval=20, interval=10, scaling_rule=None)
lr = LRScalingPolicy("linear", base_batch=16, micro_batch_size=8, interval=10)
# Each rank trains on its own shard: identical batches would carry no noise.
run("accumulate", model, [gns, lr], dict(x=x[rank::size], y=y[rank::size], batch_size=8,
                                         epochs=1, shuffle=False))
results["accumulate"]["k"] = gns.batch.accumulation.steps

# goodput: decisions from agreed timings
ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, seed=2)
model = build()
goodput = GoodputBatchSizePolicy(min_batch=16, max_batch=256, dataset=ds, max_micro_batch_size=128,
                                 warmup_updates=20, min_change_interval=30, interval=15)
run("goodput", model, [goodput], dict(x=ds.dataset, steps_per_epoch=90, epochs=2))

# goodput_fine: candidates in steps of sqrt(2), made through the micro-batch on two workers
ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, seed=2)
model = build()
# max_batch=255 is odd: two workers make 254 (2 x 127), not 256
goodput = GoodputBatchSizePolicy(min_batch=16, max_batch=255, dataset=ds, max_micro_batch_size=128,
                                 warmup_updates=20, min_change_interval=30, interval=15,
                                 candidates_per_doubling=2)
run("goodput_fine", model, [goodput], dict(x=ds.dataset, steps_per_epoch=90, epochs=2))
results["goodput_fine"]["candidates"] = goodput.candidates()

# epochs: the policy ends each epoch on statistical progress (no steps_per_epoch;
# 2002 samples: the pass is 2002, not a multiple of any batch)
ds = AdaptiveBatchDataset(x[:2002], y[:2002], micro_batch_size=8, seed=3)
model = build()
gns = GNSBatchSizePolicy(min_batch=16, max_batch=256, dataset=ds, max_micro_batch_size=128,
                         scaling_rule="adascale", warmup_updates=20, min_change_interval=20,
                         interval=10, epoch_end="progress")


class EpochCounts(keras.callbacks.Callback):
    """Steps per epoch, the policy's progress before every step and at epoch ends."""

    def __init__(self):
        super().__init__()
        self.steps, self.before, self.at_end = [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.steps.append(0)

    def on_train_batch_begin(self, batch, logs=None):
        self.steps[-1] += 1
        self.before.append(gns.progress.progress)

    def on_epoch_end(self, epoch, logs=None):
        self.at_end.append(gns.progress.progress)


counts = EpochCounts()
run("epochs", model, [gns], dict(x=ds.dataset, epochs=3, callbacks_after=[counts]))
results["epochs"].update(
    steps=counts.steps, before=counts.before, at_end=counts.at_end,
    samples_per_pass=ds.samples_per_pass, samples=gns.progress.samples,
    tau_x_base=float(model.optimizer.adapt_state.lr_control.progress.numpy()) * gns.base_batch)

# sync: switches at the steps a scripted rule says (strategy and period), then post-local SGD
class ScriptedSync(SyncStrategyPolicy):
    """Proposes LocalSGD with H = 2 for updates [20, 40), H = 4 for [40, 60),
    AllReduceSGD for [60, 80), then the default rules (the communication
    gate stays closed, so only the post-local floor acts)."""

    def choose(self, step, values):
        if 20 <= step < 40:
            return self.with_period(2), "scripted: H = 2"
        if 40 <= step < 60:
            return self.with_period(4), "scripted: H = 4"
        if 60 <= step < 80:
            return AllReduceSGD(), "scripted: allreduce"
        return super().choose(step, values)


class NoCommunication:
    """A timing source reporting that the collective takes no time (the
    communication gate of the default rule stays closed)."""

    def result(self):
        return {"comm_fraction": 0.0}


class Snapshots(keras.callbacks.Callback):
    """Weights, strategy and trace count at the start of every step (after
    the policy's switch, before the step)."""

    def __init__(self):
        super().__init__()
        self.at = {}

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        step = int(opt.iterations.numpy())
        self.at[step] = {"strategy": opt.adapt_state.sync.strategy.name,
                         "weights": [w.tolist() for w in self.model.get_weights()],
                         "traces": traces[0]}


traces = [0]


def counting_loss(y_true, y_pred):
    traces[0] += 1  # runs once per trace of the train function
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


keras.utils.set_random_seed(100 + rank)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4)])
schedule = keras.optimizers.schedules.PiecewiseConstantDecay([80], [0.05, 0.02])
local = LocalSGD(period=4)
model.compile(keras_adapt.DistributedOptimizer(
    keras.optimizers.SGD(schedule, momentum=0.9), gradient_stats=True,
    sync_strategy=[AllReduceSGD(), local]), counting_loss)
policy = ScriptedSync(local=local, timing=NoCommunication(), comm_fraction=0.3,
                      warmup_updates=0, patience=2, min_switch_interval=0, interval=10,
                      log_dir=os.path.join(args.out, "sync_logs"))
snapshots = Snapshots()
model.fit(x[rank::size], y[rank::size], batch_size=16, epochs=1, steps_per_epoch=120,
          shuffle=False, verbose=0,
          callbacks=[BroadcastGlobalVariablesCallback(0), policy, snapshots])
results["sync"] = {"events": plain(policy.events), "traces": traces[0],
                   "at": {str(s): snapshots.at[s] for s in (29, 30, 31, 32, 33, 49, 50, 52, 53, 54,
                                                             69, 70, 71, 99, 100)}}

with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
