"""keras_adapt.checks: the values each check accepts and refuses, and its exact messages."""

import fractions
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from keras_adapt.checks import (check_bool, check_choice, check_float, check_int, check_interval,
                                invalid)


def _refused(call, error=ValueError):
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error
    return str(info.value)


def test_invalid_names_the_value_the_fix_and_the_owner():
    assert str(invalid("mode", "grow", "use 'keep'")) == "mode='grow' is not valid; use 'keep'"
    assert str(invalid("period", 0, "use an int >= 1", owner="LocalSGD")) == (
        "LocalSGD(period=0) is not valid; use an int >= 1")
    err = invalid("x", [1], "pass a dict", error=TypeError)
    assert type(err) is TypeError and str(err) == "x=[1] is not valid; pass a dict"


@pytest.mark.parametrize("value, minimum, maximum, expected", [
    (1, 1, None, 1), (0, 0, None, 0), (10**12, 1, None, 10**12), (255, 0, 255, 255),
    (np.int64(32), 1, None, 32), (np.uint8(3), 1, None, 3), (-3, -5, None, -3),
])
def test_check_int_accepts_integers_in_range_as_python_ints(value, minimum, maximum, expected):
    out = check_int("n", value, minimum, maximum)
    assert out == expected and type(out) is int


@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, 2.5, "3", None, np.float64(2.0),
                                   [1]])
def test_check_int_refuses_what_is_not_an_int_in_range(value):
    assert _refused(lambda: check_int("window", value)) == (
        f"window={value!r} is not valid; use an int >= 1")


def test_check_int_messages():
    assert _refused(lambda: check_int("warmup", -1, 0)) == (
        "warmup=-1 is not valid; use an int >= 0")
    assert _refused(lambda: check_int("exit_code", 256, 0, 255)) == (
        "exit_code=256 is not valid; use an int in [0, 255]")
    assert _refused(lambda: check_int("exit_code", 0, 1, 255)) == (
        "exit_code=0 is not valid; use an int in [1, 255]")
    assert _refused(lambda: check_int("batch_size", 0, none=True)) == (
        "batch_size=0 is not valid; use None or an int >= 1")
    assert _refused(lambda: check_int("period", 0, owner="LocalSGD")) == (
        "LocalSGD(period=0) is not valid; use an int >= 1")
    assert _refused(lambda: check_int("workers", 0, fix="pass the worker count")) == (
        "workers=0 is not valid; pass the worker count")
    assert _refused(lambda: check_int("w", 0, error=TypeError), TypeError) == (
        "w=0 is not valid; use an int >= 1")


def test_check_int_none_only_when_allowed():
    assert check_int("cap", None, none=True) is None
    assert check_int("cap", 0, 0, none=True) == 0


@pytest.mark.parametrize("kwargs, value, expected", [
    ({}, 0, 0.0), ({}, 2, 2.0), ({}, np.float32(0.5), 0.5), ({}, fractions.Fraction(1, 4), 0.25),
    ({"low_open": True}, 1e-300, 1e-300),
    ({"low": 0, "high": 1}, 1, 1.0), ({"low": 0, "high": 1}, 0, 0.0),
    ({"low": 0, "high": 1, "high_open": True}, 0.999, 0.999),
    ({"low": 1, "low_open": True}, 1.5, 1.5), ({"low": -2.0}, -2, -2.0),
    ({"finite": False}, math.inf, math.inf),
])
def test_check_float_accepts_numbers_in_range_as_python_floats(kwargs, value, expected):
    out = check_float("x", value, **kwargs)
    assert out == expected and type(out) is float


