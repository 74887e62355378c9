"""Elastic training: real ``horovodrun`` elastic jobs (Gloo, host discovery on
one machine as the two hosts ``localhost`` and ``127.0.0.1``), and the
single-process rules of the elastic callbacks and the resize rule.

Each job trains 3 epochs of 30 steps (tests/workers/elastic_train.py); the
hosts file the discovery script prints is rewritten by rank 0 at a given
step, or a worker SIGKILLs itself. A scale-up holds the job's steps (at
most 120 s) until the driver has announced the added host, so the new
worker joins while steps remain however long discovery takes under load.
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import WORKERS, _env, discovery_script, horovodrun_elastic

EPOCHS, STEPS, COMMIT = 3, 30, 4
TOTAL = EPOCHS * STEPS
TWO_HOSTS = "localhost:1\n127.0.0.1:1\n"
ONE_HOST = "localhost:1\n"
LR = 0.02


def _job(tmp_path, rule, actions, commit=COMMIT, worker_args=(), launcher_args=(), min_np=1):
    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    script, hosts = discovery_script(tmp_path, TWO_HOSTS)
    args = ["--out", out, "--log-dir", log, "--hosts", hosts, "--rule", rule,
            "--epochs", EPOCHS, "--steps", STEPS, "--commit", commit, "--lr", LR,
            "--actions", json.dumps(actions), *worker_args]
    done = horovodrun_elastic("elastic_train.py", args, script, np=2, min_np=min_np, max_np=2,
                              timeout=300, launcher_args=launcher_args)
    finals = [json.load(open(out / name)) for name in sorted(os.listdir(out))
              if name.startswith("final_")]
    finals.sort(key=lambda r: r["rank"])
    from keras_adapt.record.events import read_events

    return done, finals, read_events(str(log))


def _down_then_up(tmp_path, rule, down_at, up_at, worker_args):
    """A job that loses 127.0.0.1 after step ``down_at`` and, on one
    worker, gets it back after step ``up_at`` (a new worker joins). Rank 0
    holds its steps until each change is announced, so the job shrinks at
    the first commit after ``down_at`` and grows at the first after
    ``up_at``, however slow the discovery on a loaded machine. Returns
    the launch, the two finals (the survivor first) and the events."""
    done, finals, events = _job(tmp_path, rule, [
        {"step": down_at, "do": "hosts", "hosts": ONE_HOST, "await_removal": True},
        {"step": up_at, "do": "hosts", "hosts": TWO_HOSTS, "when_workers": 1,
         "await_join": True}], worker_args=worker_args)
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [2, 2]
    return done, finals, events


@pytest.fixture(scope="module")
def reference(elastic_reference):
    """The same global batches in one process, without elastic machinery."""
    return elastic_reference(EPOCHS, STEPS, LR)


def _ids(final):
    return [s["id"] for s in final["steps"]]


def _assert_finished(final):
    assert (final["epoch"], final["batch"]) == (EPOCHS, 0)
    assert final["iterations"] == TOTAL  # every step applied once, none twice
    assert np.isfinite(final["stats"]["gns"]) and final["stats"]["gns"] > 0


def _assert_weights(final, reference):
    # "keep": every worker count computes the same global batches, so the
    # weights equal the one-process run's iff no step was lost or repeated.
    for got, want in zip(final["weights"], reference["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def _first_step_with(final, workers, after=0):
    """The first step run with ``workers`` workers after update ``after``:
    the step whose end records the resize event."""
    return next(s for s in final["steps"] if s["workers"] == workers and s["iterations"] > after)


def _resize(event, before, after):
    assert event["kind"] == "resize" and event["rank"] == 0 and event["policy"] == "KerasState"
    assert (event["before"]["workers"], event["after"]["workers"]) == (before, after)
    # The pause is measured time: its parts add up to it, whatever the load.
    pause = event["after"]
    assert pause["pause_s"] > 0.0 and pause["reform_s"] >= 0.0 and pause["resume_s"] >= 0.0
    assert pause["pause_s"] == pytest.approx(pause["reform_s"] + pause["resume_s"], abs=1e-5)
    return event


def test_scale_down_by_discovery_keeps_the_global_batch(tmp_path, reference):
    # The data is an AdaptiveBatchDataset driven by a GlobalBatchSize: the
    # reset re-shards it and the rule acts through the actuator. Rank 0
    # holds its steps until the removal is announced, so the job shrinks at
    # the next commit however slow discovery is on a loaded machine.
    done, finals, events = _job(tmp_path, "keep", [
        {"step": 10, "do": "hosts", "hosts": ONE_HOST, "await_removal": True}], commit="auto",
        worker_args=["--adaptive-data"])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [1]  # the removed worker left
    # As Horovod ends a removed worker: its re-initialisation throws in C++
    # (SIGABRT, exit 134), an exit the driver ignores (the job succeeded).
    assert re.search(r"^Process \d exit with status code 134\.$", done.stdout, re.M), done.stdout
    assert "127.0.0.1[0] has been removed from elastic job" in done.stderr
    final = finals[0]
    _assert_finished(final)
    assert _ids(final) == list(range(TOTAL))  # exactly once each, in order
    _assert_weights(final, reference)
    # The per-worker batch doubled, the global batch and the rate stayed.
    assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, 16), (1, 32)}
    assert {s["lr"] for s in final["steps"]} == pytest.approx([LR])
    (event,) = events
    _resize(event, 2, 1)
    assert (event["before"]["batch_size"], event["after"]["batch_size"]) == (16, 32)
    assert event["before"]["global_batch"] == event["after"]["global_batch"] == 32
    assert event["before"]["lr"] == pytest.approx(LR) and event["after"]["lr"] == pytest.approx(LR)
    assert event["before"]["accumulation"] == event["after"]["accumulation"] == 1
    assert event["step"] == _first_step_with(final, 1)["iterations"]
    assert event["after"]["synced"] is False  # a removal alone: nothing to broadcast
    # The stream was re-sharded once, at the step of the change, and handed
    # out exactly the 90 global batches (2880 rows), none twice.
    data = final["data"]
    assert (data["num_workers"], data["rank_sizes"], data["produced"]) == (1, [32], TOTAL)
    assert data["global_samples"] == data["global_cursor"] == TOTAL * 32
    assert data["changes"] == [[event["step"] - 1, 32]]
    # The statistics after the change come from the one-worker estimator
    # over the whole global batch of 32.
    assert final["stats"]["batch_size"] == 32.0
    # "auto" commits: every 10 steps at first, then the interval its rule
    # gives for the commit and step times the workers measured (each step
    # sleeps 40 ms, a lower bound of the measured step time).
    from keras_adapt.elastic.state_callbacks import AUTO_FIRST_INTERVAL, auto_interval

    if final["commit_measured"] is None:  # the last fit ended before it chose
        assert final["commit_interval"] == AUTO_FIRST_INTERVAL
    else:
        commit_s, step_s = final["commit_measured"]
        assert commit_s > 0.0 and step_s >= 0.04
        assert final["commit_interval"] == auto_interval(commit_s, step_s)
    print(f"commit interval {final['commit_interval']}, {final['commits']} commits")
    print(f"scale-down pause {event['after']['pause_s']:.3f} s")


def test_a_joining_worker_prices_with_the_throughput_model_of_the_others(tmp_path, reference):
    """A GoodputBatchSizePolicy (pinned at the global batch: the training is
    the reference's) times every update on both workers, then on one, then
    a new worker joins. Its decisions are the others' only if it prices
    with the same throughput model: the model's observations, one per
    interval at each configuration, are in the committed state it syncs."""
    done, (old, new), events = _down_then_up(tmp_path, "keep", 20, 45,
                                             ["--adaptive-data", "--goodput"])
    finals = old, new
    for final in finals:
        _assert_finished(final)
        _assert_weights(final, reference)
    joined = _ids(new)
    assert joined == list(range(joined[0], TOTAL)) and joined[0] > 45
    # It shrank at the first commit after step 20 (rank 0 held its steps
    # until the removal was announced) and grew after step 45: at least 20
    # steps on one worker, four intervals of 5, so observations at 1 x 32
    # beyond the warm-up one of the visit.
    down, up = events
    assert down["step"] <= 20 + COMMIT + 1 < 45 < up["step"], (down["step"], up["step"])
    assert sum(s["workers"] == 1 for s in old["steps"]) >= 20
    # Every configuration the job ran: 2 x 16, then 1 x 32, then 2 x 16 again.
    model = old["throughput_model"]
    assert [c[:3] for c in model["configurations"]] == [[16, 2, 1], [32, 1, 1]]
    assert all(len(c[3]) >= 2 and min(c[3]) > 0 for c in model["configurations"])
    # The newcomer never ran on one worker, yet has those observations: the
    # same model on both ranks, observation for observation.
    assert new["throughput_model"] == model
    _resize(down, 2, 1)
    _resize(up, 1, 2)


# Whether to sync is agreed in KerasState.sync() by code that does not depend on
# the stack; on tf.keras 2, the scale-up tests below run the sync itself.
@pytest.mark.primary_only
def test_below_min_np_the_job_waits_and_a_new_worker_is_synced(tmp_path, reference):
    """``--min-np 2``: discovery removes 127.0.0.1, which leaves one worker,
    below the minimum, so the job waits for hosts; then localhost gets a
    second slot and a new worker starts there. The survivor left training
    for a removal alone (Horovod's rule: skip the sync) and the newcomer
    must be synced: with that rule the two ran different collectives and
    the job hung (Horovod #3494). Here both sync and the job finishes."""
    done, finals, events = _job(tmp_path, "keep", [
        {"step": 10, "do": "hosts", "hosts": ONE_HOST, "then": "localhost:2\n"}], min_np=2)
    assert done.leftover == 0
    assert re.search(r"^Process \d exit with status code 134\.$", done.stdout, re.M), done.stdout
    assert "127.0.0.1[0] has been removed from elastic job" in done.stderr
    assert [f["workers"] for f in finals] == [2, 2]
    survivor, newcomer = finals
    assert (survivor["rank"], newcomer["rank"]) == (0, 1)
    for final in finals:
        _assert_finished(final)
        _assert_weights(final, reference)
    assert survivor["weights"] == newcomer["weights"]
    assert survivor["optimizer"] == newcomer["optimizer"]
    # The survivor never trained alone and ran every step once; the
    # newcomer every step from the commit at which the survivor stopped.
    assert _ids(survivor) == list(range(TOTAL))
    assert {s["workers"] for s in survivor["steps"]} == {2}
    joined = _ids(newcomer)
    assert joined == list(range(joined[0], TOTAL)) and joined[0] > 10
    # Both entered training again at the same committed position.
    again, entry = survivor["syncs"][1], newcomer["syncs"][0]
    assert len(survivor["syncs"]) == 2 and again["workers"] == entry["workers"] == 2
    assert (again["epoch"], again["batch"]) == (entry["epoch"], entry["batch"])
    assert entry["epoch"] * STEPS + entry["batch"] == joined[0]
    (event,) = events
    _resize(event, 2, 2)
    assert event["reason"] == "workers 2 -> 2 (restarted)"
    assert event["after"]["synced"] is True
    assert event["step"] == next(s for s in survivor["steps"] if s["id"] == joined[0])["iterations"]
    print(f"waited below --min-np and resumed: pause {event['after']['pause_s']:.3f} s")


def test_scale_down_then_up_rescales_the_learning_rate(tmp_path):
    # LocalSGD (period 3): its count goes across the resets (the new worker
    # gets it in the sync), so update 90 averages the models.
    done, (old, new), events = _down_then_up(tmp_path, "scale", 8, 30, ["--sync", "local_sgd:3"])
    finals = old, new
    for final in finals:
        _assert_finished(final)
    # The two ranks end identical (the last update averaged the models;
    # LocalSGD keeps the optimizer slots local, test_scale_up_... checks
    # that the sync gives them to a new worker).
    assert old["weights"] == new["weights"]
    assert old["sync"] == new["sync"] == {"strategy": "local_sgd", "count": TOTAL,
                                          "params": {"period": 3, "start_after": 0}}
    assert _ids(old) == list(range(TOTAL))
    # The new worker joined at a commit and ran every step from there on.
    joined = _ids(new)
    assert joined == list(range(joined[0], TOTAL)) and joined[0] > 8
    assert new["syncs"][0]["batch"] + new["syncs"][0]["epoch"] * STEPS == joined[0]
    # "scale", linear, rates given for 2 workers: half the rate on one.
    for s in old["steps"]:
        assert s["batch_size"] == 16
        assert s["lr"] == pytest.approx(LR * s["workers"] / 2, rel=1e-6)
    assert {s["workers"] for s in old["steps"]} == {1, 2}
    down, up = events
    _resize(down, 2, 1)
    _resize(up, 1, 2)
    assert (down["before"]["global_batch"], down["after"]["global_batch"]) == (32, 16)
    assert (up["before"]["global_batch"], up["after"]["global_batch"]) == (16, 32)
    assert (down["before"]["lr"], down["after"]["lr"]) == pytest.approx((LR, LR / 2))
    assert (up["before"]["lr"], up["after"]["lr"]) == pytest.approx((LR / 2, LR))
    assert (down["after"]["lr_factor"], up["after"]["lr_factor"]) == (0.5, 1.0)
    assert down["step"] == _first_step_with(old, 1)["iterations"]
    assert up["step"] == _first_step_with(old, 2, after=down["step"])["iterations"]
    assert old["lr"] == new["lr"] == pytest.approx(LR)
    assert old["stats"] == new["stats"] and old["stats"]["batch_size"] == 32.0
    print(f"pauses: down {down['after']['pause_s']:.3f} s, up {up['after']['pause_s']:.3f} s; "
          f"held {old['join_wait_s']:.2f} s for the added host's announcement")


# Which worker failed, what the launcher does with its host and the return of
# that host do not depend on the stack; on tf.keras 2 the state code it runs
# (commit, restore, sync) is run by the scale-down and resume tests and the
# round trip of the state below.
@pytest.mark.primary_only
@pytest.mark.primary_only
def test_pair_averaging_survives_a_killed_peer_and_averages_with_its_replacement(tmp_path):
    """Asynchronous training (PairAveraging) and a SIGKILL of rank 1: rank 0
    trains on without it until its next commit (its one collective), goes
    back to the last commit and trains alone; when the host returns, the new
    worker and rank 0 enter the strategy again together and average with
    each other (models of the old pair are discarded). Nothing committed is
    lost and every step runs."""
    kill_after = 13
    done, finals, _ = _job(tmp_path, "keep", [{"step": kill_after, "do": "kill", "rank": 1,
                                               "await_return": True}],
                           worker_args=["--sync", "pair_averaging:1", "--sleep", 0.1],
                           launcher_args=["--blacklist-cooldown-range", 1, 2])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [2, 2]
    first, back = finals
    for final in finals:
        assert final["sync"]["strategy"] == "pair_averaging"
        assert (final["epoch"], final["batch"]) == (EPOCHS, 0) and final["iterations"] == TOTAL
        assert all(np.isfinite(w).all() for w in map(np.asarray, final["weights"]))
    ids = _ids(first)
    restart = next(i for i in range(1, len(ids)) if ids[i] <= ids[i - 1])
    assert ids[:restart] == list(range(restart))
    assert ids[restart:] == list(range(ids[restart], TOTAL))
    assert 1 <= restart - ids[restart] <= COMMIT and ids[restart] % COMMIT == 0
    # the newcomer averaged with rank 0's models: the two found each other
    assert back["exchange"]["averaged"] >= 1 and back["exchange"]["received"] >= 1
    assert first["exchange"]["averaged"] > back["exchange"]["averaged"]


def test_killed_worker_the_other_continues_from_the_last_commit_and_its_host_comes_back(
        tmp_path, reference):
    """SIGKILL of rank 1 mid-epoch: Horovod blacklists its host, rank 0 goes
    back to the last commit and trains alone; after the blacklist cooldown
    (``--blacklist-cooldown-range 1 2``: 2 s) the host is used again and the
    job grows back to two workers."""
    kill_after = 13  # mid-epoch, between commits (after steps 3, 7, 11, 15, ...)
    # 0.1 s per step: about 8 s of training left after the kill, the host
    # returns about 3 s after it; the survivor holds its steps until the
    # return is announced, so the job grows back on a slower machine too.
    done, finals, events = _job(tmp_path, "keep", [{"step": kill_after, "do": "kill", "rank": 1,
                                                    "await_return": True}],
                                worker_args=["--sleep", 0.1],
                                launcher_args=["--blacklist-cooldown-range", 1, 2])
    assert done.leftover == 0
    assert [f["workers"] for f in finals] == [2, 2]  # grown back: a new worker on that host
    first, back = finals
    for final in finals:
        _assert_finished(final)
        _assert_weights(final, reference)  # the redone steps replaced the lost ones exactly
    assert first["weights"] == back["weights"] and first["optimizer"] == back["optimizer"]
    ids = _ids(first)
    # Rank 0 ran past the kill until its collective failed, then went back
    # to the last commit: only uncommitted steps ran twice, at most COMMIT.
    restart = next(i for i in range(1, len(ids)) if ids[i] <= ids[i - 1])
    assert ids[:restart] == list(range(restart))
    assert ids[restart:] == list(range(ids[restart], TOTAL))
    redone = restart - ids[restart]
    assert 1 <= redone <= COMMIT and ids[restart] % COMMIT == 0
    assert kill_after < restart <= kill_after + 2
    # The returning worker joined at a commit and ran every step from there on.
    joined = _ids(back)
    assert joined == list(range(joined[0], TOTAL)) and joined[0] > ids[restart]
    assert back["syncs"][0]["batch"] + back["syncs"][0]["epoch"] * STEPS == joined[0]
    assert {(s["workers"], s["batch_size"]) for s in first["steps"]} == {(2, 16), (1, 32)}
    down, up = events
    _resize(down, 2, 1)
    _resize(up, 1, 2)
    assert (down["before"]["batch_size"], down["after"]["batch_size"]) == (16, 32)
    assert (up["before"]["batch_size"], up["after"]["batch_size"]) == (32, 16)
    alone = next(i for i, s in enumerate(first["steps"]) if s["workers"] == 1)
    assert down["step"] == first["steps"][alone]["iterations"]
    again = next(s for s in first["steps"][alone:] if s["workers"] == 2)
    assert up["step"] == again["iterations"]
    # Out of the blacklist no sooner than the cooldown after the failure.
    assert again["time"] - first["steps"][alone]["time"] >= 1.0
    print(f"failure pause {down['after']['pause_s']:.3f} s, {redone} steps redone; host back "
          f"after {again['time'] - first['steps'][alone]['time']:.1f} s, "
          f"pause {up['after']['pause_s']:.3f} s")


# The request's path (policy -> discovery file -> launcher) is stack-neutral;
# on tf.keras 2 the scale-down test runs the reset it ends in.
@pytest.mark.primary_only
def test_scale_up_requested_by_a_policy(tmp_path, reference):
    """One worker; a ResizePolicy asks for two through the target file that
    ``keras-adapt discover`` (the job's discovery script) reads, and Horovod
    starts the second worker."""
    from keras_adapt import discover
    from keras_adapt.record.events import read_events

    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    hosts, target = tmp_path / "hosts", str(tmp_path / "target")
    hosts.write_text(TWO_HOSTS)
    discover.write_target(target, 1)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m keras_adapt discover\n")
    script.chmod(0o755)
    request_at = 12
    args = ["--out", out, "--log-dir", log, "--rule", "keep", "--epochs", EPOCHS,
            "--steps", STEPS, "--commit", COMMIT, "--lr", LR,
            "--request-workers", 2, "--request-at", request_at]
    done = horovodrun_elastic(
        "elastic_train.py", args, str(script), np=1, min_np=1, max_np=2, timeout=300,
        extra_env={"KERAS_ADAPT_HOSTS_FILE": str(hosts), "KERAS_ADAPT_TARGET_FILE": target})
    assert done.leftover == 0
    assert discover.read_target(target) == 2
    finals = sorted((json.load(open(out / n)) for n in os.listdir(out) if n.startswith("final_")),
                    key=lambda r: r["rank"])
    assert [f["workers"] for f in finals] == [2, 2]
    first = next(f for f in finals if f["steps"][0]["workers"] == 1)  # the original worker
    joined = next(f for f in finals if f is not first)
    for final in finals:
        _assert_finished(final)
        _assert_weights(final, reference)  # "keep": no step lost or run twice
    assert first["weights"] == joined["weights"] and first["optimizer"] == joined["optimizer"]
    assert _ids(first) == list(range(TOTAL))
    ids = _ids(joined)
    assert ids == list(range(ids[0], TOTAL)) and ids[0] > request_at
    # per-worker batch 32 on one worker, 16 on two: the global batch stays 32
    assert {(s["workers"], s["batch_size"]) for s in first["steps"]} == {(1, 32), (2, 16)}
    request, resize = read_events(str(log))
    # the request: the policy's event at the step after `request_at` ran
    assert request["kind"] == "resize" and request["policy"] == "RequestAt"
    assert (request["before"]["target_workers"], request["after"]["target_workers"]) == (1, 2)
    assert request["step"] == request_at + 1
    # the change: the elastic state's event, with the pause it cost
    _resize(resize, 1, 2)
    assert (resize["before"]["batch_size"], resize["after"]["batch_size"]) == (32, 16)
    assert resize["step"] == _first_step_with(first, 2)["iterations"] > request["step"]
    print(f"policy asked at update {request['step']}, two workers from update "
          f"{resize['step']}, pause {resize['after']['pause_s']:.3f} s; held "
          f"{first['join_wait_s']:.2f} s for the added host's announcement")


# -- one process: the rules of the callbacks, the state and the resize rule ----

def _model(lr=0.05, **kwargs):
    import keras

    import keras_adapt

    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(lr), **kwargs), "mse")
    return model


def _data(n=40):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5]], "float32")


