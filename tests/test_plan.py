"""``keras-adapt plan``: predictions and costs against independently computed truth.

The synthetic run is written with the project's own writers
(``record.summary`` for the series, ``events.emit`` for the events) the
way AdaptTensorBoard and the policies write them: a write every 10
updates with each worker's mean micro-step time, the worker count, the
global batch and the noise scale; a ``batch_size`` event (and an ``lr``
event at the same step) at every change of micro-batch or accumulation,
worker counts changing as an elastic job's would. Its update times follow
the throughput model's form with known parameters; the first interval
after every change is slower (warm-up), and intervals in which the
configuration changed hold a nonsense time, so both must be left out for
the plan to be exact.
"""

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import horovodrun, load_rank_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Known costs (seconds): per sample, per micro-step, per update,
#: ring bandwidth per (N-1)/N, latency per (N-1).
TRUE = dict(per_sample=2e-4, per_micro_step=3e-3, per_update=5e-3, sync_bandwidth=0.02,
            sync_latency=0.004)
FREQ = 10  # updates between writes
PHI = 400.0  # the late noise scale


def true_update_seconds(b, n, k):
    return (k * (TRUE["per_micro_step"] + TRUE["per_sample"] * b) + TRUE["per_update"]
            + TRUE["sync_bandwidth"] * (n - 1) / n + TRUE["sync_latency"] * (n - 1))


def write_run(run_dir, segments, writes=5, phi=PHI, local_sgd=()):
    """Writes a run visiting ``segments`` [(b, N, k)] in order; returns the write steps.

    In the segments whose index is in ``local_sgd`` the run used local SGD
    (``adapt/sync_strategy`` 2) and its updates were 3x faster: not S-SGD."""
    import tensorflow as tf

    from keras_adapt.record import events
    from keras_adapt.record import summary

    step, previous, wrote = 0, None, []
    total = len(segments) * writes
    with tf.summary.create_file_writer(run_dir).as_default():
        for i, (b, n, k) in enumerate(segments):
            if previous is not None and (previous[0], previous[2]) != (b, k):
                # The policy decides 3 updates into an interval: that interval is mixed.
                s = step + 3
                state = lambda c: {"batch_size": c[0] * c[1] * c[2], "micro_batch_size": c[0],
                                   "accumulation": c[2], "workers": c[1]}  # noqa: E731
                events.emit("batch_size", s, 0, "TestPolicy", "schedule", state(previous),
                            state((b, n, k)), log_dir=run_dir, rank=0)
                events.emit("lr", s, 0, "TestPolicy", "rescale", {"lr": 0.1}, {"lr": 0.2},
                            log_dir=run_dir, rank=0)
            changed = previous is not None
            for j in range(writes + (1 if changed else 0)):
                step += FREQ
                t = true_update_seconds(b, n, k)
                if i in local_sgd:
                    t = t / 3.0
                if changed and j == 0:
                    t = 7.0 * t  # straddles the change: must be dropped
                elif j == (1 if changed else 0):
                    t = 1.3 * t  # first interval of the visit: warm-up, must be dropped
                for r in range(n):  # ranks differ, their mean is the truth
                    summary.step_time(r, t / k * (1.0 + 0.01 * (r - (n - 1) / 2.0)), step=step)
                summary.scalar("workers", n, step=step)
                summary.scalar("sync_strategy", 2.0 if i in local_sgd else 0.0, step=step)
                summary.scalar("batch_size", n * b * k, step=step)
                index = len(wrote)
                # The noise scale rises early, then stays near PHI with an outlier.
                gns = phi * min(1.0, (index + 1) / (0.5 * total))
                summary.scalar("gns", 50.0 * phi if index == total - 3 else gns, step=step)
                wrote.append(step)
            previous = (b, n, k)
    return wrote


SEGMENTS = [(16, 1, 1), (64, 1, 1), (32, 1, 2), (128, 1, 1),
            (16, 2, 1), (64, 2, 1), (32, 2, 2), (128, 2, 1),
            (16, 4, 1), (64, 4, 1), (32, 4, 2)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("plan"))
    write_run(os.path.join(logdir, "elastic"), SEGMENTS)
    return logdir


