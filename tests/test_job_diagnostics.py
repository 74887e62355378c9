"""The test helpers' account of a dead worker: a real ``horovodrun`` job
whose worker aborts, read the way a failing test's report shows it."""

import os

from conftest import WORKERS, horovodrun, worker_failures


def test_an_aborted_worker_shows_its_exit_and_python_stack():
    done = horovodrun("abort_worker.py", np=2, timeout=120, check=False)
    assert done.returncode != 0 and done.leftover == 0
    found = worker_failures(done.stdout, done.stderr)
    # The launcher's line for the worker: 128 + SIGABRT (6).
    assert "Process 1 exit with status code 134." in found
    # The stack faulthandler printed (PYTHONFAULTHANDLER reaches the workers):
    # the aborting function, called from the script's top level.
    rank1 = found.split("--- rank 1 stderr from its first fatal line\n", 1)[1]
    assert rank1.startswith("Fatal Python error: Aborted")
    script = os.path.join(WORKERS, "abort_worker.py")
    lines = open(script).read().splitlines()
    aborts, calls = lines.index("    os.abort()") + 1, lines.index("    abort_here()") + 1
    assert f'File "{script}", line {aborts} in abort_here' in rank1
    assert f'File "{script}", line {calls} in <module>' in rank1
    assert "--- rank 0" not in found  # the worker the launcher stopped died of nothing


def test_worker_failures_is_empty_for_a_clean_job_and_reads_forwarded_lines():
    assert worker_failures("all good\n", "[0]<stderr>:a warning\n") == ""
    stderr = ("[1]<stdout>:step 3\n[1]<stderr>:terminate called after throwing an instance "
              "of 'gloo::IoException'\n[0]<stderr>:unrelated\n[1]<stderr>:  what():  Read error\n")
    assert worker_failures("Process 1 exit with status code 134.\n", stderr) == (
        "--- worker exits: Process 1 exit with status code 134.\n"
        "--- rank 1 stderr from its first fatal line\n"
        "terminate called after throwing an instance of 'gloo::IoException'\n"
        "  what():  Read error")
    mpi = "[1,1]<stderr>:Fatal Python error: Segmentation fault\n"
    assert worker_failures("", mpi) == ("--- rank 1 stderr from its first fatal line\n"
                                        "Fatal Python error: Segmentation fault")
    many = "".join(f"[0]<stderr>:Traceback (most recent call last) {i}\n" for i in range(5))
    assert worker_failures("", many, lines=2).count("\n") == 2  # header + 2 lines
