"""The adapters and ``nb.instrument()``'s switch agree on who counts a model call (N-7): a call
the LangChain handler, the pydantic-ai capability or the Agents SDK hooks count is claimed
while it is under way, and its HTTP requests pass the switch (and an instrumented client)
untouched; every other request in the run is still counted by the switch. Real frameworks on
the real OpenAI SDK against the loopback server of ``tests/wire``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
from wire import Reply, Server  # noqa: E402
from wire.openai_shapes import chat, chat_stream, chat_usage  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations import claims  # noqa: E402

ASK = [{"role": "user", "content": "plan the trip"}]
USAGE = chat_usage(12, 3)  # 15 tokens a reply


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=chat("Paris.", USAGE)) as running:
        yield running


def counted(run: nb.Budget) -> tuple[float, float, float]:
    return (run.consumed.get("provider_calls", 0), run.consumed.get("turns", 0),
            run.consumed.get("tokens", 0))


def tool_call(name: str, arguments: dict[str, Any]) -> Reply:
    """A chat completion that asks for one call of tool *name* (the Chat Completions API
    reference's ``message.tool_calls``, ``finish_reason`` ``"tool_calls"``)."""
    reply = chat("", USAGE)
    choice = reply.body["choices"][0]
    choice["message"]["content"] = None
    choice["message"]["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
        "name": name, "arguments": json.dumps(arguments)}}]
    choice["finish_reason"] = "tool_calls"
    return reply


# -- the claims themselves ---------------------------------------------------------------------
class _Request:
    def __init__(self, agent: str = "") -> None:
        self.headers = {"user-agent": agent} if agent else {}


def test_a_claim_in_a_context_covers_that_context_and_the_ones_it_starts_until_it_ends() -> None:
    with nb.budget(steps=1) as run:
        core = run.lowlevel
        assert not claims.claimed(_Request(), core)
        made = claims.claim()
        seen: list[bool] = []
        worker = threading.Thread(target=lambda: seen.append(claims.claimed(_Request(), core)),
                                  name="claims-plain-thread")
        worker.start()
        worker.join()

        async def task() -> bool:
            return claims.claimed(_Request(), core)

        assert claims.claimed(_Request(), core)
        assert asyncio.run(task())  # a task copies the context: claimed
        assert seen == [False]  # a plain thread starts from an empty context: not claimed
        made.end()
        assert not claims.claimed(_Request(), core)
        made.end()  # again: nothing
        with claims.held():
            assert claims.claimed(_Request(), core)
        assert not claims.claimed(_Request(), core)


def test_a_claim_ended_elsewhere_uncovers_its_context_and_leaves_the_one_before_it() -> None:
    with nb.budget(steps=1) as run:
        outer = claims.claim()
        inner = claims.claim()
        threading_ended = threading.Thread(target=inner.end, name="claims-ender")
        threading_ended.start()
        threading_ended.join()
        assert claims.claimed(_Request(), run.lowlevel)  # the outer one still holds
        outer.end()
        assert not claims.claimed(_Request(), run.lowlevel)


def test_a_claim_in_a_run_covers_its_frameworks_requests_only_and_ends_with_the_block() -> None:
    with nb.budget(steps=1) as run, nb.budget(steps=1) as other:
        made = claims.claim_in_run(run.lowlevel, "Agents/Python")
        assert claims.claimed(_Request("Agents/Python 0.24.1"), run.lowlevel)
        assert not claims.claimed(_Request("OpenAI/Python 3.60.0"), run.lowlevel)
        assert not claims.claimed(_Request(), run.lowlevel)
        assert not claims.claimed(_Request("Agents/Python 0.24.1"), other.lowlevel)
        kept = claims.claim_in_run(run.lowlevel, "Agents/Python")
        made.end()
        assert claims.claimed(_Request("Agents/Python 0.24.1"), run.lowlevel)  # `kept` holds
    assert not kept.open  # the run's block ended it
    assert not claims.claimed(_Request("Agents/Python 0.24.1"), run.lowlevel)


def test_claims_in_a_run_made_and_ended_on_many_threads_leave_none_behind() -> None:
    """The claims by name are shared by every thread: 8 threads each claim and end 300 times
    while 2 others read; every read is consistent and nothing is left once all ended."""
    errors: list[BaseException] = []
    with nb.budget(steps=1) as run:
        core = run.lowlevel
        stop = threading.Event()

        def claiming() -> None:
            try:
                for _ in range(300):
                    made = claims.claim_in_run(core, "Agents/Python")
                    assert claims.claimed(_Request("Agents/Python 1"), core)
                    made.end()
            except BaseException as err:  # reported below
                errors.append(err)

        def reading() -> None:
            try:
                while not stop.is_set():
                    claims.claimed(_Request("Agents/Python 1"), core)
                    assert not claims.claimed(_Request("OpenAI/Python 1"), core)
            except BaseException as err:  # reported below
                errors.append(err)

        readers = [threading.Thread(target=reading, name=f"claims-reader-{i}") for i in range(2)]
        writers = [threading.Thread(target=claiming, name=f"claims-writer-{i}") for i in range(8)]
        for thread in readers + writers:
            thread.start()
        for thread in writers:
            thread.join()
        stop.set()
        for thread in readers:
            thread.join()
        assert errors == []
        assert not claims.claimed(_Request("Agents/Python 1"), core)
        assert core.held == set()  # every claim's hold on the run released as it ended


