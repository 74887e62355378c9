"""Gradient compression switched while training runs, and the policy that switches it.

Two real workers (horovodrun, Gloo), every collective delayed 60 ms
(KERAS_ADAPT_COLLECTIVE_DELAY_MS) so that the transfer is most of a step
on any load. Every update is checked against numpy's mean gradient: float32
steps to float32 precision, float16 steps to float16's, and the gradient a
float16 step applied is float16 (it travelled as such); the switch never
retraces.
"""

import json
import os

import numpy as np
import pytest

from conftest import horovodrun, load_rank_results

DIM, BATCH, LR = 32, 64, 2.0 ** -4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("compression")
    old = os.environ.get("KERAS_ADAPT_COLLECTIVE_DELAY_MS")
    os.environ["KERAS_ADAPT_COLLECTIVE_DELAY_MS"] = "60"
    try:
        horovodrun("compression_checks.py", ["--out", out, "--log_dir", out / "logs"], np=2,
                   timeout=600)
    finally:
        if old is None:
            del os.environ["KERAS_ADAPT_COLLECTIVE_DELAY_MS"]
        else:
            os.environ["KERAS_ADAPT_COLLECTIVE_DELAY_MS"] = old
    return out, load_rank_results(out, 2)


def _data(r):  # as tests/workers/compression_checks.py makes it
    rng = np.random.default_rng(100 + r)
    x = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    y = (x @ rng.standard_normal((DIM, 1)) + rng.standard_normal((BATCH, 1))).astype(np.float32)
    return x.astype(np.float64), y.astype(np.float64)


def _mean_gradient(w):
    """d/dw of the MSE of x @ w, averaged over the two ranks' batches."""
    grads = []
    for r in (0, 1):
        x, y = _data(r)
        grads.append(2.0 / BATCH * x.T @ (x @ w[:, None] - y))
    return np.mean(grads, axis=0).ravel()


def test_the_switch_changes_what_travels_without_a_retrace(results):
    _, (r0, r1) = results
    assert r0["switch"]["weights"] == r1["switch"]["weights"]  # equal across ranks, exactly
    modes = r0["switch"]["modes"]
    assert modes == ["none"] * 3 + ["fp16"] * 3 + ["none"] * 4
    traces = r0["switch"]["traces"]  # the model's traces so far, after each step
    assert traces == [traces[0]] * len(modes), traces  # none after the first step's
    assert r0["switch"]["saved_state"] == "none"  # what a checkpoint saves after step 6
    weights = np.asarray(r0["switch"]["weights"], dtype=np.float64)
    for step, mode in enumerate(modes):
        applied = (weights[step] - weights[step + 1]) / LR
        truth = _mean_gradient(weights[step])
        # w - LR * g rounds to float32: |error of applied| <= ulp(w) / LR
        slack = 4 * np.spacing(np.float32(np.abs(weights[step]).max())) / LR
        as_fp16 = applied.astype(np.float16).astype(np.float64)
        if mode == "fp16":
            np.testing.assert_allclose(applied, truth, rtol=2e-3, atol=slack + 1e-3)
            assert np.abs(applied - as_fp16).max() <= slack, (step, applied - as_fp16)
        else:
            np.testing.assert_allclose(applied, truth, rtol=1e-5, atol=slack)
            # a float32 gradient is almost never a float16 number
            assert np.mean(np.abs(applied - as_fp16) > slack) > 0.5, step


def test_the_policy_sends_fp16_when_the_transfer_dominates_and_records_it(results):
    out, (r0, r1) = results
    events = [{k: v for k, v in e.items() if k not in ("wall_time", "rank")}
              for e in r0["policy"]["events"]]
    assert events == [{k: v for k, v in e.items() if k not in ("wall_time", "rank")}
                      for e in r1["policy"]["events"]]
    assert r0["policy"]["weights"] == r1["policy"]["weights"]
    # A 60 ms wait per collective against a step of a few ms: one switch, up.
    assert len(events) == 1, events
    (event,) = events
    assert event["kind"] == "communication" and event["policy"] == "CommunicationPolicy"
    assert event["before"] == {"compression": "none"} and event["after"] == {"compression": "fp16"}
    assert "of a step at float32 >= 30%" in event["reason"]
    assert r0["policy"]["mode"] == r1["policy"]["mode"] == "fp16"
    # the monitor measures every 4 updates; two measurements in a row decide
    assert event["step"] % 4 == 0 and 8 <= event["step"] <= 40
    with open(out / "logs" / "adapt_events.jsonl") as f:
        on_disk = [json.loads(line) for line in f]
    assert [{k: v for k, v in e.items() if k not in ("wall_time", "rank")}
            for e in on_disk] == events


