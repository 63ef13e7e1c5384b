"""``nb.instrument()`` with no client bounds the calls of Groq's SDK (``groq``, on the older httpx:
``chat.completions.create``, whole and streamed, sync and async, ``POST
/openai/v1/chat/completions``) by the run current when each is made: through the real SDK
against the loopback server of ``tests/wire`` speaking Groq's API (S2-9, S3-8, S3-9, S4-6,
N-7). The server's URL is given Groq as its provider (``nb.instrument(url, provider="groq")``),
as Groq's own URL has it unasked: its Chat Completions are then read as Groq's API defines
them, a stream's usage in its last chunk's ``x_groq.usage``, unasked.

The SDK retries any error raised while it sends a request (twice, after a backoff), nbbudget's
refusals and cuts among them, then raises its own ``APIConnectionError`` from the last: the
caller inside the run gets that error, nbbudget's as its ``__cause__``, and the run's block ends
with nbbudget's error. Its retries of a refusal send nothing and take no permit."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

groq = pytest.importorskip("groq")
import httpx  # noqa: E402  (the library the groq SDK is built on)
from wire import Reply, Server, dump  # noqa: E402
from wire import groq_shapes as gq  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations.models import clients, everywhere, openai_api  # noqa: E402
from nbbudget.run.prices import cost_usd, price_of  # noqa: E402

MODEL = gq.MODEL
ASK = [{"role": "user", "content": "plan the trip"}]
PIECES = [f"w{i} " for i in range(40)]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=gq.chat("Paris.", gq.usage(12, 3))) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[Any]:
    with groq.Groq(api_key="k", base_url=server.url) as made:
        yield made


@pytest.fixture
def on_groq(server: Server, switch: Any) -> Any:
    """The switch on, with the server's URL given Groq as its provider."""
    assert nb.instrument(server.url, provider="groq") is switch
    return switch


def create(client: Any, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=ASK, **kwargs)


def streamed(client: Any, seen: list[str] | None = None, **kwargs: Any) -> str:
    """A streamed reply's text, each chunk's added to *seen* as it comes."""
    seen = [] if seen is None else seen
    for chunk in create(client, stream=True, **kwargs):
        seen.extend(choice.delta.content or "" for choice in chunk.choices)
    return "".join(seen)


def used(run: nb.Budget) -> dict[str, float]:
    return {k: v for k, v in run.consumed.items() if k not in ("run_ms", "cost_usd")}


def refusals(run: nb.Budget) -> int:
    return sum(1 for e in run.trace.events if e.kind == "dispatch_refused_budget_exceeded")


# -- permits (S4-6) --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_provider_calls_2_refuses_the_third_call_with_nothing_sent_S4_6(
        server: Server, on_groq: Any, client: Any, stream: bool) -> None:
    """The caller gets the SDK's ``APIConnectionError`` raised from nbbudget's refusal, after
    the SDK's own retries (each refused too, nothing sent); the run's block ends with the
    refusal."""
    if stream:
        server.default = gq.chat_stream(["Pa", "ris."], gq.usage(12, 2))
    caught: list[BaseException] = []
    with pytest.raises(nb.BudgetExceeded) as ended, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            try:
                streamed(client) if stream else create(client)
            except groq.APIConnectionError as err:
                caught.append(err)
                raise
    assert len(server.received) == 2
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (2, 2)
    assert type(ended.value) is openai_api.Refused and ended.value.kind == "provider_calls"
    assert caught[0].__cause__ is ended.value
    assert refusals(run) == 1 + client.max_retries  # the SDK's retries, refused alike


def test_the_sdks_retry_of_a_server_error_is_one_more_provider_call_S4_6(
        server: Server, on_groq: Any, client: Any) -> None:
    """A 503 the SDK retries (after the millisecond it is told to wait): that retry is an
    attempt of the same call, one more ``provider_calls`` permit and no turn."""
    server.queue(Reply.error(503, kind="service_unavailable"))
    with nb.budget(provider_calls=5) as run:
        assert create(client).choices[0].message.content == "Paris."
    assert [r.status for r in server.received] == [503, 200]
    assert used(run) == {"provider_calls": 2, "turns": 1, "tokens": 15, "output_tokens": 3}


