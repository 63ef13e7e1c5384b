"""Durations: ``2000``, ``"2000"``, ``"250ms"``, ``"5s"``, ``"1.5s"``, ``"2m"``, ``"1h"``."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Context, Decimal

from .errors import ConfigError, show

__all__ = ["flag_duration", "parse_duration", "spoken"]

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "": 1}
_PATTERN = re.compile(r"([0-9]+)(?:\.([0-9]+))?\s*(ms|s|m|h|)")
_MAX_MS = 2**53 - 1
#: a whole part with more significant digits than this is above the most in any unit
_MAX_DIGITS = len(str(_MAX_MS))


def parse_duration(value: object, *, field: str = "duration") -> int:
    """Return the duration *value* in whole milliseconds.

    Accepts a non-negative ``int`` (milliseconds) or a string: digits (milliseconds), or a number
    with one of the units ``ms``, ``s``, ``m``, ``h``. Anything else raises `ConfigError` naming
    the value.

    >>> parse_duration("1.5s")
    1500
    """
    if type(value) is int and 0 <= value <= _MAX_MS:
        return value
    if type(value) is str:
        known = _parsed.get(value)
        if known is not None:
            return known
    ms = _read(value, field)
    if type(value) is str:
        if len(_parsed) >= _CACHED:
            _parsed.clear()
        _parsed[value] = ms
    return ms


def flag_duration(value: str, flag: str) -> int:
    """The duration a command-line flag was given (``--time 5s``), in ms: on a flag a number
    carries its unit, so that ``--time 5`` is never 5 ms in silence (a `ConfigError` says
    ``5s`` or ``5000ms``); ``0`` alone stays 0 where 0 means off. ``%%budget`` and
    ``nbbudget run`` read ``--time``, ``--budget`` and ``--timeout`` with it; ``nb.call``,
    ``nb.budget`` and ``AGENT_CALL_BUDGET_MS`` keep bare milliseconds (seed 000)."""
    text = value.strip()
    if text.isdigit() and text.lstrip("0"):
        raise ConfigError(f"{flag} {text} has no unit: write {flag} {text.lstrip('0')}s for "
                          f"seconds or {flag} {text.lstrip('0')}ms for milliseconds (also m, h)")
    return parse_duration(value, field=flag)


#: durations read before, by their text (a call's budget is read at every call)
_parsed: dict[str, int] = {}
_CACHED = 256


def _read(value: object, field: str) -> int:
    """*value* read as a duration; a `ConfigError` names *field* and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{_shown(field, value)} is not a duration; use milliseconds as an int or a string "
            f"such as '250ms', '5s', '1.5s', '2m' or '1h'"
        )
    ms = Decimal(value) if isinstance(value, int) else _text_ms(value, field)
    if ms < 0:
        raise ConfigError(f"{_shown(field, value)} is negative; a duration is 0 or more "
                          f"milliseconds")
    if ms > _MAX_MS:
        raise ConfigError(f"{_shown(field, value)} is too large; the most is {_MAX_MS} ms")
    whole = ms.to_integral_value(rounding=ROUND_HALF_EVEN)
    if ms != whole:
        raise ConfigError(
            f"{_shown(field, value)} is not a whole number of milliseconds; round it, e.g. "
            f"'{whole}ms'"
        )
    return int(whole)


def _shown(field: str, value: object) -> str:
    return f"{field}={show(value)}"


def _text_ms(text: str, field: str) -> Decimal:
    """The milliseconds a duration text says, exactly: decimal arithmetic, so that a number of
    any length is read without Python's limit on digits, and leading zeros count for nothing."""
    written = text.strip().lower()
    match = _PATTERN.fullmatch(written.removeprefix("-"))  # a negative one is read, then refused
    if match is None:
        raise ConfigError(
            f"{_shown(field, text)} is not a duration; write a number with a unit: "
            f"'250ms', '5s', '1.5s', '2m', '1h' (a bare number means milliseconds)"
        )
    whole, fraction, unit = match.group(1).lstrip("0"), match.group(2) or "", match.group(3)
    if len(whole) > _MAX_DIGITS:
        ms = Decimal(_MAX_MS + 1)  # too large, whatever its fraction: not worth reading
    else:
        digits = len(whole) + len(fraction) + 8  # room for the exact product by the unit
        exact = Context(prec=digits, Emax=digits, Emin=-digits)
        ms = exact.multiply(Decimal(f"{whole or 0}.{fraction or 0}"), _UNITS[unit])
    return -ms if written.startswith("-") else ms


def spoken(ms: float) -> str:
    """A duration as a person says it: ``850 ms``, ``3.2 s``, ``42 s``, ``2 min 5 s``,
    ``1 min``, ``1 h 3 min``, ``2 h`` (for tables and panels, not for parsing back)."""
    seconds = max(0.0, ms / 1000)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
