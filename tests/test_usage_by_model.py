"""``run.usage(by="model")``: what a run spent on each provider and model it called (calls,
input and output tokens, cost), through ``run.provider``, the real OpenAI SDK instrumented
against the local server of tests/wire, and each framework's adapter; its rows roll up from a
grant to its run as consumption does, add up to ``provider_calls`` (S4-6), hold under 16 threads
at once, survive a checkpoint (S4-4), and show in the panel's details and ``%budget status``
(N-3, N-4)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

pytest.importorskip("openai")
import openai  # after the skip
from wire import Reply, Server
from wire import openai_shapes as o

import nbbudget as nb
from nbbudget.jupyter.panel import MODELS_SHOWN, Panel, line
from nbbudget.run.prices import given_price
from nbbudget.testing import FakeClock

COLUMNS = ["calls", "input_tokens", "output_tokens", "cost_usd"]
ASK = [{"role": "user", "content": "plan the trip"}]
#: two models' prices, USD per million tokens
BIG = {"input": 2.5, "output": 10.0}
SMALL = {"input": 0.15, "output": 0.6}


def cost(prices: dict[str, float], inp: int, out: int) -> float:
    """What *inp* input and *out* output tokens cost at *prices*, as ``prices=`` reads them."""
    return given_price(prices, "test")({"input_tokens": inp, "output_tokens": out})


def row(frame: pd.DataFrame, provider: str, model: str) -> list[Any]:
    """The figures of one model's row, as plain numbers."""
    return [x.item() if hasattr(x, "item") else x for x in frame.loc[(provider, model)]]


def reply(inp: int, out: int) -> Callable[..., dict[str, Any]]:
    """A model function for ``run.provider`` whose replies report *inp* and *out* tokens."""
    return lambda *args, **kwargs: {"usage": {"input_tokens": inp, "output_tokens": out}}


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server


# -- the frame -------------------------------------------------------------------------------------
def test_a_run_that_called_no_model_has_an_empty_frame_with_the_columns() -> None:
    with nb.budget(steps=3) as run:
        run.step()
    frame = run.usage(by="model")
    assert frame.empty and list(frame.columns) == COLUMNS
    assert list(frame.index.names) == ["provider", "model"]
    assert nb.budget(name="never-entered").usage(by="model").empty  # no parts built either
    assert list(run.usage().index) == ["steps"]  # by nothing: one row per armed axis, as ever


def test_by_anything_else_is_a_config_error_naming_the_value() -> None:
    with nb.budget(steps=3) as run:
        pass
    for by in ("kind", "models", 3):
        with pytest.raises(nb.ConfigError) as caught:
            run.usage(by=by)  # type: ignore[arg-type]
        assert str(caught.value) == (f"usage(by={by!r}): give by='model' for one row per "
                                     f"provider and model, or nothing for one row per armed axis")


# -- run.provider ----------------------------------------------------------------------------------
def test_run_provider_counts_each_model_its_attempts_tokens_and_cost_S4_6(ledger: Any) -> None:
    """Two models through run.provider, one of them retried once: a row each, in the order
    first called, every attempt counted (the failed one too: its permit is not refunded), the
    tokens as replied, the cost at prices=; the calls add up to provider_calls, over every
    ledger (a cluster's: the calls made in this process)."""
    failures = [ConnectionError("dropped")]

    def flaky(prompt: str) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return {"usage": {"input_tokens": 40, "output_tokens": 8}}

    with nb.budget(provider_calls=20, ledger=ledger) as run:
        big = run.provider(reply(120, 30), name="gpt-4o", prices=BIG)
        small = run.provider(flaky, name="gpt-4o-mini", prices=SMALL, retries=1)
        big("a")
        small("b")
        big("c")
    frame = run.usage(by="model")
    assert list(frame.columns) == COLUMNS
    assert list(frame.index) == [("unknown", "gpt-4o"), ("unknown", "gpt-4o-mini")]
    assert row(frame, "unknown", "gpt-4o") == [2, 240, 60, pytest.approx(cost(BIG, 240, 60))]
    assert row(frame, "unknown", "gpt-4o-mini") == [2, 40, 8,
                                                    pytest.approx(cost(SMALL, 40, 8))]
    assert frame["calls"].sum() == run.consumed["provider_calls"] == 4
    assert frame["input_tokens"].sum() + frame["output_tokens"].sum() == run.consumed["tokens"]
    assert frame["cost_usd"].sum() == pytest.approx(run.consumed["cost_usd"])


