"""Type and range checks for ``CheckpointManager``'s arguments, one line each in ``run/config.py``.

Python does not check annotations at run time, so a wrong type used to travel until something
compared or formatted it: ``num_checkpoints_to_keep="3"`` failed as a bare ``TypeError``, and
``preemption_exit_code="x"`` only at SIGTERM, when the process printed ``x`` and exited 1. Each
check here raises a ``ConfigError`` naming the argument, the expected type and range, and what
was given. ``bool`` is not a number here: ``True`` is an ``int`` to Python but never a count or
an exit code a user meant. (Rejected: coercing, e.g. ``int("3")``: a string where a number
belongs is more often the wrong argument than a value that needs converting.)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T", int, float)


def kind(value: object) -> str:
    """``value``'s type with its article: "a str", "an int"."""
    kind = type(value).__name__
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def flag(name: str, value: object) -> bool:
    """``value`` must be True or False (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected True or False, got {kind(value)}")
    return value


def integer(name: str, value: object, expected: str, ok: Callable[[int], bool]) -> int:
    """An int (not a bool) for which ``ok`` holds; ``expected`` says which ones, for the error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}={value!r}: expected an int, {expected}; got {kind(value)}")
    if not ok(int(value)):
        raise ConfigError(f"{name}={value!r}: expected {expected}")
    return int(value)


def optional_integer(
    name: str, value: object, expected: str, ok: Callable[[int], bool]
) -> int | None:
    """None, or an ``integer`` for which ``ok`` holds."""
    return None if value is None else integer(name, value, f"None or {expected}", ok)


def seconds(name: str, value: object, expected: str, ok: Callable[[float], bool]) -> float:
    """A number of seconds (int or float, not a bool, not NaN) for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name}={value!r}: expected {expected}; got {kind(value)}")
    number = float(value)
    if math.isnan(number) or not ok(number):
        raise ConfigError(f"{name}={value!r}: expected {expected}")
    return number


def duration(name: str, value: object) -> timedelta:
    """A positive ``datetime.timedelta``."""
    expected = "a datetime.timedelta > 0, e.g. timedelta(minutes=10)"
    if not isinstance(value, timedelta):
        raise ConfigError(f"{name}={value!r}: expected {expected}; got {kind(value)}")
    if value <= timedelta(0):
        raise ConfigError(f"{name}={value!r}: expected {expected}")
    return value


def names(name: str, value: object, what: str) -> tuple[str, ...]:
    """A list (any iterable but a string) of strings. A plain string is refused rather than
    taken as one name: iterating it would yield its characters, and splitting it on commas
    would be a guess."""
    if isinstance(value, str | bytes):
        raise ConfigError(
            f"{name}={value!r}: expected a list of {what}, e.g. [{value!r}], not a string"
        )
    try:
        items = tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError(f"{name}={value!r}: expected a list of {what}") from None
    wrong = [item for item in items if not isinstance(item, str)]
    if wrong:
        raise ConfigError(
            f"{name}={value!r}: expected a list of {what} (strings), got {wrong[0]!r}"
        )
    return items


def environment_seconds(
    variable: str,
    environ: Mapping[str, str],
    default: float,
    expected: str,
    ok: Callable[[float], bool],
) -> float:
    """A number of seconds from an environment variable: ``default`` when unset or empty, else
    a finite decimal number for which ``ok`` holds. A bad value is a ``ConfigError`` naming the
    variable and ``expected``."""
    return _from_environment(variable, environ, default, expected, parse=_finite_float, ok=ok)


def environment_integer(
    variable: str,
    environ: Mapping[str, str],
    default: int,
    expected: str,
    ok: Callable[[int], bool],
) -> int:
    """An integer environment variable (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``): ``default``
    when unset or empty, else a decimal int for which ``ok`` holds. A bad value is a
    ``ConfigError`` naming the variable (``int()``'s own ``ValueError`` named neither the
    variable nor what was expected)."""
    return _from_environment(variable, environ, default, expected, parse=_int_or_none, ok=ok)


def _finite_float(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int_or_none(raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _from_environment(
    variable: str,
    environ: Mapping[str, str],
    default: T,
    expected: str,
    *,
    parse: Callable[[str], T | None],
    ok: Callable[[T], bool],
) -> T:
    """``default`` when the variable is unset or empty, else its parsed value for which ``ok``
    holds; otherwise a ``ConfigError`` naming the variable and ``expected``."""
    raw = environ.get(variable, "").strip()
    if not raw:
        return default
    value = parse(raw)
    if value is None or not ok(value):
        raise ConfigError(f"{variable}={raw!r}: expected {expected}")
    return value
