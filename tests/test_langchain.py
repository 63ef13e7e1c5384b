"""The LangChain handler, with real LangGraph graphs and a scripted LangChain chat model.

The model (`ScriptedChatModel`) is a real `BaseChatModel`: LangChain calls it through its own
invoke, stream and callback machinery, and it answers from a script, reporting usage as
LangChain's provider integrations do (``usage_metadata``, ``response_metadata``).
"""

from __future__ import annotations

import asyncio
import json
import operator
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langgraph")

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy, Send

import nbbudget as nb
from nbbudget.langchain import Budgeted
from nbbudget.testing import FakeClock


class Script:
    """The replies a model gives, in order (the last one again when they run out; an exception
    is raised as a failed attempt), and how many times it was called. Each reply is a fresh
    copy: LangChain writes the call's id into the message it returns."""

    def __init__(self, *replies: AIMessage | Exception) -> None:
        self.replies = list(replies)
        self.calls = 0
        self.lock = threading.Lock()

    def next(self) -> AIMessage:
        with self.lock:
            self.calls += 1
            reply = self.replies[min(self.calls, len(self.replies)) - 1]
        if isinstance(reply, Exception):  # the provider failed this attempt
            raise reply
        if callable(reply):  # made while the call is under way
            reply = reply()
        return reply.model_copy(deep=True)


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a `Script`. It streams a reply a word a chunk, each chunk
    reporting the one output token it carries (the first also the input), as Anthropic's
    stream reports usage as it goes; a reply asking for tools comes in one chunk."""

    script: Any
    model: str = "scripted-model"
    provider: str = "scripted"
    max_tokens: int | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """Its output cap, as ChatOpenAI and ChatAnthropic report theirs in a call's
        ``invocation_params``."""
        return {} if self.max_tokens is None else {"max_tokens": self.max_tokens}

    def _get_ls_params(self, stop: Any = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = self.provider
        return params

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.next())])

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                **kwargs: Any) -> Any:
        reply = self.script.next()
        if reply.tool_calls:  # asked for tools: one chunk, as a provider streams a short reply
            yield ChatGenerationChunk(message=AIMessageChunk(
                content=reply.content, usage_metadata=reply.usage_metadata,
                tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]),
                                   "id": c["id"], "index": i}
                                  for i, c in enumerate(reply.tool_calls)]))
            return
        words = str(reply.content).split()
        inputs = (reply.usage_metadata or {}).get("input_tokens", 0)
        for i, word in enumerate(words):
            used = {"input_tokens": inputs if i == 0 else 0, "output_tokens": 1,
                    "total_tokens": (inputs if i == 0 else 0) + 1}
            yield ChatGenerationChunk(message=AIMessageChunk(content=word + " ",
                                                             usage_metadata=used))


def usage(inp: int, out: int, **details: int) -> dict[str, Any]:
    used: dict[str, Any] = {"input_tokens": inp, "output_tokens": out,
                            "total_tokens": inp + out}
    if details:
        used["input_token_details"] = details
    return used


def asks(*names: str, used: tuple[int, int] = (10, 5)) -> AIMessage:
    """A reply asking for one call of each tool in *names*, side by side."""
    calls = [{"name": name, "args": {"q": f"q{i}"}, "id": f"call-{i}"}
             for i, name in enumerate(names)]
    return AIMessage(content="", tool_calls=calls, usage_metadata=usage(*used))


def answer(text: str = "done", used: tuple[int, int] = (10, 5)) -> AIMessage:
    return AIMessage(content=text, usage_metadata=usage(*used))


def agent_graph(script: Script, *, model: Any = None, handle_tool_errors: Any = None,
                during_tool: Any = None) -> tuple[Any, list[str]]:
    """The usual agent loop: a model node (*model*, else a `ScriptedChatModel` of *script*),
    a ToolNode, and the edge between them. Returns the compiled graph and the list of the
    lookups that ran."""
    ran: list[str] = []
    lock = threading.Lock()

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        with lock:
            ran.append(q)
        if during_tool is not None:
            during_tool()
        return q.upper()

    model = model or ScriptedChatModel(script=script)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    tools = ToolNode([lookup]) if handle_tool_errors is None else ToolNode(
        [lookup], handle_tool_errors=handle_tool_errors)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(), ran


def invoke(graph: Any, state: Any, mode: str, handler: Budgeted | None = None) -> Any:
    """Run *graph* as *mode* says: ``invoke``, ``ainvoke``, ``stream`` or ``astream``."""
    config = {"callbacks": [handler or Budgeted()]}
    if mode == "invoke":
        return graph.invoke(state, config=config)
    if mode == "stream":
        return list(graph.stream(state, config=config))
    if mode == "ainvoke":
        return asyncio.run(graph.ainvoke(state, config=config))

    async def collect() -> list[Any]:
        return [part async for part in graph.astream(state, config=config)]

    return asyncio.run(collect())


START_STATE = {"messages": [HumanMessage("plan the trip")]}
MODES = ["invoke", "ainvoke", "stream", "astream"]


def refusals(run: nb.Budget) -> list[Any]:
    return [e for e in run.trace.events if e.kind == "dispatch_refused_budget_exceeded"]


@pytest.mark.parametrize("mode", MODES)
def test_a_graph_counts_model_calls_turns_tool_calls_node_runs_and_tokens(mode):
    """Two tool rounds, then an answer: three model calls (provider calls and turns), two
    tool calls, five node runs (agent three times, tools twice), and the replies' tokens."""
    script = Script(asks("lookup", used=(100, 20)), asks("lookup", used=(150, 30)),
                    answer(used=(200, 40)))
    graph, ran = agent_graph(script)
    with nb.budget(provider_calls=10, turns=10, tool_calls=10, steps=10, tokens=10_000,
                   output_tokens=1_000) as run:
        invoke(graph, START_STATE, mode)
    assert ran == ["q0", "q0"]
    assert script.calls == 3
    assert {k: run.consumed[k] for k in ("provider_calls", "turns", "tool_calls", "steps",
                                         "tokens", "output_tokens")} == {
        "provider_calls": 3, "turns": 3, "tool_calls": 2, "steps": 5, "tokens": 540,
        "output_tokens": 90}
    frame = run.usage()
    assert frame.loc["steps", "consumed"] == 5 and frame.loc["tokens", "remaining"] == 9_460
    assert run.outcome.status == nb.Status.COMPLETED


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_tool_call_never_runs_and_ends_the_graph_with_budget_exceeded(mode, caplog):
    """S4-3, S4-8: a tool-calling loop stops at tool_calls=2; the third lookup does not run
    and the model is not asked again. LangChain logs no warning about it: the error says it."""
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(tool_calls=2) as run:
        invoke(graph, START_STATE, mode)
    assert ran == ["q0", "q0"]
    assert script.calls == 3
    err = caught.value
    assert (err.kind, err.limit, err.consumed, err.target) == ("tool_calls", 2, 2,
                                                               "tool:lookup")
    assert run.consumed["tool_calls"] == 2
    [event] = refusals(run)
    assert event.payload["budget_kind"] == "tool_calls"
    assert run.outcome.status == nb.Status.FAILED
    assert [r.getMessage() for r in caplog.records if r.name.startswith("langchain")] == []


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_model_call_never_reaches_the_model(mode):
    """S4-6: provider_calls=2; the third call of the model is refused before the model runs."""
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        invoke(graph, START_STATE, mode)
    assert script.calls == 2
    assert ran == ["q0", "q0"]
    assert (caught.value.kind, caught.value.target) == ("provider_calls",
                                                        "provider:scripted-model")
    assert run.consumed["provider_calls"] == 2 and run.consumed["turns"] == 2


