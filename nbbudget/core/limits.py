"""What a run is allowed: `Limits` (frozen) and the manifest declaring them (S2-8, S4-1, S4-2)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .duration import flag_duration
from .errors import ConfigError, WideningError, show
from .files import file_path, read_json
from .kinds import KIND_INDEX, KINDS, Kind

__all__ = ["MANIFEST_VERSION", "MAX_INT", "NO_LIMITS", "Limits", "Manifest", "budget_flags",
           "check_limit", "limits_from_flags", "negative_values_joined"]

MAX_INT = 2**53 - 1
MANIFEST_VERSION = "nbbudget-manifest-v1"


def check_limit(field: str, value: object, *, flag: str | None = None,
                json: bool = False) -> int | float | None:
    """Validate one limit value (S3-4, S4-1) and return it; `None` means unbounded.

    Every message names the value as it was given, and says how to ask for no limit where it
    was given: ``None`` in Python, ``null`` in JSON (*json*), leaving the flag out on a
    command line (*flag*, the flag that gave it).
    """
    if value is None:
        return None
    integral = KINDS[KIND_INDEX[field]].integral
    shown = f"{flag} {_brief(value)}" if flag is not None else f"{field}={_brief(value)}"
    unbounded = (f"leave {flag} out" if flag is not None else "use null" if json
                 else "use None") + " for no limit"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"{shown} is not a number; use a positive "
            f"{'integer' if integral else 'number'}, or {unbounded.removeprefix('use ')}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{shown} is not finite; {unbounded}")
    if integral and isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{shown} is not a whole number; use an integer")
    if value <= 0:
        raise ConfigError(f"{shown} must be greater than 0; {unbounded}")
    if value > MAX_INT:
        raise ConfigError(f"{shown} is too large; the most is {MAX_INT}")
    return int(value) if integral else value


@dataclass(frozen=True, slots=True)
class Limits:
    """Ceilings for a whole run, shared by everything inside it. ``None`` means unbounded.

    Integers are strictly positive and at most 2**53 - 1; ``cost_usd`` is a positive finite
    number (S4-1). Combine sources with ``a & b`` (field-wise minimum) or ``a.restrict(b)``,
    which refuses to widen (S4-2).
    """

    run_ms: int | None = None
    steps: int | None = None
    tool_calls: int | None = None
    agent_invocations: int | None = None
    provider_calls: int | None = None
    turns: int | None = None
    tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        for f in _FIELDS:  # (fields(self) builds the tuple again at each call)
            value = getattr(self, f.name)
            if value is not None:  # None is unbounded as given; most fields are None
                object.__setattr__(self, f.name, check_limit(f.name, value))

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_json(cls, source: str | bytes | Mapping[str, Any]) -> Limits:
        """Limits from a JSON text or a mapping; keys are field names, bare or with ``max_``."""
        if isinstance(source, (str, bytes)):
            return _from_json(_limits_json(source), source, json=True)
        return _from_json(source, source, json=False)

    @classmethod
    def from_manifest(cls, path: str | os.PathLike[str]) -> Limits:
        """The run limits of a manifest file (see `Manifest.load`)."""
        return Manifest.load(path).limits

    # -- combination ----------------------------------------------------------------------
    def __and__(self, other: Limits) -> Limits:
        if not isinstance(other, Limits):
            return NotImplemented
        if not other:
            return self
        if not self:
            return other
        return _trusted(**{name: _min(a, b) for name, a, b in self._pairs(other)})

    def restrict(self, other: Limits) -> Limits:
        """The minimum of both; raises `WideningError` when *other* would widen a set field."""
        if not isinstance(other, Limits):
            raise ConfigError(f"restrict() takes Limits, not {type(other).__name__}")
        for name, mine, theirs in self._pairs(other):
            if mine is not None and theirs is not None and theirs > mine:
                raise WideningError(name, mine, theirs)
        return self & other

    def _pairs(self, other: Limits) -> Iterator[tuple[str, Any, Any]]:
        for f in _FIELDS:
            yield f.name, getattr(self, f.name), getattr(other, f.name)

    # -- reading --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, int | float]:
        """The fields that are set, by bare name."""
        return {f.name: v for f in _FIELDS if (v := getattr(self, f.name)) is not None}

    def replace(self, **changes: Any) -> Limits:
        """A copy with *changes* applied (validated)."""
        return dataclasses.replace(self, **changes)

    def __bool__(self) -> bool:
        return bool(self.to_dict())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"Limits({inner})"


_FIELDS = fields(Limits)


def _from_json(source: object, given: object, json: bool) -> Limits:
    """Limits from *source*, the mapping of run limits read from *given* (a JSON text, when
    *json*: a bad value is then named with JSON's words)."""
    if not isinstance(source, Mapping):
        raise ConfigError(
            f"run limits must be a JSON object such as {{\"max_steps\": 100}}, "
            f"not {_json_kind(source)}: {_brief(given)}"
        )
    values: dict[str, Any] = {}
    for key, value in source.items():
        name = _field_name(key)
        if name in values:
            raise ConfigError(f"run limits set {name} twice ({key!r}); keep one of them")
        values[name] = check_limit(name, value, json=json)
    return Limits(**values)


def _check_fields() -> None:
    """`Limits` declares one field per row of the table of kinds, typed as the row says (whole
    numbers or dollars); a kind added to the table without its field fails here, at import."""
    declared = {f.name: f.type for f in _FIELDS}
    wanted = {k.name: "int | None" if k.integral else "float | None" for k in KINDS}
    if declared != wanted:
        raise TypeError(f"Limits declares {declared}; the table of kinds asks for {wanted}")


_check_fields()
#: no limit at all (the empty source, shared)
NO_LIMITS = Limits()


def _trusted(**values: Any) -> Limits:
    """Limits from values that were validated already (the minimum of two valid Limits)."""
    out = object.__new__(Limits)
    for f in _FIELDS:
        object.__setattr__(out, f.name, values.get(f.name))
    return out


def _min(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _limits_json(text: str | bytes) -> Any:
    """The value of run limits given as JSON text; what cannot be read is a `ConfigError`."""
    try:
        return json.loads(text)
    except RecursionError:  # Python's reader stops at about a thousand levels
        raise ConfigError(
            f"run limits nest deeper than JSON can be read here: {_brief(text)}; run limits "
            f"are one object such as {{\"max_steps\": 100}}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"run limits are not valid JSON ({exc}): {_brief(text)}") from None


#: what a JSON value is called, for messages
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), f"a {type(value).__name__}")


_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80
_BRIEF.maxlong = 200


def _brief(value: object) -> str:
    """*value* as given, shortened: `show` for numbers and text, `reprlib` for the rest."""
    if isinstance(value, (int, str)):
        return show(value)
    return _BRIEF.repr(value)


#: the field of each JSON key of run limits: the key of its kind (``max_steps``) or its name
_KEYS = {**{k.key: k.name for k in KINDS}, **{k.name: k.name for k in KINDS}}


def _field_name(key: object) -> str:
    if isinstance(key, str) and key in _KEYS:
        return _KEYS[key]
    known = ", ".join(k.key for k in KINDS)
    raise ConfigError(
        f"unknown run limit {_brief(key)}; known limits are {known} (the max_ is optional)")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A manifest file: ``{"manifest_version": "nbbudget-manifest-v1", "run_limits": {...}}``,
    optionally with the runtime's two ceilings (S2-8): ``"turn": {"wallClock": ms, "under": ms}``
    and ``"transport": {"envelopeBytes": n}``; a manifest that declares one declares both."""

    limits: Limits = Limits()
    wall_clock_ms: int | None = None
    under_ms: int | None = None
    envelope_bytes: int | None = None
    path: str | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read and check the manifest at *path*; every problem is a `ConfigError` naming it."""
        where = file_path(path, "manifest")
        data = read_json(where, "manifest", f"a manifest is one object such as "
                         f"{{\"manifest_version\": \"{MANIFEST_VERSION}\", \"run_limits\": "
                         f"{{\"max_steps\": 100}}}}")
        try:
            return cls.from_mapping(data, path=where)
        except ConfigError as exc:
            if where in str(exc):
                raise
            raise ConfigError(f"manifest {where!r}: {exc}") from None

    @classmethod
    def from_mapping(cls, data: object, *, path: str | None = None) -> Manifest:
        if not isinstance(data, Mapping):
            raise ConfigError("a manifest must be a JSON object")
        version = data.get("manifest_version")
        if version != MANIFEST_VERSION:
            raise ConfigError(
                f"manifest_version is {_brief(version)}; this nbbudget reads {MANIFEST_VERSION!r}"
            )
        unknown = set(data) - {"manifest_version", "run_limits", "turn", "transport", "bindings"}
        if unknown:
            raise ConfigError(f"unknown manifest entries {_brief(sorted(unknown, key=str))}")
        run_limits = data.get("run_limits", {})
        limits = _from_json(run_limits, run_limits, json=True)
        turn, transport = data.get("turn"), data.get("transport")
        if (turn is None) != (transport is None):
            missing = "transport.envelopeBytes" if transport is None else "turn.wallClock"
            raise ConfigError(
                f"the manifest declares one runtime ceiling but not {missing}; "
                f"declare both turn.wallClock and transport.envelopeBytes, or neither"
            )
        if turn is None:
            return cls(limits, path=path)
        wall = _entry(turn, "turn", "wallClock", required=True)
        under = _entry(turn, "turn", "under", required=False)
        envelope = _entry(transport, "transport", "envelopeBytes", required=True)
        if under is not None and wall >= under:
            raise ConfigError(
                f"turn.wallClock={wall} must sit below turn.under={under} (the platform limit), "
                f"so the run answers before the platform kills it; lower wallClock"
            )
        return cls(limits, wall, under, envelope, path)


_SECTION_KEYS = {"turn": {"wallClock", "under"}, "transport": {"envelopeBytes"}}


def _entry(section: object, name: str, key: str, *, required: bool) -> Any:
    if not isinstance(section, Mapping):
        raise ConfigError(f"manifest entry {name!r} must be an object with {key!r}")
    unknown = set(section) - _SECTION_KEYS[name]
    if unknown:
        raise ConfigError(f"unknown manifest entries {_brief(sorted(unknown, key=str))} in "
                          f"{name!r}; {name} takes {', '.join(sorted(_SECTION_KEYS[name]))}")
    value = section.get(key)
    if value is None:
        if required:
            raise ConfigError(f"manifest entry {name}.{key} is missing; it is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_INT:
        raise ConfigError(f"{name}.{key}={_brief(value)} must be a positive integer")
    return value


# -- the limit flags of %%budget and nbbudget run ----------------------------------------------
#: the flags beyond one per kind: the other sources of limits, and the quota of starts
_OTHER_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--run-limits-json", {"metavar": "JSON",
                           "help": "run limits as JSON, e.g. '{\"max_steps\": 100}'"}),
    ("--manifest", {"metavar": "PATH", "help": "an nbbudget-manifest-v1 file of run limits"}),
    ("--runs-per-day", {"type": int, "metavar": "N",
                        "help": "a quota of starts of this work per calendar day (UTC), kept in "
                                "the store across kernel restarts; a continuation is not a "
                                "start"}),
)


