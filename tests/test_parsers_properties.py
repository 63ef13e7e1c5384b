"""Every parser of what a person types or writes, over generated input: a duration, run limits
as JSON, a manifest file, a call's flags and the ``%%budget`` line.

Whatever the input, a parser answers or raises `nb.ConfigError` (`nb.WideningError` is one),
or IPython's `UsageError` for the magic's line, with a message that names the value; nothing
else escapes (no `ValueError` from Python's digit limit, no `RecursionError`, no
`UnicodeDecodeError`). Values quoted the way a shell user quotes them read as the value.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

import nbbudget as nb
from nbbudget.calls import call as _call
from nbbudget.core.errors import show

MAX_MS = 2**53 - 1
UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "": 1}
V1 = "nbbudget-manifest-v1"
LIMIT_KEYS = ["run_ms", "steps", "tool_calls", "agent_invocations", "provider_calls", "turns",
              "tokens", "output_tokens", "cost_usd"]

fuzz = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers()),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)


# -- nb.parse_duration -----------------------------------------------------------------------------
numbers = st.builds(
    lambda zeros, whole, fraction, space, unit: f"{'0' * zeros}{whole}{fraction}{space}{unit}",
    st.integers(0, 40), st.from_regex(r"[0-9]{0,25}", fullmatch=True),
    st.sampled_from(["", "."]) | st.from_regex(r"\.[0-9]{1,30}", fullmatch=True),
    st.sampled_from(["", " ", "\t"]), st.sampled_from(["", "ms", "s", "m", "h", "MS", "S", "d"]),
)
huge = st.builds(lambda n, unit: "0." + "0" * n + "1" + unit, st.integers(4000, 6000),
                 st.sampled_from(["", "ms", "s", "h"]))


@fuzz
@given(anything | numbers | huge | st.integers(-(10**30), 10**30))
def test_a_duration_is_whole_milliseconds_or_a_config_error_naming_it(value: Any) -> None:
    try:
        ms = nb.parse_duration(value)
    except nb.ConfigError as error:
        assert str(error).startswith(f"duration={show(value)} ")
    else:
        assert type(ms) is int and 0 <= ms <= MAX_MS


@fuzz
@given(st.integers(0, 40), st.from_regex(r"[0-9]{1,20}", fullmatch=True),
       st.from_regex(r"(\.[0-9]{1,12})?", fullmatch=True), st.sampled_from(list(UNITS)))
def test_a_duration_text_is_read_exactly_whatever_its_leading_zeros(
    zeros: int, whole: str, fraction: str, unit: str
) -> None:
    exact = (Fraction(whole) + (Fraction(fraction) if fraction else 0)) * UNITS[unit]
    text = f"{'0' * zeros}{whole}{fraction}{unit}"
    if exact > MAX_MS:
        with pytest.raises(nb.ConfigError, match="is too large"):
            nb.parse_duration(text)
    elif exact.denominator != 1:
        with pytest.raises(nb.ConfigError, match=f"round it, e.g. '{round(exact)}ms'$"):
            nb.parse_duration(text)
    else:
        assert nb.parse_duration(text) == exact


# -- nb.Limits.from_json ---------------------------------------------------------------------------
limit_keys = st.sampled_from(LIMIT_KEYS + [f"max_{k}" for k in LIMIT_KEYS]) | st.text(max_size=8)
limit_objects = st.dictionaries(limit_keys, json_values | st.integers(1, 10**6), max_size=4)


def check_limits_answer(source: Any) -> None:
    try:
        limits = nb.Limits.from_json(source)
    except nb.ConfigError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert isinstance(limits, nb.Limits)


@fuzz
@given(st.text() | st.binary() | json_values.map(json.dumps) | limit_objects.map(json.dumps))
def test_run_limits_from_any_text_are_limits_or_a_config_error(text: str | bytes) -> None:
    check_limits_answer(text)


@fuzz
@given(limit_objects | json_values)
def test_run_limits_from_any_value_are_limits_or_a_config_error(value: Any) -> None:
    check_limits_answer(value)


@fuzz
@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_run_limits_that_are_not_an_object_name_the_value(value: Any) -> None:
    text = json.dumps(value)
    with pytest.raises(nb.ConfigError) as info:
        nb.Limits.from_json(text)
    assert str(info.value).startswith('run limits must be a JSON object such as')
    assert str(info.value).endswith(f": {show(text)}")


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 50_000), st.sampled_from(["[", '{"a":', "[{\"b\":"]))
def test_run_limits_nested_at_any_depth_are_a_config_error(depth: int, opener: str) -> None:
    with pytest.raises(nb.ConfigError):
        nb.Limits.from_json(opener * depth)


# -- nb.Manifest.load / nb.Limits.from_manifest ----------------------------------------------------
manifests = st.fixed_dictionaries(
    {"manifest_version": st.just(V1) | json_values},
    optional={"run_limits": limit_objects | json_values,
              "turn": st.dictionaries(st.sampled_from(["wallClock", "under", "x"]),
                                      st.integers(-5, 10**6) | json_values, max_size=2)
              | json_values,
              "transport": st.dictionaries(st.sampled_from(["envelopeBytes", "y"]),
                                           st.integers(-5, 10**6) | json_values, max_size=2)
              | json_values,
              "extra": json_values},
)
manifest_bytes = (st.binary() | manifests.map(lambda m: json.dumps(m).encode())
                  | st.builds(lambda n: b"[" * n, st.integers(1, 50_000))
                  | st.text().map(lambda t: t.encode("latin-1", "replace")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("manifests")


@fuzz
@given(manifest_bytes)
def test_a_manifest_file_holding_anything_loads_or_is_a_config_error_naming_it(
    folder: Path, content: bytes
) -> None:
    path = folder / "manifest.json"
    path.write_bytes(content)
    try:
        manifest = nb.Manifest.load(path)
    except nb.ConfigError as error:
        assert repr(str(path)) in str(error)
    else:
        assert isinstance(manifest.limits, nb.Limits)


@fuzz
@given(st.text(max_size=30).filter(lambda t: "/" not in t) | anything)
def test_any_manifest_path_is_read_or_a_config_error_naming_it(
    folder: Path, monkeypatch: pytest.MonkeyPatch, path: Any
) -> None:
    monkeypatch.chdir(folder)  # names are looked up here, never elsewhere on the machine
    try:
        nb.Limits.from_manifest(path)
    except nb.ConfigError as error:
        if isinstance(path, (str, bytes)) and "\0" not in os.fsdecode(path):
            assert repr(os.fsdecode(path)) in str(error)
        else:
            assert str(error).startswith("manifest path ")
            assert str(error).endswith(" is not a file path; give a str or a pathlib.Path "
                                       "without null characters")


# -- a call's flags (nb.call and %%budget alike) -------------------------------------------------
@fuzz
@given(anything, anything, st.none() | anything)
def test_a_calls_flags_are_accepted_or_a_config_error(detach: Any, resume: Any,
                                                       budget: Any) -> None:
    try:
        _call.check_interruption(detach, resume, budget)
    except nb.ConfigError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert detach in (True, False) and resume in (True, False)
        assert not (detach and resume) and (budget is None or detach or resume)


# -- the %%budget line -----------------------------------------------------------------------------
FLAGS = ["--budget", "--detach", "--resume", "--key", "--timeout", "--time", "--steps",
         "--tool-calls", "--agent-invocations", "--provider-calls", "--turns", "--tokens",
         "--output-tokens", "--cost", "--run-limits-json", "--manifest", "--runs-per-day",
         "--trace", "--no-widget"]
values = (st.text(max_size=12) | st.sampled_from(["5s", "0", "250ms", "3", "1.5", "-1", "'",
                                                  '"', "\\", '{"max_steps": 3}', "[1]"])
          | json_values.map(json.dumps))


def quoted(value: str, how: int) -> str:
    """*value* as a shell user may write it: single quotes, double quotes, or bare."""
    if how == 0:
        return shlex.quote(value)
    if how == 1:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


words = st.one_of(st.sampled_from(FLAGS), st.builds(quoted, values, st.integers(0, 2)),
                  st.text(max_size=6))
lines = (st.lists(words, max_size=8).map(" ".join) | st.text(max_size=40)).filter(
    lambda line: "\n" not in line and "\r" not in line)  # a magic's line is one line


@pytest.fixture
def magic_lines(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from nbbudget.jupyter import magics as _ipython

    monkeypatch.chdir(folder)  # a --manifest or --trace of the fuzz is looked up here only
    return _ipython


@fuzz
@given(lines)
def test_any_magic_line_is_flags_or_a_usage_error(magic_lines: Any, line: str) -> None:
    try:
        args, limits = magic_lines._read_flags(line, nb.Limits())
    except UsageError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert isinstance(limits, nb.Limits)
        assert not (args.detach and args.resume)


text_values = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)


def _argparse_keeps_an_explicit_double_dash() -> bool:
    """Whether this Python's argparse reads ``--opt=--`` as ``"--"``: before 3.11.9 and 3.12.2
    it read it as ``[]`` (CPython gh-109475), for every parser built on it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt")
    return bool(parser.parse_args(["--opt=--"]).opt == "--")


