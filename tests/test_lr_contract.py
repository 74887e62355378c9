"""One learning-rate contract on both stacks, checked on the rate each update
applied (tests/workers/lr_contract_checks.py says how it is read): whatever
sets the rate -- Keras' ``LearningRateScheduler`` with either schedule form,
``ReduceLROnPlateau``, ``optimizer.learning_rate = x`` and ``.assign(x)``,
keras-adapt's warm-up and schedule callbacks -- sets the base rate, the
factor of keras-adapt's learning-rate control stays on top, reading
``optimizer.learning_rate`` gives the base rate, and what keras-adapt logs as
``lr`` (the callbacks' logs, ``adapt/lr``) is base x factor."""

import sys

import numpy as np
import pytest

import keras
import keras_adapt
from keras_adapt.callbacks import AdaptTensorBoard
from keras_adapt.optimizer import set_base_learning_rate
from keras_adapt.record import metadata, reader

import tensorboard_loaders
from conftest import WORKERS, horovodrun, load_rank_results

sys.path.insert(0, WORKERS)
try:
    import lr_contract_checks as checks
finally:
    sys.path.remove(WORKERS)


@pytest.mark.parametrize("sgd", checks.sgd_classes(), ids=lambda c: c.__module__)
@pytest.mark.parametrize("name", sorted(checks.SCENARIOS))
def test_every_setter_sets_the_base_rate_under_the_factor(name, sgd):
    result = checks.run(name, sgd)
    assert len(result["applied"]) == checks.EPOCHS * checks.STEPS
    checks.check(name, result)


@pytest.mark.parametrize("sgd", checks.sgd_classes(), ids=lambda c: c.__module__)
def test_the_update_reads_the_factor_when_run_eagerly_too(sgd):
    # The update is not traced here: the rule keys on the update, not on graph mode.
    checks.check("scheduler_relative", checks.run("scheduler_relative", sgd, run_eagerly=True))


def test_the_issue_script_trains_alike_on_both_stacks():
    # The absolute schedule next to a factor of 4: 0.08 then 0.008, not what
    # the schedule returns (0.02, 0.002).
    applied = checks.run("scheduler_absolute")["applied"]
    steps = checks.STEPS
    np.testing.assert_allclose(applied[:steps], [0.08] * steps, rtol=1e-6)
    np.testing.assert_allclose(applied[steps:], [0.008] * (len(applied) - steps), rtol=1e-6)


def test_adapt_tensorboard_writes_the_effective_rate(tmp_path):
    # Written after every update: the rate of the update just made (the base
    # changes only at epoch starts, the factor is constant); on tf.keras 2
    # the scheduler's own logs "lr" holds the base rate, which is not taken.
    log_dir = str(tmp_path / "run")
    result = checks.run("scheduler_absolute", extra_callbacks=[
        AdaptTensorBoard(log_dir, update_freq=1, batch_size=checks.BATCH, step_times=False)])
    provider, stop = tensorboard_loaders.provider("python", str(tmp_path), expect_runs=["run"])
    try:
        series = reader.read_series(provider, None, "", "run")
    finally:
        stop()
    written = {step: value for step, _, value in series[metadata.SCALAR_TAGS["lr"]]}
    assert sorted(written) == list(range(1, checks.EPOCHS * checks.STEPS + 1))
    np.testing.assert_allclose([written[k] for k in sorted(written)], result["applied"], rtol=1e-6)


def test_a_schedule_cannot_be_set_on_either_stack():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    for sgd in checks.sgd_classes():
        opt = keras_adapt.DistributedOptimizer(sgd(schedule))
        with pytest.raises(ValueError, match="LearningRateSchedule"):
            set_base_learning_rate(opt, 0.1)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("lr_contract")
    horovodrun("lr_contract_checks.py", ["--out", out], np=2)
    return load_rank_results(out, 2)


def test_two_workers_keep_the_contract(two_workers):
    # The warm-up really warms up here (from lr / 2), under the factor.
    for r in two_workers:
        assert r["size"] == 2
        for name, result in r["results"].items():
            checks.check(name, result)
        assert r["results"]["keras_adapt_warmup"]["applied"][0] == pytest.approx(
            checks.LR0 / 2 * (1 + 1 / checks.STEPS / 2) * checks.FACTOR, rel=1e-6)
    assert two_workers[0]["results"] == two_workers[1]["results"]