# -- usage, as the server reports it (S2-9) -------------------------------------------------------
def test_tokens_and_cost_are_charged_as_the_server_reports_them_S2_9(
        server: Server, on_groq: Any, client: Any) -> None:
    """A whole reply's ``usage``; a stream's in its last chunk's ``x_groq.usage``, or, where
    that chunk repeats it as ``usage``, once; the cost at genai-prices' price of the model at
    Groq."""
    server.queue(gq.chat("Paris.", gq.usage(12, 3)),
                 gq.chat_stream(["Ni", "ce."], gq.usage(20, 2)),
                 gq.chat_stream(["Ly", "on."], gq.usage(30, 4), both=True))
    with nb.budget(tokens=1000) as run:
        assert create(client).choices[0].message.content == "Paris."
        assert streamed(client) == "Nice."
        assert streamed(client) == "Lyon."
    assert used(run) == {"provider_calls": 3, "turns": 3, "tokens": 71, "output_tokens": 9}
    assert all("stream_options" not in body for body in server.bodies())
    if price_of("groq", MODEL) is None:
        return  # no genai-prices (Python 3.10), or a model it does not know
    expected = [cost_usd("groq", MODEL, {"input_tokens": i, "output_tokens": o})
                for i, o in ((12, 3), (20, 2), (30, 4))]
    assert run.consumed["cost_usd"] == pytest.approx(sum(c or 0 for c in expected))


@pytest.mark.parametrize("both", [False, True], ids=["x_groq", "x_groq-and-usage"])
def test_a_stream_reaches_the_caller_as_the_bare_sdk_reads_it_S3_9(
        server: Server, on_groq: Any, client: Any, both: bool) -> None:
    """Inside a run the stream is sent as the SDK asked it (no ``stream_options``) and every
    chunk reaches the caller as outside every run, the last with its usage."""
    def chunks() -> list[Any]:
        server.queue(gq.chat_stream(["Ni", "ce."], gq.usage(20, 2), both=both))
        return [chunk.model_dump() for chunk in create(client, stream=True)]

    bare = chunks()
    with nb.budget(tokens=1000) as run:
        assert chunks() == bare
    assert bare[-1]["x_groq"]["usage"]["completion_tokens"] == 2
    first, second = server.received
    assert first.raw == second.raw
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (22, 2)


# -- the output cap (S2-9) ------------------------------------------------------------------------
def test_the_cap_is_clamped_to_what_remains_and_made_when_absent_S2_9(
        server: Server, on_groq: Any, client: Any) -> None:
    """``max_tokens`` (deprecated by Groq, still taken) clamped where the request gives it;
    else ``max_completion_tokens`` clamped or made."""
    server.queue(gq.chat("x", gq.usage(5, 3)), gq.chat("x", gq.usage(5, 3)),
                 gq.chat_stream(["x"], gq.usage(5, 1)), gq.chat("x", gq.usage(5, 3)))
    with nb.budget(output_tokens=50) as run:
        create(client, max_tokens=4096, temperature=0.2)
        create(client)
        streamed(client)
        create(client, max_completion_tokens=20)  # below what is left: as asked
    bodies = server.bodies()
    caps = [{key: body[key] for key in ("max_tokens", "max_completion_tokens") if key in body}
            for body in bodies]
    assert caps == [{"max_tokens": 50}, {"max_completion_tokens": 47},
                    {"max_completion_tokens": 44}, {"max_completion_tokens": 20}]
    assert bodies[0]["temperature"] == 0.2
    assert run.consumed["output_tokens"] == 10


