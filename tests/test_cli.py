"""The ``keras-adapt`` command starts quietly: no TensorFlow for ``--help``."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code_or_args, module=False):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.path.join(ROOT, "plugins"),
                                                      env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "keras_adapt", *code_or_args] if module else \
        [sys.executable, "-c", code_or_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_help_prints_usage_only():
    proc = _run(["--help"], module=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: keras-adapt")
    assert "report" in proc.stdout and "plan" in proc.stdout
    # TensorFlow's start-up lines ("oneDNN custom operations ...",
    # "cpu_feature_guard") would land on stderr.
    assert proc.stderr == ""


def test_importing_the_package_does_not_import_tensorflow():
    proc = _run("import sys, keras_adapt, keras_adapt.cli; "
                "print('tensorflow' in sys.modules, keras_adapt.__version__)")
    assert proc.returncode == 0, proc.stderr
    imported, version = proc.stdout.split()
    assert imported == "False" and version == __import__("keras_adapt").__version__


def test_public_names_resolve_lazily():
    import keras_adapt

    assert keras_adapt.DistributedOptimizer is keras_adapt.optimizer.DistributedOptimizer
    assert keras_adapt.callbacks.GradientStatsMonitor.__name__ == "GradientStatsMonitor"
    assert set(keras_adapt.__all__) <= set(dir(keras_adapt))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        keras_adapt.nonexistent  # noqa: B018


def test_version_prints_the_packages_version():
    proc = subprocess.run([sys.executable, "-m", "keras_adapt", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout == f"keras-adapt {__import__('keras_adapt').__version__}\n"