class ToolCallingScriptedModel(ScriptedChatModel):
    """A `ScriptedChatModel` that takes tools (``bind_tools``), as a langchain
    ``create_agent`` graph asks of its model; its script says which tools it calls."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def counted_agent(script: Script, counts: dict[str, int], *limits: Any) -> Any:
    """A langchain ``create_agent`` graph with a tool, ``lookup``, whose preparation of each
    model call is counted in *counts*: ``before_model`` (a middleware's before_model node) and
    ``prompt`` (a ``@dynamic_prompt``, a wrap_model_call middleware run in the model node);
    *limits* are middleware put first."""
    agents = pytest.importorskip("langchain.agents")
    middleware = pytest.importorskip("langchain.agents.middleware")

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return q.upper()

    class Counted(middleware.AgentMiddleware):
        def before_model(self, state: Any, runtime: Any) -> None:
            counts["before_model"] += 1

    @middleware.dynamic_prompt
    def prompt(request: Any) -> str:
        counts["prompt"] += 1
        return "look it up"

    return agents.create_agent(ToolCallingScriptedModel(script=script), tools=[lookup],
                               middleware=[*limits, Counted(), prompt])


@pytest.mark.parametrize("mode", MODES)
def test_an_agents_model_call_past_the_turns_is_refused_before_its_middleware_run(mode):
    """turns=1 over a create_agent graph prepares what ModelCallLimitMiddleware(run_limit=1)
    prepares: the second model call is refused at the start of its first before_model node,
    before the before_model and wrap_model_call middleware (@dynamic_prompt) run again, where
    the model call itself would be refused only after them; the refusal is traced (S4-8) and
    takes no step."""
    middleware = pytest.importorskip("langchain.agents.middleware")
    counts = {"before_model": 0, "prompt": 0}
    script = Script(asks("lookup"), answer())
    limit = middleware.ModelCallLimitMiddleware(run_limit=1, exit_behavior="error")
    limit_error = pytest.importorskip(
        "langchain.agents.middleware.model_call_limit").ModelCallLimitExceededError
    with pytest.raises(limit_error):
        counted_agent(script, counts, limit).invoke(START_STATE)
    reference, counts = counts, {"before_model": 0, "prompt": 0}
    assert reference == {"before_model": 1, "prompt": 1} and script.calls == 1

    script = Script(asks("lookup"), answer())
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(turns=1) as run:
        invoke(counted_agent(script, counts), START_STATE, mode)
    assert counts == reference and script.calls == 1
    assert (caught.value.kind, caught.value.target) == ("turns", "node:Counted.before_model")
    assert run.consumed["turns"] == 1 and run.consumed["steps"] == 3  # before_model, model, tools
    assert [e.payload["budget_kind"] for e in refusals(run)] == ["turns"]


def test_each_attempt_of_a_retried_model_is_a_provider_call():
    """S4-6: LangChain's with_retry calls the model again after a failure; each attempt takes
    a provider call, the failed one is not refunded, and the third attempt is refused."""
    script = Script(ConnectionError("reset"), ConnectionError("reset"), answer())
    model = ScriptedChatModel(script=script).with_retry(stop_after_attempt=3,
                                                        wait_exponential_jitter=False)
    with nb.budget(provider_calls=5) as run:
        model.invoke("go", config={"callbacks": [Budgeted()]})
    assert script.calls == 3 and run.consumed["provider_calls"] == 3
    script.calls = 0
    with pytest.raises(nb.BudgetExceeded), nb.budget(provider_calls=2) as run:
        model.invoke("go", config={"callbacks": [Budgeted()]})
    assert script.calls == 2 and run.consumed["provider_calls"] == 2


def test_turns_and_provider_calls_are_reserved_together():
    """A call refused by turns takes no provider call either (check and reserve at once)."""
    script = Script(asks("lookup"))
    graph, _ = agent_graph(script)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(turns=1, provider_calls=5) as run:
        invoke(graph, START_STATE, "invoke")
    assert caught.value.kind == "turns"
    assert script.calls == 1
    assert run.consumed["provider_calls"] == 1


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_refused_node_never_runs(mode):
    """steps=3: agent, tools, agent run; the second tools node is refused before it runs."""
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(steps=3) as run:
        invoke(graph, START_STATE, mode)
    assert (caught.value.kind, caught.value.target) == ("steps", "node:tools")
    assert ran == ["q0"] and script.calls == 2
    assert run.consumed["steps"] == 3


class Fan(TypedDict):
    log: Annotated[list[str], operator.add]


def fan_graph(width: int) -> tuple[Any, list[str]]:
    """start -> ``width`` branches side by side (LangGraph's Send) -> join. Each branch runs a
    runnable of its own inside (not a node run). Returns the graph and the branches that ran."""
    ran: list[str] = []
    lock = threading.Lock()

    def branch(item: dict[str, str]) -> dict[str, list[str]]:
        RunnableLambda(lambda value: value, name="branch").invoke(item["name"])
        with lock:
            ran.append(item["name"])
        return {"log": [item["name"]]}

    def fan_out(state: Fan) -> list[Send]:
        return [Send("branch", {"name": f"b{i}"}) for i in range(width)]

    graph = StateGraph(Fan)
    graph.add_node("start", lambda state: {"log": ["start"]})
    graph.add_node("branch", branch)
    graph.add_node("join", lambda state: {"log": ["join"]})
    graph.add_edge(START, "start")
    graph.add_conditional_edges("start", fan_out, ["branch"])
    graph.add_edge("branch", "join")
    graph.add_edge("join", END)
    return graph.compile(), ran


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_each_node_run_is_one_step_fan_out_included(mode):
    """Six branches side by side: start, six branch runs and join are eight steps; the
    runnable each branch calls is no step of its own."""
    graph, ran = fan_graph(6)
    with nb.budget(steps=100) as run:
        state = invoke(graph, {"log": []}, mode)
    assert sorted(ran) == [f"b{i}" for i in range(6)]
    assert len(state["log"]) == 8
    assert run.consumed["steps"] == 8


def test_a_subgraph_node_is_a_step_and_so_is_each_of_its_nodes():
    """A compiled graph used as a node: the node's run is one step, the subgraph's own nodes
    one each, and the subgraph itself (a runnable inside the node) none."""
    inner = StateGraph(Fan)
    inner.add_node("x", lambda state: {"log": ["x"]})
    inner.add_node("y", lambda state: {"log": ["y"]})
    inner.add_edge(START, "x")
    inner.add_edge("x", "y")
    outer = StateGraph(Fan)
    outer.add_node("first", lambda state: {"log": ["first"]})
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "first")
    outer.add_edge("first", "sub")
    with nb.budget(steps=10) as run:
        invoke(outer.compile(), {"log": []}, "invoke")
    assert run.consumed["steps"] == 4


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_branches_side_by_side_get_exactly_the_steps_left(mode):
    """S4-3: steps=5 leaves four for twelve branches run at once: exactly four permits are
    taken. Run by threads (invoke), the four run; under ainvoke LangGraph cancels the other
    tasks of a step as soon as one fails, so a branch that took its permit may be cancelled
    before it runs (its permit stays spent): never more than four run."""
    graph, ran = fan_graph(12)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(steps=5) as run:
        invoke(graph, {"log": []}, mode)
    assert caught.value.kind == "steps"
    assert run.consumed["steps"] == 5
    if mode == "invoke":
        assert len(ran) == 4
    else:
        assert len(ran) <= 4


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_tool_calls_side_by_side_run_exactly_the_permits_left(mode):
    """S4-3: a reply asks for eight lookups at once under tool_calls=3: ToolNode starts them
    side by side, and exactly three run."""
    entered = threading.Barrier(3, timeout=5)
    script = Script(asks(*["lookup"] * 8))
    graph, ran = agent_graph(script, during_tool=lambda: entered.wait())
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(tool_calls=3) as run:
        invoke(graph, START_STATE, mode)
    assert caught.value.kind == "tool_calls"
    assert len(ran) == 3 and len(set(ran)) == 3
    assert run.consumed["tool_calls"] == 3
    assert script.calls == 1


def test_a_node_retried_by_langgraph_after_a_refusal_is_refused_again():
    """LangGraph's RetryPolicy retries a node on any error it does not know, a refusal
    included: the retry is refused at its start, and neither it nor the model runs again."""
    script = Script(asks("lookup"))
    model = ScriptedChatModel(script=script)
    attempts = []

    def agent(state: MessagesState) -> dict[str, Any]:
        attempts.append(1)
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent, retry_policy=RetryPolicy(initial_interval=0.01,
                                                            max_attempts=3))
    graph.add_node("tools", ToolNode([_noop_lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        invoke(graph.compile(), START_STATE, "invoke")
    assert caught.value.kind == "provider_calls"
    assert len(attempts) == 3 and script.calls == 2  # agent, agent, agent (refused)
    assert run.consumed["steps"] == 5  # agent, tools, agent, tools, agent: no retry


@tool("lookup")
def _noop_lookup(q: str) -> str:
    """Look something up (and find it)."""
    return q


def test_coroutine_tools_side_by_side_start_exactly_the_permits_left():
    """The same with tools that are coroutines, under ainvoke: exactly three start. (The
    three go on to their end after the graph has raised, as asyncio does with the tasks of a
    gather whose sibling failed: a budget never stops work already started, S4-10.)"""
    started: list[str] = []

    @tool
    async def lookup(q: str) -> str:
        """Look something up."""
        started.append(q)
        await asyncio.sleep(0.01)
        return q

    script = Script(asks(*["lookup"] * 8))
    model = ScriptedChatModel(script=script)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(tool_calls=3) as run:
        invoke(graph.compile(), START_STATE, "ainvoke")
    assert caught.value.kind == "tool_calls"
    assert len(started) == 3 and run.consumed["tool_calls"] == 3


def test_a_tool_node_that_handles_errors_does_not_turn_a_refusal_into_an_answer():
    """ToolNode(handle_tool_errors=True) hands a tool's error to the model as a message; a
    refusal is not the tool's error: the graph ends with it and the model is not asked again."""
    script = Script(asks("lookup", "lookup", "lookup"), answer())
    graph, ran = agent_graph(script, handle_tool_errors=True)
    with nb.budget(tool_calls=10):  # the graph does turn a tool's own error into a message
        invoke(graph, START_STATE, "invoke")
    script.calls = 0
    ran.clear()
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(tool_calls=2):
        invoke(graph, START_STATE, "invoke")
    assert caught.value.kind == "tool_calls"
    assert len(ran) == 2
    assert script.calls == 1


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_run_cancelled_during_a_tool_ends_the_graph_with_cancelled(mode):
    """S2-3: run.cancel() from inside a tool; the graph stops at the next event, past
    ToolNode's error handling, and the run's block raises nb.Cancelled."""
    script = Script(asks("lookup"))
    holder: dict[str, nb.Budget] = {}
    graph, ran = agent_graph(script, handle_tool_errors=True,
                             during_tool=lambda: holder["run"].cancel("enough"))
    with pytest.raises(nb.Cancelled, match="enough"), nb.budget(tool_calls=10) as run:
        holder["run"] = run
        invoke(graph, START_STATE, mode)
    assert ran == ["q0"] and script.calls == 1
    assert run.outcome.status == nb.Status.STOPPED


def test_the_runs_time_is_checked_at_every_event():
    """A tool that uses up the time grant (a fake clock): the graph ends at the tool's end,
    with nb.BudgetCut by timeout, and the model is not asked again."""
    clock = FakeClock()
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script, during_tool=lambda: clock.advance("6s"))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(time="5s", clock=clock):
        invoke(graph, START_STATE, "invoke")
    assert caught.value.by == "timeout"
    assert ran == ["q0"] and script.calls == 1


@pytest.mark.parametrize("mode", MODES)
def test_tokens_past_the_limit_cut_the_run(mode):
    """S3-3: each reply uses 30 tokens under tokens=50: the second passes the limit, is
    recorded, and the run fails budget-cut by tokens; nothing runs after it."""
    script = Script(asks("lookup", used=(20, 10)))
    graph, ran = agent_graph(script)
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(tokens=50) as run:
        invoke(graph, START_STATE, mode)
    assert caught.value.by == "tokens"
    assert script.calls == 2 and ran == ["q0"]
    assert run.consumed["tokens"] == 60
    assert run.outcome.status == nb.Status.FAILED


def test_output_tokens_spent_refuse_the_next_model_call():
    """S2-9: once output_tokens is spent to the limit, the next model call is refused."""
    script = Script(asks("lookup", used=(10, 5)))
    graph, _ = agent_graph(script)
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(output_tokens=10) as run:
        invoke(graph, START_STATE, "invoke")
    assert caught.value.kind == "output_tokens"
    assert script.calls == 2
    assert run.consumed["output_tokens"] == 10


def test_a_stream_is_cut_at_the_chunk_that_passes_the_limit():
    """S3-9: a reply of six words, one output token a chunk, under output_tokens=3: the caller
    receives three chunks, and the run is cut by output_tokens."""
    model = ScriptedChatModel(script=Script(answer("one two three four five six", (4, 6))))
    received: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=3) as run:
        for chunk in model.stream("go", config={"callbacks": [Budgeted()]}):
            received.append(str(chunk.content))
    assert caught.value.by == "output_tokens"
    assert received == ["one ", "two ", "three "]
    assert run.consumed["output_tokens"] == 4


