"""Properties of `nb.Limits` over generated values (S4-1, S3-4, S4-2).

``&`` is a meet: commutative, associative, idempotent, with ``Limits()`` as its identity.
``restrict`` is ``&`` that refuses to widen, and it refuses exactly when a field set on both
sides is larger in the later source. Every invalid value is a `ConfigError` naming the field
and the value.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import nbbudget as nb

MAX_INT = 2**53 - 1
FIELDS = [
    "run_ms", "steps", "tool_calls", "agent_invocations", "provider_calls", "turns", "tokens",
    "output_tokens", "cost_usd",
]
INT_FIELDS = [f for f in FIELDS if f != "cost_usd"]

no_deadline = settings(deadline=None)


def valid_value(field: str) -> st.SearchStrategy[Any]:
    if field == "cost_usd":
        number = st.floats(min_value=0, max_value=1e9, exclude_min=True, allow_nan=False,
                           allow_infinity=False)
    else:
        number = st.integers(min_value=1, max_value=MAX_INT)
    return st.none() | number


limits = st.builds(nb.Limits, **{f: valid_value(f) for f in FIELDS})


def widens(a: nb.Limits, b: nb.Limits) -> list[str]:
    """The fields set on both sides that are larger in *b*."""
    out = []
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is not None and y is not None and y > x:
            out.append(f)
    return out


# -- & is a meet (S4-2) ----------------------------------------------------------------------------
@no_deadline
@given(limits, limits)
def test_and_is_commutative_S4_2(a: nb.Limits, b: nb.Limits) -> None:
    assert a & b == b & a


@no_deadline
@given(limits, limits, limits)
def test_and_is_associative_S4_2(a: nb.Limits, b: nb.Limits, c: nb.Limits) -> None:
    assert (a & b) & c == a & (b & c)


@no_deadline
@given(limits)
def test_and_is_idempotent_S4_2(a: nb.Limits) -> None:
    assert a & a == a


@no_deadline
@given(limits)
def test_unbounded_limits_are_the_identity_of_and_S4_2(a: nb.Limits) -> None:
    assert a & nb.Limits() == a


@no_deadline
@given(limits, limits)
def test_and_takes_the_minimum_of_each_field_S4_2(a: nb.Limits, b: nb.Limits) -> None:
    both = a & b
    for f in FIELDS:
        values = [v for v in (getattr(a, f), getattr(b, f)) if v is not None]
        assert getattr(both, f) == (min(values) if values else None)


# -- restrict never widens (S4-2) ------------------------------------------------------------------
@no_deadline
@given(limits, limits)
def test_restrict_never_widens_and_otherwise_equals_and_S4_2(a: nb.Limits, b: nb.Limits) -> None:
    try:
        result = a.restrict(b)
    except nb.WideningError:
        return
    for f in FIELDS:
        mine = getattr(a, f)
        if mine is not None:
            assert getattr(result, f) <= mine
    assert result == a & b


@no_deadline
@given(limits, limits)
def test_restrict_raises_exactly_when_a_field_set_in_both_is_larger_in_the_later_S4_2(
    a: nb.Limits, b: nb.Limits
) -> None:
    wider = widens(a, b)
    try:
        a.restrict(b)
    except nb.WideningError as error:
        assert error.field in wider
        assert error.current == getattr(a, error.field)
        assert error.requested == getattr(b, error.field)
    else:
        assert wider == []


@no_deadline
@given(limits, limits)
def test_restricting_to_the_meet_never_raises_S4_2(a: nb.Limits, b: nb.Limits) -> None:
    assert a.restrict(a & b) == a & b


# -- every invalid value is a ConfigError naming the field and the value (S3-4, S4-1) --------------
def invalid_value(field: str) -> st.SearchStrategy[Any]:
    common = st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=MAX_INT + 1, max_value=10**100),
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.booleans(),
        st.text(max_size=10),
        st.lists(st.integers(), max_size=2),
    )
    if field == "cost_usd":
        floats = st.one_of(
            st.floats(max_value=0, allow_nan=False, allow_infinity=False),
            st.floats(min_value=2.0**53, allow_nan=False, allow_infinity=False),
        )
    else:
        floats = st.one_of(
            st.integers(min_value=-(2**40), max_value=2**40).map(lambda n: n + 0.5),
            st.floats(min_value=-1e6, max_value=1e6).filter(lambda x: not x.is_integer()),
            st.sampled_from([0.0, -3.0, 2.0**53, 1e300]),  # whole floats, named as given
        )
    return common | floats


field_and_invalid_value = st.sampled_from(FIELDS).flatmap(
    lambda f: st.tuples(st.just(f), invalid_value(f))
)


@settings(max_examples=200, deadline=None)
@given(field_and_invalid_value)
def test_every_invalid_value_is_a_config_error_naming_field_and_value_S3_4(
    case: tuple[str, Any],
) -> None:
    field, value = case
    try:
        nb.Limits(**{field: value})
    except nb.ConfigError as error:
        shown = repr(value)
        if not isinstance(value, str) or len(shown) <= 80:
            assert f"{field}={shown} " in str(error)
        else:  # a long text is named by its start and its end, shortened between them
            assert f"{field}={shown[:30]}" in str(error) and "..." in str(error)
    else:
        raise AssertionError(f"Limits({field}={value!r}) was accepted")


@no_deadline
@given(field_and_invalid_value)
def test_from_json_refuses_the_same_values_with_the_same_message_S3_4(
    case: tuple[str, Any],
) -> None:
    field, value = case
    messages = []
    for source in ({field: value}, {f"max_{field}": value}):
        try:
            nb.Limits.from_json(source)
        except nb.ConfigError as error:
            messages.append(str(error))
    try:
        nb.Limits(**{field: value})
    except nb.ConfigError as error:
        messages.append(str(error))
    assert len(messages) == 3
    assert len(set(messages)) == 1