def test_epochs_are_counted_once_with_initial_epoch_and_with_horovods_pattern():
    from keras_adapt import elastic

    x, y = _data()
    for pattern in ("initial_epoch", "horovod"):
        model = _model()
        state = elastic.KerasState(model, epoch=2)
        seen = []
        cb = elastic.UpdateEpochStateCallback(state)
        kwargs = ({"initial_epoch": state.epoch, "epochs": 5} if pattern == "initial_epoch"
                  else {"epochs": 5 - state.epoch})
        model.fit(x, y, batch_size=10, verbose=0, callbacks=[
            cb, _Lambda(on_epoch_end=lambda e, logs: seen.append(state.epoch))], **kwargs)
        # Horovod's rule (initial + epoch + 1) gives 5, 7, 9 with initial_epoch.
        assert seen == [3, 4, 5], pattern
        assert state.epoch == 5


class _Lambda:
    """A tiny callback from functions (keras.callbacks.LambdaCallback on both stacks)."""

    def __new__(cls, **hooks):
        import keras

        return keras.callbacks.LambdaCallback(**hooks)


def test_batch_position_and_commits_whatever_the_callback_order():
    from keras_adapt import elastic

    x, y = _data(40)  # 4 steps of 10 per epoch
    for order in ("commit_first", "commit_last"):
        model = _model()
        state = elastic.KerasState(model)
        committed = []
        original_save = state.save

        def save():
            original_save()
            committed.append((state.epoch, state.batch))

        state.save = save
        commit = elastic.CommitStateCallback(state, batches_per_commit=3)
        track = [elastic.UpdateBatchStateCallback(state), elastic.UpdateEpochStateCallback(state)]
        callbacks = [commit, *track] if order == "commit_first" else [*track, commit]
        model.fit(x, y, batch_size=10, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
        # Every commit holds the position of the steps already done: after
        # step 3, at the end of epoch 1, after 3 steps of epoch 2, at the end.
        assert committed == [(0, 3), (1, 0), (1, 3), (2, 0)], order
        assert commit.commits == 4 and commit.commit_seconds > 0


def test_fit_resumes_mid_epoch_and_the_state_round_trips_keras_adapt_state():
    from keras_adapt import elastic
    from keras_adapt.actuators import LearningRateScale

    import tensorflow as tf

    from keras_adapt.policies import AdaptationPolicy

    model = _model(stats_interval=1, batch_size=8)
    LearningRateScale(model).set(3.0)
    policy = AdaptationPolicy()
    policy.restore({"last_adapt": 5})
    state = elastic.KerasState(model, batch=2, epoch=1, policies=[policy],
                               rule=elastic.ResizeRule("keep", global_batch=8))
    asked = []
    x, y = _data(400)

    def data(epoch, batch):
        asked.append((epoch, batch))
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(state.batch_size).repeat()

    runs = elastic.fit(state, data, epochs=3, steps_per_epoch=5, verbose=0,
                       callbacks=[elastic.CommitStateCallback(state, batches_per_commit=2)])
    assert asked == [(1, 2), (2, 0)]
    assert [h.epoch for h in runs] == [[1], [2]]
    assert (state.epoch, state.batch) == (3, 0)
    opt = model.optimizer
    assert int(opt.iterations.numpy()) == 3 + 5  # the 3 steps left of epoch 1, then epoch 2
    # Committed now; change everything, then restore: all of it comes back.
    weights = [w.copy() for w in model.get_weights()]
    slots = [np.array(v) for v in __import__("keras_adapt").optimizer.optimizer_variables(opt)]
    stats = opt.gradient_statistics.result()
    assert stats["updates"] == 7  # one-worker pairs of consecutive updates
    lr = state.lr
    assert lr == pytest.approx(0.05 * 3.0, rel=1e-6)
    model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=4, verbose=0)
    LearningRateScale(model).set(1.0)
    state.epoch, state.batch = 9, 9
    policy.restore({"last_adapt": 9})
    assert opt.gradient_statistics.result()["updates"] == 11
    state.restore()
    assert (state.epoch, state.batch) == (3, 0)
    assert policy.get_state() == {"last_adapt": 5}
    for got, want in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)
    import keras_adapt

    for got, want in zip(keras_adapt.optimizer.optimizer_variables(opt), slots):
        np.testing.assert_array_equal(np.array(got), want)
    assert opt.gradient_statistics.result() == stats
    assert state.lr == pytest.approx(lr, rel=1e-6)


