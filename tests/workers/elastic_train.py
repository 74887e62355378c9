"""Elastic training under ``horovodrun --host-discovery-script`` (tests/test_elastic.py),
or the same training in one process without Horovod Elastic (``--reference``).

Seeded teacher-student regression; step s of epoch e uses the global batch
made of samples ``perm_e[s*G + i]`` (G the global batch, perm_e a seeded
permutation), worker r of N taking the r-th slice of G/N (rule "keep") or
b samples at ``s*N*b + r*b`` (rule "scale"). With "keep", every worker count
computes the same global batches, so the final weights equal those of the
one-process reference (to float rounding) iff no step ran twice or was lost.

Actions (``--actions``, JSON list), each done once (a marker file in --out):
  {"step": i, "do": "hosts", "hosts": "localhost:1\\n"}            rank 0 rewrites the
      discovery file after global step i (``"when_workers": n``: only once n workers run)
      (``"await_join": true``: a scale-up; rank 0 then holds its steps until
      the driver has announced the added host, so the job grows while steps
      remain however long the discovery takes on a loaded machine;
      ``"await_removal": true``: a scale-down, held until the driver has
      announced the removed host, so the job shrinks at the next commit
      whatever the load and a later action sees enough steps on fewer workers)
      (``"then": "localhost:2\\n"``: once this rank has left training for
      the change, rank 0 writes that too: with ``--min-np`` above the hosts
      left, the job waits for it, and its new worker joins the survivors)
  {"step": i, "do": "kill", "rank": r}       rank r SIGKILLs itself after step i
      (``"await_return": true``: after going back to the last commit, the
      survivors hold their steps until the driver announces an added host,
      the killed one's back from the blacklist, so the job grows again
      while steps remain whatever the load)
  {"step": i, "do": "term", "rank": r}       rank r sends itself SIGTERM after step i
      (a preempted machine: it leaves gracefully, LeaveOnSignalCallback);
      ``"signal": "SIGINT"`` sends that one instead

``--sync local_sgd:H``: the optimizer runs LocalSGD with period H (its count
and choice go across the resets); ``--sync pair_averaging:H``: PairAveraging
(what its exchange did goes to the final JSON). ``--adaptive-data``: the data is an
AdaptiveBatchDataset over the same global batches in order (unshuffled rows
``step_indices`` of every step) driven by a GlobalBatchSize, given to the
state, which re-shards it on every reset; the rule acts through them.

``--goodput`` (with ``--adaptive-data``): a GoodputBatchSizePolicy pinned at
the global batch (min = max, no learning-rate rule: the training is the
reference's) among the callbacks and the state's policies; its throughput
model goes to the final JSON (a worker that joins must price with the
model the others have).

``--checkpoint DIR``: a PreemptionCheckpoint(DIR, save_freq=None) among the
callbacks: when every worker is signalled it is written and every worker
exits with 75; the same command again resumes from it (with any worker
count). ``--save-freq N``: its save_freq (written every N updates too).

``--reference --rule scale --reference-workers 0:1,50:2``: the reference
of a job whose updates 0-49 ran on one worker and the rest on two.

``--request-workers N --request-at I``: a ResizePolicy asks for N workers
once global step I has run (through the target file that ``keras-adapt
discover``, the job's discovery script, reads: KERAS_ADAPT_TARGET_FILE); the worker then holds its steps until the driver announced the
added host, as ``"await_join"`` does).

Each process appends every step it runs to <out>/steps_<pid>.jsonl (a worker
that leaves on a signal ends at once), and one that finishes writes
<out>/final_<pid>.json.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import signal
import socket
import threading
import time

import numpy as np

import keras
import tensorflow as tf

import keras_adapt
from keras_adapt import elastic
from keras_adapt.actuators import GlobalBatchSize
from keras_adapt.callbacks import GradientStatsMonitor, PreemptionCheckpoint
from keras_adapt.data import AdaptiveBatchDataset
from keras_adapt.policies import GoodputBatchSizePolicy, ResizePolicy
from keras_adapt.sync import LocalSGD, PairAveraging
from horovod.common.exceptions import HostsUpdatedInterrupt
from hosts_heard import HostsHeard

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log-dir", default=None)
parser.add_argument("--hosts", default=None)
parser.add_argument("--rule", choices=["keep", "scale"], default="keep")
parser.add_argument("--global-batch", type=int, default=32)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--commit", default="4", help="steps between commits, or auto")
parser.add_argument("--sleep", type=float, default=0.04)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--actions", default="[]")
parser.add_argument("--reference", action="store_true")
parser.add_argument("--reference-workers", default="0:1",
                    help="with --reference: update:workers,... (the workers from each update on)")
parser.add_argument("--request-workers", type=int, default=None)
parser.add_argument("--request-at", type=int, default=None)
parser.add_argument("--sync", default=None, help="local_sgd:H or pair_averaging:H")
parser.add_argument("--adaptive-data", action="store_true")
parser.add_argument("--goodput", action="store_true")
parser.add_argument("--checkpoint", default=None)
parser.add_argument("--save-freq", type=int, default=None)
args = parser.parse_args()

DIM, SAMPLES = 8, 4096
rng = np.random.default_rng(3)
W_TRUE = rng.standard_normal((DIM, 1)).astype(np.float32)
X = rng.standard_normal((SAMPLES, DIM)).astype(np.float32)
Y = (X @ W_TRUE + 0.5 * rng.standard_normal((SAMPLES, 1))).astype(np.float32)
ACTIONS = json.loads(args.actions)
#: The longest a worker holds its steps waiting for an added host to be
#: announced (the discovery script is a Python process: seconds under load).
JOIN_WAIT_S = 120.0


def step_indices(epoch, step, rank, workers, per_worker):
    perm = np.random.default_rng(1000 + epoch).permutation(SAMPLES)
    start = step * workers * per_worker + rank * per_worker
    return perm[(start + np.arange(per_worker)) % SAMPLES]


def make_model(plain=False):
    """The model; ``plain``: compiled with Keras's own Adam (no keras-adapt)."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    if plain:
        model.compile(keras.optimizers.Adam(args.lr), "mse")
        return model
    # Adam: the joining worker needs the slots (m, v) before the first sync.
    sync = None
    if args.sync is not None:
        name, period = args.sync.split(":")
        sync = {"local_sgd": LocalSGD, "pair_averaging": PairAveraging}[name](period=int(period))
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(args.lr),
                                                   sync_strategy=sync), "mse")
    return model