def test_a_model_with_no_price_shows_nan_not_zero_and_free_shows_zero() -> None:
    with nb.budget(provider_calls=5) as run:
        run.provider(reply(10, 2), name="mystery")("a")
        run.provider(reply(10, 2), name="local", prices="free")("b")
    frame = run.usage(by="model")
    assert row(frame, "unknown", "mystery")[:3] == [1, 10, 2]
    assert pd.isna(frame.loc[("unknown", "mystery"), "cost_usd"])
    assert row(frame, "unknown", "local") == [1, 10, 2, 0.0]


def test_a_degraded_provider_counts_the_cheaper_model_on_a_row_of_its_own_S3_7() -> None:
    def cheap(prompt: str) -> dict[str, Any]:
        return {"usage": {"input_tokens": 10, "output_tokens": 1}}

    with nb.budget(cost_usd=0.02) as run:
        ask = run.provider(reply(1000, 500), name="large", prices=BIG, degrade=(cheap, 0.3))
        ask("a")  # 0.0075 of 0.02: past 0.3 of it, so the next call degrades
        ask("b")
    frame = run.usage(by="model")
    assert list(frame.index) == [("unknown", "large"), ("unknown", "cheap")]
    assert row(frame, "unknown", "cheap")[:3] == [1, 10, 1]
    degraded = run.trace.latest("degraded")
    assert degraded is not None and degraded.payload["to"] == "cheap"  # named alike


def test_a_grants_calls_count_in_its_run_as_its_consumption_does(ledger: Any) -> None:
    """A grant shows its own models and its run every grant's; a grant of a grant counts in
    its own and in the run's, not in the grant between, as its consumption does (S2-2)."""
    with nb.budget(provider_calls=20, ledger=ledger) as run:
        run.provider(reply(5, 1), name="m1", prices=SMALL)("a")
        with run.grant(name="outer") as outer:
            outer.provider(reply(7, 2), name="m2", prices=SMALL)("b")
            with outer.grant(name="inner") as inner:
                inner.provider(reply(9, 3), name="m2", prices=SMALL)("c")
                inner_rows = inner.usage(by="model")
            outer_rows = outer.usage(by="model")
            outer_consumed = outer.consumed
    assert list(run.usage(by="model").index) == [("unknown", "m1"), ("unknown", "m2")]
    assert row(run.usage(by="model"), "unknown", "m2")[:3] == [2, 16, 5]
    assert row(outer_rows, "unknown", "m2")[:3] == [1, 7, 2]
    assert outer_consumed["provider_calls"] == 1  # the inner grant's call is not the outer's
    assert row(inner_rows, "unknown", "m2")[:3] == [1, 9, 3]


def test_a_checkpoint_keeps_the_tally_and_a_resumed_run_goes_on_from_it_S4_4() -> None:
    with nb.budget(provider_calls=10) as first:
        first.provider(reply(10, 2), name="m", prices=SMALL)("a")
    state = json.loads(json.dumps(first.state()))
    assert state["models"] == [["unknown", "m", 1, 10, 2, pytest.approx(cost(SMALL, 10, 2))]]
    with nb.Budget.resume(state) as second:
        second.provider(reply(10, 2), name="m", prices=SMALL)("b")
    assert row(second.usage(by="model"), "unknown", "m") == [
        2, 20, 4, pytest.approx(cost(SMALL, 20, 4))]
    assert second.consumed["provider_calls"] == 2
    with nb.budget(steps=1) as idle:
        pass
    assert "models" not in idle.state()  # the state of a run that called none is as it was


