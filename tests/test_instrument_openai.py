"""``nb.instrument`` on the OpenAI SDK (Chat Completions and Responses), through the real SDK
against a local server speaking OpenAI's wire format, asserting what the server received
(S2-9, S3-3, S3-7, S3-8, S3-9, S4-6)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
import httpx2
import openai  # after the skip
from wire import Reply, Server
from wire import openai_shapes as o

import nbbudget as nb
from nbbudget.run.prices import cost_usd

ASK = [{"role": "user", "content": "plan the trip"}]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server


@pytest.fixture
def bare(server: Server) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=server.url, api_key="test", max_retries=3)
    yield client
    client.close()


@pytest.fixture
def client(bare: openai.OpenAI) -> openai.OpenAI:
    return nb.instrument(bare)


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=kwargs.pop("model", "gpt-4o"), messages=ASK,
                                          **kwargs)


def test_every_attempt_the_sdks_retries_included_reserves_a_provider_call_S4_6(
        server: Server, client: openai.OpenAI) -> None:
    server.queue(Reply.error(429), Reply.error(500, kind="server_error"),
                 o.chat("done", o.chat_usage(10, 2)))
    with nb.budget(provider_calls=10) as run:
        reply = chat(client)
    assert reply.choices[0].message.content == "done"
    assert len(server.received) == 3
    assert [r.headers["x-stainless-retry-count"] for r in server.received] == ["0", "1", "2"]
    assert run.consumed["provider_calls"] == 3
    assert run.consumed["turns"] == 1  # one call


def test_a_first_attempt_is_told_from_a_retry_by_its_header_where_httpx2_keeps_it_S4_6(
        server: Server) -> None:
    """The gate reads the SDK's retry header in place, in httpx2's own list of (raw key,
    lower-case key, value) triples, as it is cheaper than a copy (`Headers.raw`): should httpx2
    keep it otherwise, the header is looked up instead, correct but slower, and this fails."""
    seen: list[Any] = []
    server.queue(Reply.error(500, kind="server_error"), o.chat("done", o.chat_usage(3, 1)))
    with httpx2.Client(event_hooks={"request": [seen.append]}) as http, openai.OpenAI(
            base_url=server.url, api_key="test", http_client=http, max_retries=1) as bare, \
            nb.budget(provider_calls=5) as run:
        chat(nb.instrument(bare))
    first = (b"x-stainless-retry-count", b"x-stainless-retry-count", b"0")
    assert [first in request.headers._list for request in seen] == [True, False]
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (2, 1)


def test_a_refused_attempt_sends_nothing_and_raises_BudgetExceeded_S4_6(
        server: Server, client: openai.OpenAI) -> None:
    server.queue(Reply.error(429), Reply.error(429), o.chat("never", o.chat_usage(1, 1)))
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        chat(client)
    assert caught.value.kind == "provider_calls"
    assert isinstance(caught.value, openai.OpenAIError)  # the SDK passed it on, unretried
    assert len(server.received) == 2
    assert run.consumed["provider_calls"] == 2
    assert run.trace.latest("dispatch_refused_budget_exceeded") is not None


def test_a_calls_first_attempt_takes_its_turn_and_its_permit_both_or_neither(
        server: Server, client: openai.OpenAI) -> None:
    server.queue(Reply.error(429), o.chat("one", o.chat_usage(1, 1)))
    with pytest.raises(nb.BudgetExceeded) as caught, nb.budget(provider_calls=2) as run:
        chat(client)  # two attempts, one turn
        chat(client)  # refused before it is sent: no turn taken either
    assert caught.value.kind == "provider_calls"
    assert len(server.received) == 2
    assert (run.consumed["turns"], run.consumed["provider_calls"]) == (1, 2)


def test_chat_usage_is_charged_with_cached_input_and_reasoning_output(
        server: Server, client: openai.OpenAI) -> None:
    server.queue(o.chat("ok", o.chat_usage(100, 30, cached=40, reasoning=20)))
    with nb.budget(cost_usd=1.0) as run:
        chat(client)
    price = cost_usd("openai", "gpt-4o", {"input_tokens": 100, "cache_read_tokens": 40,
                                          "output_tokens": 30})
    assert price is not None
    assert run.consumed["tokens"] == 130
    assert run.consumed["output_tokens"] == 30
    assert run.consumed["cost_usd"] == pytest.approx(price)
    assert price == pytest.approx(60 * 2.5e-6 + 40 * 1.25e-6 + 30 * 1e-5)


@pytest.mark.parametrize("spacing", [
    {"separators": (",", ":")},  # compact
    {},  # json.dumps' default, ": " after a key
    {"indent": 2},  # pretty-printed, as OpenAI's own replies come
    {"separators": (" , ", " :  ")},  # white space before the colon too
])
def test_a_replys_usage_is_read_whatever_its_json_spacing(
        server: Server, client: openai.OpenAI, spacing: dict[str, Any]) -> None:
    reply = o.chat("ok", o.chat_usage(100, 30, cached=40))
    server.queue(Reply(raw=json.dumps(reply.body, **spacing).encode()))
    with nb.budget(cost_usd=1.0) as run:
        assert chat(client).usage.prompt_tokens == 100
    price = cost_usd("openai", "gpt-4o", {"input_tokens": 100, "cache_read_tokens": 40,
                                          "output_tokens": 30})
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (130, 30)
    assert run.consumed["cost_usd"] == pytest.approx(price)


def test_a_request_body_with_white_space_around_it_is_still_bounded(
        server: Server, client: openai.OpenAI) -> None:
    """A body the SDK did not serialise itself (``client.post`` with bytes) is read all the
    same: the request is reserved and clamped like any other."""
    server.queue(o.chat("ok", o.chat_usage(10, 3)))
    body = json.dumps({"model": "gpt-4o", "messages": ASK, "max_completion_tokens": 500})
    with nb.budget(output_tokens=40, provider_calls=5) as run:
        client.post("/chat/completions", cast_to=openai.types.chat.ChatCompletion,
                    content=f"  {body}\n".encode(),
                    options={"headers": {"content-type": "application/json"}})
    assert server.received[0].body["max_completion_tokens"] == 40  # clamped (S2-9)
    assert run.consumed["provider_calls"] == 1
    assert run.consumed["output_tokens"] == 3


def test_responses_usage_is_charged_in_its_own_shape(server: Server,
                                                     client: openai.OpenAI) -> None:
    server.queue(o.response("ok", o.response_usage(200, 50, cached=100, reasoning=30)))
    with nb.budget(tokens=10_000) as run:
        reply = client.responses.create(model="gpt-4o", input="plan the trip")
    assert reply.output_text == "ok"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (250, 50)
    assert run.consumed["cost_usd"] == pytest.approx(cost_usd(
        "openai", "gpt-4o", {"input_tokens": 200, "cache_read_tokens": 100,
                             "output_tokens": 50}))


def test_prices_per_million_tokens_or_a_function_of_the_usage(server: Server,
                                                              bare: openai.OpenAI) -> None:
    server.queue(o.chat("a", o.chat_usage(1000, 500)), o.chat("b", o.chat_usage(1000, 500)))
    per_million = nb.instrument(bare, prices={"input": 2.0, "output": 8.0})
    seen: list[dict[str, int]] = []

    def price(usage: Any) -> float:
        seen.append(dict(usage))
        return 0.25

    by_function = nb.instrument(bare, prices=price)
    with nb.budget(cost_usd=10) as run:
        chat(per_million, model="house-model")
        first = run.consumed["cost_usd"]
        chat(by_function, model="house-model")
    assert first == pytest.approx(1000 * 2e-6 + 500 * 8e-6)
    assert run.consumed["cost_usd"] == pytest.approx(first + 0.25)
    # the reply's usage, after the request's worst case was priced with it (S3-10)
    assert seen[-1] == {"input_tokens": 1000, "output_tokens": 500, "cache_read_tokens": 0}
    assert all(usage["input_tokens"] > 1000 for usage in seen[:-1]) and len(seen) > 1


def test_an_unpriced_model_with_cost_limited_is_refused_before_sending(
        server: Server, client: openai.OpenAI) -> None:
    with pytest.raises(nb.ConfigError, match=r"'house-model'.*prices="), \
            nb.budget(cost_usd=1):
        chat(client, model="house-model")
    assert server.received == []
    with nb.budget(tokens=100):  # no cost limit: an unknown price is no matter
        server.queue(o.chat("ok", o.chat_usage(1, 1)))
        chat(client, model="house-model")


def test_the_output_cap_is_clamped_in_the_field_each_api_takes_S2_9(
        server: Server, client: openai.OpenAI) -> None:
    server.queue(*[o.chat("x", o.chat_usage(5, 10))] * 3,
                 o.response("x", o.response_usage(5, 10)))
    with nb.budget(output_tokens=50) as run:
        chat(client, max_completion_tokens=100)
        chat(client, max_tokens=100)  # the older field, kept
        chat(client)  # no cap asked: what remains
        client.responses.create(model="gpt-4o", input="x", max_output_tokens=10)
    bodies = server.bodies()
    assert bodies[0]["max_completion_tokens"] == 50
    assert bodies[1]["max_tokens"] == 40 and "max_completion_tokens" not in bodies[1]
    assert bodies[2]["max_completion_tokens"] == 30
    assert bodies[3]["max_output_tokens"] == 10
    assert run.consumed["output_tokens"] == 40


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_body_changed_keeps_its_headers_with_the_new_length(
        stream: bool) -> None:
    """A clamped cap (and, for a stream, the usage asked for) makes a new request: every
    header the SDK set is kept, with one length, the new body's, and a stream is asked for
    uncompressed."""
    sent: list[httpx2.Request] = []

    def send(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        if stream:
            return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                                   content=iter(_events(["a"], asked=True)))
        return httpx2.Response(200, json=o.chat("a", o.chat_usage(3, 1)).body)

    with httpx2.Client(transport=httpx2.MockTransport(send)) as http, openai.OpenAI(
            base_url="http://memory", api_key="k", http_client=http) as bare, \
            nb.budget(output_tokens=50):
        for client in (bare, nb.instrument(bare)):
            reply = chat(client, max_completion_tokens=100, stream=stream)
            if stream:
                list(reply)
    before, after = sent
    assert json.loads(after.content)["max_completion_tokens"] == 50
    assert after.headers.get_list("content-length") == [str(len(after.content))]
    assert after.headers.get_list("accept-encoding") == (
        ["identity"] if stream else before.headers.get_list("accept-encoding"))
    kept = {key: value for key, value in before.headers.items()
            if key not in ("content-length", "accept-encoding")}
    assert {key: after.headers[key] for key in kept} == kept


def test_an_exhausted_output_grant_refuses_the_request(server: Server,
                                                       client: openai.OpenAI) -> None:
    server.queue(o.chat("x", o.chat_usage(5, 10)))
    with pytest.raises(nb.BudgetError), nb.budget(output_tokens=10):
        chat(client)
        chat(client)
    assert len(server.received) == 1


def test_a_stream_reports_its_usage_and_the_caller_sees_the_chunks_it_asked_for(
        server: Server, bare: openai.OpenAI, client: openai.OpenAI) -> None:
    server.queue(*[o.chat_stream(["Par", "is"], o.chat_usage(12, 2))] * 2)
    with nb.budget(tokens=100) as run:
        chunks = list(chat(client, stream=True))
        bare_chunks = list(chat(bare, stream=True))
    assert server.bodies()[0]["stream_options"] == {"include_usage": True}
    assert "stream_options" not in server.bodies()[1]
    # neither the usage chunk nor the "usage": null of every other chunk reaches the caller
    assert [c.model_dump(exclude_unset=True) for c in chunks] == [
        c.model_dump(exclude_unset=True) for c in bare_chunks]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Paris"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (14, 2)


def test_a_caller_who_asks_for_usage_gets_the_usage_chunk(server: Server,
                                                          client: openai.OpenAI) -> None:
    server.queue(o.chat_stream(["a"], o.chat_usage(3, 1)))
    with nb.budget(tokens=100):
        chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 1


def test_a_chat_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, client: openai.OpenAI) -> None:
    pieces = [f"w{i} " for i in range(40)]
    server.queue(o.chat_stream(pieces, o.chat_usage(10, 40), event_delay=0.005))
    received: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5) as run:
        for chunk in chat(client, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    err = caught.value
    assert err.by == "output_tokens"
    assert err.salvage == "".join(pieces[:6])  # the crossing delta included
    assert "".join(received) == "".join(pieces[:5])
    assert run.consumed["output_tokens"] == 6
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and answer.events_sent < answer.events_total


def _events(pieces: list[str], asked: bool) -> list[bytes]:
    """The bytes of a streamed chat completion of *pieces*, an event each, as the server
    writes them (usage asked or not)."""
    body = {"stream_options": {"include_usage": True}} if asked else {}
    return o.chat_stream(pieces, o.chat_usage(3, len(pieces))).written(body)


@pytest.mark.parametrize("limit", [1, 6, 17, 29])
@pytest.mark.parametrize("per_chunk", [1, 3])
@pytest.mark.parametrize("usage_at", [None, 12])
def test_a_stream_counted_lazily_is_cut_at_the_event_a_count_of_each_chunk_gives_S3_9(
        limit: int, per_chunk: int, usage_at: int | None) -> None:
    """The meter counts text deltas only once the bytes since its last count could hold
    enough of them to pass the limit; the stream is cut in the chunk where the deltas first
    pass it, as when every chunk is counted. The chunks are the transport's, *per_chunk*
    events each (the role chunk's empty text is no delta); with *usage_at*, an event there
    reports usage so far (2 output tokens), charged while deltas wait uncounted."""
    pieces = [f"w{i} " for i in range(40)]
    events = _events(pieces, asked=True)
    if usage_at is not None:
        usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": "gpt-4o-mini", "choices": [], "usage": o.chat_usage(3, 2)}
        events.insert(usage_at, f"data: {json.dumps(usage, separators=(',', ':'))}\n\n"
                      .encode())
        pieces.insert(usage_at - 1, "")  # no text, where the caller's chunks are counted
    chunks = [b"".join(events[i:i + per_chunk]) for i in range(0, len(events), per_chunk)]
    # the reference: the first chunk whose deltas, with those before it, pass the limit
    deltas, crossing = 0, None
    for at, chunk in enumerate(chunks):
        deltas += chunk.count(b'"content":"') - chunk.count(b'"content":""')
        if deltas > limit:
            crossing = at
            break
    assert crossing is not None

    def send(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=iter(chunks))

    received: list[str] = []
    with httpx2.Client(transport=httpx2.MockTransport(send)) as http, openai.OpenAI(
            base_url="http://memory", api_key="k", http_client=http) as bare, \
            pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=limit) as run:
        for chunk in chat(nb.instrument(bare), stream=True):
            received.append(chunk.choices[0].delta.content or "")
    before = sum(len(chunk.split(b"\n\n")) - 1 for chunk in chunks[:crossing]) - 1
    assert "".join(received) == "".join(pieces[:max(before, 0)])
    assert caught.value.by == "output_tokens"
    assert run.consumed["output_tokens"] == deltas


@pytest.mark.parametrize("per_chunk", [1, 2, 3, 5])
def test_the_usage_a_caller_did_not_ask_for_is_charged_and_kept_from_it_however_events_arrive(
        per_chunk: int) -> None:
    """Events arrive *per_chunk* to a chunk of the transport, so that the usage event comes
    alone or beside text events (which carry ``"usage":null``): it is charged and kept from the
    caller, and every other event reaches it as the bare SDK reads it."""
    pieces = ["Par", "is", " is", " far"]

    def chunked(events: list[bytes]) -> list[bytes]:
        return [b"".join(events[i:i + per_chunk]) for i in range(0, len(events), per_chunk)]

    def send(request: httpx2.Request) -> httpx2.Response:
        asked = "stream_options" in json.loads(request.content)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=iter(chunked(_events(pieces, asked))))

    with httpx2.Client(transport=httpx2.MockTransport(send)) as http, openai.OpenAI(
            base_url="http://memory", api_key="k", http_client=http) as bare, \
            nb.budget(tokens=100) as run:
        chunks = list(chat(nb.instrument(bare), stream=True))
        bare_chunks = list(chat(bare, stream=True))
    assert [c.model_dump(exclude_unset=True) for c in chunks] == [
        c.model_dump(exclude_unset=True) for c in bare_chunks]
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (3 + 4, 4)


def test_an_empty_text_delta_counts_no_token_S3_9(server: Server, client: openai.OpenAI) -> None:
    server.queue(o.chat_stream(["a", "", "b"], o.chat_usage(3, 2), event_delay=0.002))
    with nb.budget(output_tokens=2) as run:
        text = "".join(c.choices[0].delta.content or "" for c in chat(client, stream=True)
                       if c.choices)
    assert text == "ab"
    assert run.consumed["output_tokens"] == 2
    assert run.outcome is not None and run.outcome.ok


def test_a_responses_stream_is_cut_by_cost_S3_9(server: Server, bare: openai.OpenAI) -> None:
    client = nb.instrument(bare, prices={"input": 0, "output": 1_000_000})  # $1 a token
    pieces = [f"{i}," for i in range(40)]
    server.queue(o.response_stream(pieces, o.response_usage(5, 40), event_delay=0.005))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(cost_usd=3.5) as run:
        for _ in client.responses.create(model="gpt-4o", input="count", stream=True):
            pass
    assert caught.value.by == "cost_usd"
    assert caught.value.salvage == "0,1,2,3,"
    assert run.consumed["cost_usd"] == pytest.approx(4.0)
    server.wait_finished()
    assert server.received[0].disconnected


def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(server: Server,
                                                              client: openai.OpenAI) -> None:
    server.queue(Reply(body={}, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(time="300ms") as run:
        chat(client)
    assert caught.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1  # not retried as an HTTP timeout
    assert run.outcome is not None and run.outcome.by == "timeout"


def test_a_stream_stops_at_the_runs_deadline_S3_8(server: Server,
                                                  client: openai.OpenAI) -> None:
    server.queue(o.chat_stream([f"{i}" for i in range(100)], o.chat_usage(1, 100),
                               event_delay=0.02))
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(time="300ms"):
        for _ in chat(client, stream=True):
            pass
    assert caught.value.by == "timeout"
    assert caught.value.salvage  # what came before the deadline
    server.wait_finished()
    assert server.received[0].disconnected


def test_degrade_switches_the_model_one_way_and_is_recorded_S3_7(
        server: Server, bare: openai.OpenAI) -> None:
    client = nb.instrument(bare, prices={"input": 0, "output": 10_000},  # 1 c a token
                           degrade=("gpt-4o-mini", 0.5))
    server.queue(*[o.chat("x", o.chat_usage(1, 30))] * 3)
    with nb.budget(cost_usd=1.0) as run:
        chat(client)  # 0.30: below half
        chat(client)  # 0.60: past half, degraded from here on
        chat(client)
    assert [b["model"] for b in server.bodies()] == ["gpt-4o", "gpt-4o", "gpt-4o-mini"]
    assert run.outcome is not None and run.outcome.degraded == {
        "from": "gpt-4o", "to": "gpt-4o-mini", "reason": "budget"}
    assert run.trace.latest("degraded") is not None


def test_degrade_without_a_cost_limit_reads_the_most_used_limit(
        server: Server, bare: openai.OpenAI) -> None:
    client = nb.instrument(bare, degrade=("gpt-4o-mini", 0.5))
    server.queue(*[o.chat("x", o.chat_usage(1, 1))] * 3)
    with nb.budget(provider_calls=4, tokens=1000) as run:
        for _ in range(3):
            chat(client)
    assert [b["model"] for b in server.bodies()] == ["gpt-4o", "gpt-4o", "gpt-4o-mini"]
    assert run.outcome is not None and run.outcome.degraded is not None


def test_calls_outside_every_run_pass_through_untouched(server: Server, bare: openai.OpenAI,
                                                        client: openai.OpenAI) -> None:
    server.queue(*[o.chat_stream(["a"], o.chat_usage(1, 1))] * 2)
    list(chat(bare, stream=True, max_completion_tokens=99))
    list(chat(client, stream=True, max_completion_tokens=99))
    first, second = server.received
    assert first.body == second.body and "stream_options" not in second.body
    assert bare._client is not client._client  # the passed client is left as it was
    assert type(client) is type(bare)


def test_threads_sharing_one_client_get_exactly_the_limit(server: Server,
                                                          client: openai.OpenAI) -> None:
    server.default = o.chat("x", o.chat_usage(1, 1))
    outcomes: list[str] = []
    lock = threading.Lock()
    with nb.budget(provider_calls=7) as run:
        def work() -> None:
            for _ in range(5):
                try:
                    chat(client)
                    result = "sent"
                except nb.BudgetExceeded:
                    result = "refused"
                with lock:
                    outcomes.append(result)

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work,),
                                    name=f"caller-{i}") for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert outcomes.count("sent") == 7 and outcomes.count("refused") == 13
    assert len(server.received) == 7
    assert run.consumed["provider_calls"] == 7


def test_the_async_client_is_bounded_alike(server: Server) -> None:
    async def main() -> tuple[Any, Any]:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="test",
                                      max_retries=2) as bare:
            client = nb.instrument(bare)
            server.queue(Reply.error(429), o.chat("a", o.chat_usage(10, 3)),
                         o.chat_stream([f"{i}" for i in range(30)], o.chat_usage(1, 30),
                                       event_delay=0.005))
            run = nb.budget(output_tokens=8)
            try:
                with run:
                    reply = await client.chat.completions.create(model="gpt-4o",
                                                                 messages=ASK)
                    async for _ in await client.chat.completions.create(
                            model="gpt-4o", messages=ASK, stream=True):
                        pass
            except nb.BudgetCut as err:
                return reply, (err, run)
        raise AssertionError("not cut")

    reply, (err, run) = asyncio.run(main())
    assert reply.choices[0].message.content == "a"
    assert err.by == "output_tokens" and err.salvage == "012345"
    assert run.consumed["provider_calls"] == 3
    assert server.bodies()[-1]["max_completion_tokens"] == 5
    server.wait_finished()
    assert server.received[-1].disconnected


def test_bad_options_are_refused_at_once(bare: openai.OpenAI) -> None:
    with pytest.raises(nb.ConfigError, match="degrade="):
        nb.instrument(bare, degrade=("gpt-4o-mini", 1.5))
    with pytest.raises(nb.ConfigError, match="prices="):
        nb.instrument(bare, prices={"input": -1, "output": 1})
    with pytest.raises(nb.ConfigError, match="instrumented already"):
        nb.instrument(nb.instrument(bare))
    with pytest.raises(nb.ConfigError, match=r"takes an openai\.OpenAI"):
        nb.instrument(object())


def test_the_guardrail_bounds_a_request_that_never_answers_S3_8(
        server: Server, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbbudget.integrations.models import clients

    monkeypatch.setattr(clients, "GUARDRAIL_MS", 300)  # one hour by default
    server.queue(Reply(body={}, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(provider_calls=5) as run:
        chat(client)
    assert caught.value.by == "guardrail"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1
    event = run.trace.latest("cut")
    assert event is not None and event.payload["code"] == "guardrail_timeout"


@pytest.mark.parametrize("limits", [{"output_tokens": 1000}, {"provider_calls": 5}],
                         ids=["a-token-limit", "no-token-limit"])
def test_a_stream_left_early_is_charged_what_it_counted(server: Server, client: openai.OpenAI,
                                                        limits: dict[str, int]) -> None:
    server.queue(o.chat_stream([f"{i} " for i in range(40)], o.chat_usage(5, 40),
                               event_delay=0.005))
    with nb.budget(**limits) as run:
        stream = chat(client, stream=True)
        for seen, _ in enumerate(stream):
            if seen == 3:
                break
        stream.close()
    assert 3 <= run.consumed["output_tokens"] < 40  # the deltas received, no usage reported
    assert run.consumed["tokens"] == run.consumed["output_tokens"]  # no input reported
    server.wait_finished()
    assert server.received[0].disconnected


def test_without_genai_prices_a_limited_cost_asks_for_it_or_for_prices(
        server: Server, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # as on Python 3.10
    with pytest.raises(nb.ConfigError, match=r"not installed.*nbbudget\[openai\].*prices="), \
            nb.budget(cost_usd=1):
        chat(client, model="gpt-4o-2024-05-13")
    assert server.received == []
    server.queue(o.chat("ok", o.chat_usage(10, 2)))
    with nb.budget(tokens=100) as run:  # no cost limit: tokens are counted, cost is not
        chat(client, model="gpt-4o-2024-05-13")
    assert run.consumed["tokens"] == 12 and "cost_usd" not in run.consumed
