"""``nb.instrument()`` with no client bounds the calls of Mistral's SDK (``mistralai``, on httpx2:
``chat.complete`` and ``chat.stream``, sync and async, ``POST /v1/chat/completions``) by the run
current when each is made: through the real SDK against the loopback server of ``tests/wire``
speaking Mistral's API (S2-9, S3-8, S3-9, S4-6, N-7). The server's URL is given Mistral as its
provider (``nb.instrument(url, provider="mistral")``), as Mistral's own URL has it unasked: its
Chat Completions are then read as Mistral's API defines them, which refuses every field it does
not define (OpenAI's ``max_completion_tokens`` and ``stream_options`` among them)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mistralai.client")
import httpx2
from mistralai.client import Mistral, errors, utils
from wire import Reply, Server, dump
from wire import mistral_shapes as ms

import nbbudget as nb
from nbbudget.integrations.models import clients, everywhere, openai_api
from nbbudget.run.prices import cost_usd, price_of

MODEL = ms.MODEL
ASK = [{"role": "user", "content": "plan the trip"}]
PIECES = [f"w{i} " for i in range(40)]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=ms.chat("Paris.", ms.usage(12, 3))) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[Mistral]:
    with Mistral(api_key="k", server_url=server.url) as made:
        yield made


@pytest.fixture
def mistral(server: Server, switch: Any) -> Any:
    """The switch on, with the server's URL given Mistral as its provider."""
    assert nb.instrument(server.url, provider="mistral") is switch
    return switch


def complete(client: Mistral, **kwargs: Any) -> Any:
    return client.chat.complete(model=MODEL, messages=ASK, **kwargs)


def streamed(client: Mistral, seen: list[str] | None = None, **kwargs: Any) -> str:
    """A streamed reply's text, each chunk's added to *seen* as it comes."""
    seen = [] if seen is None else seen
    for event in client.chat.stream(model=MODEL, messages=ASK, **kwargs):
        seen.extend(str(choice.delta.content or "") for choice in event.data.choices)
    return "".join(seen)


async def async_streamed(client: Mistral, seen: list[str]) -> str:
    async for event in await client.chat.stream_async(
            model=MODEL, messages=ASK):
        seen.extend(str(choice.delta.content or "") for choice in event.data.choices)
    return "".join(seen)


def used(run: nb.Budget) -> dict[str, float]:
    return {k: v for k, v in run.consumed.items() if k not in ("run_ms", "cost_usd")}


def undefined(body: dict[str, Any]) -> set[str]:
    """The fields of *body* that Mistral's API does not define (it refuses them with 422)."""
    return set(body) - ms.FIELDS


# -- permits (S4-6) --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_provider_calls_2_refuses_the_third_call_with_nothing_sent_S4_6(
        server: Server, mistral: Any, client: Mistral, stream: bool) -> None:
    """The SDK passes nbbudget's refusal to the caller as it was raised, unwrapped."""
    if stream:
        server.default = ms.chat_stream(["Pa", "ris."], ms.usage(12, 2))
    with nb.budget(provider_calls=2) as run:
        for _ in range(2):
            streamed(client) if stream else complete(client)
        with pytest.raises(nb.BudgetExceeded) as refused:
            streamed(client) if stream else complete(client)
    assert len(server.received) == 2
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (2, 2)
    assert type(refused.value) is openai_api.Refused
    assert refused.value.kind == "provider_calls"
    assert run.trace.latest("dispatch_refused_budget_exceeded") is not None


@pytest.mark.parametrize("limits", [{}, {"output_tokens": 100}], ids=["as-sent", "clamped"])
def test_the_sdks_retries_are_attempts_and_its_refusal_is_not_retried_S4_6(
        server: Server, mistral: Any, limits: dict[str, Any]) -> None:
    """Given a retry configuration, the SDK retries a 503 by sending the same request again:
    that retry is one more ``provider_calls`` permit (no turn), and its reply is charged,
    whether the request went as the SDK wrote it or with its cap clamped. nbbudget's refusal
    it passes on at once, unretried and unwrapped."""
    backoff = utils.BackoffStrategy(1, 2, 1.1, 5_000, jitter_ms=0)
    retries = utils.RetryConfig("backoff", backoff, True)
    server.queue(Reply(body={"object": "error", "message": "busy"}, status=503))
    began = time.monotonic()
    with Mistral(api_key="k", server_url=server.url, retry_config=retries) as client, \
            nb.budget(provider_calls=2, **limits) as run:
        assert complete(client).choices[0].message.content == "Paris."  # a 503, then 200
        assert used(run) == {"provider_calls": 2, "turns": 1, "tokens": 15, "output_tokens": 3}
        with pytest.raises(nb.BudgetExceeded) as refused:
            complete(client)
    assert type(refused.value) is openai_api.Refused
    assert [r.status for r in server.received] == [503, 200]
    assert time.monotonic() - began < 2.0  # no backoff waited for the refusal


