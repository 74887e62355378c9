"""The main example runs under horovodrun and produces what it promises."""

import csv
import math
import os
import subprocess
import sys

import pytest

from conftest import _env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.primary_only
def test_monitor_noise_scale_example_on_two_workers(tmp_path):
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           os.path.join(ROOT, "examples", "monitor_noise_scale.py"),
           "--epochs", "4", "--logdir", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    epochs = [l for l in proc.stdout.splitlines() if "gns" in l and "epoch" in l]
    assert len(epochs) == 4, proc.stdout  # printed by rank 0 only
    rows = list(csv.DictReader(open(tmp_path / "history.csv")))
    assert len(rows) == 4
    gns = [float(r["gns"]) for r in rows]
    assert all(math.isfinite(g) and g > 0 for g in gns)
    assert float(rows[-1]["accuracy"]) > 0.9
    assert "test accuracy" in proc.stdout
    assert os.listdir(tmp_path / "tensorboard" / "train")


@pytest.mark.primary_only
def test_adaptive_batch_example_grows_the_batch_and_records_every_change(tmp_path):
    import json

    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           os.path.join(ROOT, "examples", "adaptive_batch.py"),
           "--epochs", "2", "--logdir", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    printed = [l for l in proc.stdout.splitlines() if "[keras-adapt] step" in l]
    with open(tmp_path / "adapt_events.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert len(printed) == len(events) >= 2  # each decision printed once (rank 0) and on disk
    batches = [e["after"]["batch_size"] for e in events if e["kind"] == "batch_size"]
    assert batches == sorted(batches) and batches[-1] > 32
    assert "summary: 2 workers" in proc.stdout
    acc = float(proc.stdout.split("test accuracy")[1].split()[0])
    assert acc > 0.6


def test_tfrecord_example_switches_both_ranks_at_the_same_batches(tmp_path):  # both stacks
    import ast
    import json

    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           os.path.join(ROOT, "examples", "tfrecord_adaptive_batch.py"),
           "--epochs", "3", "--examples", "16000", "--logdir", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(os.listdir(tmp_path / "data")) == [f"train-0{i}-of-04.tfrecord" for i in range(4)]
    changes = {}
    for line in proc.stdout.splitlines():
        if "micro-batch changes" in line:
            rank = int(line.split("rank ")[1].split(":")[0])
            changes[rank] = ast.literal_eval(line.split("(from batch, size) ")[1])
    assert set(changes) == {0, 1} and changes[0] == changes[1] and len(changes[0]) >= 2
    with open(tmp_path / "adapt_events.jsonl") as f:
        events = [json.loads(line) for line in f]
    batch_events = [e for e in events if e["kind"] == "batch_size"]
    rebatched = [e for e in batch_events
                 if e["after"]["micro_batch_size"] != e["before"]["micro_batch_size"]]
    # One recorded switch per micro-batch change, to the size the policy chose.
    assert [e["after"]["micro_batch_size"] for e in rebatched] == [m for _, m in changes[0]]
    sizes = [e["after"]["batch_size"] for e in batch_events]
    assert sizes == sorted(sizes) and sizes[-1] > 32
    acc = float(proc.stdout.split("test accuracy")[1].split()[0])
    assert acc > 0.6


@pytest.mark.primary_only
def test_sync_strategies_example_switches_to_post_local_sgd_after_the_decay(tmp_path):
    import json

    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           os.path.join(ROOT, "examples", "sync_strategies.py"),
           "--epochs", "6", "--logdir", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    printed = [l for l in proc.stdout.splitlines() if "[keras-adapt] step" in l]
    with open(tmp_path / "adapt_events.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert len(printed) == len(events) >= 1  # each switch printed once (rank 0) and on disk
    last = events[-1]
    assert last["kind"] == "sync_strategy" and last["after"]["sync_strategy"] == "local_sgd"
    # 6 epochs of 45 updates: the rate drops after update 135; the policy
    # proposes local SGD at 140 and 150 (interval 10) and switches at the
    # second proposal (patience 2).
    assert last["step"] == 150 and last["reason"].startswith("post-local SGD")
    assert "strategies: allreduce_sgd" in proc.stdout and "-> local_sgd" in proc.stdout
    acc = float(proc.stdout.split("test accuracy")[1].split()[0])
    assert acc > 0.9
    # What the Adapt tab and the report draw: the strategy series switches
    # exactly at each switch's step (the policy runs before AdaptTensorBoard),
    # and the run gets the sync strategy panel.
    from keras_adapt import report
    from keras_adapt.record import metadata
    from keras_adapt.record.runs import load_runs

    (run,) = load_runs(str(tmp_path))
    points = dict((s, v) for s, _, v in run.series[metadata.SCALAR_TAGS["sync_strategy"]])
    switches = {e["step"]: e["after"]["sync_strategy"] for e in events
                if e["kind"] == "sync_strategy"}
    for step in sorted(points):
        earlier = [s for s in switches if s <= step]
        name = switches[max(earlier)] if earlier else "allreduce_sgd"
        assert metadata.SYNC_STRATEGIES[int(points[step])] == name, (step, points[step])
    assert set(switches) <= set(points)
    assert report.has_sync_strategy_panel(run)


def test_elastic_example_shrinks_and_grows_and_records_both(tmp_path):  # both stacks
    import json
    import re

    from conftest import discovery_script, horovodrun_elastic

    script, hosts = discovery_script(tmp_path, "localhost:1\n127.0.0.1:1\n")
    done = horovodrun_elastic(
        os.path.join(ROOT, "examples", "elastic_training.py"),
        ["--logdir", tmp_path / "log", "--hosts", hosts, "--shrink-at", 20, "--grow-after", 30],
        script, timeout=400)
    assert done.leftover == 0
    with open(tmp_path / "log" / "adapt_events.jsonl") as f:
        events = [json.loads(line) for line in f]
    assert [(e["before"]["workers"], e["after"]["workers"]) for e in events] == [(2, 1), (1, 2)], \
        done.stdout[-6000:]
    assert [(e["before"]["batch_size"], e["after"]["batch_size"]) for e in events] == [
        (32, 64), (64, 32)]
    assert all(e["kind"] == "resize" and e["after"]["pause_s"] > 0 for e in events)
    printed = re.findall(r"resize at step (\d+): .* pause ([0-9.]+) s", done.stdout)
    assert [int(step) for step, _ in printed] == [e["step"] for e in events]
    final = re.search(r"(\d) worker\(s\) at the end, (\d+) steps, test accuracy ([0-9.]+)",
                      done.stdout)
    assert final and (final[1], final[2]) == ("2", "200")  # 10 epochs x 20 steps, none twice
    assert float(final[3]) > 0.85
