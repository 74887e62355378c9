"""Launches the main example on two local Horovod workers (`make demo`)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    logdir = os.path.join(os.path.dirname(HERE), "runs", "monitor_noise_scale")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, os.path.join(HERE, "monitor_noise_scale.py"), "--logdir", logdir]
    print("$", " ".join(cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rc = subprocess.call(cmd, env=env)
    if rc == 0:
        print(f"\nlogs are in {logdir}\n"
              f"see them with: {os.path.dirname(sys.executable)}/tensorboard --logdir {logdir}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
