"""`nbbudget.core.suggest.suggest`: limits from a history of recorded runs.

Per axis the runs used, the nearest-rank quantile of what the finished runs used, plus the margin,
rounded up (S4-1: whole numbers of at least 1 on integer axes). Runs that were cut count as seen,
never in the quantile; grants count against the run (S4-3); a resumed run brings its whole-run
totals (S3-1, S4-4). How many runs the limits would have stopped is checked against
`Trace.replay`. A `FakeClock` makes every time exact.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import nbbudget as nb
from nbbudget.core.suggest import suggest
from nbbudget.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def loop(clock: FakeClock, n: int, *, trace: str = "full", tokens: int = 100) -> nb.Trace:
    """A finished run of *n* iterations, 10 ms each: a step, then a charge of *tokens*."""
    with nb.budget(clock=clock, trace=trace, notices=None) as run:
        for _ in range(n):
            clock.advance(10)
            run.step()
            run.charge("tokens", tokens, target="model:a")
    return run.trace


def cut(clock: FakeClock, steps: int) -> nb.Trace:
    """A run refused at its step *steps* + 1 (S3-2: failed, budget-cut by steps)."""
    with pytest.raises(nb.BudgetExceeded), \
            nb.budget(steps=steps, clock=clock, trace="full", notices=None) as run:
        while True:
            clock.advance(10)
            run.step()
    return run.trace


def stopped_by_replay(traces: list[nb.Trace], limits: nb.Limits) -> int:
    return sum(1 for t in traces if t.replay(limits))


# -- a history whose quantiles are known -----------------------------------------------------------
def test_twenty_runs_give_the_nearest_rank_quantile_plus_the_margin(clock: FakeClock) -> None:
    history = [loop(clock, n) for n in range(1, 21)]  # 1..20 steps, 100..2000 tokens, 10..200 ms
    s = suggest(history)
    # the 19th smallest of 20 (ceil(0.95 * 20)), times 1.2, rounded up
    assert s.limits == nb.Limits(steps=23, tokens=2280, run_ms=228)
    assert (s.runs, s.finished, s.stopped) == (20, 20, 0)
    assert stopped_by_replay(history, s.limits) == 0

    median = suggest(history, quantile=0.5, margin=0)
    assert median.limits == nb.Limits(steps=10, tokens=1000, run_ms=100)
    # the ten longer runs are refused at their 11th step, which comes before its tokens
    assert median.stopped == 10 == stopped_by_replay(history, median.limits)
    assert [r["stopped"] for r in median.rows] == [0, 10, 0]  # tokens, steps, run_ms


def test_the_quantile_is_a_value_some_run_used_not_an_interpolation(clock: FakeClock) -> None:
    history = [loop(clock, n) for n in (1, 2, 10)]
    # numpy's linear quantile of (1, 2, 10) is 3.6 at 0.6 and 5.2 at 0.7, totals no run had;
    # the nearest rank is the 2nd (ceil(1.8)) and the 3rd (ceil(2.1)) smallest
    assert suggest(history, quantile=0.6, margin=0).limits.steps == 2
    assert suggest(history, quantile=0.7, margin=0).limits.steps == 10


def test_the_frame_explains_each_axis(clock: FakeClock) -> None:
    pytest.importorskip("pandas")
    history = [loop(clock, n) for n in range(1, 21)]
    frame = suggest(history, quantile=0.5, margin=0).to_frame()
    assert list(frame.columns) == ["axis", "runs", "used_by", "finished", "quantile",
                                   "at_quantile", "margin", "limit", "stopped", "replay"]
    assert frame.to_dict("records")[1] == {
        "axis": "steps", "runs": 20, "used_by": 20, "finished": 20, "quantile": 0.5,
        "at_quantile": 10, "margin": 0, "limit": 10, "stopped": 10, "replay": "exact"}


def test_a_suggestion_shows_as_a_sentence_the_limits_and_a_table(clock: FakeClock) -> None:
    s = suggest([loop(clock, n) for n in range(1, 21)], quantile=0.5, margin=0)
    lines = repr(s).splitlines()
    assert lines[0] == ("Limits from 20 runs (20 finished): the 50% quantile (nearest rank) of "
                        "what the finished runs used, plus 0%; they would have stopped 10 of "
                        "the 20.")
    assert lines[1] == repr(nb.Limits(steps=10, tokens=1000, run_ms=100))
    assert lines[2].split() == ["axis", "finished", "quantile", "at_quantile", "margin", "limit",
                                "stopped", "replay"]
    assert lines[4].split() == ["steps", "20", "0.5", "10", "0", "10", "10", "exact"]


def test_whole_numbers_are_not_rounded_up_by_float_noise_and_cost_keeps_micro_dollars(
    clock: FakeClock,
) -> None:
    with nb.budget(clock=clock, trace="full", notices=None) as run:
        for _ in range(10):
            run.step()
            run.charge("cost_usd", 0.01)
    s = suggest([run.trace])  # 10 * 1.2 is 12.000000000000002 in floating point
    assert s.limits.steps == 12
    assert s.limits.cost_usd == 0.12  # ten charges of 0.01 add up to 0.09999999999999999
    assert suggest([run.trace], margin=0.123).limits.cost_usd == 0.1123
    assert suggest([run.trace], margin=0.1234567).limits.cost_usd == 0.112346


def test_an_axis_at_zero_at_the_quantile_gets_the_smallest_limit_S4_1(clock: FakeClock) -> None:
    history = [loop(clock, 1, tokens=0) for _ in range(3)] + [loop(clock, 1, tokens=50)]
    s = suggest(history, quantile=0.5)
    assert s.limits.tokens == 1  # S4-1: integers strictly positive
    assert s.rows[0]["used_by"] == 1
    assert s.stopped == 1 == stopped_by_replay(history, s.limits)


# -- empty and one-run histories -------------------------------------------------------------------
def test_no_runs_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(nb.ConfigError, match=r"^no recorded runs .*nb\.Trace\.load\(path\)"):
        suggest([])
    with pytest.raises(nb.ConfigError, match="no recorded runs"):
        suggest(iter(()))


def test_one_run_gives_its_own_use_plus_the_margin(clock: FakeClock) -> None:
    trace = loop(clock, 7)
    s = suggest([trace], margin=0.5)
    assert s.limits == nb.Limits(steps=11, tokens=1050, run_ms=105)
    assert (s.runs, s.finished, s.stopped) == (1, 1, 0)
    assert not trace.replay(s.limits)


def test_something_other_than_a_trace_is_a_config_error(clock: FakeClock) -> None:
    with pytest.raises(nb.ConfigError, match=r"not one nb\.Trace; pass a list, \[trace\]"):
        suggest(loop(clock, 1))
    with pytest.raises(nb.ConfigError, match=r"run 1 of the history is dict, not nb\.Trace"):
        suggest([loop(clock, 1), {"steps": 3}])  # type: ignore[list-item]


@pytest.mark.parametrize(("option", "value"), [
    ("margin", -0.1), ("margin", math.nan), ("margin", math.inf), ("margin", True),
    ("margin", "0.2"), ("quantile", 0), ("quantile", 1.5), ("quantile", math.nan),
    ("quantile", -1), ("quantile", None),
])
def test_a_bad_margin_or_quantile_is_a_config_error_naming_the_value_S3_4(
    clock: FakeClock, option: str, value: object,
) -> None:
    with pytest.raises(nb.ConfigError, match=rf"^{option}={value!r:.3}"):
        suggest([loop(clock, 1)], **{option: value})  # type: ignore[arg-type]


# -- runs that were cut ----------------------------------------------------------------------------
def test_a_cut_run_is_seen_but_left_out_of_the_quantile(clock: FakeClock) -> None:
    history = [loop(clock, n) for n in (4, 5, 6)] + [cut(clock, 2)]
    s = suggest(history, quantile=1, margin=0.5)
    assert (s.runs, s.finished) == (4, 3)
    assert s.limits.steps == 9  # the longest finished run, 6, plus 50%; not the cut run's 2
    low = suggest(history, quantile=0.5, margin=0)
    assert low.limits.steps == 5
    # the 6-step run is stopped; the cut run used 2 steps before its cut, within 5
    assert low.stopped == 1 == stopped_by_replay(history, low.limits)


def test_a_history_where_no_run_finished_is_refused_with_the_endings(clock: FakeClock) -> None:
    with pytest.raises(nb.ConfigError, match=(
            r"^none of the 2 recorded runs finished \(they ended failed\); what a cut run used "
            r"is only a floor on what it needed: record runs that finish")):
        suggest([cut(clock, 2), cut(clock, 3)])


# -- windows (S3-1) and grants ---------------------------------------------------------------------
def test_a_resumed_run_brings_its_whole_run_totals_S3_1(clock: FakeClock) -> None:
    with nb.budget(tokens=100, suspend=True, totals=nb.Limits(tokens=250), clock=clock,
                   trace="full") as first:
        while True:
            clock.advance(5)
            first.charge("tokens", 30)  # the fourth would pass the window of 100
    with nb.Budget.resume(json.loads(json.dumps(first.state())), clock=clock,
                          trace="full") as second:
        for _ in range(2):
            clock.advance(5)
            second.charge("tokens", 30)
    assert first.trace.outcome and first.trace.outcome["status"] == "suspended"
    slices = [first.trace, second.trace]
    s = suggest(slices, quantile=1, margin=0)
    assert (s.runs, s.finished) == (2, 1)
    assert s.limits.tokens == 150  # 90 in the first window, 60 in the second
    # with a run of 100 tokens beside it, the median stops the resumed run by its totals,
    # which its own trace's charges (60) do not reach
    history = [*slices, loop(clock, 1, tokens=100)]
    median = suggest(history, quantile=0.5, margin=0)
    assert median.limits.tokens == 100
    assert not second.trace.replay(median.limits)
    assert median.rows[0]["stopped"] == 1
    assert median.rows[0]["replay"] == "exact for 2 runs, from totals for 1"


def test_a_grants_charges_count_against_the_run_S4_3(clock: FakeClock) -> None:
    with nb.budget(clock=clock, trace="full", notices=None) as run:
        with run.grant(name="child", steps=5) as child:
            child.step()
            child.step()
        clock.advance(20)
        run.step()
    s = suggest([run.trace], margin=0)
    assert s.limits.steps == 3
    # beside a run of 2 steps, the median is 2: the run's own third step is refused
    median = suggest([run.trace, loop(clock, 2, tokens=0)], quantile=0.5, margin=0)
    assert median.limits.steps == 2
    assert median.stopped == 1
    assert run.trace.replay(median.limits).first == {
        "index": 4, "t_ms": 20.0, "budget_kind": "steps", "limit_value": 2, "consumed_value": 2,
        "amount": 1, "target_ref": None}


def test_time_after_the_last_charge_counts_as_stopped_by_the_time_grant(clock: FakeClock) -> None:
    with nb.budget(clock=clock, trace="full", notices=None) as slow:
        clock.advance(10)
        slow.step()
        clock.advance(90)  # no charge after 10 ms: replay cannot see the time run on
    history = [slow.trace, loop(clock, 1), loop(clock, 1)]
    s = suggest(history, quantile=0.5, margin=0)
    assert s.limits == nb.Limits(steps=1, tokens=100, run_ms=10)
    assert not slow.trace.replay(s.limits)
    assert {r["axis"]: r["stopped"] for r in s.rows} == {"tokens": 0, "steps": 0, "run_ms": 1}


def test_traces_recorded_with_counts_replay_from_totals(clock: FakeClock) -> None:
    history = [loop(clock, n, trace="counts") for n in range(1, 5)]
    s = suggest(history, quantile=0.5, margin=0)
    assert s.limits == nb.Limits(steps=2, tokens=200, run_ms=20)
    assert {r["replay"] for r in s.rows} == {"from totals"}
    # the two longer runs exceed tokens, steps and run_ms: each counts once, by tokens (S3-3)
    assert [r["stopped"] for r in s.rows] == [2, 0, 0]
    assert s.stopped == 2 == stopped_by_replay(history, s.limits)


def test_saved_traces_give_the_same_suggestion(clock: FakeClock, tmp_path: Path) -> None:
    history = [loop(clock, n) for n in range(1, 6)] + [cut(clock, 1)]
    for i, t in enumerate(history):
        t.save(tmp_path / f"{i}.json")
    loaded = [nb.Trace.load(tmp_path / f"{i}.json") for i in range(len(history))]
    a, b = suggest(history, quantile=0.8), suggest(loaded, quantile=0.8)
    assert (a.limits, a.rows, a.stopped) == (b.limits, b.rows, b.stopped)


# -- replay: the vectorised pass gives the Python pass's answers -----------------------------------
CHARGE = st.tuples(
    st.sampled_from(["steps", "tool_calls", "tokens", "cost_usd"]),
    st.integers(1, 40),
    st.integers(0, 30),  # ms before it
    st.booleans(),  # with a target
    st.booleans(),  # in a grant
)


@settings(max_examples=300, deadline=None)
@example(charges=[("steps", 5, 0, False, False), ("steps", 5, 10, False, True)],
         limits={"steps": 7, "run_ms": 5})  # past both: refused by steps (S3-3)
@example(charges=[("steps", 5, 0, False, False), ("steps", 1, 10, False, False)],
         limits={"steps": 7, "run_ms": 5})  # past the time grant only
@example(charges=[("tokens", 30, 0, True, False), ("tokens", 20, 1, False, False),
                  ("tokens", 8, 1, False, True), ("tokens", 2, 1, True, False)],
         limits={"tokens": 40})  # after the first refusal, charges that still fit pass
@given(charges=st.lists(CHARGE, max_size=60),
       limits=st.fixed_dictionaries({}, optional={
           "steps": st.integers(1, 30), "tool_calls": st.integers(1, 30),
           "tokens": st.integers(1, 400), "cost_usd": st.floats(0.05, 4),
           "run_ms": st.integers(1, 600)}))
def test_replay_with_numpy_and_without_gives_the_same_refusals(
    charges: list[tuple[str, int, int, bool, bool]], limits: dict[str, float],
) -> None:
    """Each charge refused when it would pass its kind's limit or comes after the time grant,
    a refused charge not counted against later ones: with numpy (vectorised) and without (one
    pass of Python), grants' charges among the run's (S4-3), amounts in whole numbers and in
    cents."""
    pytest.importorskip("numpy")
    clock = FakeClock()
    with nb.budget(clock=clock, trace="full", notices=None) as run, \
            run.grant(name="child") as child:
        for kind, amount, wait, targeted, in_grant in charges:
            clock.advance(wait)
            (child if in_grant else run).charge(
                kind, amount / 100 if kind == "cost_usd" else amount,
                target="tool:t" if targeted else None)
    with_numpy = run.trace.replay(nb.Limits(**limits))
    with patch.dict(sys.modules, {"numpy": None}):  # import numpy raises ImportError
        without = run.trace.replay(nb.Limits(**limits))
    assert with_numpy == without
    expected = _replayed_by_hand(run.trace, limits)
    assert [(r["index"], r["budget_kind"]) for r in without.refusals] == expected


def _replayed_by_hand(trace: nb.Trace, limits: dict[str, float]) -> list[tuple[int, str]]:
    used: dict[str, float] = {}
    out = []
    for i, event in enumerate(trace.events):
        if event.kind != "consumed":
            continue
        kind, amount = event.payload["budget_kind"], event.payload["amount"]
        over_kind = used.get(kind, 0) + amount > limits.get(kind, math.inf)
        if over_kind or event.t_ms > limits.get("run_ms", math.inf):
            out.append((i, kind if over_kind else "run_ms"))
        else:
            used[kind] = used.get(kind, 0) + amount
    return out
