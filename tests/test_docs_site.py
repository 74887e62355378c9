"""The documentation site (mkdocs.yml): it builds with ``--strict``, its API
reference is generated from the docstrings with their examples shown as code,
and a broken link fails the build."""

import functools
import http.server
import importlib
import os
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The site's tools come with the primary stack (requirements/primary-common.txt);
# the legacy stack deselects this file (nothing here is imported at collection).
pytestmark = pytest.mark.primary_only


def _tool(name):
    """The module tools/<name>.py (griffe_doctest_blocks needs Griffe, which
    mkdocstrings brings: imported here, not at collection)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))


def _build(config_dir, site_dir):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(site_dir)], cwd=config_dir, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built from this checkout with --strict (once for the module)."""
    path = tmp_path_factory.mktemp("docs") / "site"
    done = _build(ROOT, path)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def test_site_builds_strict_with_the_api_reference(site):
    page = (site / "reference" / "keras_adapt.policies" / "index.html").read_text()
    # Every public policy is documented, from its docstring...
    for name in ("GNSBatchSizePolicy", "GoodputBatchSizePolicy", "StragglerPolicy",
                 "SyncStrategyPolicy", "ThroughputScalingPolicy"):
        assert f'id="keras_adapt.policies.{name}"' in page, name
    # ... with its runnable example rendered as a code block, not as text.
    assert page.count('class="language-pycon') >= 10
    assert "Moves the global batch toward a multiple of the gradient noise scale" in page
    # Sphinx roles are shown as code, not as raw markup.
    assert ":class:" not in page and ":meth:" not in page
    assert "<code>ThroughputModel</code>" in page
    # Every page of docs/ is in the navigation (strict fails on an omitted one),
    # and the home page links the guides.
    built = {os.path.relpath(os.path.join(d, f), site)
             for d, _, files in os.walk(site) for f in files if f == "index.html"}
    for name in os.listdir(os.path.join(ROOT, "docs")):
        if name.endswith(".md") and name != "index.md":
            assert os.path.join(name[:-3], "index.html") in built, name


def test_the_reference_pages_are_the_generators_and_list_every_public_name(site):
    """tools/reference_pages.py wrote the pages; every public class and
    function of every public module is on the site (under its package or
    its own module), so none can be left out."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "reference_pages.py"),
                           "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pages = "".join(open(os.path.join(d, f)).read() for d, _, files in
                    os.walk(site / "reference") for f in files if f == "index.html")
    reference = _tool("reference_pages")
    missing = []
    for folder, _, files in os.walk(os.path.join(ROOT, "keras_adapt")):
        module = os.path.relpath(folder, ROOT).replace(os.sep, ".")
        if "._" in module or "__pycache__" in module or "patches" in module:
            continue
        for file in files:
            if not file.endswith(".py") or file.startswith("_") or file in ("cli.py",
                                                                             "version.py"):
                continue
            name = module if file == "__init__.py" else f"{module}.{file[:-3]}"
            package = module if folder != os.path.join(ROOT, "keras_adapt") else name
            for obj in reference.public_names(open(os.path.join(folder, file)).read()):
                if (f'id="{name}.{obj}"' not in pages
                        and f'id="{package}.{obj}"' not in pages):
                    missing.append(f"{name}.{obj}")
    assert missing == []


def test_every_public_module_has_a_reference_page():
    import pkgutil

    import keras_adapt

    public = {m.name for m in pkgutil.iter_modules(keras_adapt.__path__)
              if not m.name.startswith("_") and m.name not in ("cli", "version")}
    pages = {name[:-3] for name in os.listdir(os.path.join(ROOT, "docs", "reference"))}
    assert pages == {"keras_adapt"} | {f"keras_adapt.{m}" for m in public}
    for name in pages - {"keras_adapt"}:
        with open(os.path.join(ROOT, "docs", "reference", name + ".md")) as f:
            assert f"::: {name}\n" in f.read(), name


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
    fence_doctests = _tool("griffe_doctest_blocks").fence_doctests
    text = "Intro.\n\n>>> x = 1\n>>> x + 1\n2\n\nAfter.\n"
    assert fence_doctests(text) == (
        "Intro.\n\n```pycon\n>>> x = 1\n>>> x + 1\n2\n```\n\nAfter.\n")
    # At the block's indentation (inside an Args entry, say); at the end of the text.
    assert fence_doctests("Args:\n    a: one.\n\n    >>> f(1)\n    3") == (
        "Args:\n    a: one.\n\n    ```pycon\n    >>> f(1)\n    3\n    ```")
    # A doctest already inside a fence, and prompts inside text, are left alone.
    fenced = "```pycon\n>>> 1\n1\n```\nthe prompt >>> in a sentence\n"
    assert fence_doctests(fenced) == fenced


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = os.path.join(ROOT, "test-artifacts")


@pytest.fixture
def served(site):
    """The built site on a loopback HTTP server; yields its URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_home_and_an_api_page_in_the_browser(served):
    """What a reader sees: the home page with its navigation, and the
    policies' API page with a docstring's example as a code block; nothing
    is loaded from outside the site. Screenshots go to test-artifacts/."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (requirements/primary-common.txt)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (make setup does it as root)")
    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            outside = []
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(
                (served, "data:", "blob:", "about:")) else None)
            page.goto(served + "/", wait_until="load")
            # (the heading's permanent link follows its text)
            assert page.locator("h1").first.inner_text().startswith("keras-adapt documentation")
            nav = page.locator("nav.md-nav--primary").inner_text()
            for entry in ("Install", "Adaptive batch size and learning rate", "Slurm",
                          "Kubernetes", "Troubleshooting", "Time to accuracy",
                          "keras_adapt.policies"):
                assert entry in nav, entry
            page.screenshot(path=os.path.join(ARTIFACTS, "docs_home.png"))

            page.goto(served + "/reference/keras_adapt.policies/", wait_until="load")
            heading = page.locator('[id="keras_adapt.policies.GNSBatchSizePolicy"]')
            assert heading.is_visible()
            heading.scroll_into_view_if_needed()
            example = page.locator("div.language-pycon").filter(
                has_text="GNSBatchSizePolicy(min_batch=8").first
            assert example.is_visible()
            assert ">>> policy = GNSBatchSizePolicy" in example.inner_text()
            example.scroll_into_view_if_needed()
            page.wait_for_timeout(500)  # the header's title swap on scrolling settles
            page.screenshot(path=os.path.join(ARTIFACTS, "docs_api_policies.png"))
            assert outside == []
        finally:
            browser.close()


def test_roles_as_code():
    roles_as_code = _tool("griffe_doctest_blocks").roles_as_code
    assert roles_as_code("a :class:`~keras_adapt.data.AdaptiveBatchDataset` b") == (
        "a `AdaptiveBatchDataset` b")
    assert roles_as_code(":func:`keras_adapt.elastic.fit` and :mod:`keras_adapt.formulas`") == (
        "`keras_adapt.elastic.fit` and `keras_adapt.formulas`")
    assert roles_as_code(":meth:`CheckpointFiles.latest <keras_adapt.checkpointing.CheckpointFiles.latest>`") == (
        "`CheckpointFiles.latest`")
    assert roles_as_code("no role: `code` and :notarole:`x`") == "no role: `code` and :notarole:`x`"