@pytest.mark.parametrize("streamed", [False, True])
def test_a_streamed_reply_is_charged_once(streamed):
    """The chunks' usage and the reply's merged usage are the same tokens: charged once."""
    model = ScriptedChatModel(script=Script(answer("one two three", (4, 3))))
    with nb.budget(tokens=100) as run:
        config = {"callbacks": [Budgeted()]}
        if streamed:
            asyncio.run(_drain(model.astream("go", config=config)))
        else:
            model.invoke("go", config=config)
    assert run.consumed["tokens"] == 7 and run.consumed["output_tokens"] == 3


def test_a_graph_streaming_its_messages_charges_each_reply_once():
    """stream_mode="messages" makes LangGraph stream every model call: the chunks' usage is
    charged as it comes, and the replies' merged usage is not charged again; the answer's
    third word passes output_tokens=22 and cuts the run there (S3-9)."""
    script = Script(asks("lookup", used=(100, 20)), answer("a b c", used=(200, 3)))
    graph, _ = agent_graph(script)
    config = {"callbacks": [Budgeted()]}
    with nb.budget(tokens=10_000) as run:
        list(graph.stream(START_STATE, config=config, stream_mode="messages"))
    assert run.consumed["tokens"] == 323 and run.consumed["output_tokens"] == 23
    script.calls = 0
    received = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=22) as run:
        for chunk, _ in graph.stream(START_STATE, config=config, stream_mode="messages"):
            if chunk.type == "AIMessageChunk" and chunk.content:
                received.append(chunk.content)
    assert caught.value.by == "output_tokens"
    assert received == ["a ", "b "]
    assert run.consumed["output_tokens"] == 23


