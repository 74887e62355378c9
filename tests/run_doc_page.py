"""Runs a page's blocks in order: ``run_doc_page.py BLOCKS.json``.

BLOCKS.json holds a list of ``[where, kind, code]`` (``where`` is
``page:line``). ``python`` (and ``invisible``) blocks run in one namespace,
each compiled with its ``where`` as the file name, so a traceback names the
page and the block's line; ``shell`` blocks run under ``bash -e`` in the
same working directory (so a command may read what an earlier block wrote),
with this Python's environment first on PATH. The first failing block ends
the run with exit 1 after printing ``FAILED where`` and why.
"""

import json
import os
import subprocess
import sys
import traceback


def _shell(code):
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    proc = subprocess.run(["bash", "-e", "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    print(proc.stdout, flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bash exited {proc.returncode}:\n{proc.stderr[-4000:]}")


def main(path):
    namespace = {"__name__": "__main__"}
    for where, kind, code in json.load(open(path)):
        try:
            if kind == "shell":
                _shell(code)
            else:
                exec(compile(code, where, "exec"), namespace)
        except BaseException:  # noqa: B902 - any failure of a block is the page's failure
            print(f"FAILED {where}", flush=True)
            traceback.print_exc()
            return 1
        print(f"ok {where}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
