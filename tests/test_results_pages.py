"""The results pages (docs/results/) are generated from the stored benchmark lines
(benchmarks/results/*.jsonl) by benchmarks/results_pages.py: the committed pages
are what the generator writes, every stored line is well-formed, and a table's
cells are the stored values."""

import glob
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "benchmarks", "results")
PAGES = os.path.join(ROOT, "docs", "results")
SCRIPT = os.path.join(ROOT, "benchmarks", "results_pages.py")


def _generator():
    spec = importlib.util.spec_from_file_location("results_pages", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stored(bench):
    with open(os.path.join(DATA, f"{bench}.jsonl")) as f:
        return [json.loads(text) for text in f if text.strip()]


def test_every_benchmark_has_stored_results_and_a_page():
    scripts = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
               if not os.path.basename(p).startswith("_")} - {"results_pages"}
    stored = {os.path.basename(p)[:-6] for p in glob.glob(os.path.join(DATA, "*.jsonl"))}
    assert stored == scripts
    assert set(_generator().BENCHES) == scripts
    for bench in scripts:
        assert os.path.exists(os.path.join(PAGES, f"{bench}.md")), bench


def test_committed_pages_equal_what_the_generator_writes():
    gen = _generator()
    for name, text in gen.render().items():
        with open(os.path.join(PAGES, name)) as f:
            assert f.read() == text, f"docs/results/{name} differs: run python benchmarks/results_pages.py"
    done = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_lists_a_page_that_drifted_from_its_data(tmp_path):
    gen = _generator()
    lines = _stored("preemption")
    lines[0]["to_disk_s"] = 99.0
    (tmp_path / "preemption.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for bench in gen.BENCHES:
        if bench != "preemption":
            (tmp_path / f"{bench}.jsonl").write_text(open(os.path.join(DATA, f"{bench}.jsonl")).read())
    changed = gen.render(str(tmp_path))["preemption.md"]
    assert "| 99.00 |" in changed
    assert changed != open(os.path.join(PAGES, "preemption.md")).read()


def test_every_stored_line_parses_and_has_its_key_fields():
    gen = _generator()
    for bench, (_, _, keys, _) in gen.BENCHES.items():
        lines = _stored(bench)
        assert lines, bench
        for line in lines:
            assert line["bench"] == bench
            for key in keys:
                assert key in line, (bench, key)
            run = line["run"]
            assert run["command"].split()[1] == f"benchmarks/{bench}.py", run["command"]
            assert run["machine"]
            # Either the date and commit of a measured run, or where the figures came from.
            assert ("date" in run and "commit" in run) or "source" in run, (bench, run)


def test_time_to_accuracy_table_is_the_stored_values():
    """Each row recomputed here from the JSON, independently of the generator's formatting."""
    page = open(os.path.join(PAGES, "time_to_accuracy.md")).read()
    rows = [r for r in page.splitlines() if r.startswith("| ") and "(" in r.split("|")[2]]
    lines = _stored("time_to_accuracy")
    assert len(rows) == len(lines) == 12
    for row, line in zip(rows, lines):
        cells = [c.strip() for c in row.strip("|").split("|")]
        best = line["best_fixed"]
        assert cells[0] == line["task"] and cells[1] == "(%s)" % line["protocol"]
        assert abs(float(cells[2]) - line["target"]) < 5e-5
        batch, rest = cells[3].split(" @ ")
        lr, updates = rest.split(", ")
        assert int(batch) == best["batch"] and int(updates) == best["updates_to_target"]
        assert abs(float(lr) - best["lr"]) < 1e-9
        assert abs(float(cells[4].rstrip("×")) - line["update_ratio_vs_best_fixed"]) <= 0.0051
        assert abs(float(cells[5]) - line["acc_delta_vs_best_fixed"]) <= 0.0051
        goodput = line["goodput_update_ratio_vs_best_fixed"]
        if goodput is None:
            assert cells[6] == "miss"
        else:
            assert abs(float(cells[6].rstrip("×")) - goodput) <= 0.0051
    # The teacher_student (b) row: the tuned batch is 256 and the policy needs 1.17x fewer updates.
    ts = next(x for x in lines if x["task"] == "teacher_student" and x["protocol"] == "b")
    per_seed = ts["update_ratio_vs_best_fixed_seeds"]
    assert abs(sum(per_seed) / len(per_seed) - ts["update_ratio_vs_best_fixed"]) < 0.002


def test_results_data_blocks_are_marked_not_run():
    for path in glob.glob(os.path.join(PAGES, "*.md")):
        lines = open(path).read().splitlines()
        for i, text in enumerate(lines):
            if text.startswith("```json"):
                assert lines[i - 1] == "<!-- not run: results data -->", (path, i)