def test_a_v3_event_stream_is_charged_as_it_finishes_and_stops_with_the_run():
    """stream_events(version="v3") reports usage only with the message's end, where it is
    charged; a stop of the run ends the stream at its next event."""
    model = ScriptedChatModel(script=Script(answer("one two three four", (4, 4))))
    config = {"callbacks": [Budgeted()]}
    with nb.budget(tokens=100) as run:
        events = list(model.stream_events("go", version="v3", config=config))
    assert run.consumed["tokens"] == 8 and run.consumed["output_tokens"] == 4
    received = []
    with pytest.raises(nb.Cancelled), nb.budget(tokens=100) as run:
        for event in model.stream_events("go", version="v3", config=config):
            received.append(event)
            if len(received) == 2:
                run.cancel("enough")
    assert len(received) < len(events)
    assert "tokens" not in run.consumed


async def _drain(chunks: Any) -> None:
    async for _ in chunks:
        pass


class TokenUsageChatModel(ScriptedChatModel):
    """Reports usage as older LangChain integrations do: OpenAI's names in ``llm_output``."""

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        reply = AIMessage(content="hi")
        return ChatResult(generations=[ChatGeneration(message=reply)],
                          llm_output={"token_usage": {"prompt_tokens": 12,
                                                      "completion_tokens": 7}})