def _progress_epochs_run(reset_at=None):
    """elastic.fit, one process: batch 4, 8 from epoch 1, 12 from epoch 2
    (micro-batch 4), epochs of one pass's worth of progress; with
    ``reset_at``, training fails after that update and restarts from the
    last commit, as ``elastic.run`` does after a failure. Returns the epoch
    ends ``(epoch, updates, progress)``, the final weights and the updates
    trained in all."""

    from keras_adapt import elastic
    from keras_adapt.data import AdaptiveBatchDataset
    from keras_adapt.policies import ScheduledBatchSizePolicy

    class Failure(Exception):
        pass

    x, y = _data(100)
    model = _model(stats_interval=1)
    data = AdaptiveBatchDataset(x, y, micro_batch_size=4, seed=0)
    policy = ScheduledBatchSizePolicy({1: 8, 2: 12}, dataset=data, micro_batch_size=4,
                                      max_micro_batch_size=4, epoch_end="progress")
    state = elastic.KerasState(model, policies=[policy], dataset=data)
    ends, trained = [], []

    def on_epoch_end(epoch, logs):
        ends.append((epoch, int(model.optimizer.iterations.numpy()),
                     policy.progress.count("progress")))

    def on_batch_end(batch, logs):
        updates = int(model.optimizer.iterations.numpy())
        if not trained or trained[-1] != updates:
            trained.append(updates)
        if updates == reset_at and len(trained) == updates:  # the first time only
            raise Failure

    callbacks = [policy, _Lambda(on_epoch_end=on_epoch_end, on_train_batch_end=on_batch_end),
                 elastic.CommitStateCallback(state, batches_per_commit=3)]
    try:
        elastic.fit(state, data, epochs=4, callbacks=callbacks, verbose=0)
    except Failure:
        state.restore()
        restored = int(model.optimizer.iterations.numpy())
        assert restored < reset_at and (state.epoch, ends[-1][0]) == (1, 0)
        elastic.fit(state, data, epochs=4, callbacks=callbacks, verbose=0)
    return ends, [np.array(w) for w in model.get_weights()], len(trained)


def test_fit_with_progress_epochs_resumes_after_a_reset_where_the_run_without_it_ends_them():
    ends, weights, updates = _progress_epochs_run()
    # epoch 0 at the base batch: 25 updates of 4; each epoch ends at the
    # first update whose progress reaches the next multiple of 100
    assert [e for e, _, _ in ends] == [0, 1, 2, 3] and ends[0][1] == 25
    for epoch, _, count in ends:
        assert 100 * (epoch + 1) <= count < 100 * (epoch + 1) + 12
    assert updates == ends[-1][1]
    reset_at = ends[0][1] + 5  # mid-epoch 1, between two commits
    again, weights_again, updates_again = _progress_epochs_run(reset_at)
    assert again == ends  # the same updates and progress at every epoch end
    assert updates_again > updates  # the uncommitted updates ran twice
    for got, want in zip(weights_again, weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_resize_rule_values_and_errors():
    from keras_adapt import elastic

    keep = elastic.ResizeRule("keep", global_batch=48)
    assert [keep.per_worker_batch(n) for n in (1, 2, 3, 4)] == [48, 24, 16, 12]
    assert keep.lr_factor(4) == 1.0
    with pytest.raises(ValueError, match="global_batch=48.*cannot split over 5 workers"):
        keep.per_worker_batch(5)
    scale = elastic.ResizeRule("scale", batch_size=16, scaling="sqrt", base_workers=4)
    assert scale.per_worker_batch(1) == 16
    assert scale.lr_factor(1) == pytest.approx(0.5) and scale.lr_factor(16) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="mode='keep' needs global_batch"):
        elastic.ResizeRule("keep")
    with pytest.raises(ValueError, match="mode='scale' needs batch_size"):
        elastic.ResizeRule("scale")
    with pytest.raises(ValueError, match="mode='grow' is not valid"):
        elastic.ResizeRule("grow")
    with pytest.raises(ValueError, match="unknown scaling rule 'cubic'"):
        elastic.ResizeRule("scale", batch_size=8, scaling="cubic")
    # Applied to a model: the learning rate follows the rule (linear, 2 -> 1 workers).
    model = _model(lr=0.04)
    rule = elastic.ResizeRule("scale", batch_size=8, base_workers=2)
    change = rule.apply(model, 2, 1)
    assert change["before"] == {"batch_size": 8, "global_batch": 16, "lr": pytest.approx(0.04)}
    assert change["after"] == {"batch_size": 8, "global_batch": 8, "lr_factor": 0.5,
                               "lr": pytest.approx(0.02)}
    from keras_adapt.optimizer import effective_learning_rate

    assert effective_learning_rate(model.optimizer) == pytest.approx(0.02)


