"""One price model (nbbudget.run.prices): ``prices=`` means USD per million tokens, a function of
the usage, or ``"free"`` in every integration, and a price comes from ``prices=``, else from the
cost the reply reports, else from genai-prices at the provider the client talks to. Through the
real SDKs and frameworks against the local server of tests/wire."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
import httpx2
import openai  # after the skip
from wire import Server
from wire import openai_shapes as o

import nbbudget as nb
from nbbudget.run.prices import cost_usd

needs_genai_prices = pytest.mark.skipif(importlib.util.find_spec("genai_prices") is None,
                                        reason="genai-prices needs Python 3.11 or newer")

ASK = [{"role": "user", "content": "plan the trip"}]
#: the usage every integration reports below: 1,000 input tokens, 400 of them read from the
#: cache, and 200 output tokens
PRICES = {"input": 2.0, "output": 8.0, "cache_read": 0.5}
COST = (600 * 2.0 + 400 * 0.5 + 200 * 8.0) / 1e6


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server


# -- the same call through each integration: (server, model, prices, run) -> None -------------
def through_instrument(server: Server, model: str, prices: Any, run: nb.Budget) -> None:
    server.queue(o.chat("done", o.chat_usage(1000, 200, cached=400), model=model))
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare:
        nb.instrument(bare, prices=prices).chat.completions.create(model=model, messages=ASK)


def through_provider(server: Server, model: str, prices: Any, run: nb.Budget) -> None:
    reply = {"usage": {"input_tokens": 1000, "output_tokens": 200, "cache_read_tokens": 400}}
    run.provider(lambda: reply, name=model, prices=prices)()


def through_langchain(server: Server, model: str, prices: Any, run: nb.Budget) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from nbbudget.langchain import Budgeted

    usage = {"input_tokens": 1000, "output_tokens": 200, "total_tokens": 1200,
             "input_token_details": {"cache_read": 400}}
    chat = GenericFakeChatModel(messages=iter([AIMessage(content="done",
                                                         usage_metadata=usage)]))
    chat.invoke("go", config={"callbacks": [Budgeted(prices=prices)],
                              "metadata": {"ls_model_name": model}})


def through_openai_agents(server: Server, model: str, prices: Any, run: nb.Budget) -> None:
    pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    from nbbudget.openai_agents import Budgeted

    set_tracing_disabled(True)  # nothing leaves the machine, and no exporter thread starts

    server.queue(o.chat("done", o.chat_usage(1000, 200, cached=400), model=model))
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0,
                                default_headers={"Connection": "close"})
    agent = Agent(name="planner",
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client))
    asyncio.run(Runner.run(agent, "go", hooks=Budgeted(prices=prices)))


def through_pydantic_ai(server: Server, model: str, prices: Any, run: nb.Budget) -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("nbbudget.pydantic_ai", exc_type=ImportError)  # refused before 2.64
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from nbbudget.pydantic_ai import Budgeted

    server.queue(o.chat("done", o.chat_usage(1000, 200, cached=400), model=model))
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0,
                                default_headers={"Connection": "close"})
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)))
    asyncio.run(agent.run("go", capabilities=[Budgeted(run, prices=prices)]))


INTEGRATIONS: dict[str, Callable[[Server, str, Any, nb.Budget], None]] = {
    "instrument": through_instrument, "provider": through_provider,
    "langchain": through_langchain, "openai_agents": through_openai_agents,
    "pydantic_ai": through_pydantic_ai}


@pytest.mark.parametrize("prices", [PRICES, lambda usage: COST], ids=["per-million", "function"])
@pytest.mark.parametrize("integration", list(INTEGRATIONS))
def test_the_same_usage_costs_the_same_through_every_integration(
        server: Server, integration: str, prices: Any) -> None:
    with nb.budget(cost_usd=1.0) as run:
        INTEGRATIONS[integration](server, "in-house-model", prices, run)
    assert run.consumed["cost_usd"] == pytest.approx(COST, rel=1e-12)
    assert run.consumed["tokens"] == 1200


@pytest.mark.parametrize("integration", list(INTEGRATIONS))
def test_free_costs_nothing_and_is_never_refused_as_unpriced(server: Server,
                                                            integration: str) -> None:
    """A local model (prices="free") under a cost limit: called, charged its tokens, and
    nothing of the cost limit."""
    with nb.budget(cost_usd=0.000001) as run:
        INTEGRATIONS[integration](server, "llama-local-q4", "free", run)
    assert run.outcome.status == "completed"
    assert run.consumed["tokens"] == 1200 and run.consumed.get("cost_usd", 0) == 0


def _instrument(prices: Any) -> None:
    nb.instrument(openai.OpenAI(base_url="http://127.0.0.1:9", api_key="test"), prices=prices)


def _adapter(module: str) -> Callable[[Any], None]:
    def make(prices: Any) -> None:
        pytest.importorskip(module.replace("openai_agents", "agents")
                            .replace("langchain", "langchain_core"))
        # an adapter refuses a release of its framework it cannot bound (pydantic-ai before
        # 2.64, on Python 3.10): nothing of it to compare there
        budgeted = pytest.importorskip(f"nbbudget.{module}", exc_type=ImportError).Budgeted
        budgeted(prices=prices)

    return make


CONSTRUCTORS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "instrument": ("nb.instrument()", _instrument),
    "provider": ("run.provider()", lambda prices: nb.budget().provider(lambda: None,
                                                                        prices=prices)),
    "langchain": ("nbbudget.langchain.Budgeted()", _adapter("langchain")),
    "openai_agents": ("nbbudget.openai_agents.Budgeted()", _adapter("openai_agents")),
    "pydantic_ai": ("nbbudget.pydantic_ai.Budgeted()", _adapter("pydantic_ai")),
}


@pytest.mark.parametrize("bad", [{"input": 0.15}, {"input": 0.15, "outptu": 0.6},
                                 {"input": -1, "output": 1}, "cheap", 0.15])
@pytest.mark.parametrize("integration", list(CONSTRUCTORS))
def test_a_bad_price_is_the_same_error_in_every_integration(integration: str, bad: Any) -> None:
    where, make = CONSTRUCTORS[integration]
    with pytest.raises(nb.ConfigError) as info:
        make(bad)
    assert str(info.value) == (
        f"{where}: prices={bad!r} is not a price: give USD per million tokens, "
        f"{{'input': 2.5, 'output': 10.0}} (optionally 'cache_read' and 'cache_write'; finite "
        f"numbers >= 0), a function of the usage figures returning dollars, or 'free' for a "
        f"local model")


# -- the provider a client talks to --------------------------------------------------------
class ToServer(httpx2.HTTPTransport):
    """Sends every request to *server* whatever its URL: a client made for a provider's real
    base URL talks to the local server, so that nb.instrument resolves the provider from that
    URL as it would at the provider."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.target = httpx2.URL(server.url)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(scheme="http", host=self.target.host,
                                            port=self.target.port)
        return super().handle_request(request)


