"""The training script examples/slurm/train.sbatch runs by default: preemptible on Slurm.

Each worker streams its shard of a seeded teacher-student regression through
PreemptionCheckpoint.fit: a SIGTERM (forwarded by the batch script) stops
every worker at the same step, rank 0 writes the checkpoint into --dir, and
the workers exit with 75; the requeued job runs this same command, which
resumes there. --dir must be on a file system every node sees.

    sbatch examples/slurm/train.sbatch python examples/slurm/train.py --dir /shared/ckpt
"""

import argparse
import os

import numpy as np

import keras
import keras_adapt
from keras_adapt.callbacks import BroadcastGlobalVariablesCallback, PreemptionCheckpoint
from keras_adapt.data import AdaptiveBatchDataset

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--dir", default=os.path.join(os.environ.get("SLURM_SUBMIT_DIR", "."),
                                                  "keras-adapt-checkpoints"),
                    help="checkpoint directory on a shared file system")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--batch", type=int, default=32, help="per-worker batch")
args = parser.parse_args()

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((args.samples, 16)).astype("float32")
y = np.tanh(x @ rng.standard_normal((16, 1))).astype("float32")
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "mse")
data = AdaptiveBatchDataset(x, y, micro_batch_size=args.batch, seed=1)
ckpt = PreemptionCheckpoint(args.dir, log_dir=args.dir)
if keras_adapt.rank() == 0:
    epoch, step = ckpt.position()
    print(f"rank 0 of {keras_adapt.size()}: starting at epoch {epoch} step {step}", flush=True)
history = ckpt.fit(model, data, epochs=args.epochs, verbose=0,
                   callbacks=[BroadcastGlobalVariablesCallback(0)])
if keras_adapt.rank() == 0 and history.history.get("loss"):
    print(f"final loss {history.history['loss'][-1]:.5f}", flush=True)
