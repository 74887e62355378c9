"""PreemptionCheckpoint: a signal stops every worker at the same step, the
checkpoint resumes there, mid-epoch included; damaged checkpoints fall back."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import keras
import keras_adapt
from conftest import BIN, HOROVODRUN, JOB_MARK, WORKERS, _env, controllers, kill_job
from keras_adapt.callbacks import PreemptionCheckpoint
from keras_adapt.coordination import EXIT_CODE
from keras_adapt.record import events


# -- single process -----------------------------------------------------------
def _model(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01), stats_interval=1),
                  "mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 4)).astype("float32")
    return x, (x.sum(1, keepdims=True) + 0.1 * rng.standard_normal((100, 1))).astype("float32")


class _SignalAt(keras.callbacks.Callback):
    """Sends ``sig`` to this process at the end of optimizer step ``step``."""

    def __init__(self, step, sig=signal.SIGTERM):
        super().__init__()
        self.at, self.sig = step, sig

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.at:
            os.kill(os.getpid(), self.sig)


def _state(model):
    opt = model.optimizer
    v = opt.variables() if callable(opt.variables) else opt.variables
    adapt = opt.adapt_state.checkpoint_variables()
    return ([w.copy() for w in model.get_weights()], [np.array(a) for a in v],
            {k: np.array(a.numpy()) for k, a in adapt.items()})


def _assert_same(a, b, atol=0.0):
    for xs, ys in zip(a[:2], b[:2]):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            np.testing.assert_allclose(x, y, rtol=0, atol=atol)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        np.testing.assert_allclose(a[2][k], b[2][k], rtol=1e-12, atol=atol, err_msg=k)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_epoch_resumes_at_that_step_with_the_same_result(tmp_path, sig):
    x, y = _data()
    # 100 samples, batch 8: 12 steps per epoch (4 samples flow into the next pass)
    full = _model()
    PreemptionCheckpoint(tmp_path / "full", exit_code=None).fit(full, x, y, batch_size=8, epochs=3,
                                                                verbose=0)
    assert int(full.optimizer.iterations.numpy()) == 36

    model = _model()
    ckpt = PreemptionCheckpoint(tmp_path / "ck", exit_code=None, log_dir=tmp_path, check_interval=1)
    ckpt.fit(model, x, y, batch_size=8, epochs=3, verbose=0, callbacks=[_SignalAt(17, sig)])
    assert ckpt.preempted and int(model.optimizer.iterations.numpy()) == 17  # no step after it
    stopped = _state(model)
    assert ckpt.position() == (1, 5)  # step 17 = epoch 1 (12 steps) + 5
    assert 0.0 < ckpt.signal_to_disk_s < 30.0
    assert os.path.exists(str(tmp_path / "ck" / "ckpt-17.index"))

    resumed = _model(seed=99)  # other initial weights: everything must come from the checkpoint
    seen = {}

    class Begin(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.setdefault("begin", _state(self.model))

    again = PreemptionCheckpoint(tmp_path / "ck", exit_code=None, log_dir=tmp_path)
    history = again.fit(resumed, x, y, batch_size=8, epochs=3, verbose=0, callbacks=[Begin()])
    _assert_same(seen["begin"], stopped)  # identical weights, slots and keras-adapt state
    assert history.epoch == [1, 2] and len(history.history["loss"]) == 2
    assert int(resumed.optimizer.iterations.numpy()) == 36
    _assert_same(_state(resumed), _state(full), atol=1e-6)
    kinds = [(e["kind"], e["step"], e["after"].get("epoch"), e["after"].get("step_in_epoch"))
             for e in events.read_events(str(tmp_path))]
    assert kinds == [("checkpoint", 12, 1, 0), ("preemption", 17, 1, 5), ("resume", 17, 1, 5),
                     ("checkpoint", 24, 2, 0), ("checkpoint", 36, 3, 0)]
    stop = events.read_events(str(tmp_path))[1]
    assert stop["after"]["signalled_ranks"] == [0] and stop["after"]["exit_code"] is None


def test_signal_at_the_last_step_of_an_epoch_saves_after_the_epoch_end(tmp_path):
    x, y = _data()
    model = _model()
    ckpt = PreemptionCheckpoint(tmp_path, exit_code=None, save_freq=None, check_interval=1)
    ckpt.fit(model, x, y, batch_size=8, epochs=3, verbose=0, callbacks=[_SignalAt(24)])
    assert ckpt.position() == (2, 0) and [os.path.basename(p) for p in ckpt.checkpoints()] == [
        "ckpt-24"]
    resumed = _model()
    history = PreemptionCheckpoint(tmp_path, exit_code=None).fit(resumed, x, y, batch_size=8,
                                                                 epochs=3, verbose=0)
    assert history.epoch == [2] and int(resumed.optimizer.iterations.numpy()) == 36


def test_truncated_newest_checkpoint_warns_and_the_previous_one_is_used(tmp_path):
    x, y = _data()
    full = _model()
    PreemptionCheckpoint(tmp_path / "full", exit_code=None).fit(full, x, y, batch_size=8, epochs=3,
                                                                verbose=0)
    ckpt = PreemptionCheckpoint(tmp_path / "ck", exit_code=None, check_interval=1)
    ckpt.fit(_model(), x, y, batch_size=8, epochs=3, verbose=0, callbacks=[_SignalAt(30)])
    newest = ckpt.checkpoints()[-1]
    assert newest.endswith("ckpt-30")
    data = newest + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    with pytest.warns(RuntimeWarning, match="ckpt-30 cannot be read"):
        assert ckpt.position() == (2, 0)  # the epoch-end checkpoint before it
    resumed = _model(seed=5)
    with pytest.warns(RuntimeWarning, match="ckpt-30"):
        history = PreemptionCheckpoint(tmp_path / "ck", exit_code=None).fit(
            resumed, x, y, batch_size=8, epochs=3, verbose=0)
    assert history.epoch == [2]
    _assert_same(_state(resumed), _state(full), atol=1e-6)


def test_policy_and_accumulation_state_survive_a_preemption(tmp_path):
    from keras_adapt.policies import ScheduledBatchSizePolicy

    x, y = _data()

    def run(callbacks, ckdir, data_seed=0):
        model = _model()
        data = keras_adapt.data.AdaptiveBatchDataset(x, y, micro_batch_size=4, seed=data_seed)
        policy = ScheduledBatchSizePolicy({1: 8, 2: 12}, dataset=data, micro_batch_size=4,
                                          max_micro_batch_size=4)
        ckpt = PreemptionCheckpoint(ckdir, exit_code=None, check_interval=1)
        ckpt.fit(model, data, epochs=3, verbose=0, callbacks=[policy, *callbacks])
        return model, policy, ckpt

    class SignalMidAccumulation(keras.callbacks.Callback):
        """SIGTERM after the first micro-step of an update (k = 3) from update 38 on."""

        at = None

        def on_train_batch_end(self, batch, logs=None):
            acc = self.model.optimizer.adapt_state.accumulation
            it = int(self.model.optimizer.iterations.numpy())
            if self.at is None and it >= 38 and int(acc.count.numpy()) == 1:
                self.at = it
                os.kill(os.getpid(), signal.SIGTERM)

    full, full_policy, _ = run([], tmp_path / "full")
    signal_cb = SignalMidAccumulation()
    model, policy, ckpt = run([signal_cb], tmp_path / "ck")
    assert ckpt.preempted
    acc = model.optimizer.adapt_state.accumulation
    # The stop waited for the end of the update in progress: 2 more micro-steps.
    assert acc.steps_value == 3 and int(acc.count.numpy()) == 0
    assert int(model.optimizer.iterations.numpy()) == signal_cb.at + 1
    resumed, resumed_policy, _ = run([], tmp_path / "ck")
    assert resumed.optimizer.adapt_state.accumulation.steps_value == 3
    assert resumed_policy.get_state() == full_policy.get_state()
    assert [e["kind"] for e in resumed_policy.events][0] == "resume"
    _assert_same(_state(resumed), _state(full), atol=1e-6)


def test_a_periodic_checkpoint_at_an_epochs_last_step_resumes_at_the_next_epoch(tmp_path):
    # 12 steps per epoch, a checkpoint every 12 updates: each falls on an
    # epoch's last step and is stored as the next epoch's start, after the
    # epoch's end callbacks (before: "epoch 0, step 12", which no resume took).
    x, y = _data()
    full = _model()
    PreemptionCheckpoint(tmp_path / "full", exit_code=None, save_freq=None).fit(
        full, x, y, batch_size=8, epochs=3, verbose=0)
    first = PreemptionCheckpoint(tmp_path / "ck", exit_code=None, save_freq=12, log_dir=tmp_path)
    first.fit(_model(), x, y, batch_size=8, epochs=2, verbose=0)  # then the machine is lost
    assert [os.path.basename(p) for p in first.checkpoints()] == ["ckpt-12", "ckpt-24"]
    assert first.position() == (2, 0)
    assert [(e["step"], e["after"]["epoch"], e["after"]["step_in_epoch"])
            for e in events.read_events(str(tmp_path))] == [(12, 1, 0), (24, 2, 0)]
    resumed = _model(seed=7)
    history = PreemptionCheckpoint(tmp_path / "ck", exit_code=None, save_freq=12).fit(
        resumed, x, y, batch_size=8, epochs=3, verbose=0)
    assert history.epoch == [2]
    _assert_same(_state(resumed), _state(full), atol=1e-6)

class _EpochEnds(keras.callbacks.Callback):
    """``(epoch, optimizer updates, learning rate, progress)`` at every epoch end."""

    def __init__(self, policy):
        super().__init__()
        self.policy, self.ends = policy, []

    def on_epoch_end(self, epoch, logs=None):
        opt = self.model.optimizer
        self.ends.append((epoch, int(opt.iterations.numpy()),
                          round(float(np.array(opt.learning_rate)), 8),
                          self.policy.progress.count("progress")))


def _progress_run(ckdir, callbacks=(), epochs=4):
    """Batch 4, 8 from epoch 1, 12 from epoch 2 (micro-batch 4: accumulation
    2 and 3), epochs of one pass's worth of progress (the noise scale
    measured every update enters each update's progress), the rate / 2 at
    epoch 3; returns the model, the epoch ends and the checkpoint callback."""
    from keras_adapt.policies import ScheduledBatchSizePolicy

    x, y = _data()
    model = _model()
    data = keras_adapt.data.AdaptiveBatchDataset(x, y, micro_batch_size=4, seed=0)
    policy = ScheduledBatchSizePolicy({1: 8, 2: 12}, dataset=data, micro_batch_size=4,
                                      max_micro_batch_size=4, epoch_end="progress")
    ends = _EpochEnds(policy)
    halve = keras.callbacks.LearningRateScheduler(lambda e, lr: 0.01 if e < 3 else 0.005)
    ckpt = PreemptionCheckpoint(ckdir, exit_code=None, check_interval=1)
    ckpt.fit(model, data, epochs=epochs, verbose=0,
             callbacks=[policy, halve, ends, *callbacks])
    return model, ends.ends, ckpt, policy


@pytest.fixture(scope="module")
def progress_full(tmp_path_factory):
    """The uninterrupted run of :func:`_progress_run`."""
    model, ends, _, policy = _progress_run(tmp_path_factory.mktemp("full"))
    return _state(model), ends, policy.progress.count("progress")


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_last_step"])
def test_progress_epochs_resume_and_end_where_the_uninterrupted_run_ends_them(
        tmp_path, progress_full, where):
    full_state, full_ends, full_progress = progress_full
    # Epochs end on the policy's count, not on steps: one pass of 100
    # samples is 25 updates at the base batch 4, where progress = samples;
    # each later epoch ends at the first update whose progress reaches the
    # next multiple of 100 (an update at batch B adds at most B).
    assert [e for e, *_ in full_ends] == [0, 1, 2, 3] and full_ends[0][1] == 25
    for epoch, _, _, count in full_ends:
        assert 100 * (epoch + 1) <= count < 100 * (epoch + 1) + 12
    assert full_ends[-1][3] == full_progress
    assert [lr for _, _, lr, _ in full_ends] == [0.01, 0.01, 0.01, 0.005]
    updates = [u for _, u, _, _ in full_ends]
    # SIGTERM mid-epoch 1, or after the update that ends epoch 1
    at = updates[0] + 5 if where == "mid_epoch" else updates[1]
    model, ends, ckpt, _ = _progress_run(tmp_path, [_SignalAt(at)])
    assert ckpt.preempted and int(model.optimizer.iterations.numpy()) == at
    if where == "mid_epoch":
        assert ckpt.position() == (1, 5 * 2)  # 5 updates of 2 micro-steps into epoch 1
        assert ends[0] == full_ends[0] and ends[1][:3] == (1, at, 0.01)  # fit ended it there
        assert ends[1][3] < 200.0
    else:
        # the epoch ended, its end callbacks ran, then the checkpoint: epoch 2 next
        assert ckpt.position() == (2, 0) and ends == full_ends[:2]
    model, ends, _, policy = _progress_run(tmp_path)
    assert [e["kind"] for e in policy.events][0] == "resume"
    # every later epoch ends at the update, the rate and the progress of the
    # uninterrupted run
    assert ends == full_ends[1 if where == "mid_epoch" else 2:]
    _assert_same(_state(model), full_state, atol=1e-6)


def test_bad_arguments_and_inputs_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="max_to_keep=0"):
        PreemptionCheckpoint(tmp_path, max_to_keep=0)
    with pytest.raises(ValueError, match="exit_code=300"):
        PreemptionCheckpoint(tmp_path, exit_code=300)
    with pytest.raises(ValueError, match="deadline_s=-1"):
        PreemptionCheckpoint(tmp_path, deadline_s=-1)
    with pytest.raises(ValueError, match="save_freq='step'"):
        PreemptionCheckpoint(tmp_path, save_freq="step")
    with pytest.raises(ValueError, match="check_interval=0"):
        PreemptionCheckpoint(tmp_path, check_interval=0)
    with pytest.raises(ValueError, match="check_interval='fast'"):
        PreemptionCheckpoint(tmp_path, check_interval="fast")
    import tensorflow as tf

    x, y = _data()
    ckpt = PreemptionCheckpoint(tmp_path)
    with pytest.raises(TypeError, match="cannot save the position of a .*Dataset"):
        ckpt.fit(_model(), tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    with pytest.raises(ValueError, match="instead of model.fit"):
        _model().fit(x, y, epochs=1, verbose=0, callbacks=[ckpt])
    with pytest.raises(ValueError, match="sets steps_per_epoch and initial_epoch"):
        ckpt.fit(_model(), x, y, steps_per_epoch=3)
    # A checkpoint of another stream (other batch size) is refused before training.
    PreemptionCheckpoint(tmp_path / "a", exit_code=None, check_interval=1).fit(
        _model(), x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_SignalAt(3)])
    with pytest.raises(ValueError, match="initial_micro_batch_size=8"):
        PreemptionCheckpoint(tmp_path / "a", exit_code=None).fit(_model(), x, y, batch_size=16,
                                                                 epochs=1, verbose=0)
    # A checkpoint without part of this run's state (written without gradient
    # statistics, or by a keras-adapt with another layout of them) is refused by name.
    other = _model()
    other.compile(keras_adapt.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                   gradient_stats=False), "mse")
    PreemptionCheckpoint(tmp_path / "b", exit_code=None, check_interval=1).fit(
        other, x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_SignalAt(3)])
    with pytest.raises(ValueError, match=r"ckpt-3 does not hold all of this run's state.*"
                                         r"gradient_stats"):
        PreemptionCheckpoint(tmp_path / "b", exit_code=None).fit(_model(), x, y, batch_size=8,
                                                                 epochs=1, verbose=0)


_DEADLINE_SCRIPT = """
import os, signal, time, numpy as np, keras, keras_adapt
from keras_adapt.callbacks import PreemptionCheckpoint
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(600)  # a step far longer than the deadline and the test's timeout
            print("the slow step ended", flush=True)
