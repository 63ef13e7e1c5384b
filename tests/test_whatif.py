"""`Trace.explore()`: how a recorded run would have ended under other limits
(`nbbudget.core.whatif`).

Runs recorded on a `FakeClock`, so every event's index and time is known: a run refused at a
known event (S3-2), a refusal inside a grant counted against the run (S4-3), windows that suspend
and a resumed run (S3-1, S4-4), runs that were cut (S3-2, S4-7) or stopped (S2-3), what is kept
and lost (S4-10), a trace of counts only. The verdict is checked against `Trace.replay`'s first
refusal on many limits. Then the view: the text where widgets cannot render, the sliders moved
from code, and the throttle of a drag (on a real event loop).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

import nbbudget as nb
from nbbudget.testing import FakeClock

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def agent(clock: FakeClock, *, steps: int | None = 8, turns: int = 10) -> nb.Trace:
    """A loop of *turns* turns, one a second: a step, then 120 tokens to a model. Under its
    limit of *steps* it is refused at its ninth step, event 18 (S3-2)."""
    with pytest.raises(nb.BudgetExceeded) if steps is not None and steps < turns else _none(), \
            nb.budget(steps=steps, tokens=1000, trace="full", clock=clock, name="agent") as run:
        for i in range(turns):
            clock.advance("1s")
            run.step()
            run.charge("tokens", 120, target=f"model-{i}")
    return run.trace


class _none:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- the verdict ---------------------------------------------------------------------------------
def test_S3_2_a_tighter_limit_refuses_the_run_at_a_known_event(clock: FakeClock) -> None:
    explorer = agent(clock).explore(widgets=False)
    verdict = explorer.set(steps=5)
    # events: (step, tokens) per turn from 0, and two approach notices before turn 5's step
    assert (verdict.status, verdict.event, verdict.kind, verdict.t_ms) == (
        "refused", 10, "steps", 6000.0)
    assert verdict.kept == {"checkpoints": 0, "tool outputs": 0, "tokens": 600, "steps": 5}
    assert verdict.lost == {"checkpoints": 0, "tool outputs": 0, "tokens": 360, "steps": 3}
    assert (verdict.done, round(verdict.done_time, 4)) == (0.5, 0.6667)
    assert verdict.lines == (
        "Refused at event 10 of 20 by steps (limit 5), at 6.0 s, after 50% of the recorded "
        "events and 67% of its time.",
        "Kept: 600 tokens; 5 steps; done work stays done (see: nbbudget explain S4-10).",
        "Lost: 360 tokens; 3 steps.",
    )
    assert str(verdict) == verdict.text == "\n".join(verdict.lines)


def test_S3_3_the_first_limit_to_trip_ends_the_run(clock: FakeClock) -> None:
    explorer = agent(clock).explore(widgets=False)
    verdict = explorer.set(steps=5, tokens=500)  # tokens: 600 > 500 at turn 4's charge
    assert (verdict.status, verdict.event, verdict.kind) == ("refused", 9, "tokens")


def test_S4_7_a_shorter_time_grant_cuts_the_run_before_the_first_event_after_it(
        clock: FakeClock) -> None:
    trace = agent(clock)
    verdict = trace.explore(widgets=False).set(run_ms=4500)
    assert (verdict.status, verdict.event, verdict.kind, verdict.t_ms) == ("cut", 8, "run_ms",
                                                                         4500.0)
    assert verdict.lines[0] == ("Cut by its time grant (4.5 s) before event 8 of 20, after 40% "
                                "of the recorded events and 50% of its time.")
    assert trace.replay(nb.Limits(run_ms=4500)).first["index"] == 8


def test_the_verdict_is_the_first_refusal_of_replay(clock: FakeClock) -> None:
    """On a run with a grant and charges of many sizes, for 300 limits drawn at random."""
    rnd = random.Random(24)
    with nb.budget(trace="full", clock=clock, notices=None) as run:
        for i in range(60):
            clock.advance(rnd.randint(1, 50))
            run.charge("tokens", rnd.randint(1, 100))
            if i % 3 == 0:
                with run.grant(name="tool", steps=100) as child:
                    child.step()
                    child.charge("cost_usd", 0.001 * rnd.randint(1, 9))
            run.step()
    trace = run.trace
    explorer = trace.explore(widgets=False)
    used = trace.stats()["consumed"]
    for _ in range(300):
        limits = {k: max(1, round(used[k] * rnd.uniform(0.05, 1.2)))
                  for k in ("tokens", "steps", "run_ms") if rnd.random() < 0.7}
        if rnd.random() < 0.5:
            limits["cost_usd"] = round(used["cost_usd"] * rnd.uniform(0.05, 1.2), 6) or 0.001
        verdict = explorer.set(**limits)  # the sliders not named stay where they were
        limits = explorer.limits.to_dict()
        first = trace.replay(explorer.limits).first
        if first is None:
            assert verdict.status in ("completed", "cut"), limits
            if verdict.status == "cut":  # time ran out after the last charge
                assert limits["run_ms"] < used["run_ms"]
        elif first["budget_kind"] == "run_ms":
            assert verdict.status == "cut" and verdict.event <= first["index"], limits
        else:
            assert (verdict.status, verdict.event, verdict.kind) == (
                "refused", first["index"], first["budget_kind"]), limits


def test_S4_3_a_charge_in_a_grant_is_refused_by_the_run_wide_limit_and_named(
        clock: FakeClock) -> None:
    with nb.budget(trace="full", clock=clock, name="agent", notices=None) as run:
        run.step()
        run.step()
        with run.grant(name="search", steps=5) as search:
            search.step()  # event 2: the run's third step
            search.step()
    verdict = run.trace.explore(widgets=False).set(steps=2)  # event 2: the grant is made
    assert (verdict.status, verdict.event, verdict.kind) == ("refused", 3, "steps")
    assert verdict.lines[0].startswith("Refused at event 3 of ")
    assert "(in grant 'search') by steps (limit 2)" in verdict.lines[0]
    assert verdict.lost["steps"] == 2


def test_S3_1_a_suspended_window_goes_on_under_a_wider_limit_and_ends_there_under_its_own(
        clock: FakeClock) -> None:
    with nb.budget(tokens=100, suspend=True, trace="full", clock=clock, notices=None) as run:
        for _ in range(10):
            clock.advance("1s")
            run.charge("tokens", 30)
    explorer = run.trace.explore(widgets=False)  # 3 charges, the refusal, suspended, outcome
    wider = explorer.set(tokens=120)
    assert (wider.status, wider.event, wider.as_recorded) == ("beyond", 3, False)
    assert wider.lines == ("Gets past where the recorded run ended (event 3 of 6, suspended by "
                           "tokens): under these limits it goes on, and what it would have done "
                           "next was never recorded.",)
    same = explorer.set(tokens=100)
    assert (same.status, same.event, same.as_recorded) == ("refused", 3, True)
    assert same.lines[0].endswith("where the recorded run was suspended by its tokens window: "
                                  "as a whole-run ceiling, the limit ends it there (see: "
                                  "nbbudget explain S3-1).")
    assert explorer.set(tokens=50).event == 1  # the second charge: 60 > 50


def test_S3_1_a_resumed_runs_ceiling_counts_what_its_earlier_slices_spent(
        clock: FakeClock) -> None:
    with nb.budget(tokens=100, suspend=True, clock=clock, notices=None) as first:
        while True:
            clock.advance("1s")
            first.charge("tokens", 30)  # 90, then the window is spent
    with nb.Budget.resume(first.state(), clock=clock, trace="full") as second:
        for _ in range(3):
            clock.advance("1s")
            second.charge("tokens", 30)  # 120, 150, 180 over the whole run
    explorer = second.trace.explore(widgets=False)  # event 0 is "resumed"
    assert explorer.model.ranges()["tokens"].start == 100  # the window it had
    verdict = explorer.set(tokens=130)
    assert (verdict.status, verdict.event, verdict.kind) == ("refused", 2, "tokens")
    assert verdict.kept["tokens"] == 30 and verdict.lost["tokens"] == 60  # this slice's charges
    # time: 4 s of active time came with the checkpoint; a 5 s grant ends it a second in
    cut = explorer.set(tokens=1000, run_ms=5000)
    assert (cut.status, cut.event, cut.t_ms) == ("cut", 2, 1000.0)


def test_S3_2_a_run_that_was_cut_ends_as_recorded_under_its_own_limit_and_goes_on_past_it(
        clock: FakeClock) -> None:
    explorer = agent(clock).explore(widgets=False)
    own = explorer.verdict  # the sliders start at the run's own limits
    assert (own.status, own.event, own.kind, own.as_recorded) == ("refused", 18, "steps", True)
    assert own.lines[0].endswith(", as recorded.")
    assert own.lost == {"checkpoints": 0, "tool outputs": 0, "tokens": 0, "steps": 0}
    past = explorer.set(steps=9)
    assert (past.status, past.event, past.kind) == ("beyond", 18, "steps")
    assert "(event 18 of 20, failed by steps)" in past.lines[0]


def test_S4_7_a_run_cut_by_its_time_grant_goes_on_under_a_longer_one(clock: FakeClock) -> None:
    with pytest.raises(nb.BudgetCut), nb.budget(time="3s", trace="full", clock=clock,
                                                notices=None) as run:
        for _ in range(10):
            clock.advance("1s")
            run.step()
    explorer = run.trace.explore(widgets=False)  # events: 2 steps, cut, outcome
    assert explorer.verdict.status == "cut" and explorer.verdict.as_recorded
    assert explorer.verdict.event == 2
    longer = explorer.set(run_ms=4000)
    assert longer.status == "beyond"
    assert "(event 2 of 4, ran out of time)" in longer.lines[0]  # not "timeout": --time's
    shorter = explorer.set(run_ms=1500)
    assert (shorter.status, shorter.event, shorter.as_recorded) == ("cut", 1, False)


def test_S2_3_a_stopped_run_ends_as_recorded_whatever_the_limits(clock: FakeClock) -> None:
    with pytest.raises(nb.Cancelled), nb.budget(trace="full", clock=clock, notices=None) as run:
        for _ in range(4):
            clock.advance("1s")
            run.step()
        run.cancel("enough")
        run.step()
    explorer = run.trace.explore(widgets=False)
    verdict = explorer.set(steps=4)
    assert (verdict.status, verdict.as_recorded) == ("stopped", True)
    assert verdict.lines[0] == ("Stopped at event 4 of 7 (by user), as recorded: limits do not "
                                "change that.")
    assert explorer.set(steps=2).status == "refused"  # a limit that bites first still does


def test_S4_10_checkpoints_and_tool_outputs_before_the_cut_are_kept(clock: FakeClock) -> None:
    with nb.budget(trace="full", clock=clock, notices=None) as run:
        @run.tool
        def search(query: str, ctx) -> str:
            ctx.progress({"found": query})
            return query

        for i in range(4):
            clock.advance("1s")
            run.step()
            search(f"q{i}")
            run.lowlevel.record("checkpoint_saved", {"checkpoint": f"ck-{i}"})
    verdict = run.trace.explore(widgets=False).set(steps=2)  # refused at the third step
    assert verdict.status == "refused"
    assert verdict.kept == {"checkpoints": 2, "tool outputs": 2, "steps": 2, "tool_calls": 2}
    assert verdict.lost == {"checkpoints": 2, "tool outputs": 2, "steps": 2, "tool_calls": 2}
    assert verdict.lines[1] == ("Kept: 2 checkpoints; 2 tool outputs; 2 steps; 2 tool_calls; "
                                "done work stays done (see: nbbudget explain S4-10).")


def test_a_trace_of_counts_says_which_limit_its_totals_pass_but_not_where(
        clock: FakeClock) -> None:
    trace = agent(clock, steps=None, turns=8)
    counts_only = nb.Trace.from_json({**trace.to_json(), "mode": "counts"})
    explorer = counts_only.explore(widgets=False)
    verdict = explorer.set(tokens=500)
    assert (verdict.status, verdict.event, verdict.kind) == ("refused", None, "tokens")
    assert verdict.lines == ("Refused by tokens: the run used 960, over the limit of 500; "
                             "where, a trace of counts cannot say (record with trace=\"full\" "
                             "to see the event).",)
    assert explorer.set(tokens=960).lines[1].startswith("(from the run's totals")


def test_a_run_that_completed_says_so_with_what_it_used_of_each_limit(clock: FakeClock) -> None:
    explorer = agent(clock, steps=None, turns=3).explore(widgets=False)
    assert explorer.verdict.lines == (
        "Completed, as recorded: tokens 360 of 1000, steps 3 of 5, time 3.0 s of 4.5 s.",)


def test_explore_reads_a_saved_trace_as_the_live_one(clock: FakeClock, tmp_path: Path) -> None:
    trace = agent(clock)
    trace.save(tmp_path / "run.json")
    loaded = nb.Trace.load(tmp_path / "run.json").explore(widgets=False)
    assert loaded.set(steps=5).lines == trace.explore(widgets=False).set(steps=5).lines


def test_set_names_an_axis_the_run_did_not_use_and_refuses_a_bad_value(
        clock: FakeClock) -> None:
    explorer = agent(clock).explore(widgets=False)
    with pytest.raises(nb.ConfigError) as info:
        explorer.set(turns=3)
    assert str(info.value) == ("the run used no 'turns' to explore; its axes are: tokens, steps, "
                               "run_ms")
    with pytest.raises(nb.ConfigError, match="steps"):
        explorer.set(steps=0)


# -- the view ------------------------------------------------------------------------------------
def test_without_widgets_the_explorer_shows_its_verdict_as_text(clock: FakeClock) -> None:
    explorer = agent(clock).explore(widgets=False)
    assert explorer.fallback == "widgets=False" and explorer.sliders == {}
    assert explorer.mimebundle() == {"text/plain": explorer.text}
    assert repr(explorer) == explorer.text == (
        "What if (time 14 s, steps 8, tokens 1000):\n" + explorer.verdict.text)


def test_in_ipython_the_explorer_displays_its_widget_with_the_text_beside(
        clock: FakeClock) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    InteractiveShell.instance(config=config)
    explorer = agent(clock).explore()
    with capture_output() as shown:
        display(explorer)
    (output,) = shown.outputs
    assert output.data["text/plain"] == explorer.text
    assert output.data[WIDGET_VIEW]["model_id"] == explorer.mimebundle()[WIDGET_VIEW]["model_id"]


def test_one_slider_per_axis_used_starting_at_the_runs_own_limits(clock: FakeClock) -> None:
    explorer = agent(clock).explore()
    sliders = explorer.sliders
    assert list(sliders) == ["tokens", "steps", "run_ms"]
    assert [(s.min, s.value, s.max) for s in sliders.values()] == [
        (1, 1000, 1500), (1, 8, 12), (1, 13500, 13500)]  # run_ms: none set, so the top
    assert [s.description for s in sliders.values()] == ["tokens", "steps", "time (ms)"]
    assert explorer.draws == 1 and explorer.drawn == explorer.limits
    assert explorer.png.startswith(PNG)


def test_moving_a_slider_from_code_gives_the_new_verdict_and_redraws(clock: FakeClock) -> None:
    explorer = agent(clock).explore()
    before = explorer.png
    explorer.sliders["steps"].value = 5  # as a front end's drag ends
    assert explorer.limits == nb.Limits(tokens=1000, steps=5, run_ms=13500)
    assert (explorer.verdict.status, explorer.verdict.event) == ("refused", 10)
    assert explorer.draws == 2 and explorer.drawn == explorer.limits
    assert explorer.png != before and explorer.png.startswith(PNG)
    verdict_html = explorer.widget.children[len(explorer.sliders)]
    assert "Refused at event 10 of 20 by steps (limit 5)" in verdict_html.value
    explorer.set(steps=12, tokens=1500)  # two sliders, one drawing
    assert explorer.draws == 3 and explorer.verdict.status == "beyond"
    explorer.set(steps=50)  # past the slider's top: the slider grows to take it
    assert explorer.sliders["steps"].max == 50 and explorer.limits.steps == 50


@pytest.mark.realclock
def test_a_drag_redraws_at_once_then_once_per_interval_with_the_last_limits(
        clock: FakeClock) -> None:
    explorer = agent(clock).explore(interval_ms=1000)  # drawn once, as it is made

    async def drag() -> None:
        for steps in range(12, 0, -1):  # twelve moves in well under a second
            explorer.sliders["steps"].value = steps
        assert explorer.draws == 1  # within a second of the last drawing: none drew yet
        assert explorer.verdict.event == 2 and explorer.drawn.steps == 8  # the text follows
        deadline = time.monotonic() + 10
        while explorer.draws < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert explorer.draws == 2 and explorer.drawn == explorer.limits  # the last move
        assert explorer.drawn.steps == 1

    asyncio.run(drag())


def test_a_run_with_nothing_charged_has_no_slider_and_completed(clock: FakeClock) -> None:
    with nb.budget(trace="full", clock=clock) as run:
        pass
    explorer = run.trace.explore()
    assert explorer.sliders == {} and explorer.verdict.lines == ("Completed, as recorded.",)
    assert json.loads(json.dumps(explorer.mimebundle()))["text/plain"].startswith(
        "What if (no limits):")


# -- in a real kernel ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from test_magic_kernel import run, started_kernel

    for client in started_kernel(tmp_path_factory):
        setup = run(client, f"""\
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from nbbudget.testing import FakeClock
            from test_whatif import agent
            """)
        assert setup.status == "ok", setup.reply["content"]
        yield client


@pytest.mark.realclock
def test_a_drag_of_thirty_moves_from_a_front_end_draws_a_few_times_in_a_kernel(kernel) -> None:
    """What a front end sends while a slider is dragged: one ``update`` per position. The
    verdict follows every move; the plot is drawn a few times, the last position among them."""
    from test_magic_kernel import run

    made = run(kernel, """\
        explorer = agent(FakeClock()).explore(interval_ms=500)
        print(explorer.sliders["steps"].model_id)
        """)
    assert made.status == "ok", made.reply["content"]
    comm_id = made.stdout.strip()
    positions = [12, 11, 10, 9, 8, 7, 6, 5, 4, 3] * 3
    for steps in positions:
        kernel.shell_channel.send(kernel.session.msg("comm_msg", {
            "comm_id": comm_id, "data": {"method": "update", "state": {"value": steps},
                                         "buffer_paths": []}}))
    deadline = time.monotonic() + 20
    while True:
        probe = run(kernel, "print(explorer.draws, explorer.drawn.steps, explorer.limits.steps, "
                            "explorer.verdict.event)")
        draws, drawn, steps, event = map(int, probe.stdout.split())
        if drawn == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (steps, event, drawn) == (3, 6, 3)  # the last position, drawn
    assert 2 <= draws <= 5, f"{draws} drawings for {len(positions)} moves"