@fuzz
@given(text_values, st.integers(0, 1))
@example("", 0)
def test_a_quoted_value_reads_as_the_value(magic_lines: Any, value: str, how: int) -> None:
    assume(value != "--" or _argparse_keeps_an_explicit_double_dash())
    line = f"--key={quoted(value, how)}"
    if value == "":  # read as the value, an empty key is refused as it is read: it names no work
        with pytest.raises(UsageError) as refused:
            magic_lines._read_flags(line, nb.Limits())
        assert str(refused.value) == "--key '': use a non-empty string that names the work"
        return
    args, _ = magic_lines._read_flags(line, nb.Limits())
    assert args.key == value


@fuzz
@given(st.permutations([("--steps", "5"), ("--time", "2s"), ("--key", "my work"),
                        ("--run-limits-json", '{"max_steps": 9}'), ("--detach", None)]),
       st.lists(st.sampled_from([0, 1, 3]), min_size=5, max_size=5),
       st.sampled_from(["", "--budget 2s", "--timeout=9s --runs-per-day 3"]))
def test_the_same_flags_however_quoted_placed_or_budgeted_name_the_same_work(
    magic_lines: Any, flags: list[tuple[str, str | None]], hows: list[int], aside: str
) -> None:
    def written(flag: str, value: str | None, how: int) -> str:
        if value is None:
            return flag
        if how == 3:  # --flag='value'
            return f"{flag}={quoted(value, 0)}"
        return f"{flag} {quoted(value, how)}"

    line = " ".join(written(f, v, h) for (f, v), h in zip(flags, hows, strict=True))
    plain = "--steps 5 --time 2s --key 'my work' --run-limits-json '{\"max_steps\": 9}' --detach"
    assert magic_lines._identity_flags(f"{line} {aside}") == magic_lines._identity_flags(plain)
    assert magic_lines._identity_flags(plain) != magic_lines._identity_flags(
        plain.replace("--steps 5", "--steps 6"))



# -- nbbudget run's -p values --------------------------------------------------------------------
@fuzz
@given(st.one_of(st.text(), st.sampled_from(["True", "False", "None", "1", "-2", "1.5", "1e3",
                                             "nan", "inf", " 7 ", "0x10", "1_000", "true"])))
def test_a_parameter_value_is_read_as_papermills_command_line_reads_it(text: str) -> None:
    from papermill.cli import _resolve_type  # the reading nbbudget run promises to match

    from nbbudget.cli.runner import parameter_value

    ours, theirs = parameter_value(text), _resolve_type(text)
    assert type(ours) is type(theirs)
    assert ours == theirs or (ours != ours and theirs != theirs)  # nan is nan