def test_observations_recover_the_configurations_and_drop_mixed_intervals(synthetic):
    from keras_adapt import plan
    from keras_adapt.record.runs import load_runs

    (run,) = load_runs(synthetic, max_points=None)
    obs = plan.run_observations(run)
    assert obs.configurations() == sorted(SEGMENTS)
    # Every change (10 of them) leaves one mixed interval: 7 batch_size events
    # inside an interval, 3 worker-count changes (no event) between writes.
    assert obs.mixed == len(SEGMENTS) - 1 and obs.unknown == 0 and obs.notes == []
    assert obs.other_sync == 0
    assert len(obs.observations) == len(SEGMENTS) * 5
    for o in obs.observations:
        t = true_update_seconds(o.micro_batch, o.workers, o.accumulation)
        assert o.update_seconds == pytest.approx(t, rel=1e-6) or \
            o.update_seconds == pytest.approx(1.3 * t, rel=1e-6)


def test_plan_times_and_costs_equal_the_analytic_values(synthetic):
    from keras_adapt import plan

    samples, price = 2_000_000, 3.0
    p = plan.make_plan(synthetic, samples, workers=[1, 2, 4, 8],
                       batch_sizes=[64, 256, 512, 1024], price_on_demand=price)
    assert p.run == "elastic" and p.fit.usable
    assert p.noise_scale == pytest.approx(PHI, rel=1e-6)  # the outlier is ignored
    assert p.base_batch == 16 and p.max_micro_batch == 128
    assert p.fit.params["per_sample"] == pytest.approx(TRUE["per_sample"], rel=1e-4)
    rows = {(r.workers, r.batch_size): r for r in p.rows}
    assert len(rows) == 16
    for (n, big_b), r in rows.items():
        assert r.status == "ok", r.status
        b = min(128, big_b // n)  # the largest micro-batch the run used: 128
        k = big_b // (n * b)
        assert (r.micro_batch, r.accumulation) == (b, k)
        t = true_update_seconds(b, n, k)
        samples_b = samples * (PHI + big_b) / (PHI + 16)
        hours = samples_b / big_b * t / 3600.0
        assert r.step_seconds == pytest.approx(t, rel=1e-5)
        assert r.throughput == pytest.approx(big_b / t, rel=1e-5)
        assert r.efficiency == pytest.approx((PHI + 16) / (PHI + big_b), rel=1e-12)
        assert r.samples == pytest.approx(samples_b, rel=1e-9)
        assert r.seconds == pytest.approx(hours * 3600.0, rel=1e-5)
        assert r.cost == pytest.approx(price * n * hours, rel=1e-5)
        assert r.preemptible_seconds is None and r.preemptible_cost is None
    # Inside the observed workers and sizes: sure. Eight workers: flagged.
    assert rows[(2, 256)].sure and rows[(4, 512)].sure
    assert not rows[(8, 512)].sure
    assert any("workers 8 outside the observed 1-4" in f for f in rows[(8, 512)].flags)
    # 1024 on one worker is 128 x 8: accumulation beyond the observed 1-2.
    assert any("accumulation 8 outside" in f for f in rows[(1, 1024)].flags)


def test_intervals_under_another_sync_strategy_are_left_out(tmp_path):
    from keras_adapt import plan
    from keras_adapt.record.runs import load_runs

    # Segment 2 ran local SGD, 3x faster. A strategy point governs the updates
    # after it: the interval straddling the change into the segment is mixed
    # (S-SGD before the change), its 5 others and the one straddling the
    # change back ran local SGD; the plan stays exact.
    write_run(str(tmp_path / "r"), SEGMENTS, local_sgd=(2,))
    (run,) = load_runs(str(tmp_path), max_points=None)
    obs = plan.run_observations(run)
    assert obs.other_sync == 5 + 1 and obs.mixed == len(SEGMENTS) - 1 - 1
    assert (32, 1, 2) not in obs.configurations()
    p = plan.plan_run(run, 1e6, workers=[2], batch_sizes=[256])
    assert p.rows[0].step_seconds == pytest.approx(true_update_seconds(128, 2, 1), rel=1e-5)
    assert "1 without a known configuration" not in plan.format_table(p)
    assert "6 under a synchronisation strategy other than S-SGD" in plan.format_table(p)


def test_preemptible_formula_against_a_hand_computation():
    from keras_adapt.plan import preemptible_time

    # 10 h of work on 8 workers, each revoked 0.05 times per hour:
    # M = 1/(8*0.05) h = 2.5 h = 9000 s; C = 30 s: tau = sqrt(2*30*9000) = 734.85 s.
    # W = 36000*(1 + 30/734.85) / (1 - (367.42 + 120)/9000) = 37469.7 / 0.945842 = 39615.2 s.
    est = preemptible_time(36000.0, 8, 0.05, 30.0, 120.0)
    assert est.mtbr_seconds == pytest.approx(9000.0)
    assert est.interval_seconds == pytest.approx(734.8469, rel=1e-6)
    busy = 36000.0 * (1 + 30.0 / 734.8469228)
    assert est.wall_seconds == pytest.approx(busy / (1 - (367.4234614 + 120.0) / 9000.0),
                                             rel=1e-9)
    assert est.wall_seconds == pytest.approx(39615.2, abs=0.1)
    assert est.revocations == pytest.approx(est.wall_seconds / 9000.0)
    # Young's interval minimises the first-order waste C/tau + tau/(2M).
    waste = [30.0 / tau + tau / 18000.0 for tau in (600.0, 734.8469, 900.0)]
    assert waste[1] < waste[0] and waste[1] < waste[2]
    # No revocations: no overhead. Revocations faster than a restart: never done.
    assert preemptible_time(100.0, 4, 0.0, 30.0, 60.0).wall_seconds == 100.0
    assert math.isinf(preemptible_time(100.0, 100, 10.0, 30.0, 60.0).wall_seconds)


def test_plan_with_preemptible_prices_side_by_side(synthetic):
    from keras_adapt import plan

    p = plan.make_plan(synthetic, 1e6, workers=[4], batch_sizes=[256], price_on_demand=2.0,
                       price_preemptible=0.6, revocations_per_hour=0.1, checkpoint_seconds=20.0,
                       restart_seconds=90.0)
    (r,) = p.rows
    work = r.seconds
    mtbr = 3600.0 / (4 * 0.1)
    tau = math.sqrt(2 * 20.0 * mtbr)
    wall = work * (1 + 20.0 / tau) / (1 - (tau / 2 + 90.0) / mtbr)
    assert r.checkpoint_interval == pytest.approx(tau) and r.preemptible_seconds == \
        pytest.approx(wall)
    assert r.cost == pytest.approx(2.0 * 4 * work / 3600.0)
    assert r.preemptible_cost == pytest.approx(0.6 * 4 * wall / 3600.0)
    text = plan.format_table(p)
    header = [line for line in text.splitlines() if line.lstrip().startswith("workers")][0]
    for column in ("cost @2", "ckpt every", "preempt. time", "cost @0.6"):
        assert column in header
    line = text.splitlines()[text.splitlines().index(header) + 1]
    assert f"{r.cost:,.2f}" in line and f"{r.preemptible_cost:,.2f}" in line
    # The columns line up: every cell ends where its header does.
    assert len(line) == len(header)


def test_only_one_and_two_workers_observed_flags_four_as_not_determined(tmp_path):
    from keras_adapt import plan

    write_run(str(tmp_path / "r"), [c for c in SEGMENTS if c[1] <= 2])
    p = plan.make_plan(str(tmp_path), 1e6, workers=[2, 4], batch_sizes=[128])
    rows = {r.workers: r for r in p.rows}
    assert rows[2].sure
    # Bandwidth and latency are one column at N in {1, 2}: N = 4 rests on their split.
    assert any(f.startswith("not determined") for f in rows[4].flags)
    assert "sync_latency" not in p.fit.identified


def test_single_worker_run_cannot_predict_more_workers(tmp_path):
    from keras_adapt import plan

    write_run(str(tmp_path / "r"), [c for c in SEGMENTS if c[1] == 1] + [(32, 1, 1)])
    p = plan.make_plan(str(tmp_path), 1e6, workers=[1, 2], batch_sizes=[64, 100])
    rows = {(r.workers, r.batch_size): r for r in p.rows}
    assert rows[(1, 64)].status == "ok"
    assert rows[(2, 64)].status.startswith("no prediction: workers=2: no multi-worker")
    assert rows[(2, 100)].status.startswith("no prediction")
    assert rows[(1, 100)].status == "ok" and rows[(1, 100)].sure


@pytest.mark.primary_only  # reads logs; the monitors that write them run in the legacy suite
def test_a_real_two_worker_run_gives_a_plan(tmp_path):
    from keras_adapt import plan
    from keras_adapt.record.runs import load_runs

    log_dir, out = tmp_path / "logs" / "run", tmp_path / "out"
    out.mkdir()
    horovodrun("plan_worker.py", ["--out", out, "--log_dir", log_dir], np=2, timeout=300)
    ran = sorted({tuple(c) for c in load_rank_results(str(out), 2)[0]["configurations"]})
    (run,) = load_runs(str(tmp_path / "logs"), max_points=None)
    obs = plan.run_observations(run)
    # The configurations the plan reads back are the ones the workers ran.
    assert obs.configurations() == ran and obs.unknown == 0 and obs.notes == []
    p = plan.make_plan(str(tmp_path / "logs"), 1e6, workers=[1, 2, 4], price_on_demand=1.0)
    rows = {(r.workers, r.batch_size): r for r in p.rows}
    # Every interval the workers wrote at 2 workers: N = 2 is predicted, N = 1 flagged
    # (the sync cost cannot be told from the fixed costs), N = 4 not predicted.
    base = rows[(2, p.base_batch)]
    assert base.status == "ok" and not any(f.startswith("not determined") for f in base.flags)
    assert base.seconds == pytest.approx(1e6 / p.base_batch * base.step_seconds)
    assert base.cost == pytest.approx(2 * base.seconds / 3600.0)
    assert any(f.startswith("not determined") for f in rows[(1, p.base_batch)].flags)
    assert rows[(4, p.base_batch)].status.startswith("no prediction: workers=4")
    # The fit's prediction for an observed configuration is near its measured median.
    measured = sorted([o.update_seconds for o in obs.observations
                       if (o.micro_batch, o.workers, o.accumulation) == (256, 2, 1)][1:])
    median = measured[len(measured) // 2]
    assert rows[(2, 512)].micro_batch == 256
    assert rows[(2, 512)].step_seconds == pytest.approx(median, rel=0.35)


def _cli(*args):
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.path.join(ROOT, "plugins"),
                                                      env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "keras_adapt", "plan", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_cli_json_is_one_document_with_the_library_numbers(synthetic):
    from keras_adapt import plan

    proc = _cli(synthetic, "--samples", "2e6", "--workers", "2,8", "--batch-sizes", "256,1024",
                "--price-on-demand", "3", "--price-preemptible", "0.9",
                "--revocations-per-hour", "0.05", "--checkpoint-seconds", "30",
                "--restart-seconds", "120", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    expected = plan.make_plan(synthetic, 2e6, workers=[2, 8], batch_sizes=[256, 1024],
                              price_on_demand=3, price_preemptible=0.9,
                              revocations_per_hour=0.05, checkpoint_seconds=30,
                              restart_seconds=120).to_dict()
    assert doc == json.loads(json.dumps(expected))
    assert doc["noise_scale"]["value"] == pytest.approx(PHI, rel=1e-6)
    assert doc["base_batch"] == {"value": 16, "source": "the run's first global batch"}
    assert doc["observations"]["mixed_dropped"] == len(SEGMENTS) - 1
    rows = {(r["workers"], r["batch_size"]): r for r in doc["rows"]}
    r = rows[(2, 256)]
    t = true_update_seconds(128, 2, 1)
    hours = 2e6 * (PHI + 256) / (PHI + 16) / 256 * t / 3600
    assert r["cost"] == pytest.approx(3 * 2 * hours, rel=1e-5) and r["sure"] is True
    assert rows[(8, 1024)]["sure"] is False and rows[(8, 1024)]["flags"]


def test_cli_table_is_aligned(synthetic, capsys):
    from keras_adapt import cli

    assert cli.main(["plan", synthetic, "--samples", "1e6", "--workers", "1,4",
                     "--batch-sizes", "64,512"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("workers"))
    table = lines[start:start + 5]
    assert len({len(line) for line in table}) == 1  # right-aligned columns, equal width
    assert [line.split()[:2] for line in table[1:]] == [["1", "64"], ["1", "512"], ["4", "64"],
                                                        ["4", "512"]]


@pytest.mark.parametrize("args, message", [
    (["--samples", "0"], "--samples=0.0 is not valid; pass a finite number > 0"),
    (["--samples", "1e6", "--price-on-demand", "-1"],
     "--price-on-demand=-1.0 is not valid; pass a finite number >= 0"),
    (["--samples", "1e6", "--price-preemptible", "0.3"],
     "--price-preemptible needs --revocations-per-hour, --checkpoint-seconds and "
     "--restart-seconds"),
    (["--samples", "1e6", "--revocations-per-hour", "0.1"],
     "missing: --checkpoint-seconds, --restart-seconds"),
    (["--samples", "1e6", "--revocations-per-hour", "nan", "--checkpoint-seconds", "1",
      "--restart-seconds", "1"], "--revocations-per-hour=nan is not valid"),
    (["--samples", "1e6", "--workers", "2,0"], "'2,0' is not valid; pass comma-separated "
     "integers >= 1"),
    (["--samples", "1e6", "--run", "nope"], "no run 'nope' under "),
])
def test_cli_bad_options_name_the_value_and_the_fix(synthetic, args, message, capsys):
    from keras_adapt import cli

    try:
        code = cli.main(["plan", synthetic, *args])
    except SystemExit as exc:  # argparse rejects a malformed list itself
        code = exc.code
    err = capsys.readouterr().err
    assert code == (1 if "--run" in args else 2) and message in err, err


def test_errors_for_logs_that_cannot_give_a_plan(tmp_path):
    import tensorflow as tf

    from keras_adapt import plan
    from keras_adapt.record import summary

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(plan.PlanError, match="no run under .* has adapt data; train with "
                       r"keras_adapt.callbacks.AdaptTensorBoard\(log_dir=...\)"):
        plan.make_plan(str(empty), 1e6)
    # Adapt data but no step times.
    with tf.summary.create_file_writer(str(tmp_path / "lr" / "run")).as_default():
        summary.scalar("lr", 0.1, step=1)
    with pytest.raises(plan.PlanError,
                       match=r"no run under .* recorded step times .* step_times=True\)"):
        plan.make_plan(str(tmp_path / "lr"), 1e6)
    # Too few observations: one configuration.
    write_run(str(tmp_path / "one" / "run"), [(32, 2, 1)], writes=4)
    with pytest.raises(plan.PlanError, match=r"too few observations to fit the throughput model: "
                       r"4 usable write intervals in 1 configuration\(s\) \(b=32 N=2 k=1\).*"
                       "Record a run that visits at least 4-6 batch sizes"):
        plan.make_plan(str(tmp_path / "one"), 1e6)
    # Step times that do not follow the configuration: the fit loses to a constant.
    noise = [0.05, 0.03, 0.07, 0.04, 0.06]
    flat = str(tmp_path / "flat" / "run")
    write_run(flat, [(16, 1, 1), (32, 1, 1), (64, 1, 1), (128, 1, 1), (256, 1, 1)], writes=5)
    with tf.summary.create_file_writer(flat).as_default():  # overwrite every time: noise
        for i, s in enumerate(range(FREQ, 30 * FREQ, FREQ)):
            summary.step_time(0, noise[i % 5] * (1 + 0.37 * ((i * 7) % 3)), step=s)
    with pytest.raises(plan.PlanError, match="the throughput model cannot be used: held-out "
                       "MAPE .* does not beat the constant model"):
        plan.make_plan(str(tmp_path / "flat"), 1e6)
    # Two timed runs: which one?
    write_run(str(tmp_path / "two" / "a"), SEGMENTS[:4] + [(32, 1, 1)])
    write_run(str(tmp_path / "two" / "b"), SEGMENTS[:4] + [(32, 1, 1)])
    with pytest.raises(plan.PlanError, match=r"2 runs under .* \(a, b\); choose one with --run"):
        plan.make_plan(str(tmp_path / "two"), 1e6)
    assert plan.make_plan(str(tmp_path / "two"), 1e6, run="b").run == "b"
