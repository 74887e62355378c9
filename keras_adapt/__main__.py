"""``python -m keras_adapt report LOGDIR -o report.png``: see :mod:`keras_adapt.cli`."""

import sys

from keras_adapt.cli import main

if __name__ == "__main__":
    sys.exit(main())
