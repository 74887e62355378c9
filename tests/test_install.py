"""keras-adapt installed from its wheel (built from the sdist), not the checkout.

``tools/check_install.sh VENV`` (part of ``make test``) builds the sdist and a
wheel from it, installs the wheel into a new environment that has the
stack's TensorFlow and Horovod, and runs this file there with
``KERAS_ADAPT_TEST_INSTALLED=1``, with one 2-worker job of
tests/test_distributed.py; in the ordinary suite it is skipped.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("KERAS_ADAPT_TEST_INSTALLED") != "1",
    reason="run by tools/check_install.sh against the installed wheel",
)

CHECKOUT = os.path.realpath(os.environ.get("KERAS_ADAPT_CHECKOUT", "/nonexistent"))


def _outside_checkout(path):
    return not os.path.realpath(path).startswith(CHECKOUT + os.sep)


def test_packages_import_from_the_installed_wheel():
    import keras_adapt
    import tensorboard_plugin_adapt

    for module in (keras_adapt, tensorboard_plugin_adapt):
        assert _outside_checkout(module.__file__), module.__file__
        assert "site-packages" in module.__file__
    dist = importlib.metadata.distribution("keras-adapt")
    assert dist.version == keras_adapt.__version__
    # a wheel install, not an editable one: the files are listed in RECORD,
    # subpackages included
    files = {str(f) for f in dist.files}
    for path in ("keras_adapt/optimizer/_step.py", "keras_adapt/sync/sync_state.py",
                 "keras_adapt/monitors/system.py", "keras_adapt/formulas/throughput.py",
                 "keras_adapt/monitors/worker_timing.py", "keras_adapt/policies/straggler.py",
                 "keras_adapt/plan.py"):
        assert path in files, path


def test_every_module_of_the_checkout_imports_from_the_wheel():
    # The checkout's modules, found by file; each must come from the wheel.
    expected = []
    for package, root in (("keras_adapt", CHECKOUT),
                          ("tensorboard_plugin_adapt", os.path.join(CHECKOUT, "plugins"))):
        for directory, _, files in os.walk(os.path.join(root, package)):
            relative = os.path.relpath(directory, root).replace(os.sep, ".")
            expected += [relative if f == "__init__.py" else f"{relative}.{f[:-3]}"
                         for f in files if f.endswith(".py")]
    assert len(expected) > 80, expected  # the checkout was found
    for name in sorted(expected):
        module = importlib.import_module(name)
        assert _outside_checkout(module.__file__), (name, module.__file__)


def test_the_compiled_op_ships_in_the_wheel_and_loads():
    import glob

    from keras_adapt import ops

    libraries = glob.glob(os.path.join(os.path.dirname(ops.__file__), "_keras_adapt_ops_tf*.so"))
    assert len(libraries) == 1 and _outside_checkout(libraries[0]), libraries
    assert ops.implementation() == "native"
    per_tensor, total = ops.squared_norms([[3.0, 4.0], [[1.0], [2.0]]])
    assert per_tensor.numpy().tolist() == [25.0, 5.0] and float(total) == 30.0


def test_tensorboard_finds_the_plugin_and_its_frontend():
    eps = [ep for ep in importlib.metadata.entry_points(group="tensorboard_plugins")
           if ep.name == "adapt"]
    assert len(eps) == 1
    loader = eps[0].load()()
    from tensorboard.plugins import base_plugin

    plugin = loader.load(base_plugin.TBContext())
    assert plugin.plugin_name == "adapt"
    from tensorboard_plugin_adapt import plugin as plugin_module

    static = os.path.join(plugin_module.STATIC_DIR, "index.js")
    assert _outside_checkout(static) and os.path.getsize(static) > 1000


def test_the_command_line_tool_is_installed():
    import keras_adapt

    script = os.path.join(os.path.dirname(sys.executable), "keras-adapt")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: keras-adapt"), proc.stderr
    assert "build-horovod" in proc.stdout
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == f"keras-adapt {keras_adapt.__version__}\n"


def test_the_metadata_names_the_license_the_extras_and_the_patches():
    dist = importlib.metadata.distribution("keras-adapt")
    assert dist.metadata["License"] == "Apache-2.0"
    assert sorted(dist.metadata.get_all("Provides-Extra")) == [
        "async", "examples", "report", "system", "tensorboard", "test"]
    from keras_adapt.extras import EXTRAS

    requires = dist.requires
    for extra, distributions in EXTRAS.items():
        for name in distributions:  # what the errors name is what the extra installs
            assert any(r.startswith(name) and f'extra == "{extra}"' in r for r in requires), (
                extra, name, requires)
    files = {str(f) for f in dist.files}
    assert any(f.endswith(".dist-info/LICENSE") for f in files), sorted(files)[:5]
    from keras_adapt.horovod_build import build

    for name in build.patch_names():
        assert f"keras_adapt/horovod_build/patches/{name}" in files
    assert _outside_checkout(build.PATCH_DIR) and len(build.patch_names()) == 3