def test_usage_reported_in_llm_output_is_charged():
    model = TokenUsageChatModel(script=None)
    with nb.budget(tokens=100) as run:
        model.invoke("go", config={"callbacks": [Budgeted()]})
    assert run.consumed["tokens"] == 19 and run.consumed["output_tokens"] == 7


def test_cost_comes_from_genai_prices_for_the_model_that_answered():
    """The reply names its model and provider (as LangChain's OpenAI integration does); the
    cost is genai-prices' own figure for that usage, cached input priced as such."""
    from genai_prices import Usage, calc_price

    reply = AIMessage(content="hi", usage_metadata=usage(2_000, 500, cache_read=1_500),
                      response_metadata={"model_name": "gpt-4o-2024-08-06",
                                         "model_provider": "openai"})
    model = ScriptedChatModel(script=Script(reply))
    with nb.budget(cost_usd=1.0) as run:
        with pytest.raises(nb.ConfigError, match="scripted-model"):  # no price: refused
            model.invoke("go", config={"callbacks": [Budgeted()]})
        assert model.script.calls == 0
        priced = ScriptedChatModel(script=model.script, model="gpt-4o", provider="openai")
        priced.invoke("go", config={"callbacks": [Budgeted()]})
    expected = calc_price(Usage(input_tokens=2_000, cache_read_tokens=1_500, output_tokens=500),
                          model_ref="gpt-4o-2024-08-06", provider_id="openai").total_price
    assert run.consumed["cost_usd"] == pytest.approx(float(expected))
    assert run.consumed["cost_usd"] == pytest.approx(500 * 2.5e-6 + 1_500 * 1.25e-6
                                                     + 500 * 10e-6)


