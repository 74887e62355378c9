"""The ``keras-adapt`` command (also ``python -m keras_adapt``).

``keras-adapt report LOGDIR -o report.png`` (or ``.html``) draws the Adapt
tab's charts for every run under LOGDIR without TensorBoard.

Example:

>>> from keras_adapt import cli
>>> cli.main(["report", "/nonexistent", "-o", "r.png"])
2
"""

import argparse
import os
import sys

__all__ = ["main"]


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-adapt",
        description="Tools for keras-adapt runs (adaptive distributed training for Keras).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rep = sub.add_parser(
        "report",
        help="draw the Adapt tab's charts into a PNG or HTML file",
        description="Draws noise scale and global batch size, learning rate, workers, "
        "throughput, per-worker step times and every adaptation event for each run "
        "under LOGDIR into a PNG, or an HTML page with the picture and an events table.",
    )
    rep.add_argument("logdir", metavar="LOGDIR", help="TensorBoard log directory (runs below it)")
    rep.add_argument("-o", "--output", default="adapt_report.png",
                     help="output file ending in .png or .html (default: %(default)s)")
    rep.add_argument("--run", action="append", dest="runs", metavar="RUN",
                     help="only this run (repeatable; names as TensorBoard shows them)")
    rep.add_argument("--max-points", type=int, default=2000,
                     help="points per series after downsampling (default: %(default)s)")
    return parser


def main(argv=None):
    """Runs the command line; returns the exit code (0 ok, 2 bad input).

    Example:

    >>> from keras_adapt import cli
    >>> cli.main(["report", "/nonexistent", "-o", "r.txt"])
    2
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "report":
        parser.print_help()
        return 2
    if args.max_points < 2:
        print(f"keras-adapt report: --max-points={args.max_points} is not valid; use 2 or more",
              file=sys.stderr)
        return 2
    # TensorFlow (loaded with TensorBoard's reader) prints start-up lines at
    # INFO level; a command-line tool shows only warnings and errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_adapt import report

    try:
        path = report.write_report(args.logdir, args.output, runs=args.runs,
                                   max_points=args.max_points)
    except (ValueError, FileNotFoundError) as exc:
        print(f"keras-adapt report: {exc}", file=sys.stderr)
        return 2
    print(f"keras-adapt report: wrote {path}")
    print(f"Interactive view: tensorboard --logdir {args.logdir}  (the Adapt tab)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
