"""Run by tests/test_discover_elastic.py under ``horovodrun`` elastic with
``keras-adapt discover`` as the host discovery script.

A loop of allreduces under ``hvd.elastic.run`` (no Keras: this checks the
discovery loop, not the training state). At step ``--request-at`` rank 0
asks for ``--request`` workers through ``WorkerTarget``; Horovod must then
change the membership. Rank 0 writes the worker count of every step to
``<out>/sizes.json`` at the end.
"""

import argparse
import json
import os
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from keras_adapt.actuators import WorkerTarget

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--request-at", type=int, default=5)
parser.add_argument("--request", type=int, required=True)
args = parser.parse_args()

hvd.init()
target = WorkerTarget(min_workers=1, max_workers=2)   # the file from KERAS_ADAPT_TARGET_FILE
state = hvd.elastic.ObjectState(bcast_object=hvd.broadcast_object, get_rank=hvd.rank,
                                step=0, sizes=[], requested_at=None, changed_at=None)


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy()
        assert total == hvd.size(), (total, hvd.size())
        state.sizes.append(hvd.size())
        if state.step == args.request_at and state.requested_at is None:
            target.request(args.request)   # every rank calls; rank 0 writes
            state.requested_at = time.time()
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