ckpt = PreemptionCheckpoint({d!r}, deadline_s=1.0, save_freq=None)
x = np.ones((64, 2), "float32")
ckpt.fit(model, x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[Slow()])
"""


def test_deadline_passed_exits_with_the_code_and_no_new_checkpoint(tmp_path):
    script = _DEADLINE_SCRIPT.format(d=str(tmp_path / "ck"))
    # The slow step lasts 600 s: a run that waited for it would hit the timeout.
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == EXIT_CODE, proc.stderr[-3000:]
    assert "no checkpoint within deadline_s=1.0 s of SIGTERM" in proc.stderr
    assert "the slow step ended" not in proc.stdout
    assert PreemptionCheckpoint(tmp_path / "ck").checkpoints() == []


# -- two workers ----------------------------------------------------------------
def _launch(out, ckdir, controller, extra=()):
    cmd = [*HOROVODRUN, "-np", "2", "-H", "localhost:2", f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe"]
    cmd += [sys.executable, os.path.join(WORKERS, "preemption_checks.py"), "--out", str(out),
            "--dir", str(ckdir), *extra]
    env = _env()
    env[JOB_MARK] = f"{os.getpid()}-{time.monotonic_ns()}"  # every process of the job has it
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    proc.mark = env[JOB_MARK]
    return proc


def _finish(proc, timeout=240):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc.mark)
        out, err = proc.communicate()
        pytest.fail(f"job timed out\n{out[-4000:]}\n{err[-4000:]}")
    return proc.returncode, out, err


def _stop(proc):
    """Kills every process of the job (launcher and workers) still running."""
    kill_job(proc.mark)
    if proc.returncode is None:
        proc.communicate()


def _read(path):
    with open(path) as f:
        return json.load(f)


def _wait_for_step(out, rank, step, proc, timeout=300):
    path = os.path.join(out, f"progress{rank}")
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            pytest.fail("the job ended before the signal: " + proc.stderr.read()[-4000:])
        try:
            with open(path) as f:
                if int(f.read() or 0) >= step:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    kill_job(proc.mark)
    pytest.fail(f"rank {rank} did not reach step {step} in {timeout}s")


@pytest.fixture(scope="module", params=controllers(mpi="primary"))
def runs(request, tmp_path_factory):
    """The job cut by SIGTERM to one worker under each controller; under
    Gloo also the uninterrupted job and the two resumptions (of the
    checkpoint, and of a copy whose newest checkpoint is truncated). How a
    signal reaches the workers and how the launcher reports their exit
    differ under mpirun; the resumption is the same code under both, so it
    runs once (the tests that read it take only Gloo)."""
    controller = request.param
    base = tmp_path_factory.mktemp(f"preempt_{controller}")
    if not os.path.exists(os.path.join(BIN, "horovodrun")):
        pytest.skip("horovodrun is not installed in this environment")
    # 640 samples, 2 workers, batch 8: 40 steps per epoch, 3 epochs. Jobs
    # that do not depend on each other run at the same time (the uninterrupted
    # one beside the one cut by the signal, then the two resumptions): each
    # job's result is its steps and weights, not its timing.
    resumes = controller == "gloo"
    if resumes:
        full = _launch(base / "full", base / "full_ck", controller)
        request.addfinalizer(lambda: _stop(full))  # a failure below leaves no job behind
    proc = _launch(base / "cut", base / "ck", controller, ["--sleep", "0.03"])
    _wait_for_step(base / "cut", 1, 52, proc)
    pid = int(open(base / "cut" / "pid1").read())
    os.kill(pid, signal.SIGTERM)  # one worker only
    rc, out, err = _finish(proc)
    cut_rc, cut_err = rc, err
    cut_files = sorted(os.listdir(base / "ck"))
    # The damaged copy: the newest checkpoint truncated, as by a crash mid-copy.
    shutil.copytree(base / "ck", base / "ck_bad")
    bad_newest = PreemptionCheckpoint(base / "ck_bad").checkpoints()[-1]
    data = bad_newest + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 7)
    cut = {"base": base, "cut_rc": cut_rc, "cut_err": cut_err, "cut_files": cut_files,
           "bad_newest": bad_newest}
    if not resumes:
        return cut
    resumed = _launch(base / "resumed", base / "ck", controller)
    fallback = _launch(base / "fallback", base / "ck_bad", controller)
    request.addfinalizer(lambda: _stop(resumed) or _stop(fallback))
    for job in (full, resumed):
        rc, out, err = _finish(job)
        assert rc == 0, err[-4000:]
    rc, _, bad_err = _finish(fallback)
    assert rc == 0, bad_err[-4000:]
    return {**cut, "bad_err": bad_err}


def _all(runs, name, phase):
    return [_read(runs["base"] / name / f"{phase}{r}.json") for r in (0, 1)]


def test_sigterm_to_one_worker_stops_both_at_the_same_step_with_the_documented_code(runs):
    stop = _all(runs, "cut", "stop")
    assert stop[0]["iterations"] == stop[1]["iterations"] >= 52
    assert stop[0]["weights"] == stop[1]["weights"]
    # Each worker exits with EXIT_CODE; horovodrun reports it and exits 1.
    assert runs["cut_rc"] != 0 and re.search(rf"Exit code:\s+{EXIT_CODE}\n", runs["cut_err"])
    step = stop[0]["iterations"]
    # On disk when the job ended, listed last (the later runs rotate it out, max_to_keep=2).
    # (and before it the last epoch-end checkpoint: steps 40, 80, ...; 40 steps an epoch)
    previous = 40 * ((step - 1) // 40)
    assert runs["cut_files"] == sorted([
        "checkpoint", f"ckpt-{previous}.data-00000-of-00001", f"ckpt-{previous}.index",
        f"ckpt-{step}.data-00000-of-00001", f"ckpt-{step}.index"])
    assert runs["bad_newest"] == str(runs["base"] / "ck_bad" / f"ckpt-{step}")
    cut_events = events.read_events(str(runs["base"] / "cut"))
    assert [e["kind"] for e in cut_events] == ["checkpoint"] * (previous // 40) + ["preemption"]
    pre = cut_events[-1]
    assert pre["step"] == step and pre["after"]["signalled_ranks"] == [1]
    assert (pre["after"]["epoch"], pre["after"]["step_in_epoch"]) == divmod(step, 40)
    assert pre["after"]["exit_code"] == EXIT_CODE
    assert 0.0 < stop[1]["signal_to_disk_s"] < 10.0


@pytest.mark.parametrize("runs", ["gloo"], indirect=True)
def test_rerun_resumes_at_that_step_with_identical_state_and_finishes_like_an_uninterrupted_run(
        runs):
    stop, begin = _all(runs, "cut", "stop"), _all(runs, "resumed", "begin")
    for r in (0, 1):
        assert begin[r]["iterations"] == stop[r]["iterations"]
        assert begin[r]["weights"] == stop[r]["weights"]
        assert begin[r]["optimizer"] == stop[r]["optimizer"]
        assert begin[r]["adapt"] == stop[r]["adapt"]
        assert begin[r]["produced"] == stop[r]["produced"] == stop[r]["iterations"]
    final, full = _all(runs, "resumed", "final"), _all(runs, "full", "final")
    assert final[0]["iterations"] == full[0]["iterations"] == 120
    for r in (0, 1):
        for a, b in zip(final[r]["weights"], full[r]["weights"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        for a, b in zip(final[r]["optimizer"], full[r]["optimizer"]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    resumed = events.read_events(str(runs["base"] / "resumed"))
    assert resumed[0]["kind"] == "resume" and resumed[0]["step"] == stop[0]["iterations"]


@pytest.mark.parametrize("runs", ["gloo"], indirect=True)
def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(runs):
    name = os.path.basename(runs["bad_newest"])
    assert f"{name} cannot be read" in runs["bad_err"]
    fallback = events.read_events(str(runs["base"] / "fallback"))
    stopped = _all(runs, "cut", "stop")[0]["iterations"]
    assert fallback[0]["kind"] == "resume"  # from the epoch-end checkpoint before
    assert fallback[0]["after"]["step_in_epoch"] == 0
    assert fallback[0]["step"] == 40 * ((stopped - 1) // 40)
    final, full = _all(runs, "fallback", "final"), _all(runs, "full", "final")
    for a, b in zip(final[0]["weights"], full[0]["weights"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def progress_runs(tmp_path_factory):
    """Two workers, epochs that a policy ends on its progress (Gloo): the
    uninterrupted job beside the one cut by SIGTERM to one worker in epoch
    1, then the same command resuming the cut one."""
    base = tmp_path_factory.mktemp("preempt_progress")
    if not os.path.exists(os.path.join(BIN, "horovodrun")):
        pytest.skip("horovodrun is not installed in this environment")
    full = _launch(base / "full", base / "full_ck", "gloo", ["--progress"])
    cut = _launch(base / "cut", base / "ck", "gloo", ["--progress", "--sleep", "0.03"])
    try:
        _wait_for_step(base / "cut", 1, 52, cut)
        os.kill(int(open(base / "cut" / "pid1").read()), signal.SIGTERM)
        rc, _, err = _finish(cut)
        assert rc != 0 and re.search(rf"Exit code:\s+{EXIT_CODE}\n", err), err[-4000:]
        resumed = _launch(base / "resumed", base / "ck", "gloo", ["--progress"])
        try:
            for job in (full, resumed):
                rc, _, err = _finish(job)
                assert rc == 0, err[-4000:]
        finally:
            _stop(resumed)
    finally:
        _stop(full)
        _stop(cut)
    return base


def test_two_workers_resume_epochs_that_a_policy_ends_where_the_uninterrupted_job_ends_them(
        progress_runs):
    read = lambda name, phase: [_read(progress_runs / name / f"{phase}{r}.json") for r in (0, 1)]
    full, stop = read("full", "final"), read("cut", "stop")
    begin, final = read("resumed", "begin"), read("resumed", "final")
    # Both ranks count the same progress and end the same epochs: one pass
    # (640) at the base batch 16 is 40 updates; each later epoch ends at the
    # first update whose progress reaches the next multiple of 640 (an update
    # at batch B adds at most B = 32 or 48).
    assert full[0]["epoch_ends"] == full[1]["epoch_ends"]
    ends = full[0]["epoch_ends"]
    assert [e for e, _, _ in ends] == [0, 1, 2] and ends[0][1] == 40
    for epoch, _, count in ends:
        assert 640 * (epoch + 1) <= count < 640 * (epoch + 1) + 48
    # SIGTERM to one worker in epoch 1: both stop at the same update, and the
    # resumed job starts from exactly that state, its progress included
    at = stop[0]["iterations"]
    assert stop[1]["iterations"] == at and ends[0][1] < at < ends[1][1]
    # (the stop ended fit's epoch 1 there, before its progress ends it)
    assert stop[0]["epoch_ends"] == ends[:1] + [[1, at, stop[0]["progress"]]]
    assert stop[0]["progress"] < 1280
    for r in (0, 1):
        assert begin[r]["iterations"] == at
        assert begin[r]["weights"] == stop[r]["weights"]
        assert begin[r]["adapt"] == stop[r]["adapt"]
        assert begin[r]["progress"] == stop[r]["progress"] == stop[0]["progress"]
    # it ends epochs 1 and 2 at the updates and the progress of the
    # uninterrupted job (bit for bit), with its weights
    for r in (0, 1):
        assert final[r]["epoch_ends"] == ends[1:]
        for a, b in zip(final[r]["weights"], full[r]["weights"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert final[0]["weights"] == final[1]["weights"]