# -- streams cut at the crossing (S3-9) -----------------------------------------------------------
def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, on_groq: Any, client: Any) -> None:
    """The cut raises while the SDK reads the stream, not while it sends: it reaches the
    caller as it was raised."""
    server.queue(gq.chat_stream(PIECES, gq.usage(10, 40), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        streamed(client, seen)
    assert type(cut.value) is openai_api.Cut
    assert cut.value.by == "output_tokens"
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and answer.events_sent < answer.events_total
    assert "stream_options" not in answer.body


# -- async ----------------------------------------------------------------------------------------
def test_the_async_client_is_bounded_alike_S4_6(server: Server, on_groq: Any) -> None:
    """``AsyncGroq``: its usage charged, its cap clamped, the third call refused with nothing
    sent (the SDK's ``APIConnectionError`` from nbbudget's refusal, after its retries)."""
    async def calls(run: nb.Budget) -> BaseException:
        async with groq.AsyncGroq(api_key="k", base_url=server.url) as client:
            with run:
                for _ in range(2):
                    await client.chat.completions.create(model=MODEL, messages=ASK,
                                                         max_tokens=4096)
                try:
                    await client.chat.completions.create(model=MODEL, messages=ASK)
                except groq.APIConnectionError as err:
                    return err
        raise AssertionError("not refused")

    run = nb.budget(provider_calls=2, output_tokens=50)
    err = asyncio.run(calls(run))
    assert type(err.__cause__) is openai_api.Refused
    assert len(server.received) == 2
    assert [body["max_tokens"] for body in server.bodies()] == [50, 47]
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 30, "output_tokens": 6}


def test_an_async_stream_is_cut_at_the_crossing_S3_9(server: Server, on_groq: Any) -> None:
    async def read(seen: list[str]) -> None:
        async with groq.AsyncGroq(api_key="k", base_url=server.url) as client:
            async for chunk in await client.chat.completions.create(
                    model=MODEL, messages=ASK, stream=True):
                seen.extend(choice.delta.content or "" for choice in chunk.choices)

    server.queue(gq.chat_stream(PIECES, gq.usage(10, 40), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        asyncio.run(read(seen))
    assert type(cut.value) is openai_api.Cut and cut.value.by == "output_tokens"
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected


# -- usage that cannot be read (N-7) --------------------------------------------------------------
def test_a_stream_that_reports_no_usage_stops_a_token_limited_run_N_7(
        server: Server, on_groq: Any, client: Any) -> None:
    server.queue(gq.chat_stream(["a", "b", "c"], None))
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000) as run:
        streamed(client)
    assert cut.value.by == "tokens"
    assert f"groq reply reported no usage for {MODEL}" in str(cut.value)
    assert run.consumed["output_tokens"] == 3
    assert len(server.received) == 1


@pytest.mark.parametrize(("bad", "said"), [
    ({"prompt_tokens": 12}, "no x_groq.usage.completion_tokens"),
    ({"prompt_tokens": 12, "completion_tokens": "3"}, "x_groq.usage.completion_tokens='3'"),
    ({"prompt_tokens": -1, "completion_tokens": 3}, "x_groq.usage.prompt_tokens=-1"),
    ("lots", "x_groq.usage='lots'"),
])
def test_a_last_chunk_with_usage_missing_or_malformed_stops_the_run_naming_it_N_7(
        server: Server, on_groq: Any, client: Any, bad: Any, said: str) -> None:
    made = gq.chat_stream(["a", "b"], gq.usage(1, 1))
    assert isinstance(made.events, list)
    *rest, (_, last), done = made.events
    made.events = [*rest, (None, dump({**last, "x_groq": {"id": "req_1", "usage": bad}})),
                   done]
    server.queue(made)
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000):
        streamed(client)
    assert f"groq reply reported {said} for {MODEL}" in str(cut.value)
    assert len(server.received) == 1


def test_a_whole_reply_with_malformed_usage_is_cut_and_never_resent_N_7(
        server: Server, on_groq: Any, client: Any) -> None:
    """The cut raises while the SDK sends: the SDK retries it (each retry cut at once, nothing
    sent) and raises its own error from it; the block ends with the cut, naming the field."""
    body = {**gq.chat("ab", {}).body, "usage": {"prompt_tokens": 12, "completion_tokens": "3"}}
    server.queue(Reply(raw=dump(body).encode()))
    caught: list[BaseException] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000):
        try:
            create(client)
        except groq.APIConnectionError as err:
            caught.append(err)
            raise
    assert f"groq reply reported usage.completion_tokens='3' for {MODEL}" in str(cut.value)
    assert caught[0].__cause__ is cut.value
    assert len(server.received) == 1


