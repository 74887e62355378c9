"""Run under horovodrun by tests/test_pair_averaging.py; writes <out>/rank<r>.json.

PairAveraging (H = 1) on 2 workers, two fits:
  wait    24 updates each: rank 1 stops before its update 4 until rank 0 has
          finished all 24 (a file rank 0 writes after fit returns). Any
          collective after update 3 would hold rank 0 too and the job would
          time out (AdaptTensorBoard writes every 5 updates, gathering
          nothing). Every exchange's own model, the model it returned and
          the weights after that update are kept.
  vanish  40 more: rank 1 leaves the job for good (os._exit) before its
          update 6; rank 0 trains on to the end, saves its model, and
          reads it back.
"""

import lean_imports  # noqa: F401  (first: Keras 3's optional imports, see there)
import argparse
import json
import os
import time

import numpy as np

import keras
import keras_adapt
from keras_adapt.callbacks import AdaptTensorBoard
from keras_adapt.sync import PairAveraging

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--log_dir", required=True)
args = parser.parse_args()
rank, size = keras_adapt.rank(), keras_adapt.size()
results = {"rank": rank, "size": size}
done_file = os.path.join(args.out, "rank0_done")

keras.utils.set_random_seed(3)  # the same initial model on both ranks
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1)])
opt = keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                       sync_strategy=PairAveraging(period=1))
model.compile(opt, "mse")
exchange = opt.adapt_state.sync.exchange
rng = np.random.default_rng(10 + rank)  # each rank its own data
x = rng.standard_normal((640, 6)).astype(np.float32)
y = (x @ rng.standard_normal((6, 1)) + 0.1 * rng.standard_normal((640, 1))).astype(np.float32)

calls = []
original = exchange.exchange


def logged(updates, arrays):
    """The exchange, with its input and output kept (the graph calls it):
    the version it sent with is the one before plus the updates since the
    last exchange (one each here)."""
    own = [np.array(a) for a in arrays]
    sent_version = exchange.version + updates - (calls[-1]["updates"] if calls else 0)
    mixed = original(updates, arrays)
    calls.append({"updates": int(updates), "own": [a.tolist() for a in own],
                  "mixed": None if mixed is None else [a.tolist() for a in mixed],
                  "sent_version": sent_version, "version": exchange.version})
    return mixed


exchange.exchange = logged


class Phase(keras.callbacks.Callback):
    def __init__(self, phase):
        super().__init__()
        self.phase = phase

    def on_train_batch_begin(self, batch, logs=None):
        if self.phase == "wait" and rank == 0 and batch == 2:
            # so that rank 0 averages with one of rank 1's models at least once
            results["heard_rank1"] = (exchange.record.received > 0
                                      or exchange.receive(120) > 0)
        if self.phase == "wait" and rank == 1 and batch == 4:
            deadline = time.time() + 240
            while not os.path.exists(done_file):
                if time.time() > deadline:
                    raise SystemExit("rank 0 never finished: something waited for rank 1")
                time.sleep(0.05)
            results["waited_for_rank0"] = True
        if self.phase == "vanish" and rank == 1 and batch == 6:
            os._exit(0)  # gone without a word: no shutdown, sockets dropped

    def on_train_batch_end(self, batch, logs=None):
        if calls and calls[-1].get("after") is None:
            calls[-1]["after"] = [w.tolist() for w in model.get_weights()]


def save(name, value):
    results[name] = value
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


model.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=24, shuffle=False, verbose=0,
          callbacks=[Phase("wait"), AdaptTensorBoard(args.log_dir, update_freq=5)])
save("wait", {"updates": int(opt.adapt_state.updates.numpy()), "calls": list(calls),
              "record": exchange.record.summary(), "staleness": list(exchange.record.staleness),
              "peers": list(exchange.record.peers)})  # copies: the lists grow in the next fit
if rank == 0:
    with open(done_file, "w") as f:
        f.write("done")
first = exchange.record.summary()
model.fit(x, y, batch_size=16, epochs=1, steps_per_epoch=40, shuffle=False, verbose=0,
          callbacks=[Phase("vanish")])
path = os.path.join(args.out, f"rank{rank}.weights.h5")
model.save_weights(path)
reread = keras.models.clone_model(model)
reread.load_weights(path)
save("vanish", {"updates": int(opt.adapt_state.updates.numpy()), "first": first,
                "calls": calls,  # both fits' (rank 1 averages with rank 0's second fit too)
                "record": exchange.record.summary(),
                "saved_equal": all(np.array_equal(a, b) for a, b in
                                   zip(model.get_weights(), reread.get_weights()))})