# -- the adapters with the switch on -----------------------------------------------------------
def test_langchain_handler_and_switch_count_each_model_call_once(server: Server,
                                                                 switch: Any) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from nbbudget.langchain import Budgeted

    gpt = langchain_openai.ChatOpenAI(model="gpt-4o-mini", base_url=server.url, api_key="k",
                                      max_retries=0)
    config = {"callbacks": [Budgeted()]}
    with nb.budget(provider_calls=2) as run, pytest.raises(nb.BudgetExceeded) as refused:
        for _ in range(3):
            gpt.invoke("plan the trip", config=config)
    assert len(server.received) == 2
    assert counted(run) == (2, 2, 30)  # each call once, by the handler
    assert refused.value.kind == "provider_calls"

    server.received.clear()

    async def streamed() -> None:
        async for _ in gpt.astream("plan the trip", config=config):
            pass

    server.queue(chat_stream(["Par", "is."], USAGE))
    with nb.budget(provider_calls=5) as run:
        asyncio.run(streamed())
        # the claim ended with the call: a bare client's call after it is the switch's
        with openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as bare:
            bare.chat.completions.create(model="gpt-4o-mini", messages=ASK)
    assert len(server.received) == 2
    assert counted(run)[:2] == (2, 2)


def test_a_bare_call_inside_a_langchain_tool_is_counted_by_the_switch(server: Server,
                                                                     switch: Any) -> None:
    """A tool runs outside every model call: the request its own client sends is not claimed."""
    pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    from nbbudget.langchain import Budgeted

    bare = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)

    @tool
    def ask(question: str) -> str:
        """Ask another model."""
        reply = bare.chat.completions.create(model="gpt-4o-mini", messages=ASK)
        return str(reply.choices[0].message.content)

    with bare, nb.budget(provider_calls=5, tool_calls=5) as run:
        ask.invoke({"question": "where?"}, config={"callbacks": [Budgeted()]})
    assert len(server.received) == 1
    assert (run.consumed["tool_calls"], run.consumed["provider_calls"]) == (1, 1)


def test_pydantic_ai_capability_and_switch_count_each_model_request_once(
        server: Server, switch: Any) -> None:
    if not hasattr(pytest.importorskip("pydantic_ai.capabilities").AbstractCapability,
                   "prepare_model_request"):
        pytest.skip("the adapter needs pydantic-ai 2.64 or newer (Python 3.11 or newer)")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from nbbudget.pydantic_ai import Budgeted

    async def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def adder() -> Any:  # each on a client of its own: each run below has an event loop of its own
        client = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0,
                                    default_headers={"Connection": "close"})
        return Agent(OpenAIChatModel("gpt-4o-mini",
                                     provider=OpenAIProvider(openai_client=client)), tools=[add])

    agent = adder()
    server.queue(tool_call("add", {"a": 1, "b": 2}), chat("3", USAGE))
    with nb.budget(provider_calls=5, tool_calls=5) as run:
        result = asyncio.run(agent.run("add", capabilities=[Budgeted(run)]))
    assert result.output == "3"
    assert len(server.received) == 2
    assert counted(run) == (2, 2, 30)
    assert run.consumed["tool_calls"] == 1

    server.received.clear()

    agent = adder()

    async def streamed() -> str:
        async with agent.run_stream("hello", capabilities=[Budgeted(run)]) as stream:
            return await stream.get_output()

    server.queue(chat_stream(["Par", "is."], USAGE))
    with nb.budget(provider_calls=5) as run:
        assert asyncio.run(streamed()) == "Paris."
    assert len(server.received) == 1
    assert counted(run)[:2] == (1, 1)


def test_agents_sdk_hooks_and_switch_count_each_model_call_once(server: Server,
                                                                switch: Any) -> None:
    pytest.importorskip("agents")
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    from nbbudget.openai_agents import Budgeted

    set_tracing_disabled(True)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    async def run_agent(client: Any) -> str:
        agent = Agent(name="adder", tools=[add], model=OpenAIChatCompletionsModel(
            model="gpt-4o-mini", openai_client=client))
        result = await Runner.run(agent, "add", hooks=Budgeted())
        # the claim ended with the call: a bare call with the same client is the switch's
        await client.chat.completions.create(model="gpt-4o-mini", messages=ASK)
        return str(result.final_output)

    for instrumented in (False, True):  # the switch alone, and an instrumented client beside
        server.received.clear()
        server.queue(tool_call("add", {"a": 1, "b": 2}), chat("3", USAGE))
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        if instrumented:
            client = nb.instrument(client)
        with nb.budget(provider_calls=5, tool_calls=5) as run:
            assert asyncio.run(run_agent(client)) == "3"
        assert len(server.received) == 3
        assert counted(run) == (3, 3, 45), instrumented
        assert run.consumed["tool_calls"] == 1
