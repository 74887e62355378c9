"""Every public object has a docstring with an example, and every example runs."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import keras_adapt
import tensorboard_plugin_adapt

# The compiled op libraries sit in the package too; they are not Python modules.
MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(keras_adapt.__path__, "keras_adapt.")
    if not name.rsplit(".", 1)[-1].startswith("_keras_adapt_ops")
) + ["tensorboard_plugin_adapt"] + sorted(
    name for _, name, _ in pkgutil.walk_packages(tensorboard_plugin_adapt.__path__,
                                                 "tensorboard_plugin_adapt.")
)


def _public_objects():
    for module_name in ["keras_adapt"] + MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{module_name}.{name}", obj


@pytest.mark.parametrize("name,obj", list(_public_objects()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_object_has_a_docstring_with_an_example(name, obj):
    doc = inspect.getdoc(obj) or ""
    assert ">>>" in doc, f"{name} has no runnable example in its docstring"


@pytest.mark.filterwarnings("ignore:keras-adapt. one worker")
@pytest.mark.parametrize("module_name", ["keras_adapt"] + MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"
