"""The OpenAI Agents SDK's hooks (nbbudget.openai_agents), with real agents whose model is the
SDK's own OpenAI model (Chat Completions, Responses), through the real OpenAI client, against
the scripted server of tests/wire on 127.0.0.1, which records every request it received."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    AgentHooks,
    MaxTurnsExceeded,
    ModelRetrySettings,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    retry_policies,
    set_tracing_disabled,
)
from agents.exceptions import UserError
from openai import AsyncOpenAI
from wire import Reply, Server
from wire.openai_shapes import chat, chat_usage, response, response_stream, response_usage

import nbbudget as nb
from nbbudget.openai_agents import Budgeted, BudgetRefused
from nbbudget.testing import FakeClock

set_tracing_disabled(True)  # nothing leaves the machine

#: what the server reports for each reply: 100 input tokens (40 of them cached), 20 output
#: tokens (5 of them reasoning)
USAGE = chat_usage(100, 20, cached=40, reasoning=5)
#: gpt-4o-mini at its published prices, USD per million tokens: 0.15 input, 0.075 cached input,
#: 0.60 output: 60 uncached and 40 cached input tokens and 20 output tokens
GPT_4O_MINI_CALL = (60 * 0.15 + 40 * 0.075 + 20 * 0.60) / 1_000_000


needs_prices = pytest.mark.skipif(importlib.util.find_spec("genai_prices") is None,
                                  reason="genai-prices needs Python 3.11 or newer")


CALL_IDS = itertools.count()  # a tool call's id is unique in a run


def text(content: str) -> Reply:
    """A chat completion that answers *content*."""
    return chat(content, USAGE)


def calls(*tools: tuple[str, dict]) -> Reply:
    """A chat completion that asks for the tool calls *tools* ((name, arguments) pairs), in the
    shape of the Chat Completions API reference (``message.tool_calls``, ``finish_reason``
    ``"tool_calls"``)."""
    reply = chat("", USAGE)
    choice = reply.body["choices"][0]
    choice["message"]["content"] = None
    choice["message"]["tool_calls"] = [
        {"id": f"call_{next(CALL_IDS)}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}}
        for name, args in tools]
    choice["finish_reason"] = "tool_calls"
    return reply


@pytest.fixture(autouse=True)
def sync_loop():
    """Runner.run_sync runs on the thread's default event loop and leaves it open, with the
    worker threads of its sync tools: close it after each test, so those threads end."""
    yield
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        try:
            loop = policy.get_event_loop()
        except RuntimeError:
            return
    if not loop.is_closed():
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    policy.set_event_loop(None)


@pytest.fixture
def server():
    with Server() as running:
        yield running


def model(server: Server, name: str = "gpt-4o-mini") -> OpenAIChatCompletionsModel:
    """The SDK's Chat Completions model on the real OpenAI client, pointed at *server*."""
    # each request on its own connection, so that no connection outlives the test
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0,
                         default_headers={"Connection": "close"})
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


def adding_agent(server: Server, ran: list, name: str = "gpt-4o-mini") -> Agent:
    """An agent with one tool, ``add``, which records each call it runs in *ran*."""

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append((a, b))
        return a + b

    return Agent(name="planner", tools=[add], model=model(server, name))


def refusals(run):
    return [e.payload for e in run.trace.events if e.kind == "dispatch_refused_budget_exceeded"]


@needs_prices
def test_counts_two_tool_calls_and_a_handoff_synchronously(server):
    """One turn and one provider call per model call, a tool call per tool run, an agent
    invocation per handoff; tokens and cost from what the server reported."""
    ran: list = []
    planner = adding_agent(server, ran)
    writer = Agent(name="writer", model=model(server))
    planner.handoffs = [writer]
    server.queue(calls(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})),
                  calls(("transfer_to_writer", {})), text("3 and 7"))
    with nb.budget(turns=10, tool_calls=10, provider_calls=10, agent_invocations=5) as run:
        result = Runner.run_sync(planner, "add them", hooks=Budgeted())
    assert result.final_output == "3 and 7"
    assert result.last_agent is writer
    assert sorted(ran) == [(1, 2), (3, 4)]
    assert len(server.received) == 3
    used = run.consumed
    assert (used["turns"], used["provider_calls"], used["tool_calls"],
            used["agent_invocations"]) == (3, 3, 2, 1)
    assert (used["tokens"], used["output_tokens"]) == (3 * 120, 3 * 20)
    assert used["cost_usd"] == pytest.approx(3 * GPT_4O_MINI_CALL, rel=1e-9)
    assert run.outcome.status == "completed"


