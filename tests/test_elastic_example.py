"""Horovod's own elastic Keras example run on keras-adapt under real
``horovodrun`` elastic, with only its import changed.

The example (``examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py``
in Horovod 0.28.1's source) is not in Horovod's PyPI source distribution,
and nothing is fetched here: the test runs when ``KERAS_ADAPT_HOROVOD_SOURCE``
names a checkout of Horovod 0.28.1's source (as for the parity test of
Horovod's Keras test file), and skips saying so otherwise.

It is read at test time, ``import horovod.tensorflow.keras as hvd`` becomes
``import keras_adapt.horovod as hvd`` (its ``DistributedOptimizer``,
``elastic.KerasState``, ``elastic.run`` and callbacks are then keras-adapt's
under Horovod's names), and MNIST is replaced by seeded synthetic data of
MNIST's shapes (tests/workers/fake_mnist/sitecustomize.py on PYTHONPATH;
no download). The example trains 24 epochs of 500 // size steps; the test
is time-bounded instead: two workers start, train, one host is removed by
discovery mid-epoch, the other worker goes on with the whole epoch's steps
(500 instead of 250 per epoch), then the job is stopped.

Only on tf.keras 2: the example calls Keras 2 APIs that Keras 3 removed
(``model.compile(..., experimental_run_tf_function=False)`` is a TypeError
in Keras 3's ``compile``; its reset callback sets ``optimizer.lr``, which
Keras 3's optimizers do not have), so on Keras 3 it fails in Keras itself
whatever Horovod layer it uses.
"""

import os
import re
import sys
import time

import pytest

from conftest import HOROVODRUN, HERE, JOB_MARK, _env, discovery_script, horovod_source_file, kill_job
from keras_adapt import _keras

EXAMPLE = "examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py"


def substituted(text):
    """The example with keras_adapt.horovod in place of Horovod's Keras module."""
    text, n = re.subn(r"^import horovod\.tensorflow\.keras as hvd$",
                      "import keras_adapt.horovod as hvd", text, flags=re.M)
    assert n == 1, "the example's import changed; update the substitution"
    assert "horovod.tensorflow.keras" not in text and "horovod.keras" not in text
    return text


def _progress(text, steps):
    """The step counts printed by Keras's progress bar for epochs of ``steps`` steps."""
    return [int(m) for m in re.findall(rf"(\d+)/{steps} \[", text)]


@pytest.mark.skipif(_keras.IS_KERAS3,
                    reason="the example uses Keras 2 APIs that Keras 3 removed "
                           "(compile(experimental_run_tf_function=...), optimizer.lr)")
def test_horovods_elastic_keras_example_with_keras_adapt(tmp_path):
    import subprocess

    script = tmp_path / "tensorflow2_keras_mnist_elastic.py"
    script.write_text(substituted(open(horovod_source_file(
        EXAMPLE, "Horovod's elastic Keras example")).read()))
    discover, hosts = discovery_script(tmp_path, "localhost:1\n127.0.0.1:1\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "workers", "fake_mnist"),
                                         env["PYTHONPATH"]])
    env["PYTHONUNBUFFERED"] = "1"
    env[JOB_MARK] = f"{os.getpid()}-{time.monotonic_ns()}"
    log = tmp_path / "output.txt"
    cmd = [*HOROVODRUN, "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", discover, "--network-interface", "lo", "--gloo",
           sys.executable, str(script)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def wait_for(what, done, timeout=240):
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                text = log.read_text()
                if done(text):
                    return text
                if proc.poll() is not None:
                    pytest.fail(f"the example exited ({proc.returncode}) before {what}:\n"
                                f"{text[-6000:]}")
                time.sleep(0.5)
            pytest.fail(f"no {what} within {timeout} s:\n{log.read_text()[-6000:]}")

        # Two workers: epochs of 500 // 2 = 250 steps; 20 of them done.
        wait_for("20 steps on two workers", lambda t: max(_progress(t, 250), default=0) >= 20)
        with open(hosts + ".tmp", "w") as f:
            f.write("localhost:1\n")
        os.replace(hosts + ".tmp", hosts)
        # One worker: the job re-formed at a commit and the fit restarted
        # with 500 // 1 steps per epoch; 20 of them done.
        text = wait_for("20 steps on one worker", lambda t: max(_progress(t, 500), default=0) >= 20)
    finally:
        kill_job(env[JOB_MARK])
        proc.wait()
    before, after = text.split("/500 [", 1)[0], text
    assert max(_progress(before, 250)) >= 20
    # Still epoch 1 of 24 after the change: no epoch was counted for the
    # part of an epoch done before it.
    assert re.findall(r"Epoch (\d+)/(\d+)", after)[-1] == ("1", "24")
    assert "Traceback" not in text, text[-6000:]