#: providers genai-prices knows behind OpenAI-compatible APIs: base URL, name, a model
BEHIND_OPENAI_APIS = [
    ("https://openrouter.ai/api/v1", "openrouter", "openai/gpt-4o-mini"),
    ("https://api.groq.com/openai/v1", "groq", "llama-3.3-70b-versatile"),
    ("https://generativelanguage.googleapis.com/v1beta/openai/", "google", "gemini-2.0-flash"),
]


@needs_genai_prices
@pytest.mark.parametrize(("base_url", "provider", "model"), BEHIND_OPENAI_APIS)
def test_the_provider_is_resolved_from_the_clients_base_url(server: Server, base_url: str,
                                                            provider: str, model: str) -> None:
    server.queue(o.chat("done", o.chat_usage(1000, 200, cached=400), model=model))
    with httpx2.Client(transport=ToServer(server)) as http, openai.OpenAI(
            base_url=base_url, api_key="test", http_client=http, max_retries=0) as bare, \
            nb.budget(cost_usd=1.0) as run:
        nb.instrument(bare).chat.completions.create(model=model, messages=ASK)
    assert server.received[0].path.endswith("/chat/completions")
    expected = cost_usd(provider, model, {"input_tokens": 1000, "output_tokens": 200,
                                          "cache_read_tokens": 400})
    assert expected and run.consumed["cost_usd"] == pytest.approx(expected, rel=1e-12)