def test_a_refused_tool_never_runs_and_the_caller_sees_budget_exceeded(server):
    """S4-3: the second tool call is refused before it runs; Runner.run ends with the nbbudget
    error, not the SDK's 'Error running tool' wrapper, and the model is not asked again."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), calls(("add", {"a": 3, "b": 4})),
                  text("never asked"))
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(tool_calls=1) as run:
        Runner.run_sync(agent, "add them", hooks=Budgeted())
    assert isinstance(caught.value, BudgetRefused)
    assert not isinstance(caught.value, UserError)
    assert (caught.value.kind, caught.value.limit, caught.value.target) == (
        "tool_calls", 1, "tool:add")
    assert ran == [(1, 2)]
    assert len(server.received) == 2
    assert run.consumed["tool_calls"] == 1
    assert [r["budget_kind"] for r in refusals(run)] == ["tool_calls"]


def test_a_refused_model_call_is_never_sent(server):
    """S4-6: the second model call is refused in on_llm_start; the server received one request."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), text("never asked"))

    async def main():
        with nb.budget(provider_calls=1) as run:
            try:
                await Runner.run(agent, "add", hooks=Budgeted(run))
            finally:
                assert len(server.received) == 1
        return run

    with pytest.raises(BudgetRefused) as caught:
        asyncio.run(main())
    assert (caught.value.kind, caught.value.target) == ("provider_calls", "provider:gpt-4o-mini")
    assert ran == [(1, 2)]
    assert len(server.received) == 1
    assert caught.value.outcome is not None and caught.value.outcome.code == (
        "ProviderCallBudgetExceeded")


def test_the_turns_limit_ends_the_loop_before_the_sdks_max_turns(server):
    """One turn per model call: turns=2 refuses the third call, where max_turns=10 would let it
    run; the refusal names turns, and no third request was sent."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(*[calls(("add", {"a": i, "b": i})) for i in range(5)])
    with pytest.raises(BudgetRefused) as caught, nb.budget(turns=2) as run:
        Runner.run_sync(agent, "loop", hooks=Budgeted(), max_turns=10)
    assert caught.value.kind == "turns"
    assert len(server.received) == 2
    assert ran == [(0, 0), (1, 1)]
    assert run.consumed["turns"] == run.consumed["provider_calls"] == 2


def test_no_output_tokens_left_refuses_the_next_call(server):
    """S2-9: with the output-token grant spent, the next model call is refused before dispatch."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), text("never asked"))
    with pytest.raises(BudgetRefused) as caught, nb.budget(output_tokens=20):
        Runner.run_sync(agent, "add", hooks=Budgeted())
    assert caught.value.kind == "output_tokens"
    assert len(server.received) == 1


