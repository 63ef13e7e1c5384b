"""Provider calls: a permit per attempt, usage charged after the fact, the output-token grant,
the guardrail (S2-9, S3-3, S3-6, S3-8, S4-6, S4-10)."""

from __future__ import annotations

import threading

import pytest

import nbbudget as nb
from nbbudget.core.kinds import KIND_INDEX
from nbbudget.run.providers import reserve_request
from nbbudget.testing import FakeClock, Reply, ScriptedProvider


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_S4_6_a_retrying_provider_spends_one_permit_per_attempt_never_refunded(clock):
    model = ScriptedProvider([Reply(error=ConnectionError("reset")),
                              Reply(error=ConnectionError("reset")),
                              Reply("hello", input_tokens=10, output_tokens=5)])
    with nb.budget(provider_calls=5, clock=clock) as run:
        ask = run.provider(model, name="chat", retries=2)
        assert ask("hi").text == "hello"
    assert run.consumed["provider_calls"] == 3
    assert run.consumed["tokens"] == 15 and run.consumed["output_tokens"] == 5


def test_S4_6_the_permit_is_reserved_before_dispatch_and_a_refusal_sends_nothing(clock):
    model = ScriptedProvider([Reply("a"), Reply("b")])
    with nb.budget(provider_calls=1, clock=clock) as run:
        ask = run.provider(model, name="chat")
        ask("one")
        with pytest.raises(nb.BudgetExceeded) as info:
            ask("two")
    assert info.value.target == "provider:chat"
    assert len(model.calls) == 1


def test_S4_6_retries_give_up_when_the_permits_run_out(clock):
    model = ScriptedProvider([Reply(error=ConnectionError("reset"))] * 3)
    with nb.budget(provider_calls=2, clock=clock) as run:
        ask = run.provider(model, retries=5)
        with pytest.raises(nb.BudgetExceeded):
            ask("hi")
    assert run.consumed["provider_calls"] == 2


def test_S2_9_S3_6_max_output_tokens_is_clamped_to_what_remains(clock):
    model = ScriptedProvider([Reply("x", output_tokens=300), Reply("y", output_tokens=300)])
    with nb.budget(output_tokens=500, clock=clock) as run:
        ask = run.provider(model)
        ask("a", max_output_tokens=400)
        ask("b", max_output_tokens=400)
    assert [cap for _, cap in model.calls] == [400, 200]
    assert run.consumed["output_tokens"] == 500


def test_S2_9_an_exhausted_output_grant_fails_the_run_never_a_made_up_reply(clock):
    model = ScriptedProvider([Reply("x", output_tokens=100)])
    with pytest.raises(nb.BudgetExceeded) as info, nb.budget(output_tokens=100,
                                                            clock=clock) as run:
        ask = run.provider(model)
        ask("a", max_output_tokens=100)
        ask("b", max_output_tokens=100)  # nothing left: refused before dispatch
    assert info.value.kind == "output_tokens"
    assert len(model.calls) == 1
    assert (run.outcome.status, run.outcome.by) == ("failed", "output_tokens")


def test_S4_10_S3_3_usage_past_a_limit_is_recorded_then_fails_by_the_first_in_order(clock):
    model = ScriptedProvider([Reply("long", input_tokens=900, output_tokens=300,
                                    cost_usd=2.0)])
    with pytest.raises(nb.BudgetCut) as info, nb.budget(tokens=1000, cost_usd=1.0,
                                                       clock=clock) as run:
        run.provider(model)("a")
        pytest.fail("the run goes on after a reply passed its limits")
    assert info.value.by == "tokens"  # tokens > cost at the same boundary
    assert run.consumed["tokens"] == 1200 and run.consumed["cost_usd"] == 2.0
    assert (run.outcome.status, run.outcome.cause, run.outcome.code) == (
        "failed", "budget-cut", "TokenBudgetExceeded")


