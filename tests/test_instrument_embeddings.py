"""OpenAI's Embeddings (``POST /embeddings``) under ``nb.instrument``: a request that generates
no text is a provider call (S4-6), its input is charged as ``tokens`` and priced, and with
``cost_usd`` limited its input's worst case is reserved before it is sent (S3-10); it is no turn
and has no output cap, so an exhausted ``output_tokens`` does not refuse it (S2-9 bounds what
a call writes). Through the real OpenAI SDK, the bare client under the switch and an
instrumented one, against the loopback server of ``tests/wire``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
from wire import FORMS, Server  # noqa: E402
from wire import openai_shapes as o  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations.models import openai_api  # noqa: E402
from nbbudget.run.prices import price_of  # noqa: E402

MODEL = "text-embedding-3-small"
TEXTS = ["plan the trip", "to Paris"]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=o.embeddings(2, 9)) as server:
        yield server


@pytest.fixture(params=["switch", "instrumented"])
def client(request: pytest.FixtureRequest, server: Server) -> Iterator[Any]:
    """A bare client under the process-wide switch, or a client given to nb.instrument."""
    bare = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    if request.param == "switch":
        with nb.instrument(), bare:
            yield bare
    else:
        with bare, nb.instrument(bare) as instrumented:
            yield instrumented


def embed(client: Any, **kwargs: Any) -> Any:
    return client.embeddings.create(model=MODEL, input=TEXTS, **kwargs)


@pytest.mark.parametrize("form", FORMS)
def test_an_embedding_is_a_provider_call_whose_input_is_charged_S4_6(
        server: Server, client: Any, form: str) -> None:
    reply = o.embeddings(2, 9)
    reply.form = form
    server.queue(reply)
    with nb.budget(provider_calls=5) as run:
        result = embed(client)
    assert [len(item.embedding) for item in result.data] == [4, 4]
    assert run.consumed["provider_calls"] == 1
    assert run.consumed["tokens"] == 9
    assert run.consumed.get("turns", 0) == 0  # no reply text: no turn
    assert run.consumed.get("output_tokens", 0) == 0
    assert run.usage(by="model").loc[("openai", MODEL), "calls"] == 1


def test_the_third_embedding_under_two_provider_calls_is_refused_with_nothing_sent(
        server: Server, client: Any) -> None:
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            embed(client)
    assert len(server.received) == 2
    assert refused.value.kind == "provider_calls"
    assert isinstance(refused.value, openai_api.Refused)
    assert run.consumed["provider_calls"] == 2


def test_an_exhausted_output_limit_does_not_refuse_an_embedding(server: Server,
                                                                client: Any) -> None:
    with nb.budget(output_tokens=5) as run:
        run.charge("output_tokens", 5)
        embed(client)
    assert len(server.received) == 1
    assert "dimensions" not in server.received[0].body  # nothing clamped: it has no cap


@pytest.mark.skipif(price_of("openai", MODEL) is None,
                    reason="genai-prices is not installed (it needs Python 3.11+)")
def test_its_cost_is_priced_and_its_worst_case_reserved_before_it_is_sent_S3_10(
        server: Server, client: Any) -> None:
    price = price_of("openai", MODEL)
    assert price is not None
    with nb.budget(cost_usd=1.0) as run:
        embed(client)
    assert run.consumed["cost_usd"] == pytest.approx(price.cost({"input_tokens": 9}))
    # a limit below the worst case of its input (its bytes, as tokens) refuses it unsent
    server.received.clear()
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(cost_usd=1e-9):
        embed(client)
    assert refused.value.kind == "cost_usd"
    assert server.received == []


def test_the_async_client_is_bounded_alike(server: Server) -> None:
    async def calls() -> None:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0) as aio:
            for _ in range(3):
                await aio.embeddings.create(model=MODEL, input=TEXTS)

    with nb.instrument(), pytest.raises(nb.BudgetExceeded), nb.budget(
            provider_calls=2) as run:
        asyncio.run(calls())
    assert len(server.received) == 2 and run.consumed["tokens"] == 18