@pytest.mark.parametrize("kwargs, value, fix", [
    ({}, -0.1, "use a finite float >= 0"),
    ({}, math.inf, "use a finite float >= 0"),
    ({}, math.nan, "use a finite float >= 0"),
    ({}, True, "use a finite float >= 0"),
    ({}, "0.1", "use a finite float >= 0"),
    ({}, None, "use a finite float >= 0"),
    ({"low_open": True}, 0, "use a finite float > 0"),
    ({"low_open": True}, 0.0, "use a finite float > 0"),
    ({"low": 1, "low_open": True}, 1, "use a finite float > 1"),
    ({"low": 0.5}, 0.25, "use a finite float >= 0.5"),
    ({"finite": False}, math.nan, "use a float >= 0"),
    ({"finite": False}, -math.inf, "use a float >= 0"),
    ({"high": 1.0}, 1.5, "use a float in [0, 1]"),
    ({"high": 1.0, "low_open": True}, 0, "use a float in (0, 1]"),
    ({"high": 1.0, "high_open": True}, 1.0, "use a float in [0, 1)"),
    ({"high": 1.0, "high_open": True}, math.nan, "use a float in [0, 1)"),
    ({"none": True}, -1, "use None or a finite float >= 0"),
    ({"none": True, "high": 2}, 3, "use None or a float in [0, 2]"),
    ({"fix": "use seconds >= 0 (e.g. 30)"}, -1, "use seconds >= 0 (e.g. 30)"),
])
def test_check_float_refuses_with_the_range(kwargs, value, fix):
    assert _refused(lambda: check_float("x", value, **kwargs)) == (
        f"x={value!r} is not valid; {fix}")


def test_check_float_owner_error_and_none():
    assert _refused(lambda: check_float("rho", 0, low_open=True, owner="ElasticAveraging")) == (
        "ElasticAveraging(rho=0) is not valid; use a finite float > 0")
    assert _refused(lambda: check_float("s", -1, error=KeyError), KeyError) == (
        repr("s=-1 is not valid; use a finite float >= 0"))
    assert check_float("initial_lr", None, none=True) is None


def test_check_choice():
    assert check_choice("statistic", "mean", ("mean", "median")) == "mean"
    assert check_choice("verbose", 1, (0, 1)) == 1
    assert _refused(lambda: check_choice("statistic", "mode", ("mean", "median"))) == (
        "statistic='mode' is not valid; use 'mean' or 'median'")
    assert _refused(lambda: check_choice("mode", "grow", ("keep", "scale", "none"))) == (
        "mode='grow' is not valid; use 'keep', 'scale' or 'none'")
    assert _refused(lambda: check_choice("only", 2, (1,))) == "only=2 is not valid; use 1"
    assert _refused(lambda: check_choice("verbose", 2, (0, 1), fix="use 0 (silent) or 1")) == (
        "verbose=2 is not valid; use 0 (silent) or 1")
    assert _refused(lambda: check_choice("data_class", "x", ("scalar",), owner="f")) == (
        "f(data_class='x') is not valid; use 'scalar'")


def test_check_bool():
    assert check_bool("gpus", True) is True and check_bool("gpus", False) is False
    for value in (1, 0, "yes", None, np.bool_(True)):
        assert _refused(lambda: check_bool("gpus", value), TypeError) == (
            f"gpus must be True or False, got {value!r}")
    assert _refused(lambda: check_bool("repeats", 1, error=ValueError)) == (
        "repeats=1 is not valid; use True or False")
    assert _refused(lambda: check_bool("nesterov", "yes", owner="BlockMomentum",
                                       error=ValueError)) == (
        "BlockMomentum(nesterov='yes') is not valid; use True or False")


def test_check_interval():
    assert check_interval("interval", 1, "samples") == 1
    assert check_interval("interval", np.int32(7), "samples") == 7
    for value in (0, -3, 2.0, True, None):
        assert _refused(lambda: check_interval("interval", value, "samples")) == (
            f"interval={value!r} is not valid; use a positive int, the number of training "
            "steps between samples (e.g. 10)")


def test_every_message_has_the_one_form():
    # every check's message, its owner form included, starts "name=value is not valid; "
    calls = [lambda: check_int("a", 0), lambda: check_float("a", -1),
             lambda: check_choice("a", 3, (1, 2)), lambda: check_interval("a", 0, "x"),
             lambda: check_bool("a", 2, error=ValueError)]
    for call in calls:
        assert re.match(r"a=(0|-1|3|2) is not valid; (use|pass) ", _refused(call))


def test_imports_only_the_standard_library():
    code = ("import sys; import keras_adapt.checks; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'numpy', 'horovod') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["[]"]
