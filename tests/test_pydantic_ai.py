"""The pydantic-ai adapter, with real pydantic-ai agents run offline (FunctionModel, TestModel)."""

from __future__ import annotations

import asyncio
import pickle

import pytest

pytest.importorskip("pydantic_ai")
if not hasattr(pytest.importorskip("pydantic_ai.capabilities").AbstractCapability,
               "prepare_model_request"):
    pytest.skip("the adapter needs pydantic-ai 2.64 or newer (Python 3.11 or newer); "
                "tests/test_pydantic_ai_versions.py shows it refuses this one",
                allow_module_level=True)

from pydantic_ai import Agent
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

import nbbudget as nb
from nbbudget.pydantic_ai import Budgeted, UsageLimitCut, UsageLimitRefused


def looping_agent(*, usage=(10, 5), answer_after=None, seen_settings=None):
    """An agent whose model asks for the ``lookup`` tool on every request (a tool-calling loop),
    or answers after *answer_after* requests. Returns the agent and the list of tool calls run."""
    ran: list[str] = []
    requests = [0]

    def model(messages, info: AgentInfo) -> ModelResponse:
        requests[0] += 1
        if seen_settings is not None:
            seen_settings.append(dict(info.model_settings or {}))
        used = RequestUsage(input_tokens=usage[0], output_tokens=usage[1])
        if answer_after is not None and requests[0] > answer_after:
            return ModelResponse(parts=[TextPart("done")], usage=used)
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": f"q{requests[0]}"})],
                             usage=used)

    agent = Agent(FunctionModel(model, model_name="scripted"))

    @agent.tool_plain
    def lookup(q: str) -> str:
        ran.append(q)
        return q.upper()

    return agent, ran


def refusals(run):
    return [e for e in run.trace.events if e.kind == "dispatch_refused_budget_exceeded"]


def test_tool_loop_stops_at_the_third_tool_call_with_the_frameworks_error():
    """The issue's acceptance: a tool-calling loop stops at tool_calls=3 (S4-3, S4-8)."""
    agent, ran = looping_agent()
    with pytest.raises(UsageLimitExceeded) as info, nb.budget(tool_calls=3) as run:
        agent.run_sync("find it", capabilities=[Budgeted(run)])
    err = info.value
    assert isinstance(err, UsageLimitRefused) and isinstance(err, nb.BudgetExceeded)
    assert ran == ["q1", "q2", "q3"]  # the refused fourth call never ran
    assert (err.kind, err.limit, err.consumed, err.target) == ("tool_calls", 3, 3, "tool:lookup")
    assert "tool_calls for tool:lookup would exceed the run's limit of 3" in str(err)
    assert "usage limits" in str(err)  # pydantic-ai's own hint, as its UsageLimits would give
    # our outcome, on the error and on the run
    assert run.outcome.status == "failed" and run.outcome.cause == "budget-cut"
    assert run.outcome.by == "tool_calls"
    assert err.outcome == run.outcome
    # the refusal is in the trace with the S4-8 payload
    (refused,) = refusals(run)
    assert refused.payload == {
        "budget_kind": "tool_calls", "limit_value": 3, "consumed_value": 3,
        "target_ref": "tool:lookup", "runtime_error_code": "ToolCallBudgetExceeded",
    }
    assert run.consumed["tool_calls"] == 3
    assert run.consumed["provider_calls"] == 4 and run.consumed["turns"] == 4


def test_the_refusal_is_also_caught_as_a_budget_error_and_pickles():
    agent, _ = looping_agent()
    with nb.budget(tool_calls=1) as run, pytest.raises(nb.BudgetError) as info:
        agent.run_sync("go", capabilities=[Budgeted(run)])
    err = info.value
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UsageLimitRefused and back.kind == "tool_calls" and str(back) == str(err)


def test_testmodel_agent_is_bounded_by_provider_calls():
    """TestModel calls every tool once, then answers: the second request is refused (S4-6)."""
    agent = Agent(TestModel())
    ran = []

    @agent.tool_plain
    def weather(city: str) -> str:
        ran.append(city)
        return "sunny"

    with pytest.raises(UsageLimitRefused) as info, nb.budget(provider_calls=1) as run:
        agent.run_sync("weather?", capabilities=[Budgeted(run)])
    assert info.value.kind == "provider_calls" and info.value.target == "provider:test"
    assert len(ran) == 1
    assert run.outcome.by == "provider_calls"