# -- usage, as the server reports it (S2-9) -------------------------------------------------------
def test_tokens_and_cost_are_charged_as_the_server_reports_them_S2_9(
        server: Server, mistral: Any, client: Mistral) -> None:
    """A whole reply's ``usage``, and a stream's, reported unasked in its last chunk; the cost
    at genai-prices' price of the model at Mistral."""
    server.queue(ms.chat("Paris.", ms.usage(12, 3)), ms.chat_stream(["Ni", "ce."],
                                                                    ms.usage(20, 2)))
    with nb.budget(tokens=1000) as run:
        assert complete(client).choices[0].message.content == "Paris."
        assert streamed(client) == "Nice."
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 37, "output_tokens": 5}
    first, second = server.bodies()
    assert first["stream"] is False and second["stream"] is True
    assert undefined(first) == undefined(second) == set()  # no stream_options asked
    if price_of("mistral", MODEL) is None:
        return  # no genai-prices installed, or a model it does not know
    expected = [cost_usd("mistral", MODEL, {"input_tokens": i, "output_tokens": o})
                for i, o in ((12, 3), (20, 2))]
    assert run.consumed["cost_usd"] == pytest.approx(sum(c or 0 for c in expected))


def test_a_stream_reaches_the_caller_as_the_bare_sdk_reads_it_S3_9(
        server: Server, mistral: Any, client: Mistral) -> None:
    """Inside a run the stream is sent as the SDK asked it and every chunk reaches the caller,
    the last with its usage, as outside every run."""
    def chunks() -> list[Any]:
        server.queue(ms.chat_stream(["Ni", "ce."], ms.usage(20, 2)))
        return [event.model_dump() for event in client.chat.stream(
            model=MODEL, messages=ASK)]

    bare = chunks()
    with nb.budget(tokens=1000) as run:
        assert chunks() == bare
    assert bare[-1]["data"]["usage"]["completion_tokens"] == 2
    first, second = server.received
    assert first.raw == second.raw
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (22, 2)


# -- the output cap (S2-9) ------------------------------------------------------------------------
def test_max_tokens_is_clamped_to_what_remains_and_made_when_absent_S2_9(
        server: Server, mistral: Any, client: Mistral) -> None:
    """Mistral's cap is ``max_tokens``, the only one its API takes: clamped where given, made
    where not; never OpenAI's ``max_completion_tokens``."""
    server.queue(ms.chat("x", ms.usage(5, 3)), ms.chat("x", ms.usage(5, 3)),
                 ms.chat_stream(["x"], ms.usage(5, 1)))
    with nb.budget(output_tokens=50) as run:
        complete(client, max_tokens=4096, temperature=0.2)
        complete(client)
        streamed(client)
    bodies = server.bodies()
    assert [body.get("max_tokens") for body in bodies] == [50, 47, 44]
    assert bodies[0]["temperature"] == 0.2
    assert [undefined(body) for body in bodies] == [set(), set(), set()]
    assert run.consumed["output_tokens"] == 7


def test_with_no_output_limit_the_body_is_sent_as_the_sdk_wrote_it(
        server: Server, mistral: Any, client: Mistral) -> None:
    with nb.budget(provider_calls=5):
        complete(client, max_tokens=4096)
        complete(client)
    first, second = server.bodies()
    assert first["max_tokens"] == 4096 and "max_tokens" not in second