def test_tokens_past_the_limit_cut_the_run_with_budget_cut(server):
    """S3-3: what a reply used is charged even past the limit; the run fails budget-cut by
    tokens, and no answer is made up: the tool the reply asked for never runs."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), text("never asked"))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(tokens=100) as run:
        Runner.run_sync(agent, "add", hooks=Budgeted())
    assert caught.value.by == "tokens"
    assert ran == []
    assert len(server.received) == 1
    assert run.consumed["tokens"] == 120
    assert run.outcome.status == "failed" and run.outcome.cause == "budget-cut"


@needs_prices
def test_cost_of_a_known_model_comes_from_genai_prices(server):
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(text("hello"))
    with nb.budget(cost_usd=1.0) as run:
        Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert run.consumed["cost_usd"] == pytest.approx(GPT_4O_MINI_CALL, rel=1e-9)


def test_prices_per_million_tokens_or_a_function(server):
    ran: list = []
    agent = adding_agent(server, ran, name="in-house-model")
    server.queue(text("one"), text("two"))
    with nb.budget(cost_usd=1.0) as run:
        Runner.run_sync(agent, "hi", hooks=Budgeted(prices={"input": 2.0, "output": 10.0}))
    assert run.consumed["cost_usd"] == pytest.approx((100 * 2.0 + 20 * 10.0) / 1e6)
    seen: list = []

    def price(usage):
        seen.append(dict(usage))
        return 0.5

    with nb.budget(cost_usd=1.0) as run:
        Runner.run_sync(agent, "hi", hooks=Budgeted(prices=price))
    assert run.consumed["cost_usd"] == 0.5
    # asked first the call's worst case (S3-10), then what the reply used
    assert seen[-1] == {"input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 40,
                        "cache_write_tokens": 0}
    assert all(asked["input_tokens"] > 1024 for asked in seen[:-1])


def test_an_unpriced_model_under_a_cost_limit_is_refused_before_any_request(server):
    ran: list = []
    agent = adding_agent(server, ran, name="in-house-model")
    server.queue(text("never asked"))
    with pytest.raises(nb.ConfigError, match=r"'in-house-model'.*prices="), nb.budget(
            cost_usd=1.0):
        Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert server.received == []


def test_a_stopped_run_ends_the_agent_run_at_the_next_hook(server):
    """run.cancel() from inside a tool: the agent run ends at the hook after the tool, before
    the next model call; the caller sees nb.Cancelled."""
    server.queue(calls(("stop", {})), text("never asked"))
    ran: list = []
    with pytest.raises(nb.Cancelled, match="enough"), nb.budget(tool_calls=5) as run:

        @function_tool
        def stop() -> str:
            """Stop the run."""
            ran.append("stop")
            run.cancel("enough")
            return "stopped"

        agent = Agent(name="stopper", tools=[stop], model=model(server))
        Runner.run_sync(agent, "stop", hooks=Budgeted())
    assert ran == ["stop"]
    assert len(server.received) == 1
    assert run.outcome.status == "stopped"


def test_an_agent_used_as_a_tool_is_a_tool_call_and_an_agent_invocation(server):
    """The nested agent's model call is counted when the same hooks are given to as_tool."""
    hooks = Budgeted()
    helper = Agent(name="helper", model=model(server))
    boss = Agent(name="boss", model=model(server),
                 tools=[helper.as_tool("ask_helper", "Ask the helper.", hooks=hooks)])
    server.queue(calls(("ask_helper", {"input": "what is 2+2"})), text("4"),
                  text("the helper says 4"))
    with nb.budget(tool_calls=5, agent_invocations=1) as run:
        result = Runner.run_sync(boss, "ask", hooks=hooks)
    assert result.final_output == "the helper says 4"
    assert (run.consumed["tool_calls"], run.consumed["agent_invocations"],
            run.consumed["provider_calls"]) == (1, 1, 3)


def test_a_refusal_inside_an_agent_used_as_a_tool_ends_the_whole_run(server):
    """The nested agent's model call is refused: the SDK does not turn the refusal into a tool
    error for the outer model; Runner.run ends with it, and nothing more is sent."""
    hooks = Budgeted()
    helper = Agent(name="helper", model=model(server))
    boss = Agent(name="boss", model=model(server),
                 tools=[helper.as_tool("ask_helper", "Ask the helper.", hooks=hooks)])
    server.queue(calls(("ask_helper", {"input": "what is 2+2"})), text("never asked"))
    with pytest.raises(BudgetRefused) as caught, nb.budget(provider_calls=1) as run:
        Runner.run_sync(boss, "ask", hooks=hooks)
    assert caught.value.kind == "provider_calls"
    assert len(server.received) == 1
    assert (run.consumed["tool_calls"], run.consumed["agent_invocations"]) == (1, 1)