def rule():
    if args.rule == "keep":
        return elastic.ResizeRule("keep", global_batch=args.global_batch)
    return elastic.ResizeRule("scale", batch_size=args.batch_size, scaling="linear", base_workers=2)


class RequestAt(ResizePolicy):
    """Asks for ``wanted`` workers once the global step ``at`` has run."""

    def __init__(self, state, at, wanted, recorder):
        super().__init__(1, 2, interval=1, log_dir=args.log_dir)
        self.state, self.at, self.wanted, self.recorder = state, at, wanted, recorder

    def adapt(self, step, values):
        done = self.state.epoch * args.steps + self.state.batch
        if done > self.at and self.workers != self.wanted:
            self.request_workers(self.wanted, f"global step {self.at} ran")
            self.recorder.awaiting = "added"


def write_hosts(text):
    tmp = args.hosts + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.hosts)  # the discovery script never sees half a file


INTERRUPTED = threading.Event()  # this process left training for a change of hosts


def write_hosts_when_interrupted(text):
    """Rewrites the hosts once this process has left training for the last
    change (so that change was announced alone), while it waits to re-form."""
    if INTERRUPTED.wait(JOIN_WAIT_S):
        write_hosts(text)


class Recorder(keras.callbacks.Callback):
    """After the elastic callbacks: logs every executed step (its global id),
    sleeps a little (so membership changes land mid-training) and runs the actions."""

    def __init__(self, state, heard):
        super().__init__()
        self.state, self.heard = state, heard
        self.steps = []
        # The announcement ("added", "removed") of a change this process
        # asked for, which it holds its steps for; None: nothing to hold for.
        self.awaiting = None
        self.join_wait_s = 0.0  # held for added hosts

    def on_train_batch_end(self, batch, logs=None):
        s = self.state
        step_id = s.epoch * args.steps + s.batch - 1
        self.steps.append({"id": step_id, "workers": keras_adapt.size(), "rank": keras_adapt.rank(),
                           "batch_size": s.batch_size, "lr": s.lr, "time": time.time(),
                           "iterations": int(self.model.optimizer.iterations.numpy())})
        with open(os.path.join(args.out, f"steps_{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(self.steps[-1]) + "\n")
        for i, action in enumerate(ACTIONS):
            marker = os.path.join(args.out, f"action{i}.done")
            if step_id < action["step"] or os.path.exists(marker):
                continue
            if action.get("when_workers") not in (None, keras_adapt.size()):
                continue
            if action["do"] == "hosts" and keras_adapt.rank() == 0:
                open(marker, "w").close()
                self.awaiting = ("added" if action.get("await_join") else
                                 "removed" if action.get("await_removal") else None)
                write_hosts(action["hosts"])
                if "then" in action:
                    INTERRUPTED.clear()
                    threading.Thread(target=write_hosts_when_interrupted,
                                     args=(action["then"],), daemon=True).start()
            elif action["do"] == "kill" and keras_adapt.rank() == action["rank"]:
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            elif action["do"] == "term" and keras_adapt.rank() == action["rank"]:
                open(marker, "w").close()
                os.kill(os.getpid(), getattr(signal, action.get("signal", "SIGTERM")))
        if self.awaiting is not None:
            # Hold the steps until the change is announced: the next commit
            # then re-forms the job.
            waited = self.heard.wait(self.awaiting, JOIN_WAIT_S)
            if self.awaiting == "added":
                self.join_wait_s += waited
            self.awaiting = None
        time.sleep(args.sleep)


model = make_model(plain=args.reference and args.rule == "scale")
if args.reference:
    # One process, no elastic machinery: the global batches of the workers
    # running each update, in order. "keep": the global batch whatever the
    # workers; "scale": N x batch_size at the rate times N / 2 (linear, rates
    # given for 2 workers), set on Keras's own Adam.
    changes = sorted(tuple(map(int, c.split(":"))) for c in args.reference_workers.split(","))
    for e in range(args.epochs):
        for s in range(args.steps):
            workers = [n for start, n in changes if start <= e * args.steps + s][-1]
            if args.rule == "scale":
                model.optimizer.learning_rate = args.lr * workers / 2
                idx = step_indices(e, s, 0, 1, workers * args.batch_size)
            else:
                idx = step_indices(e, s, 0, 1, args.global_batch)
            model.train_on_batch(X[idx], Y[idx])
    out = {"weights": [w.tolist() for w in model.get_weights()],
           "iterations": int(model.optimizer.iterations.numpy())}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(out, f)
    raise SystemExit(0)

dataset = None
if args.adaptive_data:
    # Row i of the stream is sample i of the global order the reference trains on.
    rows = np.concatenate([step_indices(e, s, 0, 1, args.global_batch)
                           for e in range(args.epochs) for s in range(args.steps)])
    dataset = AdaptiveBatchDataset(
        X[rows], Y[rows], micro_batch_size=args.global_batch // keras_adapt.size(), shuffle=False)
    GlobalBatchSize(model, dataset=dataset,
                                          max_micro_batch_size=args.global_batch)
policy = None
if args.goodput:
    policy = GoodputBatchSizePolicy(args.global_batch, args.global_batch, dataset=dataset,
                                    max_micro_batch_size=args.global_batch, scaling_rule=None,
                                    interval=5)
state = elastic.KerasState(model, rule=rule(), log_dir=args.log_dir, dataset=dataset,
                           policies=[] if policy is None else [policy])
_check_host_updates = state.check_host_updates


def noted_check_host_updates():
    try:
        _check_host_updates()
    except HostsUpdatedInterrupt:
        INTERRUPTED.set()
        raise


state.check_host_updates = noted_check_host_updates
recorder = Recorder(state, HostsHeard(state))
commit = elastic.CommitStateCallback(
    state, batches_per_commit=args.commit if args.commit == "auto" else int(args.commit))
# Horovod's example order (commit first): the commit must still see the step.
callbacks = [commit, elastic.UpdateBatchStateCallback(state),
             elastic.UpdateEpochStateCallback(state), GradientStatsMonitor(interval=5), recorder]
if args.checkpoint is not None:
    callbacks.append(PreemptionCheckpoint(args.checkpoint, save_freq=args.save_freq,
                                          log_dir=args.log_dir))
if policy is not None:
    callbacks.append(policy)
if args.request_workers is not None:
    callbacks.append(RequestAt(state, args.request_at, args.request_workers, recorder))
syncs = []
restores = []
_restore = state.restore


def counted_restore():
    """Counts the rollbacks to the last commit (a failure; never a graceful leave)."""
    restores.append(time.time())
    if any(a["do"] == "kill" and a.get("await_return") for a in ACTIONS):
        recorder.awaiting = "added"
    _restore()


state.restore = counted_restore


def data(epoch, batch):
    n, r, b = keras_adapt.size(), keras_adapt.rank(), state.batch_size
    idx = [step_indices(e, s, r, n, b) for e in range(epoch, args.epochs)
           for s in range(batch if e == epoch else 0, args.steps)]
    idx = np.concatenate(idx)
    return tf.data.Dataset.from_tensor_slices((X[idx], Y[idx])).batch(b).repeat()


@elastic.run
def train(state):
    syncs.append({"epoch": state.epoch, "batch": state.batch, "workers": keras_adapt.size(),
                  "rank": keras_adapt.rank(), "time": time.time()})
    return elastic.fit(state, data if dataset is None else dataset, epochs=args.epochs,
                       steps_per_epoch=args.steps, callbacks=callbacks, verbose=0)

train(state)
stats = model.optimizer.gradient_statistics.result()
out = {"pid": os.getpid(), "host": socket.gethostname(), "rank": keras_adapt.rank(),
       "workers": keras_adapt.size(), "epoch": state.epoch, "batch": state.batch,
       "iterations": int(model.optimizer.iterations.numpy()),
       "weights": [w.tolist() for w in model.get_weights()],
       "optimizer": [np.asarray(v).tolist() for v in
                     keras_adapt.optimizer.optimizer_variables(model.optimizer)],
       "steps": recorder.steps, "syncs": syncs, "resizes": state.resizes,
       "restores": len(restores), "join_wait_s": recorder.join_wait_s,
       "commits": commit.commits, "commit_seconds": commit.commit_seconds,
       "commit_interval": commit.interval, "commit_measured": commit.measured,
       "lr": state.lr, "batch_size": state.batch_size,
       "sync": {**model.optimizer.adapt_state.sync.get_state(),
                "count": int(model.optimizer.adapt_state.sync.count.numpy())},
       "exchange": (None if model.optimizer.adapt_state.sync.exchange is None
                    else model.optimizer.adapt_state.sync.exchange.record.summary()),
       "data": None if dataset is None else {**dataset.get_state(), "changes": dataset.changes},
       "stats": {k: (v if isinstance(v, (int, float)) else None) for k, v in stats.items()},
       "throughput_model": None if policy is None else policy.throughput_model.get_state()}
with open(os.path.join(args.out, f"final_{os.getpid()}.json"), "w") as f:
    json.dump(out, f)
