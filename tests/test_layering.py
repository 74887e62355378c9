"""The direction of imports: the library never imports its viewer, no
package reaches into another's private modules, and the offline parts
never import the frameworks.

keras-adapt owns the schema of what it records (``keras_adapt.record``); the
TensorBoard plugin imports it. The pure math (``keras_adapt.formulas``), the
planner and the report need neither TensorFlow, Keras nor Horovod. Checked in
fresh interpreters, so nothing an earlier test imported can hide an import.
The source rules are read from the code with ``ast``.
"""

import ast
import pathlib
import subprocess
import sys
import textwrap

import keras_adapt


def _run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_importing_every_library_module_never_imports_the_plugin():
    out = _run("""
        import importlib, pkgutil, sys
        import keras_adapt
        names = [n for _, n, _ in pkgutil.walk_packages(keras_adapt.__path__, "keras_adapt.")
                 if not n.rsplit(".", 1)[-1].startswith("_keras_adapt_ops")]
        for n in names:
            importlib.import_module(n)
        print(len(names), sorted(m for m in sys.modules if m.startswith("tensorboard_plugin_adapt")))
    """)
    count, plugin_modules = out.split(" ", 1)
    assert int(count) > 30  # every module of the library was imported
    assert plugin_modules.strip() == "[]"


def test_the_schema_and_reader_load_without_tensorflow():
    # TensorBoard loads the plugin, and with it these, in its own process
    out = _run("""
        import sys
        from keras_adapt.record import metadata, reader
        from tensorboard_plugin_adapt import plugin
        print("tensorflow" in sys.modules, metadata.PROTO_VERSION)
    """)
    assert out.split() == ["False", "1"]


def _imports():
    """``(importer, imported)`` for every import of a keras_adapt module in
    the library's source, read with ``ast`` (imports inside functions
    included): ``imported`` is a module's dotted name, or a name imported
    from a module."""
    root = pathlib.Path(keras_adapt.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = ".".join(parts[:-1])  # the package the module is in
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(importer, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package up
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found += [(importer, base)] + [(importer, f"{base}.{a.name}")
                                               for a in node.names]
    return [(a, b) for a, b in found if b.split(".")[0] == "keras_adapt"]


def _is_module(dotted):
    root = pathlib.Path(keras_adapt.__file__).parent.parent
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_no_module_imports_a_private_module_of_another_package():
    # A private module (its name starts with "_") belongs to the package it is
    # in: keras_adapt._hvd and the other top-level ones are the library's own
    # internals, shared by all of it; keras_adapt.<sub>._x is <sub>'s alone.
    wrong = []
    for importer, imported in _imports():
        names = imported.split(".")
        for i in range(1, len(names)):
            if names[i].startswith("_") and not names[i].startswith("__"):
                owner = ".".join(names[:i])
                if _is_module(".".join(names[:i + 1])) and not (
                        importer == owner or importer.startswith(owner + ".")):
                    wrong.append(f"{importer} imports {imported}")
                break
    assert not wrong, wrong


def test_elastic_and_callbacks_do_not_import_each_other_both_ways():
    # elastic drives the preemption checkpoint; the callbacks know nothing of elastic.
    between = {(a.split(".")[1], b.split(".")[1]) for a, b in _imports()
               if len(a.split(".")) > 1 and len(b.split(".")) > 1}
    assert ("callbacks", "elastic") not in between


FRAMEWORKS = ("tensorflow", "keras", "horovod")


def test_the_offline_commands_import_no_framework():
    # keras-adapt plan and report read logs: importing them, and their command
    # line up to reading, loads neither TensorFlow, Keras nor Horovod
    out = _run("""
        import contextlib, io, sys
        import keras_adapt.plan, keras_adapt.report
        from keras_adapt import cli
        for command in ("plan", "report"):
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    cli.main([command, "--help"])
                except SystemExit as stop:
                    assert stop.code == 0, (command, stop.code)
        print(sorted(m for m in sys.modules if m.split(".")[0] in %r))
    """ % (FRAMEWORKS,))
    assert out.strip() == "[]"



def test_the_horovod_build_imports_no_framework():
    # keras-adapt build-horovod runs where Horovod is not installed yet (or is
    # broken), and must not load TensorFlow into the process that builds:
    # it asks the environment's Python in a new process.
    out = _run("""
        import contextlib, io, sys
        from keras_adapt import cli, horovod_build
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.main(["build-horovod", "--help"])
            except SystemExit as stop:
                assert stop.code == 0, stop.code
        print(sorted(m for m in sys.modules if m.split(".")[0] in %r
                     or m.startswith("keras_adapt.") and not m.startswith("keras_adapt.horovod_build")))
    """ % (FRAMEWORKS,))
    assert out.strip() == "['keras_adapt.cli', 'keras_adapt.version']"

def test_the_formulas_import_no_framework_and_only_the_argument_checks():
    # The pure math stands below every other part: it checks its arguments
    # with keras_adapt.checks (itself framework-free) and imports nothing else.
    out = _run("""
        import sys
        import keras_adapt.formulas
        print(sorted(m for m in sys.modules if m.split(".")[0] in %r
                     or m.startswith("keras_adapt.") and not m.startswith("keras_adapt.formulas")))
    """ % (FRAMEWORKS,))
    assert out.strip() == "['keras_adapt.checks', 'keras_adapt.version']"


def test_every_public_module_is_an_attribute_of_the_package():
    """``keras_adapt.sync`` (or any other public part) works without importing it first."""
    public = sorted(m.name for m in __import__("pkgutil").iter_modules(keras_adapt.__path__)
                    if not m.name.startswith("_") and m.name not in ("cli", "version"))
    out = _run(f"""
        import keras_adapt
        for name in {public!r}:
            assert getattr(keras_adapt, name).__name__ == "keras_adapt." + name, name
            assert name in dir(keras_adapt) and name in keras_adapt.__all__, name
        print(len({public!r}))
    """)
    assert int(out) == len(public) >= 20
