"""Argument checks: each returns the checked value or raises an error naming it and the fix.

Every message has one form, ``name=value is not valid; <fix>``, where the
fix says what to pass instead (``use an int >= 1``); with ``owner`` the
argument is named with what it was given to: ``LocalSGD(period=0) is not
valid; ...``. A check that is specific to one place builds its message with
:func:`invalid`.

Integers are python or numpy integers, floats any real number (never a bool);
a check returns a python ``int`` or ``float``. This module imports only the
standard library, so the modules that load without TensorFlow can use it.

Example:

>>> from keras_adapt import checks
>>> checks.check_int("window", 8), checks.check_float("rate", 1)
(8, 1.0)
>>> checks.check_int("window", 0)
Traceback (most recent call last):
...
ValueError: window=0 is not valid; use an int >= 1
"""

import math
import numbers

__all__ = ["check_bool", "check_choice", "check_float", "check_int", "check_interval", "invalid"]


def invalid(name, value, fix, owner=None, error=ValueError):
    """The error for a bad argument: ``error("name=value is not valid; fix")``.

    ``fix`` says what to pass instead, verb first (``"use an int >= 1"``);
    ``owner`` names what the argument was given to.

    Example:

    >>> from keras_adapt.checks import invalid
    >>> str(invalid("mode", "grow", "use 'keep' or 'scale'"))
    "mode='grow' is not valid; use 'keep' or 'scale'"
    >>> str(invalid("period", 0, "use an int >= 1", owner="LocalSGD"))
    'LocalSGD(period=0) is not valid; use an int >= 1'
    """
    subject = f"{name}={value!r}" if owner is None else f"{owner}({name}={value!r})"
    return error(f"{subject} is not valid; {fix}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name, value, minimum=1, maximum=None, *, none=False, fix=None, owner=None,
              error=ValueError):
    """``value`` as an int if it is an integer in ``[minimum, maximum]`` (no
    upper bound when ``maximum`` is None), or None when ``none`` allows it.

    Otherwise ``error`` (a ``ValueError`` unless given) with the fix:
    ``fix`` if given, else the accepted range.

    Example:

    >>> from keras_adapt.checks import check_int
    >>> check_int("patience", 3), check_int("warmup", 0, 0), check_int("cap", None, none=True)
    (3, 0, None)
    >>> check_int("exit_code", 300, 0, 255)
    Traceback (most recent call last):
    ...
    ValueError: exit_code=300 is not valid; use an int in [0, 255]
    >>> check_int("batch_size", 2.5, none=True)
    Traceback (most recent call last):
    ...
    ValueError: batch_size=2.5 is not valid; use None or an int >= 1
    """
    if value is None and none:
        return None
    if _is_int(value) and minimum <= value and (maximum is None or value <= maximum):
        return int(value)
    if fix is None:
        kind = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
        fix = f"use {'None or ' if none else ''}{kind}"
    raise invalid(name, value, fix, owner, error)


def check_float(name, value, low=0.0, high=math.inf, *, low_open=False, high_open=False,
                finite=True, none=False, fix=None, owner=None, error=ValueError):
    """``value`` as a float if it is a number within ``low`` and ``high``
    (excluded with ``low_open`` / ``high_open``), finite unless ``finite`` is
    False (NaN never passes), or None when ``none`` allows it.

    Otherwise ``error`` (a ``ValueError`` unless given) with the fix:
    ``fix`` if given, else the accepted range.

    Example:

    >>> from keras_adapt.checks import check_float
    >>> check_float("hysteresis", 0), check_float("alpha", 0.5, 0, 1, low_open=True)
    (0.0, 0.5)
    >>> check_float("deadline_s", float("inf"), finite=False)
    inf
    >>> check_float("rho", 0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: rho=0 is not valid; use a finite float > 0
    >>> check_float("alpha", float("nan"), 0, 1, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: alpha=nan is not valid; use a float in (0, 1]
    """
    if value is None and none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        ok = (not finite or math.isfinite(value)) and (low < value if low_open else low <= value) \
            and (value < high if high_open else value <= high)
    if ok:
        return float(value)
    if fix is None:
        if high == math.inf:
            kind = f"{'finite ' if finite else ''}float {'>' if low_open else '>='} {low:g}"
        else:
            kind = (f"float in {'(' if low_open else '['}{low:g}, {high:g}"
                    f"{')' if high_open else ']'}")
        fix = f"use {'None or ' if none else ''}a {kind}"
    raise invalid(name, value, fix, owner, error)


def check_choice(name, value, choices, *, fix=None, owner=None, error=ValueError):
    """``value`` if it is one of ``choices``; otherwise ``error`` (a
    ``ValueError`` unless given) with the fix: ``fix`` if given, else the
    choices.

    Example:

    >>> from keras_adapt.checks import check_choice
    >>> check_choice("statistic", "median", ("mean", "median"))
    'median'
    >>> check_choice("mode", "grow", ("keep", "scale", "none"))
    Traceback (most recent call last):
    ...
    ValueError: mode='grow' is not valid; use 'keep', 'scale' or 'none'
    """
    if value in choices:
        return value
    if fix is None:
        names = [repr(c) for c in choices]
        fix = "use " + (f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0])
    raise invalid(name, value, fix, owner, error)


def check_bool(name, value, *, owner=None, error=TypeError):
    """``value`` if it is True or False.

    Otherwise a ``TypeError`` ``name must be True or False, got value``, the
    form the library's type errors take; any other ``error`` (with
    ``owner``, if given) gets the message of :func:`invalid`.

    Example:

    >>> from keras_adapt.checks import check_bool
    >>> check_bool("gpus", False)
    False
    >>> check_bool("gpus", "yes")
    Traceback (most recent call last):
    ...
    TypeError: gpus must be True or False, got 'yes'
    >>> check_bool("repeats", 1, error=ValueError)
    Traceback (most recent call last):
    ...
    ValueError: repeats=1 is not valid; use True or False
    """
    if isinstance(value, bool):
        return value
    if error is TypeError:
        raise TypeError(f"{name} must be True or False, got {value!r}")
    raise invalid(name, value, "use True or False", owner, error)


def check_interval(name, value, between):
    """``value`` as an int if it is an int >= 1, the number of training steps
    between ``between``; otherwise a ``ValueError`` saying so.

    Example:

    >>> from keras_adapt.checks import check_interval
    >>> check_interval("interval", 10, "measurements")
    10
    >>> check_interval("update_freq", 0, "writes")
    Traceback (most recent call last):
    ...
    ValueError: update_freq=0 is not valid; use a positive int, the number of training steps between writes (e.g. 10)
    """
    return check_int(name, value, 1, fix=f"use a positive int, the number of training steps "
                                         f"between {between} (e.g. 10)")