# -- the real OpenAI SDK, instrumented -------------------------------------------------------------
def test_instrumented_openai_calls_show_what_the_server_reported_S4_6(
        server: Server) -> None:
    """Through nb.instrument(client) and the real SDK: a retried call (a 429, then the reply),
    a call of another model and a stream of it; the calls are the attempts the server received,
    the tokens what it reported, the cost at prices=."""
    server.queue(Reply.error(429), o.chat("Paris.", o.chat_usage(100, 20), model="gpt-4o"),
                 o.chat("Lyon.", o.chat_usage(30, 5)),
                 o.chat_stream(["Ni", "ce."], o.chat_usage(12, 2)))
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=2) as bare, \
            nb.budget(provider_calls=10, cost_usd=1.0) as run:
        big, small = nb.instrument(bare, prices=BIG), nb.instrument(bare, prices=SMALL)
        big.chat.completions.create(model="gpt-4o", messages=ASK)  # type: ignore[arg-type]
        small.chat.completions.create(model="gpt-4o-mini", messages=ASK)  # type: ignore[arg-type]
        for _ in small.chat.completions.create(model="gpt-4o-mini", messages=ASK,  # type: ignore[arg-type]
                                               stream=True):
            pass
    frame = run.usage(by="model")
    assert list(frame.index) == [("openai", "gpt-4o"), ("openai", "gpt-4o-mini")]
    assert row(frame, "openai", "gpt-4o") == [2, 100, 20, pytest.approx(cost(BIG, 100, 20))]
    assert row(frame, "openai", "gpt-4o-mini") == [
        2, 42, 7, pytest.approx(cost(SMALL, 30, 5) + cost(SMALL, 12, 2))]
    assert frame["calls"].sum() == len(server.received) == run.consumed["provider_calls"]
    assert frame["cost_usd"].sum() == pytest.approx(run.consumed["cost_usd"])


def test_the_process_wide_switch_counts_each_clients_models_by_their_api(
        server: Server) -> None:
    """nb.instrument() with no client: a bare OpenAI client and a bare Anthropic client at once,
    each model on its row under the API's provider (a local server matches no provider's URL in
    genai-prices: the SDK's own)."""
    pytest.importorskip("anthropic")
    import anthropic
    from wire import anthropic_shapes as a

    server.queue(o.chat("Paris.", o.chat_usage(15, 4)),
                 a.message("Lyon.", a.usage(9, 2)))
    with nb.instrument(), nb.budget(provider_calls=5) as run, \
            openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as gpt, \
            anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as claude:
        gpt.chat.completions.create(model="gpt-4o-mini", messages=ASK)  # type: ignore[arg-type]
        claude.messages.create(model="claude-3-5-haiku-latest", max_tokens=50,
                               messages=ASK)  # type: ignore[arg-type]
    frame = run.usage(by="model")
    assert list(frame.index) == [("openai", "gpt-4o-mini"),
                                 ("anthropic", "claude-3-5-haiku-latest")]
    assert [row(frame, *key)[:3] for key in frame.index] == [[1, 15, 4], [1, 9, 2]]


# -- every adapter gives its provider and model ----------------------------------------------------
def through_langchain(server: Server, model: str, run: nb.Budget) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    from nbbudget.langchain import Budgeted

    server.queue(o.chat("done", o.chat_usage(1000, 200), model=model))
    chat = ChatOpenAI(model=model, base_url=server.url, api_key="test",  # type: ignore[arg-type]
                      max_retries=0)
    chat.invoke("go", config={"callbacks": [Budgeted(prices=BIG)]})


