"""Durations: ``2000``, ``"2000"``, ``"250ms"``, ``"5s"``, ``"1.5s"``, ``"2m"``, ``"1h"``."""

from __future__ import annotations

import re
from fractions import Fraction

from ._errors import ConfigError, show

__all__ = ["parse_duration"]

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "": 1}
_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)")
_MAX_MS = 2**53 - 1
_MAX_DIGITS = 20  # more digits than this is always too large (and too slow to convert)


def parse_duration(value: object, *, field: str = "duration") -> int:
    """Return the duration *value* in whole milliseconds.

    Accepts a non-negative ``int`` (milliseconds) or a string: digits (milliseconds), or a number
    with one of the units ``ms``, ``s``, ``m``, ``h``. Anything else raises `ConfigError` naming
    the value.

    >>> parse_duration("1.5s")
    1500
    """
    shown = f"{field}={show(value)}"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{shown} is not a duration; use milliseconds as an int or a string "
            f"such as '250ms', '5s', '1.5s', '2m' or '1h'"
        )
    if isinstance(value, int):
        ms: Fraction | int = value
    else:
        match = _PATTERN.fullmatch(value.strip().lower())
        if match is None:
            raise ConfigError(
                f"{shown} is not a duration; write a number with a unit: "
                f"'250ms', '5s', '1.5s', '2m', '1h' (a bare number means milliseconds)"
            )
        if len(match.group(1).partition(".")[0]) > _MAX_DIGITS:
            raise ConfigError(f"{shown} is too large; the most is {_MAX_MS} ms")
        number = match.group(1)
        unit = _UNITS[match.group(2)]
        ms = int(number) * unit if "." not in number else Fraction(number) * unit
    if ms < 0:
        raise ConfigError(f"{shown} is negative; a duration is 0 or more milliseconds")
    if isinstance(ms, Fraction) and ms.denominator != 1:
        raise ConfigError(
            f"{shown} is not a whole number of milliseconds; round it, e.g. "
            f"'{round(ms)}ms'"
        )
    if ms > _MAX_MS:
        raise ConfigError(f"{shown} is too large; the most is {_MAX_MS} ms")
    return int(ms)
