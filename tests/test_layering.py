"""The direction of imports: the library never imports its viewer, and the
offline parts never import the frameworks.

keras-adapt owns the schema of what it records (``keras_adapt.record``); the
TensorBoard plugin imports it. The pure math (``keras_adapt.formulas``), the
planner and the report need neither TensorFlow, Keras nor Horovod. Checked in
fresh interpreters, so nothing an earlier test imported can hide an import.
"""

import subprocess
import sys
import textwrap


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


def test_the_formulas_import_no_framework_and_no_other_part_of_the_library():
    out = _run("""
        import sys
        import keras_adapt.formulas
        print(sorted(m for m in sys.modules if m.split(".")[0] in %r
                     or m.startswith("keras_adapt.") and not m.startswith("keras_adapt.formulas")))
    """ % (FRAMEWORKS,))
    assert out.strip() == "['keras_adapt.version']"
