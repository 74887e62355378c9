"""Run under horovodrun by tests/test_job_diagnostics.py: rank 1 aborts
(SIGABRT, as an uncaught C++ exception in a library ends a process), rank 0
waits to be stopped. No TensorFlow: the job starts in a second or two."""

import os
import time


def abort_here():
    os.abort()


if os.environ["HOROVOD_RANK"] == "1":
    abort_here()
time.sleep(60)  # the launcher stops this worker when rank 1 has failed
