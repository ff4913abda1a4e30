"""Checks of options and arguments, shared by ``App``, its decorators and its calls.

Each check raises before anything is stored, with a message that names the option and the bad
value. Which exception it raises is the caller's choice (``Errors``): ``ConfigurationError`` for
the configuration of an app or of a decorator, ``TypeError``/``ValueError`` for call arguments.
"""

from __future__ import annotations

import math
from typing import NamedTuple, NoReturn

from shoal.errors import ConfigurationError

# priority and max_attempts are 32-bit integer columns in the SQL stores
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# The shortest lease: it is renewed every lease/3, and a renewal is a store round trip plus a
# turn of the event loop; below half a second, a loaded machine misses renewals.
MIN_LEASE = 0.5


class Errors(NamedTuple):
    """What a check raises for a value of the wrong type, and for one of the right type that
    is out of range."""

    wrong_type: type[Exception]
    bad_value: type[Exception]


CONFIG = Errors(ConfigurationError, ConfigurationError)   # App(...) and decorators
CALL = Errors(TypeError, ValueError)                      # call arguments
VALUE = Errors(ValueError, ValueError)                    # calls that always raised ValueError


def _fail(error: type[Exception], what: str, expected: str, value: object) -> NoReturn:
    raise error(f"{what} must be {expected}, not {value!r:.80}.")


def integer(value: object, what: str, errors: Errors, *, low: int | None = None,
            high: int | None = None) -> int:
    """``value`` as an int in [low, high] (a bool is not an int here)."""
    if low is not None and high is not None:
        expected = f"an int between {low} and {high}"
    elif low is not None:
        expected = f"an int >= {low}"
    else:
        expected = "an int" if high is None else f"an int <= {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(errors.wrong_type, what, expected, value)
    if (low is not None and value < low) or (high is not None and value > high):
        _fail(errors.bad_value, what, expected, value)
    return value


def seconds(value: object, what: str, errors: Errors, *, low: float = 0.0,
            above: bool = False) -> float:
    """``value`` as a finite number of seconds, ``>= low`` (``> low`` with ``above``)."""
    expected = f"a finite number of seconds {'>' if above else '>='} {low:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(errors.wrong_type, what, expected, value)
    if not math.isfinite(value) or value < low or (above and value == low):
        _fail(errors.bad_value, what, expected, value)
    return float(value)


def finite(value: object, what: str, errors: Errors) -> float:
    """``value`` as a finite number (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(errors.wrong_type, what, "a finite number", value)
    if not math.isfinite(value):
        _fail(errors.bad_value, what, "a finite number", value)
    return float(value)


def text(value: object, what: str, errors: Errors, *, empty: bool = False) -> str:
    """``value`` as a str every store can keep: non-empty (unless ``empty``), without NUL
    characters (PostgreSQL text has none) and encodable as UTF-8 (no lone surrogates)."""
    expected = "a str" if empty else "a non-empty str"
    if not isinstance(value, str):
        _fail(errors.wrong_type, what, expected, value)
    if not empty and not value:
        _fail(errors.bad_value, what, expected, value)
    if "\x00" in value:
        _fail(errors.bad_value, what, f"{expected} without NUL characters", value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _fail(errors.bad_value, what, f"{expected} encodable as UTF-8", value)
    return value


def one_of(value: object, what: str, errors: Errors, choices: tuple[str, ...]) -> str:
    """``value`` as one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        _fail(errors.bad_value, what, " or ".join(repr(c) for c in choices), value)
    return value