def test_cost_comes_from_prices_per_million_tokens_or_a_price_function(clock):
    with nb.budget(clock=clock) as run:
        run.provider(ScriptedProvider([Reply(input_tokens=2000, output_tokens=1000)]),
                     prices={"input": 500, "output": 1500})("a")
        run.provider(ScriptedProvider([Reply(input_tokens=10, output_tokens=10)]),
                     prices=lambda usage: 0.25)("b")
        run.provider(ScriptedProvider([Reply(input_tokens=10, output_tokens=10)]),
                     price=lambda usage: 0.125)("c")  # the older name of prices=function
    assert run.consumed["cost_usd"] == 2.5 + 0.25 + 0.125


@pytest.mark.parametrize("usage", [
    {"input_tokens": 3, "output_tokens": 4},
    {"usage": {"input_tokens": 3, "output_tokens": 4}},
])
def test_usage_is_read_from_a_mapping_or_its_usage_entry(clock, usage):
    with nb.budget(clock=clock) as run:
        run.provider(lambda: usage)()
    assert run.consumed["tokens"] == 7


def test_S3_8_the_guardrail_stops_waiting_for_a_call_that_never_answers(clock):
    release = threading.Event()

    def hangs() -> str:
        clock.advance("2s")  # the call goes silent past its guardrail
        release.wait(5)
        return "late"

    with nb.budget(clock=clock) as run:
        ask = run.provider(hangs, name="slow", guardrail="1s")
        with pytest.raises(nb.BudgetCut) as info:
            ask()
        release.set()
    assert info.value.by == "guardrail"
    assert "guardrail_timeout" in str(info.value)


def test_bad_provider_arguments_are_config_errors(clock):
    run = nb.budget(clock=clock)
    with pytest.raises(nb.ConfigError, match="retries=-1"):
        run.provider(lambda: None, retries=-1)
    with pytest.raises(nb.ConfigError, match="not price= too"):
        run.provider(lambda: None, prices={"input": 1, "output": 2}, price=lambda u: 1)
    with pytest.raises(nb.ConfigError, match="guardrail='soon'"):
        run.provider(lambda: None, guardrail="soon")


def _chunks(n: int, tokens: int, *, fail_after: int | None = None, closed: list | None = None):
    try:
        for i in range(n):
            if fail_after is not None and i == fail_after:
                raise ConnectionError("stream reset")
            yield {"text": f"part {i}", "usage": {"output_tokens": tokens}}
    finally:
        if closed is not None:
            closed.append(True)


def test_S3_9_a_stream_is_cancelled_the_moment_it_passes_a_limit(clock):
    closed: list = []
    seen = []
    with pytest.raises(nb.BudgetCut) as info, nb.budget(tokens=250, clock=clock) as run:
        stream = run.provider(lambda: _chunks(10, 100, closed=closed))()
        for chunk in stream:
            seen.append(chunk["text"])
    assert seen == ["part 0", "part 1"]  # the third chunk passed the limit: not handed on
    assert closed == [True]
    assert info.value.by == "tokens"
    assert run.consumed["tokens"] == 300


def test_S2_4_a_stream_that_fails_after_content_is_cut_by_stream_error(clock):
    with nb.budget(clock=clock) as run:
        stream = run.provider(lambda: _chunks(5, 1, fail_after=2))()
        got = []
        with pytest.raises(nb.BudgetCut) as info:
            for chunk in stream:
                got.append(chunk)
    assert info.value.by == "stream-error" and len(got) == 2
    assert "stream reset" in str(info.value)


def test_S3_7_past_a_fraction_of_the_cost_limit_the_run_degrades_once(clock):
    cheap = ScriptedProvider([Reply("cheap", cost_usd=0.01)] * 3)
    cheap.__name__ = "small_model"
    big = ScriptedProvider([Reply("big", cost_usd=0.5), Reply("big", cost_usd=0.35)])
    with nb.budget(cost_usd=1.0, clock=clock) as run:
        ask = run.provider(big, name="large_model", degrade=(cheap, 0.8))
        assert [ask("q").text for _ in range(4)] == ["big", "big", "cheap", "cheap"]
    assert run.outcome.degraded == {"from": "large_model", "to": "small_model",
                                    "reason": "budget"}
    assert [e.payload for e in run.trace.events if e.kind == "degraded"] == [
        {"from": "large_model", "to": "small_model", "reason": "budget"}]