def test_without_a_run_the_hooks_say_how_to_give_one(server):
    agent = Agent(name="a", model=model(server))
    server.queue(text("never asked"))
    with pytest.raises(nb.ConfigError, match=r"nb\.budget"):
        Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert server.received == []


def test_models_false_leaves_the_model_calls_to_an_instrumented_client(server):
    """Budgeted(models=False) charges the tools and handoffs only, for a model whose client
    already charges each call; a refused tool still never runs."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), calls(("add", {"a": 3, "b": 4})),
                  text("never asked"))
    with pytest.raises(BudgetRefused), nb.budget(tool_calls=1, turns=1, cost_usd=1e-9) as run:
        Runner.run_sync(agent, "add", hooks=Budgeted(models=False))
    assert ran == [(1, 2)]
    assert len(server.received) == 2
    assert dict(run.consumed, run_ms=0) == {"tool_calls": 1, "run_ms": 0}


def test_the_runs_time_is_checked_at_the_hook_after_a_tool(server):
    """S3-8 at the hooks: a tool that outlasts the run's time grant (a fake clock, moved on by
    the tool) ends the agent run at the next hook, before the next model call: budget-cut by
    timeout."""
    clock = FakeClock()
    server.queue(calls(("slow", {})), text("never asked"))

    @function_tool
    def slow() -> str:
        """A slow tool."""
        clock.advance("2s")
        return "late"

    agent = Agent(name="waiter", tools=[slow], model=model(server))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(time="1s", clock=clock) as run:
        Runner.run_sync(agent, "wait", hooks=Budgeted())
    assert caught.value.by == "timeout"
    assert len(server.received) == 1
    assert run.consumed["tool_calls"] == 1


def test_a_refused_call_in_a_parallel_batch_never_runs(server):
    """Two tool calls in one reply under tool_calls=1: the second is refused before it runs and
    the SDK ends the batch; the permitted call keeps its permit (S4-3)."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})),
                  text("never asked"))
    with pytest.raises(BudgetRefused) as caught, nb.budget(tool_calls=1) as run:
        Runner.run_sync(agent, "add both", hooks=Budgeted())
    assert caught.value.kind == "tool_calls"
    assert (3, 4) not in ran
    assert len(server.received) == 1
    assert run.consumed["tool_calls"] == 1


def test_budgeted_takes_the_run_current_in_an_async_agent_run(server):
    """Budgeted() with no run charges nb.current() of the task that awaits Runner.run."""
    ran: list = []
    agent = adding_agent(server, ran)
    server.queue(calls(("add", {"a": 1, "b": 2})), text("3"))

    async def main():
        with nb.budget(tool_calls=3) as outer, outer.grant(tool_calls=2) as inner:
            result = await Runner.run(agent, "add", hooks=Budgeted())
        return result, outer, inner

    result, outer, inner = asyncio.run(main())
    assert result.final_output == "3"
    assert inner.consumed["tool_calls"] == outer.consumed["tool_calls"] == 1
    assert inner.consumed["provider_calls"] == 2


def test_the_sdks_own_retries_are_charged_as_provider_calls_after_the_reply(server):
    """ModelSettings.retry retries inside one model call, where no hook runs: the attempts the
    SDK reports with the reply are charged then, past the limit too (budget-cut)."""
    retry = ModelSettings(retry=ModelRetrySettings(
        max_retries=2, backoff={"initial_delay": 0.001, "max_delay": 0.001, "jitter": False},
        policy=retry_policies.http_status([500])))
    agent = Agent(name="a", model=model(server), model_settings=retry)
    server.queue(Reply.error(500), Reply.error(500), text("at last"))
    with nb.budget(provider_calls=5) as run:
        result = Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert result.final_output == "at last"
    assert len(server.received) == 3
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (3, 1)

    server.queue(Reply.error(500), text("at last"))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(provider_calls=1) as run:
        Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert caught.value.by == "provider_calls"
    assert run.consumed["provider_calls"] == 2

    server.queue(Reply.error(500), text("at last"))  # the tokens cut first: both recorded
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(provider_calls=1, tokens=50) as run:
        Runner.run_sync(agent, "hi", hooks=Budgeted())
    assert caught.value.by == "tokens"
    assert (run.consumed["provider_calls"], run.consumed["tokens"]) == (2, 120)