def test_commit_interval_auto_rule():
    from keras_adapt.elastic.state_callbacks import AUTO_MAX_COST, AUTO_MAX_INTERVAL, auto_interval

    assert AUTO_MAX_COST == 0.005                      # half the 1% budget
    assert auto_interval(0.006, 0.003) == 400          # 6 ms commit / (0.5% of 3 ms)
    assert auto_interval(0.006, 0.003, max_cost=0.01) == 200
    assert auto_interval(0.001, 0.2) == 1
    assert auto_interval(0.001, 0.1) == 2              # 1 ms is 1% of one 100 ms step
    assert auto_interval(1.0, 0.001) == AUTO_MAX_INTERVAL
    # k steps then one commit: the commit is at most 0.5% of the steps' time.
    for commit_s, step_s in ((0.006, 0.003), (0.002, 0.05), (0.0004, 0.0007)):
        k = auto_interval(commit_s, step_s)
        assert commit_s <= AUTO_MAX_COST * k * step_s * (1 + 1e-9)
        assert k == 1 or commit_s > AUTO_MAX_COST * (k - 1) * step_s


def test_commits_wait_for_the_end_of_an_accumulated_update():
    # k = 2 micro-steps per update, a commit due every 3 steps: each commit
    # waits for the update's last micro-step (steps 4, 8 of an epoch of 10,
    # then the epoch's end at 10), with nothing left in the accumulators.
    from keras_adapt import elastic

    model = _model(backward_passes_per_step=2)
    committed = []

    class Recorded(elastic.KerasState):
        def save(self):
            acc = self.optimizer.adapt_state.accumulation
            committed.append((self.epoch, self.batch, int(acc.count.numpy())))
            super().save()

    state = Recorded(model)
    commit = elastic.CommitStateCallback(state, batches_per_commit=3)
    x, y = _data(40)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        elastic.UpdateBatchStateCallback(state), elastic.UpdateEpochStateCallback(state), commit])
    assert committed == [(0, 4, 0), (0, 8, 0), (1, 0, 0), (1, 4, 0), (1, 8, 0), (2, 0, 0)]
    assert commit.commits == 6
    # An epoch of 9 micro-steps ends inside an update: its commit waits for
    # the next epoch's first micro-step, and the interval counts from there.
    committed.clear()
    model = _model(backward_passes_per_step=2)
    state = Recorded(model)
    model.fit(x[:36], y[:36], batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        elastic.UpdateBatchStateCallback(state), elastic.UpdateEpochStateCallback(state),
        elastic.CommitStateCallback(state, batches_per_commit=3)])
    assert committed == [(0, 4, 0), (0, 8, 0), (1, 1, 0), (1, 5, 0), (2, 0, 0)]


def test_a_plain_keras_optimizer_is_held_committed_and_restored():
    # As Horovod's KerasState: any optimizer (here not even the model's);
    # its variables (iterations and Adam's slots) are kept with the weights,
    # keras-adapt's own state is simply not there.
    import keras
    import numpy as np

    from keras_adapt import elastic
    from keras_adapt.optimizer import optimizer_variables

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(0.01)
    state = elastic.KerasState(model, optimizer, batch=3, epoch=1)
    variables = optimizer_variables(optimizer)
    assert len(variables) >= 1 + 2 * 2  # built by the state: iterations, m and v of 2 weights
    state.sync()  # one worker: nothing to receive, the state is kept

    def values():
        return [np.array(v) for v in model.get_weights() + [np.asarray(v) for v in variables]]

    committed = values()
    for v in model.weights + variables:
        v.assign(np.full(v.shape, 7, v.dtype.name if hasattr(v.dtype, "name") else v.dtype))
    state.batch = 9
    state.restore()
    for got, want in zip(values(), committed):
        np.testing.assert_array_equal(got, want)
    assert (state.batch, state.epoch, state.adapt, state.lr) == (3, 1, {}, float(np.float32(0.01)))
    for v in model.weights + variables:
        v.assign(np.ones(v.shape, v.dtype.name if hasattr(v.dtype, "name") else v.dtype))
    state.batch = 4
    state.commit()
    state.restore()
    assert all((got == 1).all() for got in values()) and state.batch == 4


def test_host_updates_are_agreed_and_interrupt_once():
    # What the driver's notifications make a commit do (here one rank; the
    # elastic jobs above run the agreement on two): any change interrupts
    # and every rank enters the sync (Horovod #3494); the sync broadcasts
    # after an addition (or both) and not after a removal alone; a stale
    # announcement is ignored.
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    from keras_adapt import elastic

    state = elastic.KerasState(_model())
    state.check_host_updates()  # nothing announced
    now = time.time()

    def resumed():
        # What elastic.run does after the interrupt (one rank: no re-form),
        # then the first step's resize event.
        state.reset()
        state.sync()
        return state.step_finished()["after"]["synced"]

    for i, (update, synced) in enumerate(((HostUpdateResult.removed, False),
                                          (HostUpdateResult.added, True),
                                          (HostUpdateResult.mixed, True))):
        stamp = now + i
        state.on_hosts_updated(stamp, update)
        with pytest.raises(HostsUpdatedInterrupt) as raised:
            state.commit()
        assert raised.value.skip_sync is False
        assert resumed() is synced
        state.check_host_updates()  # agreed once, not again
        state.on_hosts_updated(stamp - 0.5, HostUpdateResult.removed)  # older than the last
        state.check_host_updates()
    # A removal then an addition before the same commit: both, so a sync.
    state.on_hosts_updated(now + 3, HostUpdateResult.removed)
    state.on_hosts_updated(now + 4, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    assert resumed() is True
    # A removal is remembered for the next sync only.
    state.on_hosts_updated(now + 5, HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    assert resumed() is False
    assert resumed() is True


def test_bad_input_is_refused_with_the_fix():
    import keras

    import keras_adapt
    from keras_adapt import elastic

    lazy = keras.Sequential([keras.layers.Dense(1)])
    lazy.compile(keras_adapt.DistributedOptimizer("sgd"), "mse")
    with pytest.raises(ValueError, match="needs a built model"):
        elastic.KerasState(lazy)
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    plain.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match=r"rule=.* is not valid with the optimizer SGD.*"
                                         r"keras_adapt.DistributedOptimizer"):
        elastic.KerasState(plain, rule=elastic.ResizeRule("keep", global_batch=8))
    with pytest.raises(ValueError, match="optimizer=None is not valid; use a Keras optimizer"):
        elastic.KerasState(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    state = elastic.KerasState(_model())
    with pytest.raises(ValueError, match="batches_per_commit=0 is not valid"):
        elastic.CommitStateCallback(state, batches_per_commit=0)
    with pytest.raises(ValueError, match="epoch=-1 is not valid"):
        elastic.KerasState(_model(), epoch=-1)
    with pytest.raises(TypeError, match="first argument of an elastic run must be its state"):
        elastic.run(lambda s: s)("not a state")
    with pytest.raises(ValueError, match="fit sets initial_epoch"):
        elastic.fit(state, lambda e, b: None, epochs=2, steps_per_epoch=3, initial_epoch=1)


def test_collective_failures_are_told_apart():
    import tensorflow as tf

    from keras_adapt.elastic import is_collective_failure

    assert is_collective_failure(tf.errors.UnknownError(
        None, None, "HorovodGroupedAllreduce_grouped_allreduce_0 failed: Horovod has been shut down"))
    assert is_collective_failure(tf.errors.InternalError(None, None, "HorovodBroadcast: peer lost"))
    assert not is_collective_failure(tf.errors.ResourceExhaustedError(None, None, "OOM"))
    assert not is_collective_failure(ValueError("Horovod"))


def test_an_interrupted_function_is_released_beside_the_reset_and_errors_keep_their_meaning(
        monkeypatch):
    # One process, Horovod's elastic loop without a driver, and no re-form
    # (re-initialising Horovod needs horovodrun; the jobs above do it). What the
    # interrupted function's frames held (fit's epoch iterator, here a
    # tf.data iterator and a marker) is freed in the release thread, not in
    # the main thread before the reset (docs/elastic.md, "The interrupted
    # epoch's data iterator"); the loop still sees the interrupt's
    # skip_sync and restores after a collective failure.
    import threading
    import weakref

    import tensorflow as tf
    from horovod.common.exceptions import HostsUpdatedInterrupt

    from keras_adapt import elastic

    monkeypatch.setattr(sys.modules["keras_adapt.elastic.run"], "_reset", lambda: None)
    freed_in, iterators, calls = [], [], []

    class Held:
        def __del__(self):
            freed_in.append(threading.current_thread().name)

    state = elastic.KerasState(_model())
    syncs, restores = [], []
    sync, restore = state.sync, state.restore
    state.sync = lambda: (syncs.append(len(calls)), sync())
    state.restore = lambda: (restores.append(len(calls)), restore())

    @elastic.run
    def train(state, failure):
        calls.append(failure)
        if len(calls) % 2:  # each case: interrupted once, then finishes
            held = Held()  # noqa: F841 - only this frame holds it
            data = iter(tf.data.Dataset.range(1000).repeat().map(lambda i: i * 2).prefetch(2))
            next(data)
            iterators.append(weakref.ref(data))
            raise failure
        return len(calls)

    assert train(state, HostsUpdatedInterrupt(True)) == 2
    assert train(state, tf.errors.UnknownError(None, None, "HorovodAllreduce failed")) == 4
    for thread in threading.enumerate():
        if thread.name == "keras-adapt-release":
            thread.join(timeout=60)
    assert freed_in == ["keras-adapt-release"] * 2
    assert [ref() for ref in iterators] == [None, None]
    # skip_sync=True: no sync after the interrupt; a failure: restore, then sync.
    assert (syncs, restores) == ([0, 2, 3], [3])

    @elastic.run
    def broken(state):
        raise tf.errors.InvalidArgumentError(None, None, "bad shape")

    with pytest.raises(tf.errors.InvalidArgumentError, match="bad shape") as raised:
        broken(state)
    assert raised.traceback[-1].name == "broken"  # not a Horovod failure: untouched


def test_horovod_names_reach_the_elastic_package():
    import keras_adapt.horovod as hvd
    from keras_adapt import elastic

    assert hvd.elastic is elastic
    assert (hvd.elastic.KerasState, hvd.elastic.run, hvd.elastic.CommitStateCallback,
            hvd.elastic.UpdateBatchStateCallback, hvd.elastic.UpdateEpochStateCallback) == (
        elastic.KerasState, elastic.run, elastic.CommitStateCallback,
        elastic.UpdateBatchStateCallback, elastic.UpdateEpochStateCallback)


# -- the sync strategy's state and the batch machinery across a reset ----------

def test_sync_strategy_state_commits_restores_and_rejoins_after_a_sync():
    import keras_adapt
    from keras_adapt import elastic
    from keras_adapt.sync import AllReduceSGD, BlockMomentum, LocalSGD

    x, y = _data(80)
    model = _model(sync_strategy=[AllReduceSGD(), LocalSGD(period=3, start_after=2),
                                  BlockMomentum(period=2)])
    state = elastic.KerasState(model)
    sync = model.optimizer.adapt_state.sync
    # KerasState commits exactly the list PreemptionCheckpoint writes.
    assert set(state.adapt) == set(model.optimizer.adapt_state.checkpoint_variables()) | {
        "lr_control/use_progress", "compression/state"}
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=2, verbose=0)
    sync.set("local_sgd", period=5)           # a SyncStrategyPolicy's switch
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=4, verbose=0)
    assert int(sync.count.numpy()) == 4
    state.save()
    assert state.sync_choice == {"strategy": "local_sgd",
                                 "params": {"period": 5, "start_after": 2}}
    sync.set("block_momentum", period=7)
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=3, verbose=0)
    assert sync.strategy == BlockMomentum(period=7) and int(sync.count.numpy()) == 3
    state.restore()
    assert sync.strategy == LocalSGD(period=5, start_after=2)
    assert int(sync.index.numpy()) == LocalSGD.index
    assert int(sync.count.numpy()) == 4       # the period's phase and start_after go on
    assert int(sync.variables["period"].numpy()) == 5
    # BMUF after a sync: its global model restarts from the synced model and
    # its block velocity from zero (the old membership's velocity is dropped).
    sync.set("block_momentum", period=2)
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=1, verbose=0)
    for v in sync.extra["block_velocity"] + sync.extra["global_model"]:
        v.assign(v + 7.0)                     # stale state of the old membership
    state.sync()
    assert not bool(sync.entered.numpy()) and bool(sync.measure_ready.numpy())
    assert sync.strategy == BlockMomentum(period=2) and int(sync.count.numpy()) == 1
    synced = [np.array(w) for w in model.trainable_variables]
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=1, verbose=0)
    assert bool(sync.entered.numpy()) and int(sync.count.numpy()) == 2
    # count 1 -> 2 synchronises: one worker, mean = x, began = x_g = synced,
    # v = 1.0 * (x - synced), x_g = synced + v = x, start = x_g + 0.5 v.
    local = [np.array(w) for w in model.trainable_variables]
    for g, v, s, now in zip(sync.extra["global_model"], sync.extra["block_velocity"], synced,
                            local):
        velocity = np.array(g) - s
        np.testing.assert_allclose(np.array(v), velocity, atol=1e-6)
        np.testing.assert_allclose(now, np.array(g) + 0.5 * velocity, atol=1e-6)
        assert np.abs(velocity).max() < 1.0   # not the stale +7
    assert keras_adapt.optimizer.effective_learning_rate(model.optimizer) == pytest.approx(0.05)