def test_within_limits_the_agent_answers_and_usage_is_charged():
    agent, ran = looping_agent(answer_after=2, usage=(100, 20))
    # each request reserves its worst case first, all that is left (no max_tokens): its
    # input's bound alone is above a dollar at these prices (S3-10)
    with nb.budget(tool_calls=5, tokens=1000, cost_usd=10.0) as run:
        result = agent.run_sync("go", capabilities=[
            Budgeted(run, prices={"input": 1000.0, "output": 2000.0})])
    assert result.output == "done" and ran == ["q1", "q2"]
    assert run.outcome.status == "completed"
    assert run.consumed["tokens"] == 3 * 120 and run.consumed["output_tokens"] == 60
    assert run.consumed["cost_usd"] == pytest.approx(3 * (0.1 + 0.04))


def test_max_tokens_is_clamped_to_the_output_token_grant():
    """S2-9: each request asks for at most what remains of the output-token grant."""
    seen: list[dict] = []
    agent, _ = looping_agent(answer_after=2, usage=(10, 20), seen_settings=seen)
    with nb.budget(output_tokens=70) as run:
        agent.run_sync("go", model_settings={"max_tokens": 1000},
                       capabilities=[Budgeted(run)])
    assert [s["max_tokens"] for s in seen] == [70, 50, 30]


def test_exhausted_output_grant_refuses_the_request_instead_of_asking_for_nothing():
    agent, _ = looping_agent(usage=(10, 20))
    with pytest.raises(UsageLimitRefused) as info, nb.budget(output_tokens=40) as run:
        agent.run_sync("go", capabilities=[Budgeted(run)])
    assert info.value.kind == "output_tokens"
    assert run.outcome.cause == "budget-cut" and run.outcome.by == "output_tokens"


def test_tokens_passed_after_the_fact_cut_the_run_with_the_frameworks_error():
    """S3-3, S4-10: spending that happened is recorded, then the run fails by that limit."""
    agent, ran = looping_agent(usage=(10, 5))
    with pytest.raises(UsageLimitExceeded) as info, nb.budget(tokens=40) as run:
        agent.run_sync("go", capabilities=[Budgeted(run)])
    err = info.value
    assert isinstance(err, UsageLimitCut) and isinstance(err, nb.BudgetCut)
    assert err.by == "tokens"
    assert run.consumed["tokens"] == 45  # recorded past the limit
    assert len(ran) == 2  # the third response passed the limit: its tool call never ran
    assert run.outcome.status == "failed" and run.outcome.by == "tokens"
    assert err.outcome == run.outcome


def test_every_attempt_takes_a_provider_call_permit():
    """S4-6: a request retried by a capability spends one permit per attempt."""
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import RetryModelRequest

    class RetryFirst(AbstractCapability):
        attempts = 0

        async def after_model_request(self, ctx, *, request_context, response):
            RetryFirst.attempts += 1
            if request_context.attempt == 1:
                raise RetryModelRequest()
            return response

    agent, _ = looping_agent(answer_after=0)
    with nb.budget(provider_calls=10) as run:
        result = agent.run_sync("go", capabilities=[Budgeted(run), RetryFirst()])
    assert result.output == "done"
    assert RetryFirst.attempts == 2
    assert run.consumed["provider_calls"] == 2 and run.consumed["turns"] == 1


def test_budgeted_without_a_run_uses_the_current_one():
    agent, ran = looping_agent()
    with pytest.raises(UsageLimitRefused), nb.budget(tool_calls=2) as run:
        agent.run_sync("go", capabilities=[Budgeted()])
    assert len(ran) == 2 and run.outcome.by == "tool_calls"


def test_budgeted_outside_any_run_is_a_clear_error():
    agent, ran = looping_agent()
    with pytest.raises(nb.ConfigError, match="no active run"):
        agent.run_sync("go", capabilities=[Budgeted()])
    assert ran == []


