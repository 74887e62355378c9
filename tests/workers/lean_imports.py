"""Imported first by every test worker that imports TensorFlow or Keras:
keeps Keras 3 from importing scikit-learn and matplotlib.

Keras 3 imports its scikit-learn wrapper and ``matplotlib.pyplot`` at
start-up whenever they are installed, and the primary stack has both (the
benchmarks' digits task, ``keras-adapt report``). No test worker uses
either, yet the two imports cost every worker process 1-2 s of CPU:
importing keras_adapt, Keras, TensorFlow and Horovod took 5.1-5.9 s of CPU
with them blocked against 6.9-7.6 s without (primary stack, idle machine,
three pairs of runs), in a suite that starts well over a hundred such
processes on two cores.
Entering ``None`` in ``sys.modules`` makes ``import sklearn`` (and
``import matplotlib...``) raise ``ImportError``, which Keras takes as "not
installed"; a worker that needed either would fail at that import, not
silently. tf.keras 2 (the legacy stack) imports neither, so this changes
nothing there. The benchmarks and examples, whose workers load scikit-learn's
digits, do not import this module.

Usage, before any TensorFlow or Keras import::

    import lean_imports  # noqa: F401  (the workers' folder is sys.path[0])
"""

import sys

for _name in ("sklearn", "matplotlib"):
    sys.modules.setdefault(_name, None)