def test_the_compression_is_committed_and_restored():
    from keras_adapt import elastic
    from keras_adapt.actuators import GradientCompression

    x, y = _data(40)
    model = _model()
    compression = GradientCompression(model)
    state = elastic.KerasState(model)
    assert state.adapt["compression/state"] == "none"
    compression.set("fp16")
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=2, verbose=0)
    state.save()
    assert state.adapt["compression/state"] == "fp16"
    compression.set("none")
    model.fit(x, y, batch_size=10, epochs=1, steps_per_epoch=1, verbose=0)
    state.restore()
    assert compression.mode == "fp16"
    # a committed state without the switch (None) leaves it alone
    plain = elastic.KerasState(_model())
    assert plain.adapt["compression/state"] is None
    plain.restore()
    assert not plain.model.optimizer.adapt_state.compression.enabled


def test_dataset_reshard_keeps_the_global_position():
    from keras_adapt.data import AdaptiveBatchDataset

    x = np.arange(24.0)
    perm0 = np.random.default_rng((7, 0)).permutation(24)
    perm1 = np.random.default_rng((7, 1)).permutation(24)
    two = [AdaptiveBatchDataset(x, micro_batch_size=3, seed=7, num_workers=2, rank=r)
           for r in (0, 1)]
    seen = [two[r].next_indices() for _ in range(2) for r in (0, 1)]
    # Equal shares: rank r takes perm[r::2]; two steps of 2 x 3 = perm[:12].
    assert sorted(np.concatenate(seen).tolist()) == sorted(perm0[:12].tolist())
    # 2 -> 3 workers of 2 samples: step s gives rank r perm[12 + 6 s + 2 r:][:2].
    three = [AdaptiveBatchDataset(x, micro_batch_size=2, seed=7, num_workers=3, rank=r)
             for r in range(3)]
    for r, ds in enumerate(three):
        ds.reshard(3, r, 2, state=two[0].get_state())
    got = [[three[r].next_indices().tolist() for r in range(3)] for _ in range(3)]
    for s in range(2):
        for r in range(3):
            assert got[s][r] == perm0[12 + 6 * s + 2 * r:][:2].tolist()
    # Pass 0 is used up (24 samples, each once); step 2 starts pass 1.
    assert got[2] == [perm1[0:2].tolist(), perm1[2:4].tolist(), perm1[4:6].tolist()]
    used = np.concatenate(seen + [np.array(got[s][r]) for s in range(2) for r in range(3)])
    assert sorted(used.tolist()) == list(range(24))
    # 3 -> 1 worker of 12 from the middle of pass 1, and the state round-trips.
    one = AdaptiveBatchDataset(x, micro_batch_size=2, seed=7, num_workers=3, rank=2)
    one.reshard(1, 0, 12, state=three[1].get_state())
    assert (one.num_workers, one.rank, one.micro_batch_size) == (1, 0, 12)
    copy = AdaptiveBatchDataset(x, micro_batch_size=2, seed=7, num_workers=1, rank=0)
    copy.set_state(one.get_state())
    assert one.next_indices().tolist() == copy.next_indices().tolist() == perm1[6:18].tolist()
    with pytest.raises(ValueError, match=r"micro_batch_size=13\) does not fit .* at most 12"):
        one.reshard(2, 0, 13)
    with pytest.raises(ValueError, match="seed=7.*seed=8"):
        AdaptiveBatchDataset(x, micro_batch_size=2, seed=8, num_workers=1, rank=0).reshard(1, 0, 2, one.get_state())


def test_resize_rule_acts_through_global_batch_size_and_the_dataset():
    import keras_adapt
    from keras_adapt import elastic
    from keras_adapt.actuators import GlobalBatchSize
    from keras_adapt.data import AdaptiveBatchDataset

    x, y = _data(64)
    model = _model(lr=0.04)
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, num_workers=1, rank=0)
    batch = GlobalBatchSize(model, dataset=ds)    # max micro-batch 8
    batch.workers = 2                             # as with two workers: 2 x 8 x 1 = 16
    keep = elastic.ResizeRule("keep", global_batch=16)
    change = keep.apply(model, 2, 1, ds)
    # One worker keeps 16 with the largest micro-batch (8) and k = 2.
    assert (batch.workers, ds.micro_batch_size, batch.accumulation.steps, batch.value) == (
        1, 8, 2, 16)
    assert change == {"before": {"batch_size": 8, "global_batch": 16, "accumulation": 1,
                                 "lr": pytest.approx(0.04)},
                      "after": {"batch_size": 8, "global_batch": 16, "accumulation": 2,
                                "lr": pytest.approx(0.04)}}
    keep.apply(model, 1, 4, ds)                   # 4 workers: 4 x 4 x 1
    assert (ds.micro_batch_size, batch.accumulation.steps, batch.value) == (4, 1, 16)
    # "scale": each worker keeps b x k, the global batch and the rate follow N.
    scale = elastic.ResizeRule("scale", batch_size=4, base_workers=4)
    change = scale.apply(model, 4, 2, ds)
    assert (ds.micro_batch_size, batch.accumulation.steps, batch.value) == (4, 1, 8)
    assert change["after"]["lr_factor"] == 0.5
    assert keras_adapt.optimizer.effective_learning_rate(model.optimizer) == pytest.approx(0.02)
    # A GlobalBatchSize feeding a dataset the state does not know is refused.
    other = AdaptiveBatchDataset(x, y, micro_batch_size=8, num_workers=1, rank=0)
    with pytest.raises(ValueError, match=r"KerasState\(\.\.\., dataset=ds\)"):
        keep.apply(model, 2, 2, other)


def test_state_keeps_and_reshards_the_dataset_position():
    from keras_adapt import elastic
    from keras_adapt.data import AdaptiveBatchDataset

    import tensorflow as tf

    x, y = _data(64)
    perm = np.random.default_rng((0, 0)).permutation(64)
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=8, num_workers=1, rank=0)
    model = _model()
    state = elastic.KerasState(model, dataset=ds, rule=elastic.ResizeRule("keep", global_batch=8))
    runs = elastic.fit(state, ds, epochs=1, steps_per_epoch=3, verbose=0,
                       callbacks=[elastic.CommitStateCallback(state, batches_per_commit=2)])
    assert [len(h.epoch) for h in runs] == [1] and ds.produced == 3
    assert state.data_state["produced"] == 3   # committed at the end of fit
    assert ds.next_indices().tolist() == perm[24:32].tolist()
    state.restore()                           # back to the commit: the next batch again
    assert ds.next_indices().tolist() == perm[24:32].tolist()
    state.restore()
    state.reset()                             # a "restart" with one worker: re-sharded
    state.sync()
    assert ds.rank_micro_batch_sizes == [8] and ds.next_indices().tolist() == perm[24:32].tolist()
    assert state.batch_size == 8 and state.resizes == []
    # Bad combinations, each with the fix.
    with pytest.raises(ValueError, match="make the dataset with micro_batch_size=16"):
        elastic.KerasState(_model(), dataset=ds, rule=elastic.ResizeRule("keep", global_batch=16))
    with pytest.raises(TypeError, match="takes a keras_adapt.data.AdaptiveBatchDataset"):
        elastic.KerasState(_model(), dataset=tf.data.Dataset.range(3))
    with pytest.raises(ValueError, match=r"fit\(state, state.dataset"):
        elastic.fit(state, lambda e, b: None, epochs=2, steps_per_epoch=3)
    with pytest.raises(ValueError, match=r"KerasState\(model, \.\.\., dataset=ds\)"):
        elastic.fit(elastic.KerasState(_model()), ds, epochs=2, steps_per_epoch=3)