def test_bad_arguments_are_config_errors():
    with pytest.raises(nb.ConfigError, match="run="):
        Budgeted("not a run")
    with pytest.raises(nb.ConfigError, match="not price= too"):
        Budgeted(prices={"input": 1, "output": 2}, price=lambda usage: 0.0)


def test_cancelling_the_run_from_a_tool_unwinds_the_agent_run():
    """S2-3: a stop of the run ends the agent run too; nothing after it is dispatched."""
    ran: list[str] = []

    def model(messages, info):
        return ModelResponse(parts=[ToolCallPart("stop_now", {})])

    agent = Agent(FunctionModel(model))

    with pytest.raises(nb.Cancelled), nb.budget(tool_calls=10) as run:
        @agent.tool_plain
        def stop_now() -> str:
            ran.append("x")
            run.cancel("enough")
            return "ok"

        agent.run_sync("go", capabilities=[Budgeted(run)])
    assert ran == ["x"]
    assert run.outcome.status == "stopped"
    assert run.consumed["provider_calls"] == 1  # the next request was never sent


def test_async_agent_run_in_an_event_loop():
    agent, ran = looping_agent()

    async def main(run):
        return await agent.run("go", capabilities=[Budgeted(run)])

    with pytest.raises(UsageLimitRefused), nb.budget(tool_calls=2) as run:
        asyncio.run(main(run))
    assert len(ran) == 2


def test_a_grant_bounds_a_sub_agent_and_draws_on_the_run():
    """S2-1: an agent given a child grant is bounded by it; the run sees its use."""
    agent, ran = looping_agent()
    with nb.budget(tool_calls=10) as run:
        with pytest.raises(UsageLimitRefused) as info, run.agent("researcher",
                                                                 tool_calls=2) as child:
            agent.run_sync("go", capabilities=[Budgeted(child)])
        assert info.value.scope == "grant"
        assert len(ran) == 2 and run.consumed["tool_calls"] == 2
        assert run.consumed["agent_invocations"] == 1
    assert run.outcome.status == "completed"


def test_steer_tells_the_model_about_approach_notices():
    """S3-5: past 80% and 95% of a limit the next request carries the notice, once each."""
    prompts: list[list[str]] = []

    def model(messages, info):
        from pydantic_ai.messages import ModelRequest, UserPromptPart

        last = messages[-1]
        assert isinstance(last, ModelRequest)
        prompts.append([p.content for p in last.parts if isinstance(p, UserPromptPart)])
        return ModelResponse(parts=[ToolCallPart("noop", {})])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def noop() -> str:
        return "ok"

    with pytest.raises(UsageLimitRefused), nb.budget(tool_calls=20) as run:
        agent.run_sync("go", capabilities=[Budgeted(run, steer=True)])
    told = [(i, text) for i, texts in enumerate(prompts) for text in texts if "notice" in text]
    assert told == [
        (16, "Budget notice: start converging (tool_calls at 80% of its limit)."),
        (19, "Budget notice: deliver now (tool_calls at 95% of its limit)."),
    ]
    assert run.notice_level == 2


def test_without_steer_the_conversation_is_unchanged():
    seen: list[int] = []

    def model(messages, info):
        seen.append(len(messages))
        return ModelResponse(parts=[ToolCallPart("noop", {})])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def noop() -> str:
        return "ok"

    with pytest.raises(UsageLimitRefused), nb.budget(tool_calls=5) as run:
        agent.run_sync("go", capabilities=[Budgeted(run)])
    assert seen == [1, 3, 5, 7, 9, 11] and run.notice_level == 2