def test_S3_7_a_grant_that_degrades_records_it_in_its_own_outcome(clock):
    cheap = ScriptedProvider([Reply("cheap", cost_usd=0.01)] * 2)
    cheap.__name__ = "small_model"
    big = ScriptedProvider([Reply("big", cost_usd=0.9)])
    with nb.budget(clock=clock) as run, run.grant(name="writer", cost_usd=1.0) as child:
        ask = child.provider(big, name="large_model", degrade=(cheap, 0.8))
        assert [ask("q").text for _ in range(3)] == ["big", "cheap", "cheap"]
    assert child.outcome.degraded == {"from": "large_model", "to": "small_model",
                                      "reason": "budget"}
    assert run.outcome.degraded is None  # the run's own providers kept their model


def test_degrade_needs_a_cost_limit_and_a_fraction(clock):
    run = nb.budget(clock=clock)
    with pytest.raises(nb.ConfigError, match="needs a cost limit"):
        run.provider(lambda: None, degrade=(lambda: None, 0.5))
    with pytest.raises(nb.ConfigError, match="degrade="):
        nb.budget(cost_usd=1, clock=clock).provider(lambda: None, degrade=(lambda: None, 2))


@pytest.mark.parametrize("usage", [{"input_tokens": -1}, {"output_tokens": 2.5},
                                   {"cost_usd": float("nan")}, {"output_tokens": True}])
def test_a_reply_that_reports_impossible_usage_is_a_config_error_naming_it(clock, usage):
    with nb.budget(tokens=100, clock=clock) as run:
        ask = run.provider(lambda: {"usage": usage}, name="odd", guardrail=0)
        with pytest.raises(nb.ConfigError, match=r"provider odd reported \w+="):
            ask()
        assert run.consumed.get("tokens", 0) == 0


# -- what a model request takes before it is sent (the model clients and the adapters) --------
@pytest.mark.parametrize(("limits", "refused_by"), [
    ({"output_tokens": 5, "turns": 1}, "output_tokens"),  # S2-9 first: none left
    ({"turns": 1}, "turns"),
    ({"provider_calls": 1}, "provider_calls"),
])
def test_S2_9_S4_3_a_model_request_takes_its_turn_and_permit_both_or_neither(
        ledger, clock, limits, refused_by):
    with nb.budget(**limits, ledger=ledger, clock=clock) as run:
        if refused_by == "output_tokens":
            run.lowlevel.spend([(KIND_INDEX["output_tokens"], 5)], None)  # a reply used it
        else:
            assert reserve_request(run.lowlevel, 100, "provider:m") == 100
        before = dict(run.consumed)
        with pytest.raises(nb.BudgetExceeded) as info:
            reserve_request(run.lowlevel, 100, "provider:m")
        assert info.value.kind == refused_by
        assert info.value.target == "provider:m"
        assert dict(run.consumed) == before  # nothing reserved by the refused request


def test_S2_9_S4_6_a_retry_takes_one_more_permit_and_the_cap_is_what_is_left(ledger, clock):
    with nb.budget(output_tokens=30, turns=1, provider_calls=3, ledger=ledger,
                   clock=clock) as run:
        assert reserve_request(run.lowlevel, 100, "provider:m") == 30  # clamped (S2-9)
        assert reserve_request(run.lowlevel, None, "provider:m", retry=True) == 30
        assert reserve_request(run.lowlevel, 10, "provider:m", retry=True) == 10
        assert (run.consumed["turns"], run.consumed["provider_calls"]) == (1, 3)