# -- a worker preempted with SIGTERM leaves; the other goes on without rollback --

def _left(tmp_path, finals):
    """The steps of each process that did not finish (from its steps_<pid>.jsonl)."""
    out, done = tmp_path / "out", {f"steps_{f['pid']}.jsonl" for f in finals}
    return [[json.loads(line) for line in open(out / n)] for n in sorted(os.listdir(out))
            if n.startswith("steps_") and n not in done]


# Rank 0 leaves: the harder case (the survivor becomes rank 0, syncs from
# itself and writes the events). (1, "scale") passes too; one job keeps the
# suite short. The leave (signal, agreement, exit) is stack-neutral; on tf.keras 2
# the SIGTERM-to-every-worker test below runs the same signal agreement.
@pytest.mark.primary_only
@pytest.mark.parametrize("signalled,rule", [(0, "keep")])
def test_sigterm_worker_leaves_and_the_other_goes_on_without_rollback(tmp_path, reference,
                                                                      signalled, rule):
    """SIGTERM to one worker mid-epoch (between commits): it leaves at the
    step the workers agree on, the other continues from exactly there; a
    PreemptionCheckpoint given to the job writes nothing."""
    from keras_adapt.callbacks import PreemptionCheckpoint

    term_after = 13  # commits after steps 3, 7, 11, 15: a rollback would redo steps
    # With a PreemptionCheckpoint too: it is written only when every worker
    # is signalled, so the leave is exactly as without it.
    done, finals, events = _job(tmp_path, rule, [
        {"step": term_after, "do": "term", "rank": signalled}],
        worker_args=["--checkpoint", tmp_path / "ck"])
    assert done.leftover == 0
    assert PreemptionCheckpoint(tmp_path / "ck").checkpoints() == []
    (final,) = finals
    (left,) = _left(tmp_path, finals)
    assert {s["rank"] for s in left} == {signalled}
    # The leaver exited with the documented code (as horovodrun saw it).
    assert done.stdout.count("exit with status code 75") == 1, done.stdout[-3000:]
    assert "exit with status code" not in done.stdout.replace("exit with status code 75", "")
    assert final["workers"] == 1 and final["rank"] == 0
    _assert_finished(final)
    # Every step ran exactly once: the leaver's up to the agreed step, the
    # survivor's all of them, in order, and nothing was restored.
    ids, left_ids = _ids(final), [s["id"] for s in left]
    assert ids == list(range(TOTAL)) and final["restores"] == 0
    leave_at = left_ids[-1]
    assert left_ids == list(range(leave_at + 1)) and left[-1]["iterations"] == leave_at + 1
    first_alone = _first_step_with(final, 1)
    assert first_alone["id"] == leave_at + 1
    # The survivor re-formed at the leave step: its second sync is there.
    again = final["syncs"][1]
    assert (again["workers"], again["epoch"] * STEPS + again["batch"]) == (1, leave_at + 1)
    preemption, resize = events
    assert preemption["kind"] == "preemption" and preemption["policy"] == "LeaveOnSignalCallback"
    assert preemption["rank"] == 1 - signalled  # written by the survivor
    assert preemption["step"] == leave_at + 1
    assert preemption["after"]["signalled_ranks"] == [signalled]
    assert preemption["after"]["signals"] == ["SIGTERM"]
    assert preemption["after"]["exit_code"] == 75 and preemption["after"]["workers"] == 1
    assert f"SIGTERM on rank {signalled}" in preemption["reason"]
    assert 0.0 < preemption["after"]["signal_to_leave_s"] < 30.0
    # The agreement came at most one check interval after the signal.
    assert term_after <= leave_at < term_after + preemption["after"]["check_interval"]
    _resize(resize, 2, 1)
    assert resize["step"] == first_alone["iterations"] == leave_at + 2
    pause = resize["after"]
    assert pause["pause_s"] == pytest.approx(pause["reform_s"] + pause["resume_s"], abs=1e-5)
    assert pause["reform_s"] > 0.0 and pause["resume_s"] > 0.0
    if rule == "keep":
        # The survivor takes the whole global batch of 32; the rate stays,
        # and the weights are those of one process over the same batches.
        assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, 16), (1, 32)}
        assert {s["lr"] for s in final["steps"]} == pytest.approx([LR])
        assert (resize["before"]["batch_size"], resize["after"]["batch_size"]) == (16, 32)
        _assert_weights(final, reference)
    else:
        # "scale": 16 per worker; the rate given for two workers halves.
        for s in final["steps"]:
            assert s["batch_size"] == 16
            assert s["lr"] == pytest.approx(LR * s["workers"] / 2, rel=1e-6)
        assert (resize["before"]["global_batch"], resize["after"]["global_batch"]) == (32, 16)
        assert (resize["before"]["lr"], resize["after"]["lr"]) == pytest.approx((LR, LR / 2))
    # Training time the leave cost: the last step with two workers to the
    # first step with one.
    gap = first_alone["time"] - final["steps"][leave_at]["time"]
    print(f"leave of rank {signalled}: agreed at step {leave_at} (signal after "
          f"{term_after}), pause {pause['pause_s']:.3f} s (reform {pause['reform_s']:.3f}, "
          f"resume {pause['resume_s']:.3f}), last-to-first step {gap:.3f} s, "
          f"signal to leave {preemption['after']['signal_to_leave_s']:.3f} s")


def test_sigint_to_every_worker_stops_them_all_with_the_code(tmp_path):
    """Every worker signalled (here the only one, without horovodrun): all
    commit and exit with 75 at the agreed step, and the event says why."""
    from keras_adapt.record.events import read_events

    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, os.path.join(WORKERS, "elastic_train.py"), "--out", str(out),
         "--log-dir", str(log), "--epochs", "1", "--steps", "30", "--commit", "4",
         "--actions", json.dumps([{"step": 5, "do": "term", "rank": 0, "signal": "SIGINT"}])],
        env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 75, proc.stderr[-3000:]
    (steps_file,) = [n for n in os.listdir(out) if n.startswith("steps_")]
    assert not [n for n in os.listdir(out) if n.startswith("final_")]  # fit never returned
    ids = [json.loads(line)["id"] for line in open(out / steps_file)]
    (event,) = read_events(str(log))
    assert event["kind"] == "preemption" and event["policy"] == "LeaveOnSignalCallback"
    assert event["after"]["signals"] == ["SIGINT"] and event["after"]["signalled_ranks"] == [0]
    assert event["after"]["workers"] == 0 and event["after"]["exit_code"] == 75
    assert "every worker stops" in event["reason"]
    # The step the agreement came at was the last one run, and none after it.
    assert ids == list(range(ids[-1] + 1)) and 5 <= ids[-1]
    assert event["step"] == ids[-1] + 1 and event["after"]["step_in_epoch"] == ids[-1] + 1


def test_leave_on_signal_and_signal_agreement_refuse_bad_arguments():
    import signal

    from keras_adapt import elastic
    from keras_adapt.callbacks import SignalAgreement

    state = elastic.KerasState(_model())
    with pytest.raises(TypeError, match="state must be an elastic state"):
        elastic.LeaveOnSignalCallback(object())
    with pytest.raises(ValueError, match="check_interval=0 is not valid"):
        elastic.LeaveOnSignalCallback(state, check_interval=0)
    with pytest.raises(ValueError, match="exit_code=0 is not valid.*whole job"):
        elastic.LeaveOnSignalCallback(state, exit_code=0)
    with pytest.raises(ValueError, match="deadline_s=-1 is not valid"):
        elastic.LeaveOnSignalCallback(state, deadline_s=-1)
    with pytest.raises(ValueError, match="signals=\\(\\) is not valid"):
        SignalAgreement("x", signals=())
    with pytest.raises(ValueError, match="name='' is not valid"):
        SignalAgreement("")
    # One process: the agreement names this rank, its signal and time.
    agreement = SignalAgreement("test_signals", signals=(signal.SIGUSR2,))
    agreement.install()
    try:
        assert agreement.agree([1.5]) == ({}, pytest.approx([1.5]))
        os.kill(os.getpid(), signal.SIGUSR2)
        signalled, _ = agreement.agree()
        assert list(signalled) == [0] and signalled[0][0] == "SIGUSR2"
        assert signalled[0][1] == pytest.approx(agreement.signal_time, abs=1e-3)
    finally:
        agreement.remove()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


# -- every worker preempted: PreemptionCheckpoint writes to disk, the same command resumes --

