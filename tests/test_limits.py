"""`nb.Limits` and `nb.Manifest`: what a run is allowed (S4-1, S3-4, S4-2, S2-8).

`Limits` is frozen; ``None`` means unbounded; a bad value is a loud `ConfigError` naming the
field and the value. ``a & b`` is the field-wise minimum and ``a.restrict(b)`` refuses to widen.
A manifest declares run limits and, optionally, the runtime's two ceilings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.core.errors import show
from nbbudget.core.kinds import KINDS, Kind
from nbbudget.testing import FakeClock

MAX_INT = 2**53 - 1
FIELDS = [
    "run_ms", "steps", "tool_calls", "agent_invocations", "provider_calls", "turns", "tokens",
    "output_tokens", "cost_usd",
]
INT_FIELDS = [f for f in FIELDS if f != "cost_usd"]
KNOWN_KEYS = (
    "max_tokens, max_output_tokens, max_cost_usd, max_turns, max_steps, max_tool_calls, "
    "max_agent_invocations, max_provider_calls, max_run_ms"
)
V1 = "nbbudget-manifest-v1"


def config_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(nb.ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def limits_error(field: str, value: object) -> str:
    return config_error(nb.Limits, **{field: value})


# -- S4-1: the fields and their range --------------------------------------------------------------
def test_limits_has_the_nine_run_limit_fields_of_S4_1() -> None:
    assert [f.name for f in dataclasses.fields(nb.Limits)] == FIELDS


def test_every_field_defaults_to_none_meaning_unbounded_S3_4() -> None:
    limits = nb.Limits()
    assert all(getattr(limits, f) is None for f in FIELDS)
    assert not limits
    assert limits.to_dict() == {}


@pytest.mark.parametrize("field", INT_FIELDS)
def test_an_integer_limit_may_be_2_to_the_53_minus_1_S4_1(field: str) -> None:
    assert getattr(nb.Limits(**{field: MAX_INT}), field) == MAX_INT


@pytest.mark.parametrize("field", FIELDS)
def test_a_limit_of_2_to_the_53_is_refused_as_too_large_S4_1(field: str) -> None:
    assert limits_error(field, 2**53) == (
        f"{field}=9007199254740992 is too large; the most is {MAX_INT}"
    )


@pytest.mark.parametrize("field", FIELDS)
def test_a_limit_of_1_is_the_smallest_accepted_S4_1(field: str) -> None:
    assert getattr(nb.Limits(**{field: 1}), field) == 1


# -- S3-4: bad values are loud, never folded to a default ------------------------------------------
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [-1, 0, -0.5])
def test_a_negative_or_zero_limit_is_refused_naming_field_and_value_S3_4(
    field: str, value: float
) -> None:
    if field in INT_FIELDS and value == -0.5:
        expected = f"{field}=-0.5 is not a whole number; use an integer"
    else:
        expected = f"{field}={value!r} must be greater than 0; use None for no limit"
    assert limits_error(field, value) == expected


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_limit_is_refused_S3_4(field: str, value: float) -> None:
    assert limits_error(field, value) == f"{field}={value!r} is not finite; use None for no limit"


@pytest.mark.parametrize("field", INT_FIELDS)
def test_a_non_integer_float_for_an_integer_field_is_refused_S3_4(field: str) -> None:
    assert limits_error(field, 2.5) == f"{field}=2.5 is not a whole number; use an integer"


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [True, False, "5", b"5", [5]])
def test_a_bool_or_a_non_number_is_refused_S3_4(field: str, value: object) -> None:
    kind = "integer" if field in INT_FIELDS else "number"
    assert limits_error(field, value) == (
        f"{field}={value!r} is not a number; use a positive {kind}, or None for no limit"
    )


@pytest.mark.parametrize("field", INT_FIELDS)
def test_an_integral_float_becomes_an_int(field: str) -> None:
    value = getattr(nb.Limits(**{field: 5.0}), field)
    assert value == 5
    assert type(value) is int


@pytest.mark.parametrize("value", [0.5, 0.01, 5, 1e9])
def test_cost_usd_takes_any_positive_finite_number_S4_1(value: float) -> None:
    assert nb.Limits(cost_usd=value).cost_usd == value


def test_an_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_steps'"):
        nb.Limits(max_steps=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("value", [0.0, -3.0, 1e300], ids=["zero", "negative", "huge"])
def test_a_bad_integral_float_is_named_as_it_was_given_S3_4(value: float) -> None:
    assert f"steps={value!r} " in limits_error("steps", value)


def test_an_enormous_int_limit_is_a_config_error_S3_4() -> None:
    assert "is too large" in limits_error("steps", 10**5000)


# -- frozen, equal, repr ---------------------------------------------------------------------------
def test_limits_are_frozen() -> None:
    limits = nb.Limits(steps=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.steps = 6  # type: ignore[misc]
    assert limits.steps == 5


def test_limits_compare_and_hash_by_value() -> None:
    assert nb.Limits(steps=5) == nb.Limits(steps=5.0)
    assert hash(nb.Limits(steps=5)) == hash(nb.Limits(steps=5.0))
    assert nb.Limits(steps=5) != nb.Limits(steps=6)


def test_repr_shows_only_the_fields_that_are_set() -> None:
    assert repr(nb.Limits(steps=10, cost_usd=0.5)) == "Limits(steps=10, cost_usd=0.5)"
    assert repr(nb.Limits()) == "Limits()"


def test_to_dict_holds_the_set_fields_by_bare_name() -> None:
    assert nb.Limits(run_ms=1000, tokens=50).to_dict() == {"run_ms": 1000, "tokens": 50}


def test_replace_validates_the_new_value_S3_4() -> None:
    assert nb.Limits(steps=5).replace(tokens=4) == nb.Limits(steps=5, tokens=4)
    assert config_error(nb.Limits(steps=5).replace, tokens=0) == (
        "tokens=0 must be greater than 0; use None for no limit"
    )


# -- from_json: bare and max_ keys -----------------------------------------------------------------
def test_from_json_reads_a_str_with_bare_and_max_keys() -> None:
    assert nb.Limits.from_json('{"max_steps": 5, "tokens": 100, "max_cost_usd": 0.25}') == (
        nb.Limits(steps=5, tokens=100, cost_usd=0.25)
    )


def test_from_json_reads_bytes() -> None:
    assert nb.Limits.from_json(b'{"max_run_ms": 2000}') == nb.Limits(run_ms=2000)


def test_from_json_reads_a_mapping() -> None:
    assert nb.Limits.from_json({"steps": 5, "max_tool_calls": 3}) == (
        nb.Limits(steps=5, tool_calls=3)
    )


@pytest.mark.parametrize("field", FIELDS)
def test_from_json_accepts_every_field_with_and_without_max(field: str) -> None:
    assert nb.Limits.from_json({field: 7}) == nb.Limits.from_json({f"max_{field}": 7})
    assert getattr(nb.Limits.from_json({f"max_{field}": 7}), field) == 7


def test_from_json_takes_null_and_an_empty_object_as_unbounded() -> None:
    assert nb.Limits.from_json('{"max_steps": null}') == nb.Limits()
    assert nb.Limits.from_json("{}") == nb.Limits()


@pytest.mark.parametrize("key", ["foo", "max_foo", "max_max_steps", "maxsteps", "time"])
def test_from_json_refuses_an_unknown_key_naming_it_and_listing_the_known_keys(key: str) -> None:
    assert config_error(nb.Limits.from_json, {key: 1}) == (
        f"unknown run limit {key!r}; known limits are {KNOWN_KEYS} (the max_ is optional)"
    )


@pytest.mark.parametrize(
    ("source", "second"),
    [('{"steps": 1, "max_steps": 2}', "max_steps"), ({"max_steps": 1, "steps": 2}, "steps")],
)
def test_from_json_refuses_a_field_given_both_bare_and_with_max(source: Any, second: str) -> None:
    assert config_error(nb.Limits.from_json, source) == (
        f"run limits set steps twice ({second!r}); keep one of them"
    )


@pytest.mark.parametrize(
    ("source", "what"),
    [("[1, 2]", "an array: '[1, 2]'"), ("5", "a number: '5'"), ("null", "null: 'null'"),
     ('"steps"', "a string: '\"steps\"'"), (5, "a number: 5"), ([1, 2], "an array: [1, 2]"),
     (b"[1]", "an array: b'[1]'")],
)
def test_from_json_refuses_anything_but_an_object_naming_the_value(source: Any, what: str) -> None:
    assert config_error(nb.Limits.from_json, source) == (
        f'run limits must be a JSON object such as {{"max_steps": 100}}, not {what}'
    )


def test_from_json_names_a_long_value_shortened() -> None:
    message = config_error(nb.Limits.from_json, "[" + "1, " * 5000 + "1]")
    assert message.startswith('run limits must be a JSON object such as {"max_steps": 100}, '
                              "not an array: '[1, 1, 1, ")
    assert len(message) < 200


def test_from_json_refuses_nesting_too_deep_to_read_as_a_config_error() -> None:
    source = "[" * 100_000
    assert config_error(nb.Limits.from_json, source) == (
        f"run limits nest deeper than JSON can be read here: {show(source)}; run limits are "
        f'one object such as {{"max_steps": 100}}'
    )


def test_from_json_refuses_a_thousand_levels_of_nesting_on_every_python() -> None:
    """Python 3.11's reader stops at about a thousand levels; 3.12's reads on to the end of the
    text, which is then not valid JSON. Either way the input is refused as a `ConfigError`."""
    source = "[" * 1000
    assert config_error(nb.Limits.from_json, source) in (
        f"run limits nest deeper than JSON can be read here: {show(source)}; run limits are "
        f'one object such as {{"max_steps": 100}}',
        f"run limits are not valid JSON (Expecting value: line 1 column 1001 (char 1000)): "
        f"{show(source)}",
    )


@pytest.mark.parametrize("source", ["not json", "", b"\xff\xfe"])
def test_from_json_refuses_invalid_json_quoting_the_text(source: str | bytes) -> None:
    assert config_error(nb.Limits.from_json, source) == (
        f"run limits are not valid JSON (Expecting value: line 1 column 1 (char 0)): {source!r}"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ('{"max_steps": 0}', "steps=0 must be greater than 0; use null for no limit"),
        ('{"steps": NaN}', "steps=nan is not finite; use null for no limit"),
        ('{"steps": true}',
         "steps=True is not a number; use a positive integer, or null for no limit"),
        ('{"max_steps": "5"}',
         "steps='5' is not a number; use a positive integer, or null for no limit"),
        ({"max_steps": 0}, "steps=0 must be greater than 0; use None for no limit"),
    ],
)
def test_from_json_validates_values_naming_the_bare_field_in_the_words_of_what_it_read_S3_4(
        source: object, message: str) -> None:
    """JSON text says no limit with null; a mapping from Python, with None."""
    assert config_error(nb.Limits.from_json, source) == message


# -- a & b: the field-wise minimum (S4-2) ----------------------------------------------------------
def test_and_is_the_field_wise_minimum_S4_2() -> None:
    a = nb.Limits(steps=10, tokens=500, cost_usd=2.0)
    b = nb.Limits(steps=5, cost_usd=2.5, run_ms=1000)
    assert a & b == nb.Limits(steps=5, tokens=500, cost_usd=2.0, run_ms=1000)


def test_and_with_unbounded_limits_changes_nothing_S4_2() -> None:
    a = nb.Limits(steps=10, cost_usd=0.5)
    assert a & nb.Limits() == a
    assert nb.Limits() & a == a


def test_and_with_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        nb.Limits(steps=1) & {"steps": 1}  # type: ignore[operator]


# -- restrict: a later source may restrict, never widen (S4-2) -------------------------------------
def test_restrict_lowers_a_limit_S4_2() -> None:
    assert nb.Limits(steps=10).restrict(nb.Limits(steps=5)) == nb.Limits(steps=5)


def test_restrict_to_the_same_value_is_not_widening_S4_2() -> None:
    assert nb.Limits(steps=10).restrict(nb.Limits(steps=10)) == nb.Limits(steps=10)


def test_restrict_may_set_a_field_the_earlier_source_left_unbounded_S4_2() -> None:
    assert nb.Limits(steps=10).restrict(nb.Limits(tokens=100)) == (
        nb.Limits(steps=10, tokens=100)
    )
    assert nb.Limits().restrict(nb.Limits(steps=3)) == nb.Limits(steps=3)


def test_a_none_in_the_later_source_keeps_the_earlier_value_S4_2() -> None:
    assert nb.Limits(steps=10, tokens=5).restrict(nb.Limits(steps=None)) == (
        nb.Limits(steps=10, tokens=5)
    )


def test_widening_is_refused_naming_the_field_and_both_values_S4_2() -> None:
    with pytest.raises(nb.WideningError) as info:
        nb.Limits(steps=10).restrict(nb.Limits(steps=20))
    error = info.value
    assert str(error) == (
        "steps=20 would widen the limit steps=10 already in force; a later source may only "
        "restrict a limit, so use a value <= 10"
    )
    assert (error.field, error.current, error.requested) == ("steps", 10, 20)


def test_widening_cost_is_refused_with_both_values_S4_2() -> None:
    with pytest.raises(nb.WideningError) as info:
        nb.Limits(cost_usd=0.5).restrict(nb.Limits(cost_usd=0.75))
    assert str(info.value) == (
        "cost_usd=0.75 would widen the limit cost_usd=0.5 already in force; a later source may "
        "only restrict a limit, so use a value <= 0.5"
    )
    assert (info.value.field, info.value.current, info.value.requested) == ("cost_usd", 0.5, 0.75)


def test_widening_one_field_is_refused_even_when_another_is_restricted_S4_2() -> None:
    with pytest.raises(nb.WideningError) as info:
        nb.Limits(steps=10, tokens=100).restrict(nb.Limits(steps=5, tokens=200))
    assert info.value.field == "tokens"


def test_widening_error_is_a_config_error_and_a_value_error_S4_2() -> None:
    assert issubclass(nb.WideningError, nb.ConfigError)
    assert issubclass(nb.WideningError, ValueError)
    with pytest.raises(nb.ConfigError):
        nb.Limits(turns=1).restrict(nb.Limits(turns=2))


def test_restrict_takes_only_limits() -> None:
    assert config_error(nb.Limits(steps=1).restrict, {"steps": 1}) == (
        "restrict() takes Limits, not dict"
    )


# -- manifests (S2-8) ------------------------------------------------------------------------------
def write_manifest(tmp_path: Path, data: object, name: str = "manifest.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def manifest_error(path: Path) -> str:
    return config_error(nb.Manifest.load, path)


def test_from_manifest_reads_the_run_limits_of_a_v1_manifest(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1,
        "run_limits": {"max_steps": 10, "max_cost_usd": 0.5, "max_run_ms": 60_000},
    })
    assert nb.Limits.from_manifest(path) == nb.Limits(steps=10, cost_usd=0.5, run_ms=60_000)
    assert nb.Limits.from_manifest(str(path)) == nb.Limits.from_manifest(path)


def test_a_manifest_without_run_limits_is_unbounded(tmp_path: Path) -> None:
    assert nb.Limits.from_manifest(write_manifest(tmp_path, {"manifest_version": V1})) == (
        nb.Limits()
    )


def test_a_manifest_declares_both_runtime_ceilings_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1,
        "run_limits": {"max_tool_calls": 4},
        "turn": {"wallClock": 25_000, "under": 30_000},
        "transport": {"envelopeBytes": 65_536},
    })
    manifest = nb.Manifest.load(path)
    assert manifest.limits == nb.Limits(tool_calls=4)
    assert manifest.wall_clock_ms == 25_000
    assert manifest.under_ms == 30_000
    assert manifest.envelope_bytes == 65_536
    assert manifest.path == str(path)


def test_under_is_optional_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": {"wallClock": 1000}, "transport": {"envelopeBytes": 10},
    })
    manifest = nb.Manifest.load(path)
    assert (manifest.wall_clock_ms, manifest.under_ms, manifest.envelope_bytes) == (1000, None, 10)


@pytest.mark.parametrize(
    ("data", "found"),
    [
        ({"manifest_version": "nbbudget-manifest-v2", "run_limits": {}}, "'nbbudget-manifest-v2'"),
        ({"manifest_version": 1}, "1"),
        ({"run_limits": {"max_steps": 1}}, "None"),
    ],
    ids=["v2", "a number", "missing"],
)
def test_any_other_manifest_version_is_refused_naming_both(
    tmp_path: Path, data: dict[str, Any], found: str
) -> None:
    path = write_manifest(tmp_path, data)
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: manifest_version is {found}; this nbbudget reads {V1!r}"
    )


def test_turn_without_transport_is_refused_naming_transport_envelope_bytes_S2_8(
    tmp_path: Path,
) -> None:
    path = write_manifest(tmp_path, {"manifest_version": V1, "turn": {"wallClock": 1000}})
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: the manifest declares one runtime ceiling but not "
        f"transport.envelopeBytes; declare both turn.wallClock and transport.envelopeBytes, "
        f"or neither"
    )


def test_transport_without_turn_is_refused_naming_turn_wall_clock_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {"manifest_version": V1, "transport": {"envelopeBytes": 10}})
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: the manifest declares one runtime ceiling but not "
        f"turn.wallClock; declare both turn.wallClock and transport.envelopeBytes, or neither"
    )


@pytest.mark.parametrize("wall", [30_000, 31_000])
def test_a_wall_clock_not_below_under_is_refused_S2_8(tmp_path: Path, wall: int) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1,
        "turn": {"wallClock": wall, "under": 30_000},
        "transport": {"envelopeBytes": 10},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: turn.wallClock={wall} must sit below turn.under=30000 "
        f"(the platform limit), so the run answers before the platform kills it; lower wallClock"
    )


def test_a_turn_without_wall_clock_is_refused_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": {"under": 30_000}, "transport": {"envelopeBytes": 10},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: manifest entry turn.wallClock is missing; it is required"
    )


def test_a_transport_without_envelope_bytes_is_refused_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": {"wallClock": 1000}, "transport": {},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: manifest entry transport.envelopeBytes is missing; "
        f"it is required"
    )


@pytest.mark.parametrize("value", [0, -5, "5", True, 1.5])
def test_envelope_bytes_must_be_a_positive_integer_S2_8(tmp_path: Path, value: object) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": {"wallClock": 1000}, "transport": {"envelopeBytes": value},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: transport.envelopeBytes={value!r} must be a positive integer"
    )


@pytest.mark.parametrize("value", [0, "5s"])
def test_wall_clock_must_be_a_positive_integer_of_ms_S2_8(tmp_path: Path, value: object) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": {"wallClock": value}, "transport": {"envelopeBytes": 10},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: turn.wallClock={value!r} must be a positive integer"
    )


def test_a_ceiling_section_that_is_not_an_object_is_refused_S2_8(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {
        "manifest_version": V1, "turn": 1000, "transport": {"envelopeBytes": 10},
    })
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: manifest entry 'turn' must be an object with 'wallClock'"
    )


def test_a_manifest_that_cannot_be_read_is_refused_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert manifest_error(missing) == (
        f"cannot read manifest {str(missing)!r}: No such file or directory"
    )
    assert config_error(nb.Limits.from_manifest, tmp_path) == (
        f"cannot read manifest {str(tmp_path)!r}: Is a directory"
    )


def test_a_manifest_that_is_not_json_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "not json")
    assert manifest_error(path) == (
        f"manifest {str(path)!r} is not valid JSON: Expecting value: line 1 column 1 (char 0)"
    )


def test_a_manifest_nested_too_deep_to_read_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "[" * 100_000)
    assert manifest_error(path) == (
        f"manifest {str(path)!r} nests deeper than JSON can be read here; a manifest is one "
        f'object such as {{"manifest_version": "{V1}", "run_limits": {{"max_steps": 100}}}}'
    )


def test_a_manifest_of_a_thousand_levels_is_refused_naming_the_path_on_every_python(
        tmp_path: Path) -> None:
    """As for run limits: too deep for Python 3.11's reader, not valid JSON for 3.12's."""
    path = write_manifest(tmp_path, "[" * 1000)
    assert manifest_error(path) in (
        f"manifest {str(path)!r} nests deeper than JSON can be read here; a manifest is one "
        f'object such as {{"manifest_version": "{V1}", "run_limits": {{"max_steps": 100}}}}',
        f"manifest {str(path)!r} is not valid JSON: Expecting value: line 1 column 1001 "
        f"(char 1000)",
    )


def test_a_manifest_that_is_not_utf8_is_refused_naming_the_path_and_the_byte(
    tmp_path: Path,
) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes('{"manifest_version": "caf\u00e9"}'.encode("latin-1"))
    assert manifest_error(path) == (
        f"manifest {str(path)!r} is not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8"
    )


@pytest.mark.parametrize("path", ["a\0b.json", 5, None])
def test_a_manifest_path_that_is_not_a_path_is_refused_naming_it(path: Any) -> None:
    assert config_error(nb.Limits.from_manifest, path) == (
        f"manifest path {path!r} is not a file path; give a str or a pathlib.Path without "
        f"null characters"
    )


def test_a_manifest_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, [V1])
    assert manifest_error(path) == f"manifest {str(path)!r}: a manifest must be a JSON object"


def test_an_unknown_top_level_entry_is_refused(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {"manifest_version": V1, "limits": {}, "extra": 1})
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: unknown manifest entries ['extra', 'limits']"
    )


def test_a_bad_run_limit_in_a_manifest_is_refused_naming_the_path_and_field_S3_4(
    tmp_path: Path,
) -> None:
    path = write_manifest(tmp_path, {"manifest_version": V1, "run_limits": {"max_steps": 0}})
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: steps=0 must be greater than 0; use null for no limit"
    )


def test_an_unknown_run_limit_in_a_manifest_is_refused(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, {"manifest_version": V1, "run_limits": {"max_foo": 1}})
    assert manifest_error(path) == (
        f"manifest {str(path)!r}: unknown run limit 'max_foo'; known limits are {KNOWN_KEYS} "
        f"(the max_ is optional)"
    )


def test_every_kind_has_its_field_its_json_key_and_its_flag_in_budget_and_run():
    """One table of kinds: each kind is a `Limits` field, a JSON key (bare and ``max_``), and
    a flag that ``%%budget`` and ``nbbudget run`` both declare, read back as that limit."""
    import argparse
    import dataclasses

    from nbbudget.cli.main import _parser
    from nbbudget.core.kinds import KINDS
    from nbbudget.core.limits import limits_from_flags
    from nbbudget.jupyter.magics import BudgetMagics

    fields = {f.name for f in dataclasses.fields(nb.Limits)}
    run_parser = next(action for action in _parser()._actions
                      if isinstance(action, argparse._SubParsersAction)).choices["run"]
    for kind in KINDS:
        assert kind.name in fields
        assert nb.Limits.from_json({kind.name: 7}) == nb.Limits.from_json({f"max_{kind.name}": 7})
        for parser in (BudgetMagics.budget_cell.parser, run_parser):
            value = "7ms" if kind.name == "run_ms" else "7"
            notebook = ["report.ipynb"] if parser is run_parser else []
            args = parser.parse_args([*notebook, kind.flag, value])
            assert getattr(limits_from_flags(args), kind.name) == 7, (kind, parser.prog)


# -- one table of kinds: Limits, the JSON keys, the flags and the docs follow it -------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def kinds_table() -> list[str]:
    """The table of kinds as the docs' ``nbbudget-kinds`` directive renders it (no Sphinx)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        return importlib.import_module("nbbudget_render").kinds_lines()
    finally:
        sys.path.remove(str(DOCS / "_ext"))
        sys.modules.pop("nbbudget_render", None)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_kind_has_its_row_in_the_generated_docs_table(kind: Kind,
                                                            kinds_table: list[str]) -> None:
    rows = [line for line in kinds_table if line.startswith(f"| `{kind.name}` |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    metavar = "DUR" if kind.clock else "N" if kind.integral else kind.unit
    assert cells == [f"`{kind.name}`", kind.counts, kind.unit, f"`{kind.flag} {metavar}`",
                     f"`max_{kind.name}` or `{kind.name}`", f"`{kind.code}`",
                     "yes" if kind.window else "no"]


def test_the_docs_table_of_kinds_has_a_row_per_kind_in_the_attribution_order(
    kinds_table: list[str],
) -> None:
    names = [line.split("|")[1].strip().strip("`") for line in kinds_table[2:]]
    assert names == [k.name for k in sorted(KINDS, key=lambda k: k.rank)]


@pytest.mark.parametrize("page", ["concepts", "api"])
def test_the_concepts_and_api_pages_show_the_generated_table_of_kinds(page: str) -> None:
    assert "```{nbbudget-kinds}\n```" in (DOCS / f"{page}.md").read_text(encoding="utf-8")


def test_the_readme_names_every_kind_among_the_run_limits() -> None:
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    limits = readme.split("### Runs, limits and grants", 1)[1].split("```", 1)[0]
    assert [k.name for k in KINDS if f"`{k.name}`" not in limits] == []


def test_limits_declares_each_kind_typed_as_its_row_says() -> None:
    types = {f.name: f.type for f in dataclasses.fields(nb.Limits)}
    assert types == {k.name: "int | None" if k.integral else "float | None" for k in KINDS}


def test_a_kind_added_to_the_table_without_its_limits_field_fails_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nbbudget.core import limits

    extra = KINDS[0]._replace(name="pages", flag="--pages")
    monkeypatch.setattr(limits, "KINDS", (*KINDS, extra))
    with pytest.raises(TypeError, match=r"the table of kinds asks for .*'pages': 'int \| None'"):
        limits._check_fields()


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.clock], ids=lambda k: k.name)
def test_each_charged_kinds_row_says_whether_it_is_pooled_and_whether_it_is_a_window_S3_1(
    kind: Kind,
) -> None:
    """A whole-number kind leases permits into a pool (a charge of 1 then takes one without the
    lock); with ``suspend=True`` a spent window suspends the run, any other limit fails it."""
    limit = 4 if kind.integral else 1.0
    error = contextlib.nullcontext() if kind.window else pytest.raises(nb.BudgetExceeded)
    with error, nb.budget(suspend=True, clock=FakeClock(), notices=None,
                          **{kind.name: limit}) as run:
        run.charge(kind.name, 1)
        assert len(run.lowlevel.account.pools[KINDS.index(kind)]) == (3 if kind.pooled else 0)
        run.charge(kind.name, limit)
    assert run.outcome is not None
    assert (run.outcome.status, run.outcome.by) == (
        ("suspended" if kind.window else "failed"), kind.name)


def test_the_clocks_kind_is_spent_by_time_not_charged() -> None:
    clock_kinds = [k for k in KINDS if k.clock]
    assert [k.name for k in clock_kinds] == ["run_ms"]
    with pytest.raises(nb.ConfigError, match="'run_ms' is not a budget kind; use one of: "):
        nb.budget(time="1s", clock=FakeClock()).charge("run_ms", 1)
