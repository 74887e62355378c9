"""The documentation site (mkdocs.yml): it builds with ``--strict``, its API
reference is generated from the docstrings with their examples shown as code,
and a broken link fails the build."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from griffe_doctest_blocks import fence_doctests  # noqa: E402

# The site's tools come with the primary stack (requirements/primary-common.txt).
pytestmark = pytest.mark.primary_only


def _build(config_dir, site_dir):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(site_dir)], cwd=config_dir, env=env, capture_output=True,
                          text=True, timeout=300)


def test_site_builds_strict_with_the_api_reference(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "keras_adapt.policies" / "index.html").read_text()
    # Every public policy is documented, from its docstring...
    for name in ("GNSBatchSizePolicy", "GoodputBatchSizePolicy", "StragglerPolicy",
                 "SyncStrategyPolicy", "ThroughputScalingPolicy"):
        assert f'id="keras_adapt.policies.{name}"' in page, name
    # ... with its runnable example rendered as a code block, not as text.
    assert page.count('class="language-pycon') >= 10
    assert "Moves the global batch toward a multiple of the gradient noise scale" in page
    # Every page of docs/ is in the navigation (strict fails on an omitted one),
    # and the home page links the guides.
    built = {os.path.relpath(os.path.join(d, f), tmp_path / "site")
             for d, _, files in os.walk(tmp_path / "site") for f in files if f == "index.html"}
    for name in os.listdir(os.path.join(ROOT, "docs")):
        if name.endswith(".md") and name != "index.md":
            assert os.path.join(name[:-3], "index.html") in built, name


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), tmp_path)
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copytree(os.path.join(ROOT, "tools"), tmp_path / "tools")
    shutil.copytree(os.path.join(ROOT, "keras_adapt"), tmp_path / "keras_adapt",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    with open(tmp_path / "docs" / "install.md", "a") as f:
        f.write("\nSee [the missing page](no_such_page.md) and [an anchor](#no-such-anchor).\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "no_such_page.md" in done.stderr and "no-such-anchor" in done.stderr


def test_fence_doctests():
    text = "Intro.\n\n>>> x = 1\n>>> x + 1\n2\n\nAfter.\n"
    assert fence_doctests(text) == (
        "Intro.\n\n```pycon\n>>> x = 1\n>>> x + 1\n2\n```\n\nAfter.\n")
    # At the block's indentation (inside an Args entry, say); at the end of the text.
    assert fence_doctests("Args:\n    a: one.\n\n    >>> f(1)\n    3") == (
        "Args:\n    a: one.\n\n    ```pycon\n    >>> f(1)\n    3\n    ```")
    # A doctest already inside a fence, and prompts inside text, are left alone.
    fenced = "```pycon\n>>> 1\n1\n```\nthe prompt >>> in a sentence\n"
    assert fence_doctests(fenced) == fenced