def test_sigterm_to_every_worker_writes_the_checkpoint_and_the_same_command_resumes(
        tmp_path, reference):
    """A PreemptionCheckpoint among elastic.fit's callbacks: SIGTERM to both
    workers mid-epoch (between commits) -> at the agreed step rank 0 writes
    the checkpoint, both exit with 75, a ``preemption`` event; the same
    command again resumes from it at that step and ends with the weights of
    the one-process run over the same global batches."""
    from keras_adapt.callbacks import PreemptionCheckpoint
    from keras_adapt.record.events import read_events

    out, log, ckdir = tmp_path / "out", tmp_path / "log", tmp_path / "ck"
    out.mkdir()
    script, hosts = discovery_script(tmp_path, TWO_HOSTS)
    term_after = 37  # epoch 1 step 7; commits after steps 35 and 39
    actions = [{"step": term_after, "do": "term", "rank": r} for r in (0, 1)]
    # Each action runs once (a marker file in out): the rerun is the same command.
    args = ["--out", out, "--log-dir", log, "--hosts", hosts, "--rule", "keep",
            "--epochs", EPOCHS, "--steps", STEPS, "--commit", COMMIT, "--lr", LR,
            "--checkpoint", ckdir, "--actions", json.dumps(actions)]

    def run(check):
        return horovodrun_elastic("elastic_train.py", args, script, np=2, min_np=1, max_np=2,
                                  timeout=300, check=check)

    cut = run(check=False)
    assert cut.leftover == 0
    # Both workers exited with PreemptionCheckpoint's code; horovodrun fails the job.
    assert cut.returncode != 0
    assert cut.stdout.count("exit with status code 75") == 2, cut.stdout[-3000:]
    assert "exit with status code" not in cut.stdout.replace("exit with status code 75", "")
    assert not [n for n in os.listdir(out) if n.startswith("final_")]
    cut_steps = {}
    for name in os.listdir(out):
        if name.startswith("steps_"):
            steps = [json.loads(line) for line in open(out / name)]
            cut_steps[steps[0]["rank"]] = [s["id"] for s in steps]
    assert sorted(cut_steps) == [0, 1] and cut_steps[0] == cut_steps[1]
    stop = cut_steps[0][-1] + 1  # steps run; all of them must be in the checkpoint
    assert cut_steps[0] == list(range(stop))
    (event,) = read_events(str(log))
    assert event["kind"] == "preemption" and event["policy"] == "PreemptionCheckpoint"
    assert event["rank"] == 0 and event["step"] == stop
    after = event["after"]
    assert after["signalled_ranks"] == [0, 1] and after["signals"] == ["SIGTERM", "SIGTERM"]
    assert after["exit_code"] == 75 and 0.0 < after["signal_to_disk_s"] < 25.0
    assert term_after < stop <= term_after + after["check_interval"]
    assert (after["epoch"], after["step_in_epoch"]) == divmod(stop, STEPS)
    # On disk, in PreemptionCheckpoint's format, at exactly that step: no step lost.
    ckpt = PreemptionCheckpoint(ckdir)
    assert ckpt.checkpoints() == [str(ckdir / f"ckpt-{stop}")] == [after["checkpoint"]]
    meta = ckpt.read_meta(ckpt.checkpoints()[0])
    assert (meta["epoch"], meta["step_in_epoch"], meta["step"], meta["workers"]) == (
        *divmod(stop, STEPS), stop, 2)

    again = run(check=True)
    assert again.leftover == 0
    finals = [json.load(open(out / n)) for n in sorted(os.listdir(out)) if n.startswith("final_")]
    finals.sort(key=lambda r: r["rank"])
    assert [f["rank"] for f in finals] == [0, 1]
    for final in finals:
        _assert_finished(final)
        # The rerun starts at the stop step: no step twice, none skipped.
        assert _ids(final) == list(range(stop, TOTAL)) and final["restores"] == 0
        assert final["steps"][0]["iterations"] == stop + 1
    assert finals[0]["weights"] == finals[1]["weights"]
    resume = read_events(str(log))[1:]
    assert [e["kind"] for e in resume] == ["resume"] and resume[0]["rank"] == 0
    assert (resume[0]["step"], resume[0]["after"]["epoch"], resume[0]["after"]["step_in_epoch"],
            resume[0]["after"]["checkpoint"]) == (stop, *divmod(stop, STEPS), after["checkpoint"])
    # The same global batches as the uninterrupted one-process run, to the
    # tolerance of the preemption tests (measured: 2.4e-7).
    diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
               for g, w in zip(finals[0]["weights"], reference["weights"]))
    for got, want in zip(finals[0]["weights"], reference["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    print(f"whole-job preemption: signal after step {term_after}, stopped at {stop} "
          f"(0 steps lost), signal to checkpoint on disk {after['signal_to_disk_s']:.3f} s, "
          f"max |w - reference| {diff:.2e}")


def test_a_preemption_checkpoint_under_elastic_refuses_what_cannot_work(tmp_path):
    """Each combination that cannot work fails in elastic.fit before any step."""
    from keras_adapt import elastic
    from keras_adapt.callbacks import PreemptionCheckpoint

    state = elastic.KerasState(_model())
    x, y = _data()

    def data(epoch, batch):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

    def fit(callbacks):
        elastic.fit(state, data, epochs=1, steps_per_epoch=3, callbacks=callbacks, verbose=0)

    with pytest.raises(ValueError, match="exit_code=None .*cannot work under elastic"):
        fit([PreemptionCheckpoint(tmp_path, save_freq=None, exit_code=None)])
    ckpt = PreemptionCheckpoint(tmp_path, save_freq=None)
    with pytest.raises(ValueError, match="2 PreemptionCheckpoint callbacks given"):
        fit([ckpt, PreemptionCheckpoint(tmp_path, save_freq=None)])
    with pytest.raises(ValueError, match=r"LeaveOnSignalCallback\(state, \.\.\., checkpoint=ckpt"):
        fit([ckpt, elastic.LeaveOnSignalCallback(state)])
    with pytest.raises(TypeError, match="checkpoint must be a keras_adapt.callbacks.Preemption"):
        elastic.LeaveOnSignalCallback(state, checkpoint=str(tmp_path))
    assert int(state.model.optimizer.iterations.numpy()) == 0 and not os.listdir(tmp_path)
    # Given to the leave callback, or handed over by fit: one agreement.
    fit([ckpt, elastic.LeaveOnSignalCallback(state, checkpoint=ckpt)])
    assert int(state.model.optimizer.iterations.numpy()) == 3
    assert (state.epoch, state.batch) == (1, 0)
    assert ckpt.checkpoints() == [] and ckpt.events == []  # no signal: nothing written


def test_periodic_checkpoints_under_elastic_are_written_after_the_commits_at_their_steps(
        tmp_path):
    """save_freq=2 under elastic.fit (one process): a commit at every second
    update, then rank 0 writes the committed position; "epoch": after the
    commit at each epoch's end. The files hold exactly those positions."""
    import tensorflow as tf

    from keras_adapt import elastic
    from keras_adapt.callbacks import PreemptionCheckpoint
    from keras_adapt.elastic import disk_checkpoint

    model = _model()
    state = elastic.KerasState(model)
    x, y = _data()

    def data(epoch, batch):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

    every = PreemptionCheckpoint(tmp_path / "every", save_freq=2)
    commit = elastic.CommitStateCallback(state, batches_per_commit=100)
    elastic.fit(state, data, epochs=2, steps_per_epoch=5, callbacks=[every, commit], verbose=0)
    # Updates 2, 4 | 6, 8, 10 (epoch ends: 5 and 10); commits at those and the epoch ends.
    saved = [(e["step"], e["after"]["epoch"], e["after"]["step_in_epoch"]) for e in every.events]
    assert saved == [(2, 0, 2), (4, 0, 4), (6, 1, 1), (8, 1, 3), (10, 2, 0)]
    assert commit.commits == 6  # the five above and the end of the first epoch
    assert every.checkpoints() == [str(tmp_path / "every" / "ckpt-8"),
                                   str(tmp_path / "every" / "ckpt-10")]
    meta = every.read_meta(every.checkpoints()[0])
    assert (meta["epoch"], meta["step_in_epoch"], meta["step"], meta["workers"]) == (1, 3, 8, 1)
    # The newest holds the final weights and position: a fresh job resumes there.
    fresh = elastic.KerasState(_model())
    path = disk_checkpoint.resume(PreemptionCheckpoint(tmp_path / "every", save_freq=2), fresh)
    assert path == every.checkpoints()[-1] and (fresh.epoch, fresh.batch) == (2, 0)
    assert int(fresh.optimizer.iterations.numpy()) == 10
    for got, want in zip(fresh.model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)

    by_epoch = PreemptionCheckpoint(tmp_path / "epoch", max_to_keep=5)  # save_freq="epoch"
    state2 = elastic.KerasState(_model())
    elastic.fit(state2, data, epochs=2, steps_per_epoch=5, callbacks=[by_epoch], verbose=0)
    assert [(e["step"], e["after"]["epoch"], e["after"]["step_in_epoch"])
            for e in by_epoch.events] == [(5, 1, 0), (10, 2, 0)]
    assert [os.path.basename(p) for p in by_epoch.checkpoints()] == ["ckpt-5", "ckpt-10"]
    with pytest.raises(ValueError, match="save_freq=None .*give it save_freq="):
        commit.save_to(PreemptionCheckpoint(tmp_path / "none", save_freq=None))


def _checkpoint_job(tmp_path, name, rule, epochs, np):
    """An elastic job of ``np`` workers over the hosts file in ``tmp_path``
    writing a PreemptionCheckpoint every 25 updates into ``tmp_path / "ck"``
    (events in ``tmp_path / "log"``), resuming from its newest; returns the
    final records of its workers by rank."""
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "discover.sh"
    args = ["--out", out, "--log-dir", tmp_path / "log", "--hosts", tmp_path / "hosts",
            "--rule", rule, "--epochs", epochs, "--steps", STEPS, "--commit", COMMIT, "--lr", LR,
            "--checkpoint", tmp_path / "ck", "--save-freq", 25, "--sleep", 0]
    done = horovodrun_elastic("elastic_train.py", args, str(script), np=np, min_np=1, max_np=2,
                              timeout=300)
    assert done.leftover == 0
    return sorted((json.load(open(out / n)) for n in os.listdir(out) if n.startswith("final_")),
                  key=lambda r: r["rank"])


# The resize rule on resume is stack-neutral; on tf.keras 2, the resume of one
# worker's checkpoint by two (below) runs the checkpoint code.
@pytest.mark.primary_only
def test_periodic_checkpoint_of_two_workers_resumed_by_one_applies_the_resize_rule(
        tmp_path, elastic_reference):
    """Two workers ("scale", rates given for two) write a checkpoint every 25
    updates (save_freq=25: rank 0, right after the commit there); the job
    ends after 2 epochs (60 updates) with its last disk checkpoint at 50.
    The same command on ONE worker to 3 epochs resumes at update 50 with
    the rule applied: half the learning rate, the per-worker batch kept
    (the global batch halves), recorded in the ``resume`` event; its final
    weights are those of one process running the same global batches and
    rates."""
    from concurrent.futures import ThreadPoolExecutor

    from keras_adapt.callbacks import PreemptionCheckpoint
    from keras_adapt.record.events import read_events

    # Updates 0-49: global batch 32 at the rate; from 50: 16 at half the rate.
    pool = ThreadPoolExecutor(1)
    reference = pool.submit(elastic_reference, EPOCHS, STEPS, LR, "scale", "0:2,50:1")
    pool.shutdown(wait=False)
    log, ckdir = tmp_path / "log", tmp_path / "ck"
    _, hosts = discovery_script(tmp_path, TWO_HOSTS)
    two = _checkpoint_job(tmp_path, "two", "scale", 2, 2)
    assert [(f["rank"], f["workers"], f["iterations"]) for f in two] == [(0, 2, 60), (1, 2, 60)]
    assert two[0]["weights"] == two[1]["weights"]
    saves = read_events(str(log))
    assert [(e["kind"], e["rank"], e["step"], e["after"]["epoch"], e["after"]["step_in_epoch"])
            for e in saves] == [("checkpoint", 0, 25, 0, 25), ("checkpoint", 0, 50, 1, 20)]
    ckpt = PreemptionCheckpoint(ckdir)
    assert ckpt.checkpoints() == [str(ckdir / "ckpt-25"), str(ckdir / "ckpt-50")]
    meta = ckpt.read_meta(ckpt.checkpoints()[-1])
    assert (meta["epoch"], meta["step_in_epoch"], meta["step"], meta["workers"]) == (1, 20, 50, 2)
    assert all(s["lr"] == pytest.approx(LR) and s["batch_size"] == 16 for s in two[0]["steps"])

    with open(hosts, "w") as f:
        f.write(ONE_HOST)
    (one,) = _checkpoint_job(tmp_path, "one", "scale", EPOCHS, 1)
    assert (one["workers"], one["epoch"], one["batch"], one["iterations"]) == (1, EPOCHS, 0, TOTAL)
    # From the disk checkpoint at 50: updates 50-59 of the ended job run again.
    assert _ids(one) == list(range(50, TOTAL)) and one["restores"] == 0
    assert one["steps"][0]["iterations"] == 51
    # The rule for 2 -> 1 workers from the first step: linear scaling, half the rate.
    assert {s["batch_size"] for s in one["steps"]} == {16}
    assert {s["workers"] for s in one["steps"]} == {1}
    for s in one["steps"]:
        assert s["lr"] == pytest.approx(LR / 2, rel=1e-6)
    resume, periodic = read_events(str(log))[2:]
    assert resume["kind"] == "resume" and resume["rank"] == 0 and resume["step"] == 50
    assert resume["after"]["checkpoint"] == str(ckdir / "ckpt-50")
    assert (resume["before"]["workers"], resume["after"]["workers"]) == (2, 1)
    assert (resume["before"]["global_batch"], resume["after"]["global_batch"]) == (32, 16)
    assert (resume["before"]["batch_size"], resume["after"]["batch_size"]) == (16, 16)
    assert (resume["before"]["lr"], resume["after"]["lr"]) == pytest.approx((LR, LR / 2))
    assert resume["after"]["lr_factor"] == 0.5
    # The one-worker job goes on writing its own periodic checkpoints.
    assert (periodic["kind"], periodic["step"]) == ("checkpoint", 75)
    assert ckpt.read_meta(ckpt.checkpoints()[-1])["workers"] == 1
    _assert_weights(one, reference.result())
    diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
               for g, w in zip(one["weights"], reference.result()["weights"]))
    print(f"2 workers saved at 25 and 50; 1 worker resumed at 50 with lr {one['lr']:.4f} "
          f"(x{resume['after']['lr_factor']}), global batch 32 -> 16, "
          f"max |w - reference| {diff:.2e}")