@needs_prices
def test_the_responses_api_model_is_counted_the_same_way(server):
    """OpenAIResponsesModel: a function_call output item runs the tool after its permit; the
    usage in the Responses shape (input_tokens_details.cached_tokens) is priced as such."""
    ran: list = []
    asked = response("", response_usage(100, 20, cached=40, reasoning=5), model="gpt-4o-mini")
    asked.body["output"] = [{"type": "function_call", "id": "fc_1", "call_id": "call_r1",
                             "name": "add", "arguments": json.dumps({"a": 2, "b": 2}),
                             "status": "completed"}]
    server.queue(asked, response("4", response_usage(100, 20, cached=40, reasoning=5),
                                 model="gpt-4o-mini"))
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0,
                         default_headers={"Connection": "close"})

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append((a, b))
        return a + b

    agent = Agent(name="r", tools=[add],
                  model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client))
    with nb.budget(tool_calls=2, cost_usd=1.0) as run:
        result = Runner.run_sync(agent, "add", hooks=Budgeted())
    assert result.final_output == "4"
    assert ran == [(2, 2)]
    assert [r.path for r in server.received] == ["/v1/responses"] * 2
    assert (run.consumed["turns"], run.consumed["tool_calls"], run.consumed["tokens"]) == (
        2, 1, 240)
    assert run.consumed["cost_usd"] == pytest.approx(2 * GPT_4O_MINI_CALL, rel=1e-9)


def test_a_streamed_run_is_charged_when_the_reply_has_ended(server):
    """Runner.run_streamed: the same hooks run; the reply's usage is charged once its stream has
    ended, so a stream past the tokens limit is delivered whole and then cut (not S3-9)."""
    server.queue(response_stream(["Hel", "lo"], response_usage(100, 20), model="gpt-4o-mini"))
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0,
                         default_headers={"Connection": "close"})
    agent = Agent(name="s", model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client))
    deltas: list = []

    async def main():
        with nb.budget(tokens=50) as run:
            try:
                streamed = Runner.run_streamed(agent, "hi", hooks=Budgeted())
                async for event in streamed.stream_events():
                    if event.type == "raw_response_event" and hasattr(event.data, "delta"):
                        deltas.append(event.data.delta)
            finally:
                runs.append(run)

    runs: list = []
    with pytest.raises(nb.BudgetCut) as caught:
        asyncio.run(main())
    assert caught.value.by == "tokens"
    assert deltas == ["Hel", "lo"]
    assert server.received[0].events_sent == server.received[0].events_total
    assert runs[0].consumed["tokens"] == 120


def test_with_an_instrumented_client_each_model_call_is_charged_once(server):
    """Budgeted(models=False) beside nb.instrument: the client charges each HTTP attempt and
    clamps the output cap to what is left (S2-9), the hooks charge the tools; nothing twice."""
    ran: list = []
    client = nb.instrument(AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test",
                                       max_retries=0, default_headers={"Connection": "close"}))

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append((a, b))
        return a + b

    agent = Agent(name="i", tools=[add],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  model_settings=ModelSettings(max_tokens=500))
    server.queue(calls(("add", {"a": 1, "b": 2})), text("3"))
    with nb.budget(output_tokens=100, tool_calls=3) as run:
        result = Runner.run_sync(agent, "add", hooks=Budgeted(models=False))
    assert result.final_output == "3"
    assert ran == [(1, 2)]
    assert (run.consumed["provider_calls"], run.consumed["tool_calls"],
            run.consumed["tokens"], run.consumed["output_tokens"]) == (2, 1, 240, 40)
    assert [body["max_tokens"] for body in server.bodies()] == [100, 80]