def test_without_a_token_or_cost_limit_unreadable_usage_reaches_the_caller_N_7(
        server: Server, on_groq: Any, client: Any) -> None:
    server.queue(gq.chat_stream(["a", "b"], None))
    with nb.budget(provider_calls=5) as run:
        assert streamed(client) == "ab"
    event = run.trace.latest("unmetered")
    assert event is not None and event.payload["provider"] == "groq"


# -- time (S3-8) ----------------------------------------------------------------------------------
def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(
        server: Server, on_groq: Any, client: Any) -> None:
    server.queue(Reply(body=gq.chat("late", gq.usage(1, 1)).body, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="300ms") as run:
        create(client)
    assert cut.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1
    assert run.outcome is not None and run.outcome.by == "timeout"


# -- where the switch reads Groq's API -------------------------------------------------------------
@pytest.mark.parametrize("genai_prices", [True, False], ids=["resolved", "without-genai-prices"])
def test_at_groqs_url_the_switch_reads_groqs_chat_completions(
        switch: Any, monkeypatch: pytest.MonkeyPatch, genai_prices: bool) -> None:
    """Groq's URL is Groq's API, resolved by genai-prices, or known without it (Python 3.10);
    another URL is read as OpenAI's unless given Groq as its provider."""
    if not genai_prices:
        monkeypatch.setitem(sys.modules, "genai_prices", None)  # its import fails
    library = everywhere.library("httpx")
    assert library is not None
    at_groq = switch.gate(httpx.Request(
        "POST", "https://api.groq.com/openai/v1/chat/completions"), library)
    assert at_groq.provider == "groq"
    assert at_groq.api.shapes[0] is openai_api.GROQ_CHAT
    elsewhere = switch.gate(httpx.Request(
        "POST", "http://127.0.0.1:9/openai/v1/chat/completions"), library)
    assert elsewhere.api.shapes[0] is openai_api.CHAT
    assert clients.api_of("openai", "groq").shapes[0] is openai_api.GROQ_CHAT


class ToServer(httpx.HTTPTransport):
    """Sends every request to *server* whatever its URL: a client made for Groq's own URL
    talks to the stand-in server, and the switch sees the request at Groq's URL."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.target = httpx.URL(server.url)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme="http", host=self.target.host,
                                            port=self.target.port)
        return super().handle_request(request)


def test_the_sdk_at_groqs_own_url_is_read_as_groq_with_no_provider_given_S2_9(
        server: Server, switch: Any) -> None:
    """The SDK at its default URL (``https://api.groq.com``), with nothing said of the
    provider: a stream is sent as the SDK asked it, its usage read from ``x_groq.usage``, and
    priced at Groq's."""
    server.queue(gq.chat("Paris.", gq.usage(12, 3)),
                 gq.chat_stream(["Ni", "ce."], gq.usage(20, 2)))
    with httpx.Client(transport=ToServer(server)) as http, \
            groq.Groq(api_key="k", http_client=http) as client, nb.budget(tokens=1000) as run:
        create(client)
        assert streamed(client) == "Nice."
    assert all("stream_options" not in body for body in server.bodies())
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 37, "output_tokens": 5}
    if price_of("groq", MODEL) is not None:
        assert run.consumed["cost_usd"] > 0


# -- outside every run ----------------------------------------------------------------------------
def test_outside_every_run_the_requests_and_replies_are_the_bare_sdks_byte_for_byte(
        server: Server, client: Any) -> None:
    def sent() -> list[Any]:
        server.received.clear()
        server.queue(gq.chat("Paris.", gq.usage(12, 3)),
                     gq.chat_stream(["Pa", "ris."], gq.usage(12, 2)))
        reply = create(client, max_tokens=7)
        chunks = [chunk.model_dump() for chunk in create(client, stream=True)]
        return [(r.path, r.raw, r.headers) for r in server.received] + [
            reply.model_dump(), chunks]

    bare = sent()
    with nb.instrument(server.url, provider="groq"):
        switched = sent()
    assert switched == bare
    assert [path for path, _, _ in bare[:2]] == ["/openai/v1/chat/completions"] * 2
