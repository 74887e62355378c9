"""Launches the main example on two local Horovod workers (`make demo`).

Runs examples/adaptive_batch.py under horovodrun, then draws the static
report of the run and prints the TensorBoard command for the Adapt tab.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    logdir = os.path.join(os.path.dirname(HERE), "runs", "adaptive_batch")
    # A fresh run directory: the event log appends.
    if os.path.isdir(logdir):
        import shutil

        shutil.rmtree(logdir)
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, os.path.join(HERE, "adaptive_batch.py"), "--logdir", logdir,
           *sys.argv[1:]]
    print("$", " ".join(cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        sys.exit(rc)
    from keras_adapt.report import write_report

    report = os.path.join(logdir, "report.png")
    write_report(os.path.dirname(logdir), report, runs=[os.path.basename(logdir)])
    print(f"\nreport: {report}\n"
          f"TensorBoard: {os.path.dirname(sys.executable)}/tensorboard "
          f"--logdir {os.path.dirname(logdir)}  (then open http://localhost:6006/#adapt)")


if __name__ == "__main__":
    main()
