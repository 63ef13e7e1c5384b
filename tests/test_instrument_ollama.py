"""``nb.instrument()`` with no client bounds the calls of the ``ollama`` package (Ollama's native
API, ``/api/chat`` and ``/api/generate``, on the older httpx) by the run current when each is
made: through the real package against the loopback server of ``tests/wire`` speaking Ollama's
wire format, whole replies and newline-delimited JSON streams (S2-9, S3-9, S4-6, N-7)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

ollama = pytest.importorskip("ollama")
import httpx  # noqa: E402  (the library the ollama package is built on)
from wire import FORMS, LINE_FORMS, Reply, Server  # noqa: E402
from wire import ollama_shapes as ol  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations.models import everywhere, ollama_api  # noqa: E402

ASK = [{"role": "user", "content": "plan the trip"}]
MODEL = "llama3.2"
PIECES = [f"w{i} " for i in range(40)]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=ol.chat("Paris.", ol.usage(12, 3))) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[Any]:
    client = ollama.Client(host=server.url)
    yield client
    client.close()  # before the server waits for its connections


def chat(client: Any, **kwargs: Any) -> Any:
    return client.chat(model=MODEL, messages=ASK, **kwargs)


def generate(client: Any, **kwargs: Any) -> Any:
    return client.generate(model=MODEL, prompt="plan the trip", **kwargs)


def used(run: nb.Budget) -> dict[str, float]:
    return {k: v for k, v in run.consumed.items() if k != "run_ms"}


# -- permits ---------------------------------------------------------------------------------------
def test_the_third_call_under_two_provider_calls_is_refused_with_nothing_sent_S4_6(
        server: Server, switch: Any, client: Any) -> None:
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            chat(client)
    assert len(server.received) == 2
    assert run.consumed["provider_calls"] == 2
    assert refused.value.kind == "provider_calls"
    assert isinstance(refused.value, ollama_api.Refused)  # nbbudget's, passed on unchanged
    assert run.trace.latest("dispatch_refused_budget_exceeded") is not None


def test_the_async_client_is_bounded_alike(server: Server, switch: Any) -> None:
    async def calls(run: nb.Budget) -> str:
        async with ollama.AsyncClient(host=server.url) as client:
            reply = await client.chat(model=MODEL, messages=ASK)
            with run:
                await client.chat(model=MODEL, messages=ASK)
                await client.generate(model=MODEL, prompt="plan")
                await client.chat(model=MODEL, messages=ASK)
        return str(reply.message.content)

    server.queue(ol.chat("outside", ol.usage(1, 1)), ol.chat("a", ol.usage(12, 3)),
                 ol.generate("b", ol.usage(7, 2)))
    run = nb.budget(provider_calls=2, tokens=1000)
    with pytest.raises(nb.BudgetExceeded) as refused:
        assert asyncio.run(calls(run)) == "outside"
    assert refused.value.kind == "provider_calls"
    assert len(server.received) == 3  # one outside the run, two in it
    assert used(run) == {"provider_calls": 2, "turns": 2, "tokens": 24, "output_tokens": 5}


def test_an_async_stream_is_cut_at_the_crossing_S3_9(server: Server, switch: Any) -> None:
    async def read(seen: list[str]) -> None:
        async with ollama.AsyncClient(host=server.url) as client:
            async for part in await client.chat(model=MODEL, messages=ASK, stream=True):
                seen.append(part.message.content)

    server.queue(ol.chat_stream(PIECES, ol.usage(10, 40), event_delay=0.002))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        asyncio.run(read(seen))
    assert cut.value.by == "output_tokens"
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    server.wait_finished()
    assert server.received[0].disconnected


# -- usage -----------------------------------------------------------------------------------------
def test_tokens_are_charged_as_the_server_reported_them(server: Server, switch: Any,
                                                        client: Any) -> None:
    server.queue(ol.chat("Paris.", ol.usage(12, 3)), ol.generate("Lyon.", ol.usage(20, 4)),
                 ol.chat_stream(["Ni", "ce."], ol.usage(30, 5)),
                 ol.generate_stream(["Tou", "lon."], ol.usage(40, 6)))
    with nb.budget(tokens=1000) as run:
        assert chat(client).message.content == "Paris."
        assert generate(client).response == "Lyon."
        assert "".join(p.message.content for p in chat(client, stream=True)) == "Nice."
        assert "".join(p.response for p in generate(client, stream=True)) == "Toulon."
    assert used(run) == {"provider_calls": 4, "turns": 4, "tokens": 12 + 3 + 20 + 4 + 30 + 5
                         + 40 + 6, "output_tokens": 3 + 4 + 5 + 6}
    assert [body["stream"] for body in server.bodies()] == [False, False, True, True]


@pytest.mark.parametrize("form", FORMS)
def test_a_whole_replys_usage_is_read_whatever_its_json_form(server: Server, switch: Any,
                                                             client: Any, form: str) -> None:
    for reply in (ol.chat("ok", ol.usage(12, 3)), ol.generate("ok", ol.usage(12, 3))):
        reply.form = form
        server.queue(reply)
    with nb.budget(tokens=1000) as run:
        assert chat(client).message.content == "ok"
        assert generate(client).response == "ok"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (30, 6)


@pytest.mark.parametrize("form", LINE_FORMS)
def test_a_streams_usage_and_text_are_read_whatever_its_json_form_S3_9(
        server: Server, switch: Any, client: Any, form: str) -> None:
    """Each line of the stream in one JSON form (an indented object would span lines, which
    newline-delimited JSON forbids): usage charged, and the cut at the same delta."""
    server.queue(ol.chat_stream(["a", "b"], ol.usage(10, 2), form=form),
                 ol.generate_stream(PIECES, ol.usage(10, 40), form=form, event_delay=0.002))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=7) as run:
        assert "".join(p.message.content for p in chat(client, stream=True)) == "ab"
        assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (12, 2)
        for part in generate(client, stream=True):
            seen.append(part.response)
    assert cut.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])


def test_the_reply_that_loads_a_model_uses_nothing_and_is_not_unreadable_N_7(
        server: Server, switch: Any, client: Any) -> None:
    """A chat with no messages loads the model: one object with no statistics, even when a
    stream was asked (and with no line end after it)."""
    server.queue(ol.loaded(), ol.loaded())
    with nb.budget(tokens=100) as run:
        assert client.chat(model=MODEL, messages=[]).done_reason == "load"
        assert [p.done_reason for p in client.chat(model=MODEL, messages=[], stream=True)] == [
            "load"]
    assert used(run) == {"provider_calls": 2, "turns": 2}
    assert run.outcome is not None and run.outcome.ok


# -- the output cap --------------------------------------------------------------------------------
def test_num_predict_is_clamped_to_what_output_tokens_has_left_and_created_when_absent_S2_9(
        server: Server, switch: Any, client: Any) -> None:
    server.default = ol.chat("x", ol.usage(5, 10))
    with nb.budget(output_tokens=100) as run:
        chat(client, options={"num_predict": 500, "temperature": 0})
        chat(client, options={"num_predict": 20})  # below what is left: as asked
        chat(client)  # no options: made, with what is left
        chat(client, options={"temperature": 0.5})  # options without a cap: the cap added
        chat(client, options={"num_predict": -1})  # -1: no bound, clamped as if not given
        generate(client, options=ollama.Options(num_predict=-2, seed=4))
    assert [body.get("options") for body in server.bodies()] == [
        {"num_predict": 100, "temperature": 0}, {"num_predict": 20}, {"num_predict": 80},
        {"temperature": 0.5, "num_predict": 70}, {"num_predict": 60},
        {"seed": 4, "num_predict": 50}]
    assert run.consumed["output_tokens"] == 60


def test_an_exhausted_output_grant_refuses_the_request_S2_9(server: Server, switch: Any,
                                                             client: Any) -> None:
    server.queue(ol.chat("x", ol.usage(5, 10)))
    with pytest.raises(nb.BudgetError), nb.budget(output_tokens=10):
        chat(client)
        chat(client)
    assert len(server.received) == 1


def test_with_no_output_limit_the_body_is_sent_as_it_was(server: Server, switch: Any,
                                                          client: Any) -> None:
    with nb.budget(provider_calls=5):
        chat(client, options={"num_predict": -1})
        chat(client)
    first, second = server.received
    assert first.body["options"] == {"num_predict": -1} and "options" not in second.body


# -- streams ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["chat", "generate"])
def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, switch: Any, client: Any, api: str) -> None:
    make, call, text = ((ol.chat_stream, chat, lambda p: p.message.content) if api == "chat"
                        else (ol.generate_stream, generate, lambda p: p.response))
    server.queue(make(PIECES, ol.usage(10, 40), event_delay=0.005))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=5) as run:
        for part in call(client, stream=True):
            seen.append(text(part))
    err = cut.value
    assert err.by == "output_tokens"
    assert err.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]  # the crossing one
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and answer.events_sent < answer.events_total


def test_a_stream_split_anywhere_is_read_as_whole_lines_S3_9() -> None:
    """The transport's chunks cut lines anywhere (a line in three, two lines in one): the
    package reads every object it would read bare, and the usage in the last is charged."""
    written = b"".join(ol.chat_stream(["Ni", "ce", "."], ol.usage(9, 3)).written({}))

    def send(request: httpx.Request) -> httpx.Response:
        chunks = [written[i:i + 7] for i in range(0, len(written), 7)]
        return httpx.Response(200, headers={"content-type": "application/x-ndjson"},
                              content=iter(chunks))

    def parts(client: Any) -> list[dict[str, Any]]:
        return [part.model_dump() for part in chat(client, stream=True)]

    with nb.instrument(), ollama.Client(host="http://memory",
                                        transport=httpx.MockTransport(send)) as client:
        bare = parts(client)
        with nb.budget(tokens=100) as run:
            assert parts(client) == bare
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (12, 3)


# -- usage that cannot be read (N-7) ---------------------------------------------------------------
def test_a_stream_that_ends_without_its_last_object_stops_a_token_limited_run_N_7(
        server: Server, switch: Any, client: Any) -> None:
    server.queue(ol.chat_stream(["a", "b", "c"], None))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000) as run:
        for part in chat(client, stream=True):
            seen.append(part.message.content)
    assert cut.value.by == "tokens"
    assert "ollama reply reported no usage for llama3.2" in str(cut.value)
    assert cut.value.salvage == "abc"  # type: ignore[attr-defined]
    assert run.consumed["output_tokens"] == 3  # what was counted is charged
    assert len(server.received) == 1  # never resent


@pytest.mark.parametrize(("bad", "said"), [
    ({"prompt_eval_count": 12}, "no eval_count"),
    ({"prompt_eval_count": 12, "eval_count": "3"}, "eval_count='3'"),
    ({"prompt_eval_count": -1, "eval_count": 3}, "prompt_eval_count=-1"),
])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_last_object_with_counts_missing_or_malformed_stops_the_run_naming_them_N_7(
        server: Server, switch: Any, client: Any, bad: dict[str, Any], said: str,
        streamed: bool) -> None:
    server.queue(ol.chat_stream(["a", "b"], bad) if streamed else ol.chat("ab", bad))
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=1000):
        reply = chat(client, stream=streamed)
        if streamed:
            list(reply)
    assert cut.value.by == "output_tokens"
    assert f"reported {said} for llama3.2" in str(cut.value)
    assert cut.value.salvage == "ab"  # type: ignore[attr-defined]
    assert len(server.received) == 1


def test_without_a_token_or_cost_limit_unreadable_usage_reaches_the_caller_N_7(
        server: Server, switch: Any, client: Any) -> None:
    server.queue(ol.chat_stream(["a", "b"], None))
    with nb.budget(provider_calls=5) as run:
        assert "".join(p.message.content for p in chat(client, stream=True)) == "ab"
    event = run.trace.latest("unmetered")
    assert event is not None and event.payload["provider"] == "ollama"


# -- prices, time, errors --------------------------------------------------------------------------
def test_under_cost_usd_an_ollama_model_is_refused_before_it_is_sent_N_7(
        server: Server, switch: Any, client: Any) -> None:
    """A local model has no price in genai-prices: with cost_usd armed the call is refused,
    nothing sent, naming the model and how to price the calls to its server."""
    with pytest.raises(nb.ConfigError, match=r"model 'llama3\.2' at provider 'ollama'.*"
                       r"nb\.instrument\('<base URL>', prices=") as refused, nb.budget(cost_usd=1):
        chat(client)
    assert isinstance(refused.value, ollama_api.Unpriced)
    assert server.received == []


def test_the_calls_to_a_server_priced_free_go_through_under_cost_usd(
        server: Server, switch: Any, client: Any) -> None:
    """``nb.instrument(url, prices="free")``: the calls to that server cost nothing; a call to
    another server stays unpriced; undo forgets the price."""
    assert nb.instrument(server.url, prices="free") is switch
    with nb.budget(cost_usd=1, provider_calls=5) as run:
        assert chat(client).message.content == "Paris."
    assert (run.consumed["provider_calls"], run.consumed.get("cost_usd", 0)) == (1, 0)
    with Server(default=ol.chat("Lyon.", ol.usage(12, 3))) as other, \
            ollama.Client(host=other.url) as elsewhere, pytest.raises(nb.ConfigError), \
            nb.budget(cost_usd=1):
        chat(elsewhere)
    assert other.received == []


def test_the_calls_to_a_server_are_charged_at_the_prices_given(server: Server,
                                                                client: Any) -> None:
    with nb.instrument(f"{server.url}/", prices={"input": 2.0, "output": 10.0}) as on:
        with nb.budget(cost_usd=1) as run:
            chat(client)  # 12 input and 3 output tokens
        assert run.consumed["cost_usd"] == pytest.approx((12 * 2.0 + 3 * 10.0) / 1e6)
        on.undo()
        with pytest.raises(nb.ConfigError), nb.budget(cost_usd=1):  # off: the price is gone,
            nb.instrument()  # and on again the call is unpriced
            chat(client)
        nb.instrument().undo()


@pytest.mark.parametrize("options, named", [({}, "give prices= .* or provider="),
                                            ({"prices": "gratis"}, "gratis"),
                                            ({"prices": "free", "degrade": ("m", 0.5)},
                                             "takes prices= and provider= only")])
def test_pricing_a_server_names_what_is_wrong(options: dict[str, Any], named: str) -> None:
    with pytest.raises(nb.ConfigError, match=named):
        nb.instrument("http://localhost:11434", **options)
    assert everywhere.installed() is None  # a call that failed left the switch off
    switch = nb.instrument()
    assert switch.endpoints == {}
    switch.undo()


def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(server: Server, switch: Any,
                                                              client: Any) -> None:
    server.queue(Reply(body={}, delay=5.0))
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="300ms") as run:
        chat(client)
    assert cut.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert run.outcome is not None and run.outcome.by == "timeout"


def test_an_error_status_is_the_packages_own_error_as_it_never_retries(
        server: Server, switch: Any, client: Any) -> None:
    """A 503 (Ollama's queue is full) with less time left than an SDK's backoff: the ollama
    package would not wait to retry, so the run goes on and the caller gets its error."""
    server.queue(Reply(body={"error": "server busy, please try again"}, status=503))
    with pytest.raises(ollama.ResponseError) as caught, nb.budget(time="200ms") as run:
        chat(client)
    assert caught.value.status_code == 503
    assert run.consumed["provider_calls"] == 1
    assert run.outcome is not None and run.outcome.by is None


# -- outside every run -----------------------------------------------------------------------------
def test_outside_every_run_requests_and_replies_are_the_bare_packages_byte_for_byte(
        server: Server) -> None:
    def sent() -> list[Any]:
        server.received.clear()
        server.queue(ol.chat("Paris.", ol.usage(12, 3)), ol.chat_stream(["a", "b"],
                                                                         ol.usage(3, 2)),
                     ol.generate_stream(["c"], ol.usage(3, 1)))
        with ollama.Client(host=server.url) as client:
            replies = [chat(client, options={"num_predict": -1}).model_dump(),
                       [p.model_dump() for p in chat(client, stream=True)],
                       [p.model_dump() for p in generate(client, stream=True)]]
        return [(r.raw, r.headers) for r in server.received] + replies

    bare = sent()
    with nb.instrument():
        switched = sent()
    assert switched == bare
    assert json.loads(bare[0][0])["options"] == {"num_predict": -1}