def counted(server: Server, counts: dict, names: list[str]) -> list[Agent]:
    """Agents named *names*, each handing off to the next, whose preparation of a turn is
    counted in *counts*: ``instructions`` (a dynamic instructions function), ``tools`` (the
    ``is_enabled`` of their tool ``add``, which the SDK asks as it lists an agent's tools each
    turn) and ``start`` (the agent's own start hook)."""

    def instructions(context, agent):
        counts["instructions"] += 1
        return "add, or hand off"

    def enabled(context, agent):
        counts["tools"] += 1
        return True

    class Started(AgentHooks):
        async def on_start(self, context, agent):
            counts["start"] += 1

    @function_tool(is_enabled=enabled)
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    agents = [Agent(name=name, instructions=instructions, tools=[add], hooks=Started(),
                    model=model(server)) for name in names]
    for agent, to in itertools.pairwise(agents):
        agent.handoffs = [to]
    return agents


def prepared(replies: list[Reply], run_agent) -> tuple[dict, BaseException, int]:
    """What the first of a chain of five counted agents prepared when *run_agent* ran it on a
    server answering *replies*: the counts, the error the run ended with, the requests sent."""
    counts = {"instructions": 0, "tools": 0, "start": 0}
    with Server() as server:
        server.queue(*replies)
        first = counted(server, counts, [f"a{i}" for i in range(5)])[0]
        with pytest.raises(Exception) as caught:
            run_agent(first)
        return counts, caught.value, len(server.received)


def test_a_handoff_past_the_turns_is_refused_before_the_next_agent_is_prepared():
    """turns=3 over a chain of handoffs prepares what the SDK's own max_turns=3 prepares: three
    agents' instructions, tool lists and start hooks. The handoff to a fourth agent is refused
    (no turn left for it) before the SDK runs that agent's start hook, which it runs beside
    on_agent_start, where a refusal would come too late."""
    replies = [calls((f"transfer_to_a{i + 1}", {})) for i in range(4)] + [text("done")]
    reference, error, sent = prepared(
        replies, lambda agent: Runner.run_sync(agent, "go", max_turns=3))
    assert isinstance(error, MaxTurnsExceeded) and sent == 3
    assert reference == {"instructions": 3, "tools": 6, "start": 3}

    def bounded(agent):
        with nb.budget(turns=3) as run:
            try:
                Runner.run_sync(agent, "go", hooks=Budgeted())
            finally:
                assert run.consumed["agent_invocations"] == 2  # the refused handoff took none

    counts, error, sent = prepared(replies, bounded)
    assert counts == reference
    assert isinstance(error, BudgetRefused) and (error.kind, sent) == ("turns", 3)
    assert error.outcome is not None and error.outcome.code == "TurnBudgetExceeded"


def test_run_options_end_a_looping_agent_where_the_sdks_max_turns_would():
    """One agent calling its tool each turn: the hooks alone cannot act between a turn's tools
    and the next turn's preparation (the SDK calls none there), so under turns=3 the fourth
    turn's instructions and tools are prepared before on_llm_start refuses it. With
    run_options() the SDK's own turn count stops the loop where max_turns=3 does, and the
    refusal is still nbbudget's, naming turns and traced (S4-8)."""
    replies = [calls(("add", {"a": i, "b": i})) for i in range(6)]
    reference, error, sent = prepared(
        replies, lambda agent: Runner.run_sync(agent, "go", max_turns=3))
    assert isinstance(error, MaxTurnsExceeded) and sent == 3
    assert reference == {"instructions": 3, "tools": 6, "start": 1}

    def hooks_alone(agent):
        with nb.budget(turns=3):
            Runner.run_sync(agent, "go", hooks=Budgeted())

    counts, error, sent = prepared(replies, hooks_alone)
    assert isinstance(error, BudgetRefused) and (error.kind, sent) == ("turns", 3)
    # the fourth turn's instructions and tool list (the SDK asks is_enabled once more for
    # each tool call it runs), as docs/bounding-agents.md says
    assert counts == {"instructions": 4, "tools": 7, "start": 1}

    def with_options(agent):
        with nb.budget(turns=3) as run:
            try:
                Runner.run_sync(agent, "go", **Budgeted().run_options())
            finally:
                assert run.consumed["turns"] == run.consumed["provider_calls"] == 3
                assert [r["budget_kind"] for r in refusals(run)] == ["turns"]

    counts, error, sent = prepared(replies, with_options)
    assert counts == reference
    assert isinstance(error, BudgetRefused) and (error.kind, sent) == ("turns", 3)
    assert error.outcome is not None and error.outcome.code == "TurnBudgetExceeded"