def budget_flags() -> tuple[tuple[str, dict[str, Any]], ...]:
    """The options that bound a run, as ``argparse``'s ``add_argument`` takes them: one per
    kind (``--steps N``, ``--cost USD``, ``--time DUR``), then ``--run-limits-json``,
    ``--manifest`` and ``--runs-per-day``. ``%%budget`` and ``nbbudget run`` declare them
    from here."""
    per_kind = tuple((kind.flag, {"type": _flag_type(kind), "metavar": _metavar(kind),
                                  "help": kind.about}) for kind in KINDS)
    return per_kind + _OTHER_FLAGS


def _flag_type(kind: Kind) -> Any:
    return str if kind.clock else int if kind.integral else float


def _metavar(kind: Kind) -> str:
    """``DUR`` for time (a duration such as ``30s``), ``N`` for whole numbers, else the unit."""
    return "DUR" if kind.clock else "N" if kind.integral else kind.unit


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def limits_from_flags(args: Any, defaults: Limits = NO_LIMITS) -> Limits:
    """The limits *args* (parsed `budget_flags`) ask for, S4-2: *defaults*, the manifest,
    --run-limits-json, then one flag per kind; each later source restricts, never widens. A
    bad value is a `ConfigError` naming the flag."""
    limits = defaults
    if args.manifest is not None:
        limits = limits.restrict(Manifest.load(args.manifest).limits)
    if args.run_limits_json is not None:
        limits = limits.restrict(Limits.from_json(args.run_limits_json))
    fields = {kind.name: _flag_value(kind, value) for kind in KINDS
              if (value := getattr(args, _dest(kind.flag))) is not None}
    return limits.restrict(Limits(**fields) if fields else NO_LIMITS)


def _flag_value(kind: Kind, value: Any) -> Any:
    """The limit a flag's value gives, checked, a bad one named as the flag that gave it: time
    read as a duration (``--time 30s``), not zero."""
    if not kind.clock:
        return check_limit(kind.name, value, flag=kind.flag)
    ms = flag_duration(value, kind.flag)
    if ms == 0:
        raise ConfigError(f"{kind.flag} 0 is not a time grant; leave {kind.flag} out for none")
    return ms


#: a word that argparse would take for an option, but is a negative value (``-1s``, ``-2``,
#: ``-.5``), a duration or a number
_NEGATIVE = re.compile(r"-\.?[0-9]")


def negative_values_joined(words: Sequence[str]) -> list[str]:
    """The words of a command line with a negative value given after its long option (as in
    ``--budget -1s``) joined to it (``--budget=-1s``): argparse would read ``-1s`` as an option
    and say the flag expected an argument; joined, the value is read and checked as any other,
    and refused with the message its own check gives. ``%%budget`` and ``nbbudget`` read their
    words through it."""
    out: list[str] = []
    for at, word in enumerate(words):
        if word == "--":  # what follows is positional, as argparse reads it
            return out + list(words[at:])
        if out and _NEGATIVE.match(word) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out