# -- streams cut at the crossing (S3-9) -----------------------------------------------------------
def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, mistral: Any, client: Mistral) -> None:
    server.queue(ms.chat_stream(PIECES, ms.usage(10, 40), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        streamed(client, seen)
    assert type(cut.value) is openai_api.Cut  # the SDK passes it on as it was raised
    assert cut.value.by == "output_tokens"
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and answer.events_sent < answer.events_total
    assert undefined(answer.body) == set()  # sent as Mistral's API takes it


# -- async ----------------------------------------------------------------------------------------
def test_the_async_client_is_bounded_alike_S4_6(server: Server, mistral: Any) -> None:
    """``complete_async``: refused past ``provider_calls`` with nothing sent, its usage
    charged, its cap clamped."""
    async def calls(run: nb.Budget) -> BaseException:
        async with Mistral(api_key="k", server_url=server.url) as client:
            with run:
                for _ in range(2):
                    await client.chat.complete_async(
                        model=MODEL, messages=ASK, max_tokens=4096)
                try:
                    await client.chat.complete_async(
                        model=MODEL, messages=ASK)
                except nb.BudgetExceeded as refused:
                    return refused
        raise AssertionError("not refused")

    run = nb.budget(provider_calls=2, output_tokens=50)
    refused = asyncio.run(calls(run))
    assert type(refused) is openai_api.Refused and refused.kind == "provider_calls"
    assert len(server.received) == 2
    assert [body["max_tokens"] for body in server.bodies()] == [50, 47]
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 30, "output_tokens": 6}


def test_an_async_stream_is_cut_at_the_crossing_S3_9(server: Server, mistral: Any) -> None:
    async def read(seen: list[str]) -> str:
        async with Mistral(api_key="k", server_url=server.url) as client:
            return await async_streamed(client, seen)

    server.queue(ms.chat_stream(PIECES, ms.usage(10, 40), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        asyncio.run(read(seen))
    assert type(cut.value) is openai_api.Cut and cut.value.by == "output_tokens"
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and undefined(answer.body) == set()


# -- usage that cannot be read (N-7) --------------------------------------------------------------
def test_a_stream_that_reports_no_usage_stops_a_token_limited_run_N_7(
        server: Server, mistral: Any, client: Mistral) -> None:
    """A last chunk without ``usage`` (Mistral's reference makes it optional): what was
    counted is charged, then the run is cut, naming what is missing."""
    server.queue(ms.chat_stream(["a", "b", "c"], None))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000) as run:
        streamed(client, seen)
    assert cut.value.by == "tokens"
    assert f"mistral reply reported no usage for {MODEL}" in str(cut.value)
    assert run.consumed["output_tokens"] == 3
    assert len(server.received) == 1


@pytest.mark.parametrize(("bad", "said"), [
    ({"prompt_tokens": 12}, "no usage.completion_tokens"),
    ({"prompt_tokens": 12, "completion_tokens": "3"}, "usage.completion_tokens='3'"),
    ({"prompt_tokens": -1, "completion_tokens": 3}, "usage.prompt_tokens=-1"),
])
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_usage_with_counts_missing_or_malformed_stops_the_run_naming_them_N_7(
        server: Server, mistral: Any, bad: dict[str, Any], said: str, stream: bool) -> None:
    """Written as raw JSON: the SDK's own model would take a missing count for 0. With a
    ``tokens`` limit nbbudget cuts instead, naming the field; sent once."""
    if stream:
        made = ms.chat_stream(["a", "b"], ms.usage(1, 1))
        assert isinstance(made.events, list)
        *rest, (_, last), done = made.events
        made.events = [*rest, (None, dump({**last, "usage": bad})), done]
        server.queue(made)
    else:
        server.queue(Reply(raw=dump({**ms.chat("ab", {}).body, "usage": bad}).encode()))
    with Mistral(api_key="k", server_url=server.url) as client, \
            pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000):
        streamed(client) if stream else complete(client)
    assert f"mistral reply reported {said} for {MODEL}" in str(cut.value)
    assert len(server.received) == 1


def test_without_a_token_or_cost_limit_unreadable_usage_reaches_the_caller_N_7(
        server: Server, mistral: Any, client: Mistral) -> None:
    server.queue(ms.chat_stream(["a", "b"], None))
    with nb.budget(provider_calls=5) as run:
        assert streamed(client) == "ab"
    event = run.trace.latest("unmetered")
    assert event is not None and event.payload["provider"] == "mistral"


# -- time (S3-8) ----------------------------------------------------------------------------------
def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(
        server: Server, mistral: Any, client: Mistral) -> None:
    server.queue(Reply(body=ms.chat("late", ms.usage(1, 1)).body, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="300ms"):
        complete(client)
    assert cut.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1


def test_an_error_status_is_the_sdks_own_error_as_it_retries_nothing_S3_8(
        server: Server, mistral: Any, client: Mistral) -> None:
    """Without a retry configuration the SDK retries nothing: a 429 with less time left than
    an SDK's backoff is the SDK's own error, not a cut for a wait that would not happen."""
    server.queue(Reply(body={"object": "error", "message": "slow down"}, status=429))
    with pytest.raises(errors.SDKError) as caught, nb.budget(time="250ms") as run:
        complete(client)
    assert caught.value.status_code == 429
    assert run.outcome is not None and run.outcome.by is None


# -- where the switch reads Mistral's API ---------------------------------------------------------
@pytest.mark.parametrize("genai_prices", [True, False], ids=["resolved", "without-genai-prices"])
def test_at_mistrals_url_the_switch_reads_mistrals_chat_completions(
        switch: Any, monkeypatch: pytest.MonkeyPatch, genai_prices: bool) -> None:
    """Mistral's URL is Mistral's API, resolved by genai-prices, or known without it (which
    needs Python 3.11, as the mistralai SDK does: another client at that URL may be on 3.10);
    another URL is read as OpenAI's unless given Mistral as its provider."""
    if not genai_prices:
        monkeypatch.setitem(sys.modules, "genai_prices", None)  # its import fails
    library = everywhere.library("httpx2")
    assert library is not None
    at_mistral = switch.gate(httpx2.Request(
        "POST", "https://api.mistral.ai/v1/chat/completions"), library)
    assert at_mistral.provider == "mistral"
    assert at_mistral.api.shapes == (openai_api.MISTRAL_CHAT, openai_api.EMBEDDINGS)
    elsewhere = switch.gate(httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions"),
                            library)
    assert elsewhere.api.shapes[0] is openai_api.CHAT
    assert clients.api_of("openai", "mistral").shapes == (openai_api.MISTRAL_CHAT,
                                                          openai_api.EMBEDDINGS)


class ToServer(httpx2.HTTPTransport):
    """Sends every request to *server* whatever its URL: a client made for Mistral's own URL
    talks to the stand-in server, and the switch sees the request at Mistral's URL."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.target = httpx2.URL(server.url)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.url = request.url.copy_with(scheme="http", host=self.target.host,
                                            port=self.target.port)
        return super().handle_request(request)


def test_the_sdk_at_mistrals_own_url_is_read_as_mistral_with_no_provider_given_S2_9(
        server: Server, switch: Any) -> None:
    """The SDK at its default URL (``https://api.mistral.ai``), with nothing said of the
    provider: its requests are sent as Mistral's API takes them, and priced at Mistral's."""
    server.queue(ms.chat("Paris.", ms.usage(12, 3)),
                 ms.chat_stream(["Ni", "ce."], ms.usage(20, 2)))
    with httpx2.Client(transport=ToServer(server)) as http, \
            Mistral(api_key="k", client=http) as client, nb.budget(output_tokens=50) as run:
        complete(client)
        assert streamed(client) == "Nice."
    assert [undefined(body) for body in server.bodies()] == [set(), set()]
    assert [body["max_tokens"] for body in server.bodies()] == [50, 47]
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 37, "output_tokens": 5}
    if price_of("mistral", MODEL) is not None:
        assert run.consumed["cost_usd"] > 0


def test_an_instrumented_openai_client_at_mistrals_url_is_read_as_mistral_S2_9(
        server: Server) -> None:
    """``nb.instrument(client)`` of an OpenAI client whose base URL is Mistral's: its
    requests are sent as Mistral's API takes them, a stream's usage read from its last
    chunk."""
    openai = pytest.importorskip("openai")
    server.queue(ms.chat_stream(["Ni", "ce."], ms.usage(20, 2)))
    with httpx2.Client(transport=ToServer(server)) as http, openai.OpenAI(
            base_url="https://api.mistral.ai/v1", api_key="k", http_client=http,
            max_retries=0) as bare, nb.budget(output_tokens=50) as run:
        chunks = list(nb.instrument(bare).chat.completions.create(
            model=MODEL, messages=ASK, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Nice."
    (body,) = server.bodies()
    assert undefined(body) == set() and body["max_tokens"] == 50
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (22, 2)


def test_a_model_without_a_price_is_refused_unsent_under_cost_usd(
        server: Server, mistral: Any, client: Mistral) -> None:
    with pytest.raises(nb.ConfigError) as refused, nb.budget(cost_usd=1):
        client.chat.complete(model="ft:house-model-7", messages=ASK)
    assert isinstance(refused.value, openai_api.Unpriced)
    assert "'ft:house-model-7' at provider 'mistral'" in str(refused.value)
    assert "nbbudget[mistral]" in str(refused.value)
    assert server.received == []


# -- outside every run ----------------------------------------------------------------------------
def test_outside_every_run_the_requests_and_replies_are_the_bare_sdks_byte_for_byte(
        server: Server, client: Mistral) -> None:
    def sent() -> list[Any]:
        server.received.clear()
        server.queue(ms.chat("Paris.", ms.usage(12, 3)),
                     ms.chat_stream(["Pa", "ris."], ms.usage(12, 2)))
        reply = complete(client, max_tokens=7)
        chunks = [event.model_dump() for event in client.chat.stream(
            model=MODEL, messages=ASK)]
        return [(r.path, r.raw, r.headers) for r in server.received] + [
            reply.model_dump(), chunks]

    bare = sent()
    with nb.instrument(server.url, provider="mistral"):
        switched = sent()
    assert switched == bare
    assert [path for path, _, _ in bare[:2]] == ["/v1/chat/completions"] * 2