def test_cost_past_the_limit_cuts_the_run():
    """S3-3: a known model's reply costs 0.0075 under cost_usd=0.005: a call with no output
    cap reserves all that is left (S3-10), and a reply that costs more cuts the run."""
    script = Script(asks("lookup", used=(1_000, 500)))
    model = ScriptedChatModel(script=script, model="gpt-4o", provider="openai")
    graph, ran = agent_graph(script, model=model)
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(cost_usd=0.005) as run:
        invoke(graph, START_STATE, "invoke")
    assert caught.value.by == "cost_usd"
    assert script.calls == 1 and ran == []
    assert run.consumed["cost_usd"] == pytest.approx(0.0075)


@pytest.mark.parametrize("prices, expected", [
    ({"input": 3.0, "output": 15.0}, (2_000 * 3 + 500 * 15) / 1e6),
    ({"input": 3.0, "output": 15.0, "cache_read": 0.3},
     (500 * 3 + 1_500 * 0.3 + 500 * 15) / 1e6),
    (lambda used: used["input_tokens"] * 1e-6 + used.get("cache_read_tokens", 0) * 1e-9, 0.0020015),
])
def test_prices_given_per_million_tokens_or_as_a_function(prices, expected):
    reply = AIMessage(content="hi", usage_metadata=usage(2_000, 500, cache_read=1_500))
    model = ScriptedChatModel(script=Script(reply))
    with nb.budget(cost_usd=1.0) as run:
        model.invoke("go", config={"callbacks": [Budgeted(prices=prices)]})
    assert run.consumed["cost_usd"] == pytest.approx(expected)


# -- S3-10: a model call's worst-case cost is reserved before it is made -----------------------
#: USD per million tokens: output dear, so that a call's cap decides most of its worst case
PRICES = {"input": 1.0, "output": 100.0}
IN_RATE, OUT_RATE = PRICES["input"] / 1e6, PRICES["output"] / 1e6
FRAMING = 1024  # the input tokens a worst case adds to what a call sends (see the docs)


def cost_of(inp: int, out: int) -> float:
    return inp * IN_RATE + out * OUT_RATE


def test_S3_10_a_call_whose_worst_case_does_not_fit_is_refused_before_the_model_runs():
    """A cap of 1,000 output tokens is a worst case of 0.1 at least: under cost_usd=0.05 the
    call is refused before the model runs (the handler cannot lower the cap), traced, with
    nothing left reserved; a cap whose worst case fits is called."""
    script = Script(answer("hi", (20, 30)))
    model = ScriptedChatModel(script=script, max_tokens=1_000)
    with nb.budget(cost_usd=0.05) as run:
        with pytest.raises(nb.BudgetExceeded) as caught:
            model.invoke("go", config={"callbacks": [Budgeted(prices=PRICES)]})
        assert script.calls == 0
        assert (caught.value.kind, caught.value.target) == ("cost_usd", "provider:scripted-model")
        assert caught.value.requested >= 1_000 * OUT_RATE
        assert run.consumed.get("cost_usd", 0) == 0
        assert run.consumed.get("provider_calls", 0) == 0  # refused whole: no permit either
        assert [e.payload["budget_kind"] for e in refusals(run)] == ["cost_usd"]
        model.max_tokens = 400
        model.invoke("go", config={"callbacks": [Budgeted(prices=PRICES)]})
        assert script.calls == 1


@pytest.mark.parametrize("how", ["invoke", "stream", "bound"])
def test_S3_10_the_reply_settles_the_reservation_to_its_cost(how):
    """While the call runs its worst case is reserved: what it sends in bytes of JSON plus the
    framing at the input price, its cap at the output price; the reply settles it to its own
    cost exactly, whole or streamed, the cap given on the model or bound to the call."""
    during: list[float] = []
    with nb.budget(cost_usd=1.0) as run:
        def reply() -> AIMessage:
            during.append(run.consumed["cost_usd"])
            return answer("one two three", (20, 3))

        model = ScriptedChatModel(script=Script(reply), max_tokens=None if how == "bound"
                                  else 40)
        config = {"callbacks": [Budgeted(prices=PRICES)]}
        if how == "stream":
            list(model.stream("go", config=config))
        elif how == "bound":
            model.bind(max_tokens=40).invoke("go", config=config)
        else:
            model.invoke("go", config=config)
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(20, 3), rel=1e-12)
        assert run.remaining("cost_usd") == pytest.approx(1.0 - cost_of(20, 3), rel=1e-12)
    [reserved] = during
    assert cost_of(FRAMING, 40) < reserved < cost_of(FRAMING + 2_000, 40)


def test_S3_10_a_call_with_no_cap_reserves_all_that_is_left_and_gives_back_the_rest():
    during: list[float] = []
    with nb.budget(cost_usd=0.5) as run:
        def reply() -> AIMessage:
            during.append(run.remaining("cost_usd"))
            return answer("hi", (20, 30))

        ScriptedChatModel(script=Script(reply)).invoke(
            "go", config={"callbacks": [Budgeted(prices=PRICES)]})
    assert during == [0]
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(20, 30), rel=1e-12)