def through_openai_agents(server: Server, model: str, run: nb.Budget) -> None:
    pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    from nbbudget.openai_agents import Budgeted

    set_tracing_disabled(True)  # nothing leaves the machine, and no exporter thread starts
    server.queue(o.chat("done", o.chat_usage(1000, 200), model=model))
    client = openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0,
                                default_headers={"Connection": "close"})
    agent = Agent(name="planner",
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client))
    asyncio.run(Runner.run(agent, "go", hooks=Budgeted(prices=BIG)))


def through_pydantic_ai(server: Server, model: str, run: nb.Budget) -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("nbbudget.pydantic_ai", exc_type=ImportError)  # refused before 2.64
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from nbbudget.pydantic_ai import Budgeted

    server.queue(o.chat("done", o.chat_usage(1000, 200), model=model))
    client = openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0,
                                default_headers={"Connection": "close"})
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)))
    asyncio.run(agent.run("go", capabilities=[Budgeted(run, prices=BIG)]))


ADAPTERS = {"langchain": through_langchain, "openai_agents": through_openai_agents,
            "pydantic_ai": through_pydantic_ai}


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_each_adapter_counts_its_models_call_for_its_provider(server: Server,
                                                             adapter: str) -> None:
    with nb.budget(provider_calls=5, cost_usd=1.0) as run:
        ADAPTERS[adapter](server, "in-house-model", run)
    frame = run.usage(by="model")
    assert list(frame.index) == [("openai", "in-house-model")]
    assert row(frame, "openai", "in-house-model") == [
        1, 1000, 200, pytest.approx(cost(BIG, 1000, 200))]
    assert frame["calls"].sum() == run.consumed["provider_calls"] == len(server.received)


