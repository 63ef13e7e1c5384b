"""``nb.instrument`` on the Anthropic SDK (Messages), through the real SDK against a local
server speaking Anthropic's wire format, asserting what the server received (S2-9, S3-3, S3-8,
S3-9, S4-6)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("anthropic")
import anthropic  # after the skip
from wire import Reply, Server
from wire import anthropic_shapes as a

import nbbudget as nb
from nbbudget.run.prices import cost_usd

MODEL = "claude-3-5-haiku-latest"
ASK = [{"role": "user", "content": "plan the trip"}]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server


@pytest.fixture
def bare(server: Server) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=3)
    yield client
    client.close()


@pytest.fixture
def client(bare: anthropic.Anthropic) -> anthropic.Anthropic:
    return nb.instrument(bare)


def create(client: anthropic.Anthropic, **kwargs: Any) -> Any:
    return client.messages.create(model=MODEL, messages=ASK,  # type: ignore[call-overload]
                                  max_tokens=kwargs.pop("max_tokens", 1000), **kwargs)


def test_every_attempt_the_sdks_retries_included_reserves_a_provider_call_S4_6(
        server: Server, client: anthropic.Anthropic) -> None:
    server.queue(Reply.error(429), Reply.error(529, kind="overloaded_error"),
                 a.message("done", a.usage(10, 2)))
    with nb.budget(provider_calls=10) as run:
        reply = create(client)
    assert reply.content[0].text == "done"
    assert len(server.received) == 3
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (3, 1)


def test_a_refusal_is_not_taken_for_a_connection_error_and_retried_S4_6(
        server: Server, client: anthropic.Anthropic) -> None:
    server.queue(Reply.error(429), Reply.error(429))
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        create(client)
    assert isinstance(caught.value, anthropic.AnthropicError)
    assert not isinstance(caught.value, anthropic.APIConnectionError)
    assert len(server.received) == 2
    assert run.consumed["provider_calls"] == 2


def test_cached_input_is_input_and_charged_at_its_price(server: Server,
                                                        client: anthropic.Anthropic) -> None:
    server.queue(a.message("ok", a.usage(10, 40, cache_read=300, cache_write=50)))
    with nb.budget(cost_usd=1) as run:
        create(client)
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (400, 40)
    price = cost_usd("anthropic", MODEL, {"input_tokens": 360, "cache_read_tokens": 300,
                                          "cache_write_tokens": 50, "output_tokens": 40})
    assert price is not None and run.consumed["cost_usd"] == pytest.approx(price)


def test_max_tokens_is_clamped_to_what_remains_S2_9(server: Server,
                                                    client: anthropic.Anthropic) -> None:
    server.queue(a.message("x", a.usage(5, 70)), a.message("x", a.usage(5, 10)))
    with nb.budget(output_tokens=100):
        create(client, max_tokens=1000)
        create(client, max_tokens=1000)
    assert [b["max_tokens"] for b in server.bodies()] == [100, 30]


def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, client: anthropic.Anthropic) -> None:
    pieces = [f"{i} " for i in range(40)]
    server.queue(a.message_stream(pieces, a.usage(20, 40, cache_read=5), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(tokens=30) as run, \
            client.messages.stream(model=MODEL, max_tokens=1000, messages=ASK) as stream:
        seen.extend(stream.text_stream)
    # message_start charged 25 input and 1 output; the sixth delta would pass 30
    assert caught.value.by == "tokens"
    assert caught.value.salvage == "".join(pieces[:6])
    assert "".join(seen) == "".join(pieces[:5])
    assert run.consumed["tokens"] == 31
    server.wait_finished()
    assert server.received[0].disconnected


def test_a_whole_stream_is_charged_as_reported(server: Server,
                                               client: anthropic.Anthropic) -> None:
    server.queue(a.message_stream(["Pa", "ris"], a.usage(20, 2)))
    with nb.budget(tokens=100) as run, \
            client.messages.stream(model=MODEL, max_tokens=1000, messages=ASK) as stream:
        text = "".join(stream.text_stream)
    assert text == "Paris"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (22, 2)


def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(
        server: Server, client: anthropic.Anthropic) -> None:
    server.queue(Reply(body={}, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(time="300ms"):
        create(client)
    assert caught.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1


def test_the_async_client_is_bounded_alike(server: Server) -> None:
    async def main() -> tuple[nb.BudgetCut, nb.Budget]:
        async with anthropic.AsyncAnthropic(base_url=server.url, api_key="test",
                                            max_retries=2) as bare:
            client = nb.instrument(bare)
            server.queue(Reply.error(500, kind="api_error"), a.message("a", a.usage(10, 3)),
                         a.message_stream([f"{i}" for i in range(30)], a.usage(1, 30),
                                          event_delay=0.005))
            run = nb.budget(output_tokens=10)
            try:
                with run:
                    await client.messages.create(model=MODEL, max_tokens=1000, messages=ASK)
                    async with client.messages.stream(model=MODEL, max_tokens=1000,
                                                      messages=ASK) as stream:
                        async for _ in stream.text_stream:
                            pass
            except nb.BudgetCut as err:
                return err, run
        raise AssertionError("not cut")

    err, run = asyncio.run(main())
    assert err.by == "output_tokens" and err.salvage == "01234567"  # message_start reported one
    assert run.consumed["provider_calls"] == 3
    assert server.bodies()[-1]["max_tokens"] == 7
    server.wait_finished()
    assert server.received[-1].disconnected


def test_calls_outside_every_run_pass_through_untouched(
        server: Server, bare: anthropic.Anthropic, client: anthropic.Anthropic) -> None:
    server.queue(a.message("x", a.usage(1, 1)), a.message("x", a.usage(1, 1)))
    create(bare)
    create(client)
    assert server.received[0].body == server.received[1].body


def test_a_stream_whose_json_is_spaced_is_charged_its_usage(
        server: Server, client: anthropic.Anthropic) -> None:
    reply = a.message_stream(["Pa", "ris"], a.usage(20, 2))
    assert isinstance(reply.events, list)
    # a server that writes "type": "text_delta", with a space (test_instrument_usage cuts one)
    reply.events = [(name, json.dumps(data)) for name, data in reply.events]
    server.queue(reply)
    with nb.budget(tokens=100) as run, \
            client.messages.stream(model=MODEL, max_tokens=1000, messages=ASK) as stream:
        assert "".join(stream.text_stream) == "Paris"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (22, 2)


def test_async_tasks_sharing_one_client_get_exactly_the_limit(server: Server) -> None:
    server.default = a.message("x", a.usage(1, 1))

    async def main() -> list[str]:
        async with anthropic.AsyncAnthropic(base_url=server.url, api_key="test") as bare:
            client = nb.instrument(bare)

            async def call() -> str:
                try:
                    await client.messages.create(model=MODEL, max_tokens=10, messages=ASK)
                except nb.BudgetExceeded:
                    return "refused"
                return "sent"

            with nb.budget(provider_calls=4):
                return list(await asyncio.gather(*[call() for _ in range(12)]))

    outcomes = asyncio.run(main())
    assert outcomes.count("sent") == 4 and outcomes.count("refused") == 8
    assert len(server.received) == 4
