"""Run under horovodrun by tests/test_policies_distributed.py; writes <out>/rank<r>.json.

Phases (one launch):
  rebatch   GNSBatchSizePolicy through an AdaptiveBatchDataset (micro-batch
            changes) with sqrt LR scaling; events to <out>/rebatch_logs
  accumulate  GNSBatchSizePolicy through gradient accumulation (k changes)
            plus LRScalingPolicy following it
  goodput   GoodputBatchSizePolicy (host-side timings agreed by allreduce)
Each phase records its events (without wall time), the final weights, the
batch-size trajectory and the micro-batch every step actually used.
"""

import argparse
import json
import os


import keras
import keras_adapt
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback
from keras_adapt.data import AdaptiveBatchDataset, teacher_student
from keras_adapt.policies import GNSBatchSizePolicy, GoodputBatchSizePolicy, LRScalingPolicy

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
    """The micro-batch every step used, read from the in-graph record."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def on_train_batch_end(self, batch, logs=None):
        self.sizes.append(int(self.model.optimizer.gradient_statistics.batch_size.numpy()))


def plain(events):
    return [{k: v for k, v in e.items() if k not in ("wall_time", "rank")} for e in events]


def run(name, model, policies, fit_kwargs):
    sizes = StepSizes()
    history = model.fit(callbacks=[BroadcastGlobalVariablesCallback(0), *policies, sizes],
                        verbose=0, **fit_kwargs)
    results[name] = {
        "events": [e for p in policies for e in plain(p.events)],
        "weights": [w.tolist() for w in model.get_weights()],
        "batch_size": history.history["batch_size"],
        "step_sizes": sizes.sizes,
        "updates": int(model.optimizer.iterations.numpy()),
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
gns = GNSBatchSizePolicy(min_batch=16, max_batch=256, micro_batch_size=8, warmup_updates=20,
                         min_change_interval=20, interval=10)
lr = LRScalingPolicy("linear", base_batch=16, micro_batch_size=8, interval=10)
# Each rank trains on its own shard: identical batches would carry no noise.
run("accumulate", model, [gns, lr], dict(x=x[rank::size], y=y[rank::size], batch_size=8,
                                         epochs=1, shuffle=False))
results["accumulate"]["k"] = gns.batch.accumulation.steps

# goodput: decisions from agreed timings
ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, seed=2)
model = build()
goodput = GoodputBatchSizePolicy(min_batch=16, max_batch=256, dataset=ds, max_micro_batch_size=128,
                                 warmup_updates=20, min_change_interval=30, measure_updates=10,
                                 interval=15)
run("goodput", model, [goodput], dict(x=ds.dataset, steps_per_epoch=90, epochs=2))

with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