@needs_genai_prices
@pytest.mark.parametrize(("base_url", "provider", "model"), BEHIND_OPENAI_APIS)
def test_provider_names_the_provider_of_a_client_at_another_url(server: Server, base_url: str,
                                                                provider: str,
                                                                model: str) -> None:
    """A client at the local server (a proxy, say) names its provider with provider=; without
    it, the model is looked up at the SDK's own provider, which does not price it, and the call
    is refused before it is sent, naming the provider, the model, prices= and provider=."""
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare:
        with pytest.raises(nb.ConfigError) as info, nb.budget(cost_usd=1.0):
            nb.instrument(bare).chat.completions.create(model=model, messages=ASK)
        assert server.received == []
        assert f"no price for model {model!r} at provider 'openai'" in str(info.value)
        assert "provider='openrouter'" in str(info.value) and "prices=" in str(info.value)
        server.queue(o.chat("done", o.chat_usage(1000, 200), model=model))
        with nb.budget(cost_usd=1.0) as run:
            nb.instrument(bare, provider=provider).chat.completions.create(model=model,
                                                                           messages=ASK)
    expected = cost_usd(provider, model, {"input_tokens": 1000, "output_tokens": 200})
    assert expected and run.consumed["cost_usd"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("provider", ["", 3])
def test_a_bad_provider_is_refused_naming_it(provider: Any) -> None:
    with openai.OpenAI(base_url="http://127.0.0.1:9", api_key="test") as bare, pytest.raises(
            nb.ConfigError, match=f"provider={provider!r}: give the provider's name"):
        nb.instrument(bare, provider=provider)


# -- a cost the provider reports -----------------------------------------------------------
def _with_cost(usage: dict[str, Any], cost: Any) -> dict[str, Any]:
    return {**usage, "cost": cost, "is_byok": False,
            "cost_details": {"upstream_inference_cost": None}}


@pytest.mark.parametrize("form", ["compact", "spaced", "escaped"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_cost_the_reply_reports_is_charged_as_reported(server: Server, stream: bool,
                                                         form: str) -> None:
    """OpenRouter reports what a call cost in usage.cost: charged as it is, in place of
    genai-prices' price (gpt-4o-mini, whose price is known, costs 0.0123 here)."""
    usage = _with_cost(o.chat_usage(1000, 200, cached=400), 0.0123)
    reply = (o.chat_stream(["a", "b", "c"], usage, model="gpt-4o-mini") if stream
             else o.chat("done", usage, model="gpt-4o-mini"))
    reply.form = form
    server.queue(reply)
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare, \
            nb.budget(cost_usd=1.0) as run:
        made = nb.instrument(bare).chat.completions.create(model="gpt-4o-mini", messages=ASK,
                                                           stream=stream)
        if stream:
            list(made)
    assert run.consumed["cost_usd"] == pytest.approx(0.0123, rel=1e-12)
    assert run.consumed["tokens"] == 1200


def test_prices_win_over_a_reported_cost(server: Server) -> None:
    server.queue(o.chat("done", _with_cost(o.chat_usage(1000, 200, cached=400), 0.0123)))
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare, \
            nb.budget(cost_usd=1.0) as run:
        nb.instrument(bare, prices=PRICES).chat.completions.create(model="gpt-4o-mini",
                                                                   messages=ASK)
    assert run.consumed["cost_usd"] == pytest.approx(COST, rel=1e-12)


def test_a_reported_cost_of_zero_is_charged_as_zero(server: Server) -> None:
    server.queue(o.chat("done", _with_cost(o.chat_usage(1000, 200), 0)))
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=0) as bare, \
            nb.budget(cost_usd=1.0) as run:
        nb.instrument(bare).chat.completions.create(model="gpt-4o-mini", messages=ASK)
    assert run.consumed.get("cost_usd", 0) == 0 and run.consumed["tokens"] == 1200


@pytest.mark.parametrize("cost", ["0.0123", -1, True, {"total": 1}])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_malformed_reported_cost_is_usage_that_cannot_be_read_N_7(server: Server, cost: Any,
                                                                   stream: bool) -> None:
    usage = _with_cost(o.chat_usage(1000, 200), cost)
    server.queue(o.chat_stream(["a"], usage) if stream else o.chat("done", usage))
    with openai.OpenAI(base_url=server.url, api_key="test", max_retries=3) as bare, \
            pytest.raises(nb.BudgetCut) as info, nb.budget(cost_usd=1.0):
        made = nb.instrument(bare).chat.completions.create(model="gpt-4o-mini", messages=ASK,
                                                           stream=stream)
        if stream:
            list(made)
    assert info.value.by == "cost_usd"
    assert f"usage.cost={cost!r}" in str(info.value)
    assert len(server.received) == 1  # never resent