@pytest.fixture(scope="module")
def one_then_two(tmp_path_factory, elastic_reference):
    """For each rule ("keep", "scale"): one worker writes a disk checkpoint
    every 25 updates and its job ends after 2 epochs (60 updates), its last
    checkpoint at 50; then the same command on two workers to 3 epochs.
    Both rules' jobs run at the same time, beside the one-process
    references (each job's result is its steps and weights, not its
    timing). Returns, per rule, the jobs' final records and events and the
    reference weights."""
    from concurrent.futures import ThreadPoolExecutor

    from keras_adapt.record.events import read_events

    def chain(rule):
        base = tmp_path_factory.mktemp(f"one_then_two_{rule}")
        _, hosts = discovery_script(base, ONE_HOST)
        (one,) = _checkpoint_job(base, "one", rule, 2, 1)
        saves = read_events(str(base / "log"))
        with open(hosts, "w") as f:
            f.write(TWO_HOSTS)
        two = _checkpoint_job(base, "two", rule, EPOCHS, 2)
        return {"base": base, "one": one, "saves": saves, "two": two,
                "events": read_events(str(base / "log"))[len(saves):]}

    with ThreadPoolExecutor(4) as pool:
        # "keep": the global batches never change; "scale": 16 at half the
        # rate for updates 0-49, 32 at the rate from 50.
        references = {"keep": pool.submit(elastic_reference, EPOCHS, STEPS, LR),
                      "scale": pool.submit(elastic_reference, EPOCHS, STEPS, LR, "scale",
                                           "0:1,50:2")}
        runs = dict(zip(references, pool.map(chain, references)))
    for rule, run in runs.items():
        run["reference"] = references[rule].result()
    return runs


@pytest.mark.parametrize("rule", ["keep", "scale"])
def test_periodic_checkpoint_of_one_worker_resumed_by_two_applies_the_resize_rule(
        one_then_two, rule):
    """The two workers resume at update 50 with the rule for 1 -> 2 workers:
    "keep" halves the per-worker batch (the global batch of 32 stays),
    "scale" (rates given for two workers) keeps 16 per worker and doubles
    the rate (factor 0.5 -> 1, global batch 16 -> 32). Updates 50-89 run
    once each on both ranks, which end identical, with the weights of a
    one-process run of the same global batches and rates."""
    from keras_adapt.callbacks import PreemptionCheckpoint

    run = one_then_two[rule]
    ckdir = run["base"] / "ck"
    per_worker = {"keep": {1: 32, 2: 16}, "scale": {1: 16, 2: 16}}[rule]
    lr = {"keep": {1: LR, 2: LR}, "scale": {1: LR / 2, 2: LR}}[rule]
    one = run["one"]
    assert (one["workers"], one["iterations"]) == (1, 60)
    assert {s["batch_size"] for s in one["steps"]} == {per_worker[1]}
    for s in one["steps"]:
        assert s["lr"] == pytest.approx(lr[1], rel=1e-6)
    assert [(e["kind"], e["step"], e["after"]["epoch"], e["after"]["step_in_epoch"])
            for e in run["saves"]] == [("checkpoint", 25, 0, 25), ("checkpoint", 50, 1, 20)]
    ckpt = PreemptionCheckpoint(ckdir)
    assert ckpt.read_meta(str(ckdir / "ckpt-50"))["workers"] == 1

    two = run["two"]
    assert [(f["rank"], f["workers"]) for f in two] == [(0, 2), (1, 2)]
    for final in two:
        _assert_finished(final)
        # From the disk checkpoint at 50: updates 50-59 of the ended job run
        # again, every later one once; no rollback.
        assert _ids(final) == list(range(50, TOTAL)) and final["restores"] == 0
        assert final["steps"][0]["iterations"] == 51
        assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, per_worker[2])}
        for s in final["steps"]:
            assert s["lr"] == pytest.approx(lr[2], rel=1e-6)
    assert two[0]["weights"] == two[1]["weights"] and two[0]["optimizer"] == two[1]["optimizer"]
    # Updates 0-49 on one worker, 50-89 on two: the one-process run of the
    # same global batches and rates.
    _assert_weights(two[0], run["reference"])
    resume, periodic = run["events"]
    assert resume["kind"] == "resume" and resume["rank"] == 0 and resume["step"] == 50
    assert resume["after"]["checkpoint"] == str(ckdir / "ckpt-50")
    assert (resume["before"]["workers"], resume["after"]["workers"]) == (1, 2)
    assert (resume["before"]["batch_size"], resume["after"]["batch_size"]) == (
        per_worker[1], per_worker[2])
    assert (resume["before"]["global_batch"], resume["after"]["global_batch"]) == (
        per_worker[1], 2 * per_worker[2])
    assert (resume["before"]["lr"], resume["after"]["lr"]) == pytest.approx((lr[1], lr[2]))
    assert resume["after"].get("lr_factor") == {"keep": None, "scale": 1.0}[rule]
    # The two-worker job goes on writing its own periodic checkpoints.
    assert (periodic["kind"], periodic["step"]) == ("checkpoint", 75)
    assert ckpt.read_meta(ckpt.checkpoints()[-1])["workers"] == 2
    diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
               for g, w in zip(two[0]["weights"], run["reference"]["weights"]))
    print(f"{rule}: 1 worker saved at 25 and 50; 2 workers resumed at 50, per-worker batch "
          f"{per_worker[1]} -> {per_worker[2]}, lr {lr[1]:.4f} -> {resume['after']['lr']:.4f}, "
          f"max |w - reference| {diff:.2e}")


def test_a_checkpoint_of_two_workers_resumed_by_one_keeps_the_global_batch_of_its_dataset():
    """ "keep" with an AdaptiveBatchDataset and a GlobalBatchSize: the data
    position restored from a two-worker checkpoint holds its micro-batch of
    16; rescale_from(2) gives the one worker the whole global batch of 32."""
    from keras_adapt import elastic
    from keras_adapt.actuators import GlobalBatchSize
    from keras_adapt.data import AdaptiveBatchDataset

    x, y = _data(128)
    model = _model(lr=0.04)
    ds = AdaptiveBatchDataset(x, y, micro_batch_size=32, num_workers=1, rank=0, shuffle=False)
    batch = GlobalBatchSize(model, dataset=ds, max_micro_batch_size=32)
    state = elastic.KerasState(model, rule=elastic.ResizeRule("keep", global_batch=32),
                               dataset=ds)
    assert state.rescale_from(1) == {"before": {}, "after": {}}  # the same count: nothing
    ds.micro_batch_size = 16  # as restored: each of two workers took 16
    out = state.rescale_from(2)
    assert (ds.micro_batch_size, batch.workers, batch.value, state.batch_size) == (32, 1, 32, 32)
    assert (out["before"]["global_batch"], out["after"]["global_batch"]) == (32, 32)
    assert (out["before"]["batch_size"], out["after"]["batch_size"]) == (16, 32)
    assert out["after"]["lr"] == pytest.approx(0.04)
    with pytest.raises(ValueError, match="before=0 is not valid"):
        state.rescale_from(0)
