"""Every fenced code block of README.md and docs/ is run, checked or marked.

The convention is in tests/doc_blocks.py. One test per page with Python or
shell blocks to run (a fresh process, a fresh working directory, the blocks
in order), one per multi-worker block (under horovodrun, Gloo; the logs it
gives AdaptTensorBoard must be written), one per JSON or YAML block (parsed;
an event must have a known kind), and one test that accounts for every
block: the count by kind must equal the number of fences a plain scan
finds, and no block may be unclassified.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

import doc_blocks
from conftest import HOROVODRUN, _env, _run_job

from keras_adapt.record import metadata

ALL = [b for page in doc_blocks.pages() for b in doc_blocks.read_page(page)]
PAGES = sorted({b.page for b in ALL if b.kind in ("python", "shell")})
HOROVODRUN_BLOCKS = [b for b in ALL if b.kind == "horovodrun"]
HERE = os.path.dirname(os.path.abspath(__file__))


def test_every_block_is_accounted_for():
    errors = [f"{b.where}: {b.detail}" for b in ALL if b.kind == "error"]
    assert not errors, "\n".join(errors)
    fenced = [b for b in ALL if b.kind != "invisible"]
    assert len(fenced) == sum(doc_blocks.count_fences(p) for p in doc_blocks.pages())
    counts = {}
    for b in fenced:
        counts[b.kind] = counts.get(b.kind, 0) + 1
    reasons = sorted({b.detail for b in fenced if b.kind == "not run"})
    print(f"\n{len(fenced)} blocks: {counts}; not-run reasons:\n  " + "\n  ".join(reasons))
    assert all(len(r) >= 10 for r in reasons), reasons


def _values(code):
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(code) and code[i].isspace():
            i += 1
        if i == len(code):
            return values
        value, i = decoder.raw_decode(code, i)
        values.append(value)


@pytest.mark.parametrize("block", [b for b in ALL if b.kind in ("json", "yaml")],
                         ids=lambda b: b.where)
def test_data_block_parses_and_its_events_are_valid(block):
    values = _values(block.code) if block.kind == "json" else list(yaml.safe_load_all(block.code))
    assert values, block.where
    for value in values:
        if isinstance(value, dict) and "kind" in value and "step" in value:
            event = metadata.parse_event_line(json.dumps(value))
            assert event is not None, (block.where, value)
            assert event["kind"] in metadata.EVENT_KINDS, (block.where, value["kind"])


# The pages' code runs on the primary stack (about 2.5 minutes); the legacy
# stack runs the same library calls through every module's doctests
# (tests/test_docstrings.py) and the suite's tf.keras 2 jobs.
@pytest.mark.primary_only
@pytest.mark.parametrize("page", PAGES)
def test_blocks_of_the_page_run_in_order(page, tmp_path):
    code = [[b.where, b.kind, doc_blocks.shell_commands(b) if b.kind == "shell" else b.code]
            for b in doc_blocks.read_page(page) if b.kind in ("python", "invisible", "shell")]
    (tmp_path / "blocks.json").write_text(json.dumps(code))
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run_doc_page.py"),
                           str(tmp_path / "blocks.json")], cwd=work, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.stdout.count("ok ") == len(code), proc.stdout


@pytest.mark.primary_only
@pytest.mark.parametrize("block", HOROVODRUN_BLOCKS, ids=lambda b: b.where)
def test_multi_worker_block_runs_under_horovodrun(block, tmp_path):
    (tmp_path / "train.py").write_text(block.code + "\n")
    np = block.detail
    cmd = [*HOROVODRUN, "-np", np, "-H", f"localhost:{np}", "--gloo", sys.executable,
           str(tmp_path / "train.py")]
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the job's workers inherit it: their runs/ land here
    try:
        _run_job(cmd, timeout=600)
    finally:
        os.chdir(cwd)
    for log_dir in re.findall(r'AdaptTensorBoard\("([^"]+)"', block.code):  # always writes
        found = os.listdir(tmp_path / log_dir) if (tmp_path / log_dir).is_dir() else []
        assert found, (block.where, log_dir, "not written")
        if metadata.EVENTS_FILENAME in found:
            lines = (tmp_path / log_dir / metadata.EVENTS_FILENAME).read_text().splitlines()
            assert all(metadata.parse_event_line(l) for l in lines), (block.where, lines)