def test_a_stream_read_by_an_event_stream_handler_is_cut_at_the_crossing():
    """S3-9 whichever way the stream is read: agent.run with an event_stream_handler sees the
    events before the one that passed output_tokens, and the run fails by it."""
    async def chunks(messages, info):
        for word in ("one", "two", "three", "four"):
            yield word

    deltas: list[str] = []

    async def handler(ctx, events):
        from pydantic_ai.messages import PartDeltaEvent, PartStartEvent

        async for event in events:
            if isinstance(event, PartStartEvent):
                deltas.append(event.part.content)
            elif isinstance(event, PartDeltaEvent):
                deltas.append(event.delta.content_delta)

    agent = Agent(FunctionModel(stream_function=chunks))
    with pytest.raises(UsageLimitCut) as info, nb.budget(output_tokens=2) as run:
        asyncio.run(agent.run("hi", event_stream_handler=handler, capabilities=[Budgeted(run)]))
    assert deltas == ["one", "two"]
    assert info.value.salvage == "onetwothree" and run.outcome.by == "output_tokens"


def test_a_stream_whose_model_cannot_cancel_is_still_cut_and_closed_at_the_source():
    """A model whose stream has no way to cancel (pydantic-ai's default close_stream raises
    NotImplementedError) is cut all the same: the reader gets the error of the budget, and the
    model's generator is closed."""
    from contextlib import asynccontextmanager

    from pydantic_ai.models import StreamedResponse
    from pydantic_ai.models.function import FunctionStreamedResponse

    class Uncancellable(FunctionStreamedResponse):
        close_stream = StreamedResponse.close_stream

    class Model(FunctionModel):
        @asynccontextmanager
        async def request_stream(self, *args, **kwargs):
            async with super().request_stream(*args, **kwargs) as stream:
                stream.__class__ = Uncancellable
                yield stream

    closed: list[bool] = []

    async def chunks(messages, info):
        try:
            for word in ("one", "two", "three", "four"):
                yield word
        finally:
            closed.append(True)

    async def read(run):
        async with Agent(Model(stream_function=chunks)).run_stream(
                "hi", capabilities=[Budgeted(run)]) as result:
            return [text async for text in result.stream_text(delta=True, debounce_by=None)]

    with pytest.raises(UsageLimitCut) as info, nb.budget(output_tokens=2) as run:
        asyncio.run(read(run))
    assert info.value.salvage == "onetwothree" and closed == [True]


# -- S3-10: a request's worst-case cost is reserved before it is sent -------------------------
#: USD per million tokens: output dear, so that a request's cap decides most of its worst case
PRICES = {"input": 1.0, "output": 100.0}
IN_RATE, OUT_RATE = PRICES["input"] / 1e6, PRICES["output"] / 1e6
FRAMING = 1024  # the input tokens a worst case adds to what a request sends (see the docs)
PROMPT, ANSWER = 20, 30  # what each reply reports using, its output at most its cap


def cost_of(out):
    return PROMPT * IN_RATE + out * OUT_RATE


def capped_agent(*, during=None, wait=0.0, fail=None, caps=None):
    """An agent whose model answers using at most the max_tokens it was sent (30 output tokens
    without one), after *wait* seconds; *during* is called while it answers, *fail* raised
    instead of an answer; each cap it was sent is appended to *caps*."""

    async def model(messages, info: AgentInfo) -> ModelResponse:
        cap = (info.model_settings or {}).get("max_tokens")
        if caps is not None:
            caps.append(cap)
        if during is not None:
            during()
        await asyncio.sleep(wait)
        if fail is not None:
            raise fail
        out = min(ANSWER, cap or ANSWER)
        return ModelResponse(parts=[TextPart("x" * out)],
                             usage=RequestUsage(input_tokens=PROMPT, output_tokens=out))

    return Agent(FunctionModel(model, model_name="scripted"))


def test_S3_10_a_request_that_cannot_pay_for_one_output_token_is_refused_unsent():
    """Its input's bound alone (the framing's 1,024 tokens) passes cost_usd=0.0005: refused
    before the model is called, traced, with nothing left reserved."""
    caps: list = []
    with nb.budget(cost_usd=0.0005) as run, pytest.raises(UsageLimitRefused) as caught:
        capped_agent(caps=caps).run_sync("go", capabilities=[Budgeted(run, prices=PRICES)])
    assert caps == []
    assert (caught.value.kind, caught.value.target) == ("cost_usd", "provider:scripted")
    assert run.consumed.get("cost_usd", 0) == 0 and run.consumed.get("provider_calls", 0) == 0
    assert [e.payload["budget_kind"] for e in refusals(run)] == ["cost_usd"]


