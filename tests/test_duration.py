"""`nb.parse_duration`: the duration forms of the contract, and every other value refused.

A duration is a whole number of milliseconds: an ``int``, or a string of digits (milliseconds),
or a number with one of the units ``ms``, ``s``, ``m``, ``h``. Anything else is a
`nb.ConfigError` (a `ValueError`) whose message names the value and says what to write instead.
"""

from __future__ import annotations

import pytest

import nbbudget as nb
from nbbudget.core.errors import show

MAX_MS = 2**53 - 1

NOT_A_DURATION_TYPE = (
    "duration={!r} is not a duration; use milliseconds as an int or a string such as "
    "'250ms', '5s', '1.5s', '2m' or '1h'"
)
NOT_A_DURATION_TEXT = (
    "duration={!r} is not a duration; write a number with a unit: "
    "'250ms', '5s', '1.5s', '2m', '1h' (a bare number means milliseconds)"
)


def config_error_message(value: object, **kwargs: object) -> str:
    with pytest.raises(nb.ConfigError) as info:
        nb.parse_duration(value, **kwargs)
    return str(info.value)


# -- accepted forms --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (2000, 2000),
        ("2000", 2000),
        ("250ms", 250),
        ("5s", 5000),
        ("1.5s", 1500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("0", 0),
        (0, 0),
    ],
)
def test_every_form_of_the_contract_gives_whole_milliseconds(value: object, ms: int) -> None:
    assert nb.parse_duration(value) == ms


@pytest.mark.parametrize(
    ("value", "ms"),
    [("1.5m", 90_000), ("0.25h", 900_000), ("0.5s", 500), ("1.0ms", 1), ("00012", 12)],
)
def test_a_decimal_with_a_unit_is_accepted_when_it_comes_to_whole_milliseconds(
    value: str, ms: int
) -> None:
    assert nb.parse_duration(value) == ms


@pytest.mark.parametrize(
    ("value", "ms"),
    [(" 5s ", 5000), ("\t2m\n", 120_000), ("5S", 5000), ("250MS", 250), ("1H", 3_600_000),
     ("5 s", 5000)],
)
def test_surrounding_whitespace_and_upper_case_units_are_accepted(value: str, ms: int) -> None:
    assert nb.parse_duration(value) == ms


@pytest.mark.parametrize("value", [2000, "2000", "1.5s", "0"])
def test_the_result_is_a_plain_int(value: object) -> None:
    assert type(nb.parse_duration(value)) is int


@pytest.mark.parametrize("value", [MAX_MS, str(MAX_MS), f"{MAX_MS}ms"])
def test_the_largest_duration_is_2_to_the_53_minus_1_ms(value: object) -> None:
    assert nb.parse_duration(value) == MAX_MS


# -- refused values --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [True, False, 1.5, 2000.0, None, b"5s", ["5s"]])
def test_a_value_that_is_neither_an_int_nor_a_str_is_refused(value: object) -> None:
    assert config_error_message(value) == NOT_A_DURATION_TYPE.format(value)


@pytest.mark.parametrize(
    "value", ["5 sec", "", "   ", "5sec", "five", "1e3", "- 5", "+5", ".5s", "1.s", "5d", "1h30m"]
)
def test_a_string_that_is_not_a_number_with_a_unit_is_refused(value: str) -> None:
    assert config_error_message(value) == NOT_A_DURATION_TEXT.format(value)


@pytest.mark.parametrize("value", ["-5", "-1s", "-0.5m", " -250ms", "-" + "9" * 40 + "h"])
def test_a_negative_duration_written_as_text_is_refused_as_negative(value: str) -> None:
    assert config_error_message(value) == (
        f"duration={value!r} is negative; a duration is 0 or more milliseconds"
    )


def test_a_negative_int_is_refused() -> None:
    assert config_error_message(-1) == (
        "duration=-1 is negative; a duration is 0 or more milliseconds"
    )


@pytest.mark.parametrize(
    ("value", "suggestion"), [("1.5ms", "2ms"), ("1.25ms", "1ms"), ("0.0015s", "2ms")]
)
def test_a_duration_that_is_not_whole_milliseconds_is_refused_with_a_rounded_suggestion(
    value: str, suggestion: str
) -> None:
    assert config_error_message(value) == (
        f"duration={value!r} is not a whole number of milliseconds; round it, e.g. '{suggestion}'"
    )


@pytest.mark.parametrize("value", [2**53, str(2**53), "100000000000h"])
def test_a_duration_above_2_to_the_53_minus_1_ms_is_refused_as_too_large(value: object) -> None:
    assert config_error_message(value) == (
        f"duration={value!r} is too large; the most is {MAX_MS} ms"
    )


def test_the_message_names_the_field_it_was_given() -> None:
    assert config_error_message("soon", field="time") == (
        "time='soon' is not a duration; write a number with a unit: "
        "'250ms', '5s', '1.5s', '2m', '1h' (a bare number means milliseconds)"
    )


def test_config_error_is_a_value_error() -> None:
    assert issubclass(nb.ConfigError, ValueError)
    with pytest.raises(ValueError, match="is not a duration"):
        nb.parse_duration("5 sec")


# -- only ASCII digits; huge numbers are config errors too ----------------------------------------
@pytest.mark.parametrize("value", ["\u0665s", "\uff15s"], ids=["arabic-indic", "fullwidth"])
def test_non_ascii_digits_are_refused(value: str) -> None:
    assert config_error_message(value) == NOT_A_DURATION_TEXT.format(value)


@pytest.mark.parametrize("value", ["9" * 5000, 10**5000], ids=["long-string", "huge-int"])
def test_an_enormous_number_is_a_config_error(value: object) -> None:
    assert "is too large" in config_error_message(value)


# -- numbers of any length: decimal arithmetic, no digit limit, no false "too large" -------------
@pytest.mark.parametrize(("value", "ms"), [
    ("0" * 20 + "1s", 1000), ("0" * 5000 + "5ms", 5), ("1." + "0" * 5000 + "s", 1000),
    ("000.250s", 250), ("0" * 30 + "9007199254740991", MAX_MS),
])
def test_leading_and_trailing_zeros_never_change_a_duration(value: str, ms: int) -> None:
    assert nb.parse_duration(value) == ms


def test_a_fraction_longer_than_pythons_digit_limit_is_not_whole_milliseconds() -> None:
    value = "0." + "0" * 4300 + "1s"
    assert config_error_message(value) == (
        f"duration={show(value)} is not a whole number of milliseconds; round it, e.g. '0ms'"
    )


@pytest.mark.parametrize(("value", "suggestion"), [
    ("2." + "4" * 5000 + "ms", "2ms"), ("2." + "5" * 5000 + "ms", "3ms"),
    ("0.5" + "0" * 5000 + "ms", "0ms"), ("1.5" + "0" * 5000 + "ms", "2ms"),
])
def test_a_long_fraction_is_rounded_exactly_in_the_suggestion(value: str, suggestion: str) -> None:
    assert config_error_message(value).endswith(f"round it, e.g. '{suggestion}'")


@pytest.mark.parametrize("value", ["9007199254740992.5ms", "1" + "0" * 30 + ".5s",
                                   "9" * 5000 + "." + "9" * 5000 + "h"])
def test_a_duration_that_is_really_too_large_says_so_with_the_value_shortened(value: str) -> None:
    assert config_error_message(value) == (
        f"duration={show(value)} is too large; the most is {MAX_MS} ms"
    )