def test_run_options_keep_the_sdks_max_turns_when_it_is_the_smaller():
    """run_options(max_turns=2) under turns=5: the SDK's own limit ends the loop, with its own
    MaxTurnsExceeded, and the run refused nothing."""
    replies = [calls(("add", {"a": i, "b": i})) for i in range(6)]

    def with_options(agent):
        with nb.budget(turns=5) as run:
            options = Budgeted().run_options(max_turns=2)
            assert options["max_turns"] == 2
            try:
                Runner.run_sync(agent, "go", **options)
            finally:
                assert refusals(run) == [] and run.consumed["turns"] == 2

    counts, error, sent = prepared(replies, with_options)
    assert isinstance(error, MaxTurnsExceeded) and sent == 2
    assert counts == {"instructions": 2, "tools": 4, "start": 1}


def test_an_agent_started_with_no_turn_left_is_refused_before_its_instructions():
    """The run's turns already spent when Runner.run starts: on_agent_start refuses before the
    SDK lists the agent's tools or builds its instructions; nothing is sent."""

    def spent(agent):
        with nb.budget(turns=1) as run:
            run.charge("turns")
            Runner.run_sync(agent, "go", hooks=Budgeted())

    counts, error, sent = prepared([text("never asked")], spent)
    assert isinstance(error, BudgetRefused) and (error.kind, sent) == ("turns", 0)
    assert (counts["instructions"], counts["tools"]) == (0, 0)


# -- S3-10: a model call's worst-case cost is reserved before it is sent -----------------------
#: USD per million tokens: output dear, so that a call's cap decides most of its worst case
PRICES = {"input": 1.0, "output": 100.0}
IN_RATE, OUT_RATE = PRICES["input"] / 1e6, PRICES["output"] / 1e6
FRAMING = 1024  # the input tokens a worst case adds to what a call sends (see the docs)
PROMPT, ANSWER = 20, 30  # what each reply reports using, its output at most its cap


def capped(body):
    """A completion that uses at most the output cap it was asked for."""
    out = min(ANSWER, body.get("max_completion_tokens") or body.get("max_tokens") or ANSWER)
    return chat("x" * out, chat_usage(PROMPT, out)).body


def cost_of(out):
    return PROMPT * IN_RATE + out * OUT_RATE


def capped_agent(server, cap):
    return Agent(name="planner", model=model(server, "in-house-model"),
                 model_settings=ModelSettings(max_tokens=cap))


def test_S3_10_a_call_whose_worst_case_does_not_fit_is_refused_unsent(server):
    """A cap of 1,000 output tokens is a worst case of 0.1 at least: under cost_usd=0.05 the
    call is refused at on_llm_start and nothing is sent (the hooks cannot lower the cap)."""
    server.default = Reply(body=capped)
    with nb.budget(cost_usd=0.05) as run:
        with pytest.raises(BudgetRefused) as caught:
            Runner.run_sync(capped_agent(server, 1_000), "hi", hooks=Budgeted(prices=PRICES))
        assert server.received == []
        assert (caught.value.kind, caught.value.target) == ("cost_usd",
                                                            "provider:in-house-model")
        assert run.consumed.get("cost_usd", 0) == 0 and run.consumed.get("turns", 0) == 0
        assert [r["budget_kind"] for r in refusals(run)] == ["cost_usd"]
        Runner.run_sync(capped_agent(server, 400), "hi", hooks=Budgeted(prices=PRICES))
    assert len(server.received) == 1