def test_S3_10_max_tokens_is_clamped_so_that_the_worst_case_fits():
    """max_tokens=1000 is a worst case of 0.1 at least: under cost_usd=0.01 the model is sent a
    cap whose worst case fits, and the reply settles the reservation to its own cost."""
    caps: list = []
    with nb.budget(cost_usd=0.01) as run:
        capped_agent(caps=caps).run_sync("go", model_settings={"max_tokens": 1_000},
                                         capabilities=[Budgeted(run, prices=PRICES)])
    [cap] = caps
    assert 1 <= cap < (0.01 - FRAMING * IN_RATE) / OUT_RATE
    assert cap > (0.01 - (FRAMING + 3_000) * IN_RATE) / OUT_RATE
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(min(cap, ANSWER)), rel=1e-12)


@pytest.mark.parametrize("cap", [40, None])
def test_S3_10_the_reply_settles_the_reservation_to_its_cost(cap):
    """While the request is under way its worst case is reserved (its messages, instructions
    and tools in bytes of JSON plus the framing at the input price, its cap at the output
    price; with no cap, all that is left); the reply settles it to its cost exactly."""
    during: list = []
    limit = 1.0
    with nb.budget(cost_usd=limit) as run:
        agent = capped_agent(during=lambda: during.append(run.consumed["cost_usd"]))
        agent.run_sync("go", model_settings={} if cap is None else {"max_tokens": cap},
                       capabilities=[Budgeted(run, prices=PRICES)])
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER), rel=1e-12)
    [reserved] = during
    if cap is None:
        assert reserved == limit
    else:
        assert FRAMING * IN_RATE + cap * OUT_RATE < reserved < limit / 10


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_agent_runs_side_by_side_sharing_a_cost_limit_never_pass_it(round_):
    """Rounds of 12 agent runs side by side (asyncio.gather), each asking max_tokens=40 and
    using all of the cap it is sent, until every request is refused: the run never passes
    cost_usd and is never cut, and each request the model answered was charged its cost."""
    caps: list = []
    agent = capped_agent(wait=0.02, caps=caps)
    limit = 0.04  # about ten requests' worst cases (0.005 each)

    async def rounds():
        outcomes = []
        for _ in range(4):
            outcomes += await asyncio.gather(
                *(agent.run("go", model_settings={"max_tokens": 40},
                            capabilities=[Budgeted(prices=PRICES)]) for _ in range(12)),
                return_exceptions=True)
            assert run.consumed["cost_usd"] <= limit
        return outcomes

    with nb.budget(cost_usd=limit) as run:
        outcomes = asyncio.run(rounds())
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, UsageLimitRefused) and e.kind == "cost_usd" for e in refused), \
        refused
    assert run.outcome.status == "completed"
    assert 0 < len(caps) < 48 and len(refused) == 48 - len(caps)
    assert run.consumed["cost_usd"] == pytest.approx(sum(cost_of(min(c, ANSWER)) for c in caps))


def test_S3_10_an_error_status_gives_the_reservation_back_and_other_errors_keep_it():
    """A provider's error status (pydantic-ai's ModelHTTPError) bills nothing: the reservation
    goes back. An error that may come after the provider billed the request (a timeout) keeps
    its worst case spent."""
    from pydantic_ai.exceptions import ModelHTTPError

    with nb.budget(cost_usd=1.0) as run:
        with pytest.raises(ModelHTTPError):
            capped_agent(fail=ModelHTTPError(503, "scripted")).run_sync(
                "go", model_settings={"max_tokens": 40},
                capabilities=[Budgeted(run, prices=PRICES)])
        assert run.consumed.get("cost_usd", 0) == 0
        assert run.consumed["provider_calls"] == 1
        with pytest.raises(TimeoutError):
            capped_agent(fail=TimeoutError("the read timed out")).run_sync(
                "go", model_settings={"max_tokens": 40},
                capabilities=[Budgeted(run, prices=PRICES)])
        assert FRAMING * IN_RATE + 40 * OUT_RATE < run.consumed["cost_usd"] < 0.01