def capped_reply(model: ScriptedChatModel, wait: float = 0.0) -> Any:
    """A reply that uses all of *model*'s cap, after *wait* seconds (calls side by side)."""
    def reply() -> AIMessage:
        threading.Event().wait(wait)
        return answer("x", (20, model.max_tokens or 0))

    return reply


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_a_batch_sharing_a_cost_limit_never_passes_it(round_):
    """Batches of 16 calls side by side, each using all of its cap, until every call is
    refused: the run never passes cost_usd and is never cut; every call made was charged its
    cost, and every call refused never reached the model."""
    model = ScriptedChatModel(script=None, max_tokens=40)
    model.script = Script(capped_reply(model, wait=0.02))
    limit = 0.06  # about twelve calls' worst cases (0.005 each)
    config = {"callbacks": [Budgeted(prices=PRICES)], "max_concurrency": 16}
    refused = 0
    with nb.budget(cost_usd=limit) as run:
        for _ in range(5):
            results = model.batch(["go"] * 16, config=config, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert all(isinstance(e, nb.BudgetExceeded) and e.kind == "cost_usd"
                       for e in errors), errors
            refused += len(errors)
            assert run.consumed["cost_usd"] <= limit
    assert run.outcome.status == nb.Status.COMPLETED
    assert 0 < model.script.calls < 80 and refused == 80 - model.script.calls
    assert run.consumed["cost_usd"] == pytest.approx(model.script.calls * cost_of(20, 40))
    assert run.consumed["provider_calls"] == model.script.calls


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_parallel_graph_branches_sharing_a_cost_limit_never_pass_it(round_):
    """A Send fan-out of 12 branches, each calling the model with its cap, under a limit of
    about seven calls' worst cases: some branches are refused and the graph ends with the
    refusal; the run never passes cost_usd."""
    model = ScriptedChatModel(script=None, max_tokens=40)
    model.script = Script(capped_reply(model, wait=0.02))

    class Fan(TypedDict):
        done: Annotated[list[str], operator.add]

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": [str(model.invoke(state["q"]).content)]}

    graph = StateGraph(Fan)
    graph.add_node("ask", ask)
    graph.add_conditional_edges(START, lambda _: [Send("ask", {"q": f"q{i}"})
                                                  for i in range(12)])
    graph.add_edge("ask", END)
    limit = 0.035
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(cost_usd=limit) as run:
        graph.compile().invoke({"done": []}, config={"callbacks": [Budgeted(prices=PRICES)]})
    assert caught.value.kind == "cost_usd"
    assert run.consumed.get("cost_usd", 0) <= limit
    assert 0 < model.script.calls < 12
    assert run.consumed["cost_usd"] == pytest.approx(model.script.calls * cost_of(20, 40))


def status_error(status: int) -> Exception:
    """The OpenAI SDK's own error for an error status from the provider."""
    openai = pytest.importorskip("openai")
    import httpx2

    response = httpx2.Response(status, request=httpx2.Request("POST", "http://127.0.0.1/v1"))
    return openai.APIStatusError(f"Error code: {status}", response=response, body=None)


def test_S3_10_an_error_status_gives_the_reservation_back_and_other_errors_keep_it():
    """A provider's error status bills nothing: the reservation goes back, and a retry
    (with_retry) reserves its own. An error that may come after the provider billed the call
    (a timeout, a dropped connection) keeps the worst case spent."""
    script = Script(status_error(503), answer("hi", (20, 30)))
    model = ScriptedChatModel(script=script, max_tokens=40)
    config = {"callbacks": [Budgeted(prices=PRICES)]}
    with nb.budget(cost_usd=1.0) as run:
        model.with_retry(stop_after_attempt=2, wait_exponential_jitter=False).invoke(
            "go", config=config)
    assert script.calls == 2 and run.consumed["provider_calls"] == 2
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(20, 30), rel=1e-12)

    script = Script(TimeoutError("the read timed out"))
    model = ScriptedChatModel(script=script, max_tokens=40)
    with nb.budget(cost_usd=1.0) as run:
        with pytest.raises(TimeoutError):
            model.invoke("go", config=config)
        assert run.consumed["cost_usd"] > cost_of(FRAMING, 40)  # its worst case, kept


def test_an_explicit_run_is_charged_wherever_the_graph_runs():
    """Budgeted(run) charges that run, even from a thread that entered no run."""
    script = Script(asks("lookup"), answer())
    graph, _ = agent_graph(script)
    with nb.budget(tool_calls=5) as run:
        handler = Budgeted(run)
        worker = threading.Thread(target=invoke, args=(graph, START_STATE, "invoke", handler),
                                  name="graph")
        worker.start()
        worker.join()
    assert run.consumed["tool_calls"] == 1 and run.consumed["provider_calls"] == 2


def test_a_grant_bounds_the_graph_it_is_given_to():
    """S2-1: Budgeted(grant) charges a grant of the run: the grant's own tool_calls refuse the
    third lookup, and the run counts what the grant spent."""
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script)
    with nb.budget(tool_calls=10) as run:
        grant = run.grant(tool_calls=2)
        with pytest.raises(nb.BudgetExceeded) as caught:
            invoke(graph, START_STATE, "invoke", Budgeted(grant))
    assert caught.value.scope == "grant"
    assert ran == ["q0", "q0"]
    assert grant.consumed["tool_calls"] == 2 and run.consumed["tool_calls"] == 2