def _policy(**kwargs):
    import keras

    import keras_adapt
    from keras_adapt.callbacks import WorkerTimingMonitor
    from keras_adapt.policies import CommunicationPolicy

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    policy = CommunicationPolicy(WorkerTimingMonitor(interval=5), **kwargs)
    policy.set_model(model)
    return policy


def _measured(compute, wait):
    return {"compute_time": list(compute), "wait_time": list(wait)}


def test_the_policy_decides_on_the_float32_share_and_goes_back_when_the_network_recovers():
    policy = _policy(fp16_above=0.3, fp32_below=0.15, patience=2)
    # rank 1 computes 3x longer: rank 0's wait is mostly for it; the transfer
    # is rank 1's wait, 0.01 of a 0.04 step: 25%, below 30%
    policy.on_measurement(_measured([0.010, 0.030], [0.030, 0.010]))
    policy.on_measurement(_measured([0.010, 0.030], [0.030, 0.010]))
    assert policy.compression.mode == "none" and policy.events == []
    # transfer 40%: fp16 after two measurements in a row, not one
    policy.on_measurement(_measured([0.03, 0.03], [0.02, 0.02]))
    assert policy.compression.mode == "none"
    policy.on_measurement(_measured([0.03, 0.03], [0.02, 0.02]))
    assert policy.compression.mode == "fp16"
    (up,) = policy.events
    assert up["kind"] == "communication" and up["after"] == {"compression": "fp16"}
    assert up["reason"].startswith("transfer 40% of a step at float32 >= 30%")
    # at fp16 the same network measures 0.01 / 0.04 = 25%, i.e. 40% at
    # float32: no flip back, however often
    for _ in range(4):
        policy.on_measurement(_measured([0.03, 0.03], [0.01, 0.01]))
    assert policy.compression.mode == "fp16" and len(policy.events) == 1
    # a measurement in the band resets the streak
    policy.on_measurement(_measured([0.03, 0.03], [0.001, 0.001]))
    policy.on_measurement(_measured([0.03, 0.03], [0.004, 0.004]))  # 11.8% -> 21% at float32
    policy.on_measurement(_measured([0.03, 0.03], [0.001, 0.001]))
    assert policy.compression.mode == "fp16"
    policy.on_measurement(_measured([0.03, 0.03], [0.001, 0.001]))  # 3.2% -> 6.3% at float32
    assert policy.compression.mode == "none"
    down = policy.events[-1]
    assert down["before"] == {"compression": "fp16"} and down["after"] == {"compression": "none"}
    assert "(measured 3% at float16) <= 15%" in down["reason"]


@pytest.mark.parametrize("kwargs, message", [
    ({"fp16_above": 1.2}, "fp16_above=1.2 is not a share of a step"),
    ({"fp16_above": 0.0}, "fp16_above"),
    ({"fp32_below": 0.3}, "fp32_below=0.3 must be below fp16_above=0.3"),
    ({"patience": 0}, "patience"),
])
def test_bad_thresholds_are_refused_with_the_fix(kwargs, message):
    from keras_adapt.callbacks import WorkerTimingMonitor
    from keras_adapt.policies import CommunicationPolicy

    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as err:
        CommunicationPolicy(WorkerTimingMonitor(interval=5), **kwargs)
    assert "e.g." in str(err.value) or "use" in str(err.value)


def test_a_checkpoint_restores_the_compression_whatever_the_callbacks_order(tmp_path):
    import keras

    import keras_adapt
    from keras_adapt.actuators import GradientCompression
    from keras_adapt.checkpointing import CheckpointFiles

    def model():
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(keras_adapt.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
        m.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)  # traced, slots built
        return m

    saved = model()
    files = CheckpointFiles(str(tmp_path))
    files.attach(saved)  # before the switch is enabled, as a checkpoint callback listed first
    GradientCompression(saved).set("fp16")
    files.write(1, 0)
    # a new run: the checkpoint is loaded before any policy enabled the switch
    resumed = model()
    again = CheckpointFiles(str(tmp_path))
    again.attach(resumed)
    again.load(*again.latest())
    switch = resumed.optimizer.adapt_state.compression
    # and the train function traced without the switch is dropped
    assert switch.enabled and switch.mode == "fp16" and resumed.train_function is None
    # a run without the switch saves None, which leaves a resumed one alone
    plain = model()
    files = CheckpointFiles(str(tmp_path / "plain"))
    files.attach(plain)
    files.write(1, 0)
    fresh = model()
    files = CheckpointFiles(str(tmp_path / "plain"))
    files.attach(fresh)
    files.load(*files.latest())
    assert not fresh.optimizer.adapt_state.compression.enabled