@pytest.mark.parametrize("cap", [40, None])
def test_S3_10_the_reply_settles_the_reservation_to_its_cost(server, cap):
    """While the call is under way its worst case is reserved (its instructions, input and
    tools in bytes of JSON plus the framing at the input price, the agent's max_tokens at the
    output price; with no max_tokens, all that is left); the reply settles it to its cost."""
    during = []
    limit = 1.0

    def reply(body):
        during.append(run.consumed["cost_usd"])
        return capped(body)

    server.default = Reply(body=reply)
    with nb.budget(cost_usd=limit) as run:
        Runner.run_sync(capped_agent(server, cap), "hi", hooks=Budgeted(prices=PRICES))
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER), rel=1e-12)
    [reserved] = during
    if cap is None:
        assert reserved == limit
    else:
        assert cost_of(0) + FRAMING * IN_RATE + cap * OUT_RATE < reserved < limit / 10
    assert not Budgeted()._reserved


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_agent_runs_side_by_side_sharing_a_cost_limit_never_pass_it(server, round_):
    """Rounds of 12 Runner.run side by side (asyncio.gather) with one Budgeted, each reply
    using all of its cap, until every call is refused: the run never passes cost_usd and is
    never cut; each call the server saw was charged its cost, and a refused one was never
    sent."""
    server.default = Reply(body=capped, delay=0.05)
    limit = 0.04  # about ten calls' worst cases (0.004 each)
    hooks = Budgeted(prices=PRICES)

    async def rounds():
        outcomes = []
        for _ in range(4):
            outcomes += await asyncio.gather(
                *(Runner.run(capped_agent(server, 30), "hi", hooks=hooks) for _ in range(12)),
                return_exceptions=True)
            assert run.consumed["cost_usd"] <= limit
        return outcomes

    with nb.budget(cost_usd=limit) as run:
        outcomes = asyncio.run(rounds())
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, BudgetRefused) and e.kind == "cost_usd" for e in refused), refused
    assert run.outcome.status == nb.Status.COMPLETED
    made = len(server.received)
    assert 0 < made < 48 and len(refused) == 48 - made
    assert run.consumed["cost_usd"] == pytest.approx(made * cost_of(ANSWER))
    assert not hooks._reserved


def test_S3_10_an_error_the_sdk_retries_settles_once_and_a_failed_call_keeps_its_reservation(
        server):
    """The SDK's own retry (ModelSettings.retry) after an error status is one model call to
    the hooks: its reservation is settled by the reply that came. A call that fails ends
    Runner.run with the SDK's error and no hook hears of it: its worst case stays spent, as
    the provider may have billed it, and the hooks forget it when the run's block ends."""
    retry = ModelSettings(max_tokens=40, retry=ModelRetrySettings(
        max_retries=1, backoff={"initial_delay": 0.001, "max_delay": 0.001, "jitter": False},
        policy=retry_policies.http_status([500])))
    agent = Agent(name="a", model=model(server, "in-house-model"), model_settings=retry)
    server.queue(Reply.error(500), Reply(body=capped))
    hooks = Budgeted(prices=PRICES)
    with nb.budget(cost_usd=1.0) as run:
        Runner.run_sync(agent, "hi", hooks=hooks)
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER), rel=1e-12)
        server.queue(Reply.error(400, "bad request", "invalid_request_error"))
        with pytest.raises(Exception, match="bad request"):
            Runner.run_sync(agent, "hi", hooks=hooks)
        kept = run.consumed["cost_usd"] - cost_of(ANSWER)
        assert FRAMING * IN_RATE + 40 * OUT_RATE < kept < 0.01
        assert len(hooks._reserved) == 1
    assert not hooks._reserved