def test_the_agents_sdks_own_retries_count_as_calls_of_their_model_S4_6(server: Server) -> None:
    """ModelSettings.retry retries inside one model call, where no hook runs: the attempts the
    SDK reports with its reply count as calls of that model, as provider_calls counts them."""
    pytest.importorskip("agents")
    from agents import (
        Agent,
        ModelRetrySettings,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        retry_policies,
        set_tracing_disabled,
    )

    from nbbudget.openai_agents import Budgeted

    set_tracing_disabled(True)
    retry = ModelSettings(retry=ModelRetrySettings(
        max_retries=2, backoff={"initial_delay": 0.001, "max_delay": 0.001, "jitter": False},
        policy=retry_policies.http_status([500])))
    client = openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0,
                                default_headers={"Connection": "close"})
    agent = Agent(name="a", model_settings=retry,
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
    server.queue(Reply.error(500), Reply.error(500), o.chat("at last", o.chat_usage(10, 2)))
    with nb.budget(provider_calls=5) as run:
        asyncio.run(Runner.run(agent, "hi", hooks=Budgeted(prices=SMALL)))
    assert row(run.usage(by="model"), "openai", "gpt-4o-mini") == [
        3, 10, 2, pytest.approx(cost(SMALL, 10, 2))]
    assert len(server.received) == run.consumed["provider_calls"] == 3


# -- 16 threads at once ----------------------------------------------------------------------------
@pytest.fixture
def switching() -> Iterator[None]:
    """Threads switch as often as CPython lets them, so that two of them meet inside a
    charge if anything of it is not under the lock."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class Tokens(int):
    """A count of tokens of a library's own whole-number type, as a reply's usage may report
    it (nbbudget takes any whole number): adding one to another number runs Python code, where
    CPython may switch threads, so that two charges meet inside the tally's update unless the
    lock keeps them apart (a plain int's addition gives CPython no such point)."""

    def __radd__(self, other: int) -> int:
        return int(other) + int(self)


def tokens_reply(inp: int, out: int) -> Callable[..., dict[str, Any]]:
    """`reply`, its counts of the `Tokens` type."""
    return lambda *args, **kwargs: {"usage": {"input_tokens": Tokens(inp),
                                              "output_tokens": Tokens(out)}}


@pytest.mark.usefixtures("switching")
def test_sixteen_threads_at_once_lose_no_call_and_no_token_S4_3() -> None:
    """16 threads call two models at once, 8 on the run and 8 each in a grant of its own: the
    run's rows hold every call and token, and add up to provider_calls; each grant's hold its
    own. (With the tally's update moved out of the lock, tokens are lost here.)"""
    threads, each = 16, 300
    start = threading.Barrier(threads)
    grants: dict[int, pd.DataFrame] = {}

    with nb.budget(provider_calls=threads * each) as run:
        def work(k: int) -> None:
            def calls(on: nb.Budget) -> None:
                big = on.provider(tokens_reply(3, 1), name="big", prices=BIG)
                small = on.provider(tokens_reply(2, 1), name="small", prices=SMALL)
                start.wait()
                for i in range(each):
                    (big if i % 2 else small)("x")

            if k < threads // 2:
                calls(run)
            else:
                with run.grant(name=f"g{k}") as grant:
                    calls(grant)
                    grants[k] = grant.usage(by="model")

        workers = [threading.Thread(target=work, args=(k,), name=f"usage-{k}")
                   for k in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    frame = run.usage(by="model")
    half = threads * each // 2
    assert row(frame, "unknown", "big")[:3] == [half, 3 * half, half]
    assert row(frame, "unknown", "small")[:3] == [half, 2 * half, half]
    assert frame["calls"].sum() == run.consumed["provider_calls"] == threads * each
    assert frame.loc[("unknown", "big"), "cost_usd"] == pytest.approx(cost(BIG, 3 * half, half))
    assert len(grants) == threads // 2
    for rows in grants.values():
        assert row(rows, "unknown", "big")[:3] == [each // 2, 3 * each // 2, each // 2]
        assert row(rows, "unknown", "small")[:3] == [each // 2, each, each // 2]


@pytest.mark.usefixtures("switching")
def test_sixteen_threads_through_one_instrumented_client_S4_3(server: Server) -> None:
    """16 threads share one instrumented client: every attempt the server received is a call,
    every token it reported is counted."""
    server.default = o.chat("ok", o.chat_usage(11, 3))
    threads, each = 16, 4
    start = threading.Barrier(threads)
    errors: list[BaseException] = []
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare, \
            nb.budget(provider_calls=threads * each) as run:
        client = nb.instrument(bare, prices=SMALL)

        def work() -> None:
            try:
                start.wait()
                for _ in range(each):
                    client.chat.completions.create(model="gpt-4o-mini",
                                                   messages=ASK)  # type: ignore[arg-type]
            except BaseException as exc:  # shown by the assertion below
                errors.append(exc)

        # each thread in the run's context (a thread starts in an empty one)
        workers = [threading.Thread(target=contextvars.copy_context().run, args=(work,),
                                    name=f"usage-http-{k}") for k in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert not errors
    n = threads * each
    assert row(run.usage(by="model"), "openai", "gpt-4o-mini") == [
        n, 11 * n, 3 * n, pytest.approx(cost(SMALL, 11 * n, 3 * n))]
    assert len(server.received) == run.consumed["provider_calls"] == n


# -- where a person sees it ------------------------------------------------------------------------
def _cells(value: str) -> list[list[str]]:
    """The rows of the panel's details, cell by cell (the header's cells first)."""
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr)
            for tr in re.findall(r"<tr>(.*?)</tr>", value)]


def test_N_3_the_panel_shows_the_models_in_its_details_and_its_text() -> None:
    panel = Panel(nb.Limits(provider_calls=10), widgets=True)
    view = panel._view
    with nb.budget(provider_calls=10, clock=FakeClock(), name="cell") as run:
        panel.attach(run)
        panel._draw(run.snapshot(), line(run.snapshot()))
        assert (view.models.value, view.models.layout.display) == ("", "none")  # no details
        ask = run.provider(reply(1200, 300), name="gpt-4o", prices=BIG)
        ask("a")
        ask("b")
        run.provider(reply(10, 1), name="local", prices="free")("c")
        run.provider(reply(10, 1), name="mystery")("d")
        panel._draw(run.snapshot(), line(run.snapshot()))
    assert view.models.layout.display is None  # shown
    assert _cells(view.models.value) == [
        ["provider", "model", "calls", "input tokens", "output tokens", "cost"],
        ["unknown", "gpt-4o", "2", "2,400", "600", "$0.012"],
        ["unknown", "local", "1", "10", "1", "$0"],
        ["unknown", "mystery", "1", "10", "1", "no price"]]
    panel.end_cell()
    assert panel.text == ("nbbudget cell: completed, 0.0 s; provider_calls 4/10\n"
                          "  unknown gpt-4o: 2 calls, 2,400 tokens in, 600 out, $0.012\n"
                          "  unknown local: 1 call, 10 tokens in, 1 out, $0\n"
                          "  unknown mystery: 1 call, 10 tokens in, 1 out, no price")


def test_N_3_the_panel_shows_the_first_models_and_says_how_many_more() -> None:
    panel = Panel(nb.Limits(provider_calls=20), widgets=True)
    with nb.budget(provider_calls=20, clock=FakeClock(), name="cell") as run:
        panel.attach(run)
        for k in range(MODELS_SHOWN + 2):
            run.provider(reply(1, 1), name=f"m{k}", prices="free")("a")
    panel.end_cell()
    assert len(_cells(panel._view.models.value)) == 1 + MODELS_SHOWN
    assert panel._view.models.value.endswith(
        "<div>and 2 more: run.usage(by='model') has them all</div>")
    lines = panel.text.splitlines()
    assert len(lines) == 1 + MODELS_SHOWN + 1
    assert lines[-1] == "  and 2 more models: run.usage(by='model') has them all"



CELL = ("import nbbudget as nb\n"
        "run = nb.current()\n"
        "ask = run.provider(lambda p: {'usage': {'input_tokens': 120, 'output_tokens': 30}},\n"
        "                   name='gpt-4o', prices={'input': 2.5, 'output': 10.0})\n"
        "reply = ask('a')\n")
SHOWN = ("                 calls  input_tokens  output_tokens  cost_usd\n"
         "provider model                                               \n"
         "unknown  gpt-4o      1           120             30    0.0006")


@pytest.mark.usefixtures("quick_idle_workers", "home")
def test_N_4_budget_status_shows_the_models_beside_the_axes(shell: InteractiveShell) -> None:
    with capture_output() as ran:
        result = shell.run_cell("%%budget --provider-calls 5 --no-widget\n" + CELL)
    assert result.error_in_exec is None
    # the text under a cell shown without a panel says what the panel's text says
    assert ran.stdout.splitlines()[-1] == ("  unknown gpt-4o: 1 call, 120 tokens in, 30 out, "
                                           "$0.0006")
    with capture_output() as shown:
        status = shell.run_line_magic("budget", "status")
    assert status.loc["provider_calls", "consumed"] == 1  # its value: the axes, as ever
    assert [out.data["text/plain"] for out in shown.outputs] == [SHOWN]


@pytest.mark.usefixtures("quick_idle_workers", "home")
def test_N_4_status_of_a_cell_without_limits_that_called_a_model_is_its_models(
        shell: InteractiveShell) -> None:
    shell.run_cell("%%budget --no-widget\n" + CELL)
    with capture_output() as shown:
        status = shell.run_line_magic("budget", "status")
    assert re.fullmatch(r"The last %%budget cell \(.*\) set no limits, so there is no use per "
                        r"limit to show; it ran \d+ ms \(completed\), and called these "
                        r"models:\n", shown.stdout)
    assert repr(status) == SHOWN
