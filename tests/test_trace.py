"""`nb.Trace`: every budget event of a run (S4-8, S4-9).

Every refusal is a ``dispatch_refused_budget_exceeded`` event with the five payload keys of S4-8
and leaves the counters as they were. ``summary()`` gives checks, consumptions and refusals by
kind (S4-9). ``trace="counts"`` (the default) only counts successful charges; ``trace="full"``
stores each one, so ``replay(limits)`` can say exactly which charges other limits would have
refused. Traces save to versioned JSON (with the umask's mode, never silently overwritten) and
load back equal. A `FakeClock` makes every ``t_ms`` exact.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock

REFUSED = "dispatch_refused_budget_exceeded"
CODES = {
    "tokens": "TokenBudgetExceeded",
    "output_tokens": "OutputTokenBudgetExceeded",
    "cost_usd": "CostBudgetExceeded",
    "turns": "TurnBudgetExceeded",
    "steps": "StepBudgetExceeded",
    "tool_calls": "ToolCallBudgetExceeded",
    "agent_invocations": "AgentInvocationBudgetExceeded",
    "provider_calls": "ProviderCallBudgetExceeded",
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def refusal_events(trace: nb.Trace) -> list[nb.Event]:
    return [e for e in trace.events if e.kind == REFUSED]


def charge_events(trace: nb.Trace) -> list[nb.Event]:
    return [e for e in trace.events if e.kind == "consumed"]


def ten_steps(clock: FakeClock, *, trace: str = "full") -> nb.Budget:
    """A finished run of ten steps, one every 10 ms, with a token charge after every third."""
    with nb.budget(clock=clock, trace=trace, notices=None) as run:
        for i in range(1, 11):
            clock.advance(10)
            run.step()
            if i % 3 == 0:
                run.charge("tokens", 100, target="model:a")
    return run


# -- S4-8: a refusal is one event with five keys ---------------------------------------------------
def test_a_refused_charge_records_exactly_one_refusal_event_S4_8(clock: FakeClock) -> None:
    with nb.budget(tool_calls=1, clock=clock, notices=None) as run:
        run.charge("tool_calls", target="tool:search")
        clock.advance(8)
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tool_calls", target="tool:search")
    assert refusal_events(run.trace) == [
        nb.Event(REFUSED, {
            "budget_kind": "tool_calls",
            "limit_value": 1,
            "consumed_value": 1,
            "target_ref": "tool:search",
            "runtime_error_code": "ToolCallBudgetExceeded",
        }, 8.0),
    ]


def test_the_refusal_event_carries_the_same_figures_as_the_error_S4_8(clock: FakeClock) -> None:
    with nb.budget(tokens=100, clock=clock, notices=None) as run:
        run.charge("tokens", 90)
        with pytest.raises(nb.BudgetExceeded) as info:
            run.charge("tokens", 20, target="model:big")
    (event,) = refusal_events(run.trace)
    error = info.value
    assert event.payload == {
        "budget_kind": error.kind,
        "limit_value": error.limit,
        "consumed_value": error.consumed,
        "target_ref": error.target,
        "runtime_error_code": error.code,
    }
    assert (error.kind, error.limit, error.consumed, error.target, error.code) == (
        "tokens", 100, 90, "model:big", "TokenBudgetExceeded"
    )


@pytest.mark.parametrize(("kind", "code"), CODES.items())
def test_every_chargeable_kind_records_its_refusal_with_its_error_code_S4_8(
    clock: FakeClock, kind: str, code: str
) -> None:
    with nb.budget(clock=clock, notices=None, **{kind: 3}) as run:
        run.charge(kind, 2)
        with pytest.raises(nb.BudgetExceeded):
            run.charge(kind, 2)
    assert [e.payload for e in refusal_events(run.trace)] == [{
        "budget_kind": kind, "limit_value": 3, "consumed_value": 2, "target_ref": None,
        "runtime_error_code": code,
    }]


def test_each_refusal_is_its_own_event_S4_8(clock: FakeClock) -> None:
    with nb.budget(steps=1, clock=clock, notices=None) as run:
        run.step()
        for _ in range(3):
            clock.advance(1)
            with pytest.raises(nb.BudgetExceeded):
                run.step()
    assert [(e.payload["consumed_value"], e.t_ms) for e in refusal_events(run.trace)] == [
        (1, 1.0), (1, 2.0), (1, 3.0),
    ]


def test_a_grant_refusal_is_recorded_in_the_run_trace_with_the_grant_limit_S4_8(
    clock: FakeClock,
) -> None:
    with nb.budget(steps=10, clock=clock, notices=None) as run, run.grant(steps=1) as child:
        child.step()
        with pytest.raises(nb.BudgetExceeded):
            child.step()
    assert [e.payload for e in refusal_events(run.trace)] == [{
        "budget_kind": "steps", "limit_value": 1, "consumed_value": 1, "target_ref": None,
        "runtime_error_code": "StepBudgetExceeded",
    }]


def test_a_refusal_leaves_every_counter_as_it_was_S4_8(clock: FakeClock) -> None:
    with nb.budget(tokens=100, clock=clock, notices=None) as run:
        run.charge("tokens", 60)
        before = (run.consumed, run.remaining("tokens"), run.trace.summary()["by_kind"]["tokens"])
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tokens", 50)
        assert run.consumed == before[0] == {"tokens": 60}
        assert run.remaining("tokens") == before[1] == 40
        assert run.trace.summary()["by_kind"]["tokens"] == {
            "checks": 2, "consumptions": 1, "consumed": 60, "refusals": 1,
        }
        run.charge("tokens", 40)  # nothing was reserved by the refused charge
    assert run.consumed == {"tokens": 100}


# -- S4-9: summary ---------------------------------------------------------------------------------
def test_summary_counts_checks_consumptions_and_refusals_by_kind_S4_9(clock: FakeClock) -> None:
    with nb.budget(steps=3, clock=clock, notices=None, name="agent") as run:
        for _ in range(3):
            run.step()
        clock.advance(5)
        run.charge("tokens", 100)
        run.charge("tokens", 50, target="model:a")
        with pytest.raises(nb.BudgetExceeded):
            run.step()
        clock.advance(5)
    assert run.trace.summary() == {
        "run": "agent",
        "mode": "counts",
        "checks": 6,
        "consumptions": 5,
        "refusals": 1,
        "kinds": ["tokens", "steps", "run_ms"],
        "by_kind": {
            "tokens": {"checks": 2, "consumptions": 2, "consumed": 150, "refusals": 0},
            "steps": {"checks": 4, "consumptions": 3, "consumed": 3, "refusals": 1},
            "run_ms": {"checks": 0, "consumptions": 0, "consumed": 10, "refusals": 0},
        },
        "limits": {"steps": 3},
        "events": {REFUSED: 1, "outcome": 1},
        "outcome": {"status": "completed"},
    }


def test_a_live_summary_follows_the_run_S4_9(clock: FakeClock) -> None:
    with nb.budget(clock=clock) as run:
        assert run.trace.summary()["checks"] == 0
        run.step()
        run.step()
        assert run.trace.summary()["consumptions"] == 2
        assert run.trace.summary()["kinds"] == ["steps"]


def test_summary_is_the_same_in_both_modes_except_mode_and_events_S4_9() -> None:
    counts = ten_steps(FakeClock(), trace="counts").trace.summary()
    full = ten_steps(FakeClock(), trace="full").trace.summary()
    assert (counts.pop("mode"), full.pop("mode")) == ("counts", "full")
    assert counts.pop("events") == {"outcome": 1}
    assert full.pop("events") == {"consumed": 13, "outcome": 1}
    assert counts == full


# -- counts and full modes -------------------------------------------------------------------------
def test_counts_mode_stores_no_consumed_events(clock: FakeClock) -> None:
    run = ten_steps(clock, trace="counts")
    assert run.trace.full is False
    assert charge_events(run.trace) == []
    assert [e.kind for e in run.trace.events] == ["outcome"]
    assert run.trace.summary()["consumptions"] == 13


def test_counts_is_the_default_mode(clock: FakeClock) -> None:
    with nb.budget(clock=clock) as run:
        run.step()
    assert run.trace.full is False
    assert run.trace.summary()["mode"] == "counts"


def test_full_mode_stores_one_consumed_event_per_charge_with_amount_and_target(
    clock: FakeClock,
) -> None:
    with nb.budget(clock=clock, trace="full", notices=None) as run:
        run.step()
        clock.advance(5)
        run.charge("tokens", 250, target="model:a")
        run.charge("cost_usd", 0.25, target="model:a")
        clock.advance(1)
        run.charge("tool_calls")
    assert run.trace.full is True
    assert charge_events(run.trace) == [
        nb.Event("consumed", {"budget_kind": "steps", "amount": 1, "run": "run"}, 0.0),
        nb.Event("consumed", {"budget_kind": "tokens", "target": "model:a", "amount": 250,
                              "run": "run"}, 5.0),
        nb.Event("consumed", {"budget_kind": "cost_usd", "target": "model:a", "amount": 0.25,
                              "run": "run"}, 5.0),
        nb.Event("consumed", {"budget_kind": "tool_calls", "amount": 1, "run": "run"}, 6.0),
    ]


def test_full_mode_names_the_grant_a_charge_was_made_in(clock: FakeClock) -> None:
    with nb.budget(clock=clock, trace="full", notices=None, name="agent") as run:
        run.step()
        with run.grant(name="search") as child:
            child.step()
    assert [e.payload["run"] for e in charge_events(run.trace)] == ["agent", "search"]


def test_a_refused_charge_is_not_a_consumed_event(clock: FakeClock) -> None:
    with nb.budget(steps=1, clock=clock, trace="full", notices=None) as run:
        run.step()
        with pytest.raises(nb.BudgetExceeded):
            run.step()
    assert [e.kind for e in run.trace.events[:2]] == ["consumed", REFUSED]
    assert len(charge_events(run.trace)) == 1


def test_an_unknown_trace_mode_is_refused() -> None:
    with pytest.raises(nb.ConfigError) as info:
        nb.budget(trace="verbose")
    assert str(info.value) == "trace='verbose': use 'counts' (the default) or 'full'"


def test_the_outcome_event_is_stamped_with_the_time_the_run_ended(clock: FakeClock) -> None:
    with nb.budget(clock=clock) as run:
        clock.advance(8)
    assert run.trace.events[-1] == nb.Event("outcome", {"status": "completed"}, 8.0)


# -- to_frame (N-4) --------------------------------------------------------------------------------
def test_to_frame_has_one_typed_row_per_event_N_4(clock: FakeClock) -> None:
    pd = pytest.importorskip("pandas")
    with nb.budget(tool_calls=1, clock=clock, trace="full", notices=None) as run:
        run.charge("tool_calls", target="tool:search")
        clock.advance(2)
        run.step()
        clock.advance(6)
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tool_calls", target="tool:search")
    frame = run.trace.to_frame()
    assert list(frame.columns) == ["t_ms", "kind", "run", "budget_kind", "amount", "payload"]
    assert {c: str(t) for c, t in frame.dtypes.items()} == {
        "t_ms": "float64", "kind": "category", "run": "category", "budget_kind": "category",
        "amount": "float64", "payload": "object",
    }
    assert frame["kind"].tolist() == ["consumed", "consumed", REFUSED, "outcome"]
    assert [None if pd.isna(k) else k for k in frame["budget_kind"]] == [
        "tool_calls", "steps", "tool_calls", None,
    ]
    assert frame["t_ms"].tolist()[:3] == [0.0, 2.0, 8.0]
    assert frame["amount"].tolist()[:2] == [1.0, 1.0]
    assert frame["run"].tolist() == ["run"] * 4
    assert frame["payload"].tolist()[:3] == [None, None, refusal_events(run.trace)[0].payload]


def test_to_frame_kind_categories_include_the_event_kinds_of_the_contract() -> None:
    pytest.importorskip("pandas")
    categories = set(nb.budget().trace.to_frame()["kind"].cat.categories)
    assert {
        REFUSED, "approach_notice", "progress", "watchdog_cut", "cancelled", "suspended",
        "resumed", "detached", "checkpoint_saved", "outcome",
    } <= categories


def test_to_frame_of_an_empty_trace_has_the_columns_and_no_rows() -> None:
    pytest.importorskip("pandas")
    frame = nb.budget().trace.to_frame()
    assert list(frame.columns) == ["t_ms", "kind", "run", "budget_kind", "amount", "payload"]
    assert len(frame) == 0


# -- save and load ---------------------------------------------------------------------------------
@pytest.fixture
def finished_run(clock: FakeClock) -> nb.Budget:
    """A full-mode run with charges, a grant, a targeted refusal and an approach notice."""
    with nb.budget(steps=5, tool_calls=1, clock=clock, trace="full", name="agent") as run:
        run.step()
        clock.advance(3)
        run.charge("tokens", 10, target="model:x")
        run.charge("cost_usd", 0.125)
        with run.grant(steps=2, name="child") as child:
            child.step()
        run.charge("tool_calls", target="tool:search")
        clock.advance(4)
        with pytest.raises(nb.BudgetExceeded):
            run.charge("tool_calls", target="tool:search")
    return run


@pytest.mark.parametrize("mode", ["full", "counts"])
def test_save_then_load_gives_an_equal_summary_and_equal_events(
    tmp_path: Path, clock: FakeClock, mode: str
) -> None:
    run = ten_steps(clock, trace=mode)
    path = tmp_path / "trace.json"
    run.trace.save(path)
    loaded = nb.Trace.load(path)
    assert loaded.summary() == run.trace.summary()
    assert loaded.events == run.trace.events
    assert (loaded.full, loaded.name, len(loaded)) == (run.trace.full, "run", len(run.trace))


def test_a_loaded_trace_equals_the_saved_one_in_every_view(
    tmp_path: Path, finished_run: nb.Budget
) -> None:
    pd = pytest.importorskip("pandas")
    trace = finished_run.trace
    trace.save(tmp_path / "trace.json")
    loaded = nb.Trace.load(str(tmp_path / "trace.json"))
    assert loaded.summary() == trace.summary()
    assert loaded.events == trace.events
    assert loaded.replay(nb.Limits(steps=1)) == trace.replay(nb.Limits(steps=1))
    pd.testing.assert_frame_equal(loaded.to_frame(), trace.to_frame())
    assert repr(loaded) == repr(trace) == (
        "<Trace 'agent' full: 11 events, 6 checks, 5 consumptions, 1 refusals>"
    )


def test_save_refuses_to_overwrite_an_existing_file(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "trace.json"
    path.write_text("keep me")
    with pytest.raises(FileExistsError) as info:
        ten_steps(clock).trace.save(path)
    assert str(info.value) == f"{str(path)!r} exists; pass overwrite=True to replace it"
    assert path.read_text() == "keep me"


def test_save_with_overwrite_replaces_the_file(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "trace.json"
    path.write_text("old")
    ten_steps(clock).trace.save(path, overwrite=True)
    assert nb.Trace.load(path).summary()["consumptions"] == 13
    assert os.listdir(tmp_path) == ["trace.json"]


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_saved_trace_has_the_mode_the_umask_gives_a_users_own_file(
        tmp_path: Path, clock: FakeClock, umask: int) -> None:
    fresh, replaced = tmp_path / "fresh.json", tmp_path / "replaced.json"
    replaced.write_text("old")
    replaced.chmod(0o600)
    run = ten_steps(clock)
    before = os.umask(umask)
    try:
        run.trace.save(fresh)
        run.trace.save(replaced, overwrite=True)
    finally:
        os.umask(before)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(replaced.stat().st_mode) == 0o666 & ~umask


def saved_json(run: nb.Budget, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "good.json"
    run.trace.save(path)
    return json.loads(path.read_text())


def load_error(path: Path) -> str:
    with pytest.raises(nb.ConfigError) as info:
        nb.Trace.load(path)
    return str(info.value)


def test_loading_a_missing_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    assert load_error(path) == f"cannot read trace {str(path)!r}: No such file or directory"


def test_loading_a_directory_names_it(tmp_path: Path) -> None:
    assert load_error(tmp_path) == f"cannot read trace {str(tmp_path)!r}: Is a directory"


@pytest.mark.parametrize("text", ["not json", "", "\x00"])
def test_loading_invalid_json_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert load_error(path).startswith(f"trace {str(path)!r} is not valid JSON: ")


def test_loading_json_nested_too_deep_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    assert load_error(path) == (f"trace {str(path)!r} nests deeper than JSON can be read here; "
                                f"a trace is the object that Trace.save writes")


@pytest.mark.parametrize("path", ["a\0b.json", 3.5, None])
def test_loading_from_what_is_not_a_path_names_it(path: object) -> None:
    with pytest.raises(nb.ConfigError, match=r"is not a file path; give a str or a pathlib\.Path"):
        nb.Trace.load(path)  # type: ignore[arg-type]


def test_loading_text_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"run": "caf\xe9"}')
    assert load_error(path) == (f"trace {str(path)!r} is not UTF-8 text (byte 0xe9 at offset "
                                f"12); save it as UTF-8")


def mutate(data: dict[str, Any], change: str) -> object:
    data = copy.deepcopy(data)
    if change == "other format":
        data["format"] = "other-trace-v9"
    elif change == "no format":
        del data["format"]
    elif change == "a list":
        return [data]
    elif change == "no stats":
        del data["stats"]
    elif change == "no events":
        del data["events"]
    elif change == "short column":
        data["events"]["t_ms"].pop()
    elif change == "unknown event kind":
        data["events"]["code"][0] = "exploded"
    elif change == "dangling payload":
        data["events"]["ref"][-1] = 999
    elif change == "dangling run":
        data["events"]["run"][-1] = 7
    elif change == "charge of no kind":
        events = data["events"]
        first = next(i for i, (code, ref) in enumerate(
            zip(events["code"], events["ref"], strict=True)) if code == "consumed" and ref >= 0)
        del events["payloads"][events["ref"][first]]["budget_kind"]
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("other format", "not an nbbudget trace (format 'other-trace-v9', expected "
                         "'nbbudget-trace-v1')"),
        ("no format", "not an nbbudget trace (format None, expected 'nbbudget-trace-v1')"),
        ("a list", "not an nbbudget trace (format 'list', expected 'nbbudget-trace-v1')"),
        ("no stats", "a field is missing or malformed (KeyError('stats'))"),
        ("no events", "a field is missing or malformed (KeyError('events'))"),
        ("short column", "its event columns have different lengths"),
        ("unknown event kind", "a field is missing or malformed (KeyError('exploded'))"),
        ("dangling payload", "event 13 points at a payload or run that is not there"),
        ("dangling run", "event 13 points at a payload or run that is not there"),
        ("charge of no kind", "event 3 is a charge whose payload names no kind of budget "
                              "(budget_kind)"),
    ],
)
def test_loading_a_malformed_trace_is_a_config_error_naming_the_file(
    tmp_path: Path, clock: FakeClock, change: str, message: str
) -> None:
    data = saved_json(ten_steps(clock), tmp_path)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutate(data, change)))
    assert load_error(path) == f"trace {str(path)!r}: {message}"


def test_loading_a_non_charge_event_without_a_payload_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({
        "format": "nbbudget-trace-v1", "run": "run", "mode": "counts", "limits": {},
        "stats": {"checks": {}, "consumptions": {}, "consumed": {}, "refusals": {}},
        "outcome": None, "runs": ["run"],
        "events": {"code": ["outcome"], "t_ms": [0.0], "amount": [0], "ref": [-1], "run": [0],
                   "payloads": []},
    }))
    assert load_error(path).startswith(f"trace {str(path)!r}: ")


# -- replay ----------------------------------------------------------------------------------------
def test_replay_finds_exactly_the_charges_tighter_limits_would_refuse(clock: FakeClock) -> None:
    trace = ten_steps(clock).trace
    steps = [i for i, e in enumerate(trace.events)
             if e.kind == "consumed" and e.payload["budget_kind"] == "steps"]
    replay = trace.replay(nb.Limits(steps=7))
    assert replay.exact is True
    assert bool(replay) is True
    assert replay.refusals == [
        {"index": steps[n - 1], "t_ms": 10.0 * n, "budget_kind": "steps", "limit_value": 7,
         "consumed_value": 7, "amount": 1, "target_ref": None}
        for n in (8, 9, 10)
    ]
    assert replay.first == replay.refusals[0]


def test_replay_does_not_count_a_refused_charge_against_later_ones(clock: FakeClock) -> None:
    with nb.budget(clock=clock, trace="full", notices=None) as run:
        run.charge("tokens", 100)
        run.charge("tokens", 300, target="model:big")
        run.charge("tokens", 50)
    replay = run.trace.replay(nb.Limits(tokens=200))
    assert replay.refusals == [{
        "index": 1, "t_ms": 0.0, "budget_kind": "tokens", "limit_value": 200,
        "consumed_value": 100, "amount": 300, "target_ref": "model:big",
    }]


def test_replay_names_the_target_of_each_refused_charge(clock: FakeClock) -> None:
    replay = ten_steps(clock).trace.replay(nb.Limits(tokens=150))
    assert [(r["budget_kind"], r["consumed_value"], r["target_ref"]) for r in replay.refusals] == [
        ("tokens", 100, "model:a"), ("tokens", 100, "model:a"),
    ]


def test_replay_with_a_time_limit_refuses_charges_made_after_it(clock: FakeClock) -> None:
    replay = ten_steps(clock).trace.replay(nb.Limits(run_ms=75))
    assert [(r["t_ms"], r["budget_kind"], r["limit_value"], r["consumed_value"])
            for r in replay.refusals if r["target_ref"] is None] == [
        (80.0, "run_ms", 75, 80.0), (90.0, "run_ms", 75, 90.0), (100.0, "run_ms", 75, 100.0),
    ]


@pytest.mark.parametrize(
    "limits", [nb.Limits(), nb.Limits(steps=10), nb.Limits(steps=10, tokens=300, run_ms=100)]
)
def test_replay_with_limits_that_held_is_empty_and_falsy(
    clock: FakeClock, limits: nb.Limits
) -> None:
    replay = ten_steps(clock).trace.replay(limits)
    assert replay.refusals == []
    assert not replay
    assert replay.first is None
    assert replay.exact is True


def test_replay_to_frame_has_one_row_per_refusal(clock: FakeClock) -> None:
    pytest.importorskip("pandas")
    frame = ten_steps(clock).trace.replay(nb.Limits(steps=7)).to_frame()
    assert list(frame.columns) == [
        "index", "t_ms", "budget_kind", "limit_value", "consumed_value", "amount", "target_ref",
    ]
    assert frame["budget_kind"].tolist() == ["steps"] * 3


def test_replay_of_a_counts_trace_is_inexact_and_flags_kinds_whose_totals_exceed(
    clock: FakeClock,
) -> None:
    trace = ten_steps(clock, trace="counts").trace
    replay = trace.replay(nb.Limits(steps=7, tokens=300, tool_calls=1))
    assert replay.exact is False
    assert replay.refusals == [{
        "index": None, "t_ms": None, "budget_kind": "steps", "limit_value": 7,
        "consumed_value": 10, "amount": None, "target_ref": None,
    }]


def test_replay_of_a_counts_trace_within_its_totals_is_empty(clock: FakeClock) -> None:
    replay = ten_steps(clock, trace="counts").trace.replay(nb.Limits(steps=10, tokens=300))
    assert (replay.refusals, replay.exact, bool(replay)) == ([], False, False)


def test_a_replay_shows_as_a_sentence_and_a_table_with_short_times() -> None:
    with nb.budget(trace="full", notices=None) as run:  # the real clock: times like 0.0701419
        run.charge("tokens", 100)
        run.charge("tokens", 300, target="model:big")
    replay = run.trace.replay(nb.Limits(tokens=200))
    t_ms = replay.refusals[0]["t_ms"]
    assert t_ms != round(t_ms, 2)  # the data stays exact
    shown = f"{t_ms:.2f}"
    assert repr(replay).splitlines() == [
        "1 charge would have been refused under these limits (replayed charge by charge):",
        f"index  {'t_ms':>{len(shown)}}  budget_kind  limit_value  consumed_value  amount  "
        f"target_ref",
        f"    1  {shown:>4}       tokens          200             100     300   model:big",
    ]
    assert f"<td>{shown}</td><td>tokens</td>" in replay._repr_html_()
    assert repr(run.trace.replay(nb.Limits(tokens=1000))) == (
        "No charge would have been refused under these limits (replayed charge by charge).")


def test_a_replay_of_totals_shows_only_the_columns_it_has(clock: FakeClock) -> None:
    replay = ten_steps(clock, trace="counts").trace.replay(nb.Limits(steps=7, run_ms=50))
    assert repr(replay).splitlines() == [
        '2 limits would have been exceeded under these limits (from the run\'s totals: record '
        'with trace="full" to replay charge by charge):',
        "budget_kind  limit_value  consumed_value",
        "     run_ms           50             100",
        "      steps            7              10",
    ]


@pytest.mark.parametrize("limits", [{"steps": 7}, None, 7])
def test_replay_takes_only_limits(clock: FakeClock, limits: object) -> None:
    with pytest.raises(nb.ConfigError) as info:
        ten_steps(clock).trace.replay(limits)  # type: ignore[arg-type]
    assert str(info.value) == f"replay() takes nb.Limits, not {type(limits).__name__}"


def test_a_full_trace_keeps_the_target_of_a_charge_that_takes_reserved_permits(clock):
    """A charge on the locked path may take permits the run reserved for its fast path: the
    event it records is its own, with its target, and only one."""
    with nb.budget(tool_calls=300, trace="full", clock=clock, notices=None) as run:
        run.charge("tool_calls")  # the run now holds a block of reserved permits
        run.charge("tool_calls", 299, target="tool:bulk")
    consumed = [e.payload for e in run.trace.events if e.kind == "consumed"]
    assert [(p["amount"], p.get("target")) for p in consumed] == [(1, None), (299, "tool:bulk")]


def test_plot_draws_each_limited_axis_against_its_limit_with_notices_refusals_and_cuts():
    """Trace.plot(): consumption as a fraction of each limit, the notice thresholds, the
    approach notices, the refusals and the cut that ended the run."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock = FakeClock()
    with pytest.raises(nb.BudgetExceeded), nb.budget(
            steps=20, tool_calls=5, time="10s", clock=clock, trace="full") as run:
        for i in range(30):
            clock.advance("200ms")
            run.step()
            if i % 3 == 0:
                with contextlib.suppress(nb.BudgetExceeded):
                    run.charge("tool_calls", target="search")
    ax = run.trace.plot()
    try:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert {"steps (limit 20)", "tool_calls (limit 5)", "run_ms (limit 10000)",
                "failed (by steps)"} <= set(lines)
        steps = lines["steps (limit 20)"]
        assert max(steps.get_ydata()) == 1.0  # 20 of 20 steps
        assert lines["tool_calls (limit 5)"].get_ydata()[-1] == 1.0
        assert list(lines["failed (by steps)"].get_xdata()) == [4200.0] * 2  # the cut, at 4.2 s
        levels = sorted(line.get_ydata()[0] for line in ax.get_lines()
                        if line.get_linestyle() == ":")
        assert levels == [0.8, 0.95]  # the notice thresholds
        marks = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
        assert marks["approach notice"] == [[2000.0, 0.8], [2600.0, 0.95]]
        assert marks["refused"] == [[3200.0, 1.0], [3800.0, 1.0], [4200.0, 1.0]]
        assert [t.get_text() for t in ax.get_legend().get_texts()].count("refused") == 1
    finally:
        plt.close(ax.figure)


def test_plot_marks_a_cancel_when_it_was_requested():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock = FakeClock()
    with pytest.raises(nb.Cancelled), nb.budget(steps=10, clock=clock) as run:
        run.step()
        clock.advance("1s")
        run.cancel("enough")
        clock.advance("2s")
    ax = run.trace.plot()
    try:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines["cut (stop)"].get_xdata()) == [1000.0] * 2  # the request, at 1 s
        assert list(lines["stopped (user)"].get_xdata()) == [3000.0] * 2  # the end, at 3 s
    finally:
        plt.close(ax.figure)


def test_plot_says_a_run_out_of_its_time_ran_out_of_time():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clock = FakeClock()
    with pytest.raises(nb.BudgetCut), nb.budget(time="2s", clock=clock, trace="full") as run:
        clock.advance("3s")
        run.check()
    ax = run.trace.plot()
    try:
        labels = {line.get_label() for line in ax.get_lines()}
        assert "failed (out of time)" in labels, labels  # not "timeout": that is --timeout's
    finally:
        plt.close(ax.figure)
