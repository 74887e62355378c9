"""``horovodrun`` for the test suite: Horovod's launcher, with its build
checks asked once per test session instead of once per job.

Before it starts a job, ``horovodrun`` asks whether Horovod was built with
Gloo (or MPI): Horovod's ``gloo_built()``/``mpi_built()`` load its
TensorFlow extension in a new process, which imports TensorFlow. That is
about 6 s on the primary stack (3.8 s on the legacy one) before every job's
workers start; ``make test`` starts about 80 jobs.

This script runs Horovod's launcher (``horovod.runner.launch``'s
``run_commandline``, what the ``horovodrun`` script runs) unchanged, except
that each check's answer is kept in the JSON file named by
``KERAS_ADAPT_TEST_HOROVOD_BUILT`` (conftest.py gives each test session its
own): the first job of the session asks Horovod's real check, and the later
ones read its answer. Without the variable every check is asked, as by
``horovodrun``. Usage is ``horovodrun``'s::

    python tests/horovodrun_checked_once.py -np 2 -H localhost:2 --gloo python train.py
"""

import json
import os
import sys

import horovod.runner.launch as launch

#: The environment variable naming the session's answers file.
ANSWERS_ENV = "KERAS_ADAPT_TEST_HOROVOD_BUILT"


def _asked_once(name, check):
    """``check`` (a Horovod build check) whose answer is kept under ``name``."""
    path = os.environ.get(ANSWERS_ENV)
    if not path:
        return check

    def answered(verbose=False):
        try:
            with open(path) as f:
                answers = json.load(f)
        except (OSError, ValueError):
            answers = {}
        if name not in answers:
            answers[name] = bool(check(verbose=verbose))
            partial = f"{path}.{os.getpid()}"
            with open(partial, "w") as f:
                json.dump(answers, f)
            os.replace(partial, path)
        return answers[name]

    return answered


def main():
    launch.gloo_built = _asked_once("gloo", launch.gloo_built)
    launch.mpi_built = _asked_once("mpi", launch.mpi_built)
    return launch.run_commandline()


if __name__ == "__main__":
    # The launcher starts processes with multiprocessing: only under the
    # main guard.
    sys.exit(main())