def test_outside_every_run_the_handler_counts_nothing():
    script = Script(asks("lookup"), answer())
    graph, ran = agent_graph(script)
    state = invoke(graph, START_STATE, "invoke")
    assert state["messages"][-1].content == "done" and ran == ["q0"]


def test_one_handler_serves_graphs_side_by_side_in_their_own_runs():
    """Budgeted() reads nb.current() at each event: two threads, each in its own run, share
    one handler, and each run counts its own graph."""
    handler = Budgeted()
    consumed: dict[str, Any] = {}

    def work(name: str, limit: int) -> None:
        script = Script(asks("lookup"))
        graph, _ = agent_graph(script)
        try:
            with nb.budget(tool_calls=limit) as run:
                invoke(graph, START_STATE, "invoke", handler)
        except nb.BudgetExceeded:
            consumed[name] = run.consumed["tool_calls"]

    threads = [threading.Thread(target=work, args=(f"t{n}", n), name=f"graph-{n}")
               for n in (2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert consumed == {"t2": 2, "t3": 3, "t4": 4}
    assert not handler._roots and not handler._calls and not handler._refused


def test_a_handler_on_the_model_alone_bounds_its_calls_and_keeps_nothing():
    """Budgeted given to the model (callbacks=[...]) rather than to the graph: it sees the
    model's calls only, refuses the third, and holds nothing about runs it never saw end."""
    handler = Budgeted()
    script = Script(asks("lookup"))
    graph, ran = agent_graph(script, model=ScriptedChatModel(script=script,
                                                            callbacks=[handler]))
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        graph.invoke(START_STATE)
    assert caught.value.kind == "provider_calls"
    assert script.calls == 2 and ran == ["q0", "q0"]
    assert run.consumed.get("steps", 0) == 0 and run.consumed.get("tool_calls", 0) == 0
    assert not handler._roots and not handler._calls and not handler._refused


def test_a_text_completion_model_is_counted_as_a_chat_model():
    """A text-completion LLM (LangChain's on_llm_start) is a provider call and a turn too."""
    llm = FakeListLLM(responses=["one", "two"])
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            llm.invoke("go", config={"callbacks": [Budgeted()]})
    assert caught.value.target == "provider:FakeListLLM"
    assert run.consumed["provider_calls"] == 2 and run.consumed["turns"] == 2
    assert llm.i == 0  # two answers given, the third call never made (it cycles back to 0)


def test_without_langchain_the_import_says_what_to_install():
    code = ("import sys; sys.modules['langchain_core'] = None\n"
            "try:\n    import nbbudget.langchain\n"
            "except ImportError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == ("nbbudget.langchain needs langchain-core 1.8.3 or newer (on Python "
                           "3.11 or newer): pip install 'nbbudget[langchain]'")


def test_a_run_other_than_a_budget_is_refused():
    with pytest.raises(nb.ConfigError, match="give an nbbudget run"):
        Budgeted(run="run")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real kernel with nbbudget loaded, the scripted agent graph of this module built in it,
    and its lookups listed in ``ran``."""
    from test_magic_kernel import run, started_kernel

    for client in started_kernel(tmp_path_factory):
        setup = run(client, f"""\
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_langchain import Script, agent_graph, asks, START_STATE
            from nbbudget.langchain import Budgeted
            """)
        assert setup.status == "ok", setup.reply["content"]
        yield client


@pytest.mark.realclock
def test_in_a_budget_cell_a_refusal_ends_the_cell_in_one_line_and_the_tool_never_runs(kernel):
    """What a person sees: Budgeted() takes the cell's run; the refused lookup does not run and
    the cell ends as an error with the refusal's one line, no LangGraph traceback."""
    from test_magic_kernel import run

    cell = run(kernel, """\
        %%budget --tool-calls 2 --no-widget
        script = Script(asks("lookup"))
        graph, ran = agent_graph(script)
        graph.invoke(START_STATE, config={"callbacks": [Budgeted()]})
        """)
    assert cell.status == "error"
    content = cell.reply["content"]
    assert content["ename"] == "BudgetExceeded"
    assert content["evalue"].startswith("tool_calls for tool:lookup would exceed the run's "
                                        "limit of 2 (2 used, 1 more requested)")
    assert run(kernel, "print(len(ran), script.calls)").stdout == "2 3\n"


@pytest.mark.realclock
def test_in_a_budget_cell_tokens_past_the_limit_cut_the_cell(kernel):
    from test_magic_kernel import run

    cell = run(kernel, """\
        %%budget --tokens 40 --no-widget
        script = Script(asks("lookup", used=(20, 10)))
        graph, ran = agent_graph(script)
        graph.invoke(START_STATE, config={"callbacks": [Budgeted()]})
        """)
    assert cell.status == "error"
    assert cell.reply["content"]["ename"] == "BudgetCut"
    assert "tokens passed" in cell.reply["content"]["evalue"]
    assert run(kernel, "print(len(ran), script.calls)").stdout == "1 2\n"
