"""The benchmarks run end to end in their smoke modes and print what they promise."""

import json
import os
import subprocess
import sys

import pytest

from conftest import _env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.primary_only
def test_time_to_accuracy_quick():
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "time_to_accuracy.py"), "--quick"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith('{"bench"')]
    assert [l["task"] for l in lines] == ["teacher_student", "digits"]
    for line in lines:
        assert list(line)[:6] == ["bench", "task", "speedup_vs_small", "acc_delta_vs_small",
                                  "speedup_vs_large", "acc_delta_vs_large"]
        assert line["bench"] == "time_to_accuracy" and line["stack"] == "primary"
        configs = line["configs"]
        assert set(configs) == {"small", "large", "gns", "goodput"}
        for name, run in configs.items():
            assert 0.0 <= run["final"] <= 1.0 and run["updates"] > 0 and run["wall"] > 0
            batches = [b for _, b in run["batch_trajectory"]]
            if name in ("small", "large"):
                assert len(batches) == 1  # fixed batches stay fixed
            elif name == "gns":
                assert batches == sorted(batches)  # allow_decrease=False: it only grows
            assert all(32 <= b <= 2048 for b in batches)
        # same sample budget for everyone: the large batch needs the fewest updates
        assert configs["large"]["updates"] < configs["small"]["updates"]
