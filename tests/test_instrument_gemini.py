"""``nb.instrument()`` with no client bounds the calls of Google's ``google-genai`` SDK (the Gemini
API's ``generateContent`` and ``streamGenerateContent``; sync, streaming and async where it
sends through httpx2): through the real SDK against the loopback server of ``tests/wire``,
which counts the requests it receives (S2-9, S3-9, S3-10, S4-6, N-7)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import pickle
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

pytest.importorskip("google.genai")
import httpx
import httpx2
from google import genai
from google.genai import errors, types
from wire import FORMS, Reply, Server, dump
from wire import gemini_shapes as g

import nbbudget as nb
from nbbudget.integrations.models import everywhere, gemini_api
from nbbudget.run.prices import cost_usd, provider_of

MODEL = g.MODEL
ASK = "plan the trip"
PIECES = [f"w{i} " for i in range(20)]
#: google-genai sends its async calls through aiohttp where aiohttp is installed (the switch's
#: aiohttp layer: tests/test_instrument_aiohttp.py), unless it is given an httpx2 client for
#: them, as these tests do; through httpx2 otherwise
AIOHTTP = importlib.util.find_spec("aiohttp") is not None
_T = TypeVar("_T")


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=g.response("Paris.", g.usage(12, 3))) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[genai.Client]:
    with genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.url)) as made:
        yield made


def generate(client: genai.Client, **config: Any) -> Any:
    return client.models.generate_content(model=MODEL, contents=ASK, config=config or None)


def streamed(client: genai.Client, seen: list[str] | None = None, **config: Any) -> str:
    """Stream a reply; its text (each chunk's added to *seen* as it comes)."""
    seen = [] if seen is None else seen
    for chunk in client.models.generate_content_stream(model=MODEL, contents=ASK,
                                                       config=config or None):
        seen.append(chunk.text or "")
    return "".join(seen)


async def async_use(aio: Any, stream: bool, seen: list[str] | None = None) -> str:
    """One call of the async client *aio* (``client.aio``), whole or streamed, read to its
    end: its text."""
    seen = [] if seen is None else seen
    if not stream:
        reply = await aio.models.generate_content(model=MODEL, contents=ASK)
        return str(reply.text)
    async for chunk in await aio.models.generate_content_stream(model=MODEL, contents=ASK):
        seen.append(chunk.text or "")
    return "".join(seen)


async def given_async_client(stack: contextlib.AsyncExitStack, url: str) -> types.HttpOptions:
    """Options that give google-genai an async client of httpx2 (google-genai 3), or else of
    httpx (the only library it took before 3), closed with *stack*."""
    for library in (httpx2, httpx):
        http = await stack.enter_async_context(library.AsyncClient())
        try:
            return types.HttpOptions(base_url=url, httpx_async_client=http)
        except ValueError:  # pydantic's ValidationError: not a library it takes
            continue
    raise AssertionError("google-genai takes no async client of httpx2 or httpx")


def in_async_client(server: Server, work: Callable[[Any], Awaitable[_T]]) -> _T:
    """*work* of an async client of *server*, run in a new event loop: the client as the SDK
    makes it, on httpx2, or where aiohttp is installed, given an httpx2 client (`AIOHTTP`)."""
    async def main() -> _T:
        async with contextlib.AsyncExitStack() as stack:
            options = (await given_async_client(stack, server.url) if AIOHTTP
                       else types.HttpOptions(base_url=server.url))
            client = stack.enter_context(genai.Client(api_key="k", http_options=options))
            aio = await stack.enter_async_context(client.aio)
            return await work(aio)

    return asyncio.run(main())


# -- permits (S4-6) ----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_provider_calls_2_refuses_the_third_call_with_nothing_sent_S4_6(
        server: Server, switch: Any, client: genai.Client, stream: bool) -> None:
    server.default = g.stream(["Pa", "ris."], g.usage(12, 2)) if stream else server.default
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            streamed(client) if stream else generate(client)
    assert len(server.received) == 2
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (2, 2)
    assert refused.value.kind == "provider_calls"
    assert isinstance(refused.value, gemini_api.Refused)
    assert isinstance(refused.value, errors.APIError)  # the SDK's own: passed on as it is
    assert refused.value.message == str(refused.value)  # as the SDK's errors have it
    assert repr(pickle.loads(pickle.dumps(refused.value))) == repr(refused.value)


@pytest.mark.parametrize("error", ["refused", "cut"])
def test_nbbudgets_errors_are_not_retried_by_the_sdks_retry_options_S4_6(
        server: Server, switch: Any, error: str, caplog: pytest.LogCaptureFixture) -> None:
    """Given retry options, the SDK retries an ``APIError`` whose ``code`` is a status it
    retries, waiting and logging before each retry: nbbudget's errors carry none, and reach the
    caller as they were raised, after one try. The SDK's retries of the server's errors are
    attempts, each a ``provider_calls`` permit (S4-6)."""
    options = types.HttpOptions(base_url=server.url, retry_options=types.HttpRetryOptions(
        attempts=5, initial_delay=0.001, max_delay=0.002))
    server.queue(Reply(body={"error": {"code": 503, "message": "busy",
                                       "status": "UNAVAILABLE"}}, status=503),
                 g.response("Paris.", g.usage(12, 3)))
    if error == "cut":  # a reply whose usage cannot be read, under a tokens limit (N-7)
        server.queue(Reply(body={"candidates": [], "usageMetadata": {"promptTokenCount": "12"}}))
    limits = {"provider_calls": 2} if error == "refused" else {"tokens": 1000}
    caplog.set_level("INFO", logger="google_genai._api_client")
    with genai.Client(api_key="k", http_options=options) as client, \
            pytest.raises(nb.BudgetError) as caught, nb.budget(**limits) as run:
        assert generate(client).text == "Paris."  # a 503, then the retry's reply
        generate(client)
    assert type(caught.value) is (gemini_api.Refused if error == "refused" else gemini_api.Cut)
    sent = 2 if error == "refused" else 3  # the 503 and its retry, and the call cut
    assert len(server.received) == run.consumed["provider_calls"] == sent
    retries = [r for r in caplog.records if r.getMessage().startswith("Retrying")]
    assert len(retries) == 1  # the 503's


def test_an_error_status_the_sdk_does_not_retry_reaches_the_caller_near_the_deadline_S3_8(
        server: Server, switch: Any, client: genai.Client) -> None:
    """Without retry options the SDK retries nothing: a 429 with less time left than a retry's
    wait is the SDK's own error, not a cut for a wait that would not happen."""
    server.queue(Reply(body={"error": {"code": 429, "message": "slow down",
                                       "status": "RESOURCE_EXHAUSTED"}}, status=429))
    with pytest.raises(errors.ClientError) as caught, nb.budget(time="250ms"):
        generate(client)
    assert caught.value.code == 429 and not isinstance(caught.value, nb.BudgetError)
    assert len(server.received) == 1


def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(
        server: Server, switch: Any) -> None:
    """At the run's deadline the request is abandoned and the cut raises, which the SDK, even
    with retry options (it retries its HTTP library's timeouts), passes on."""
    options = types.HttpOptions(base_url=server.url, retry_options=types.HttpRetryOptions(
        attempts=3, initial_delay=0.001, max_delay=0.002))
    server.queue(Reply(body=g.response_body("late", g.usage(1, 1)), delay=5.0))
    began = time.monotonic()
    with genai.Client(api_key="k", http_options=options) as client, \
            pytest.raises(nb.BudgetCut) as caught, nb.budget(time="300ms"):
        generate(client)
    assert caught.value.by == "timeout"
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1


# -- usage, as the server reports it -----------------------------------------------------------
def test_tokens_and_cost_are_charged_as_the_server_reports_them(
        server: Server, switch: Any, client: genai.Client) -> None:
    """``promptTokenCount`` (the cached content in it) and the tools' prompt are input;
    ``candidatesTokenCount`` and ``thoughtsTokenCount`` are output; the cost is genai-prices'
    for the Gemini API's model, cached input at its cache price."""
    pytest.importorskip("genai_prices")
    server.queue(g.response("ok", g.usage(100, 20, cached=40, thoughts=10, tool_use=5)))
    with nb.budget(tokens=1000) as run:
        generate(client)
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (135, 30)
    price = cost_usd("google", MODEL, {"input_tokens": 105, "output_tokens": 30,
                                       "cache_read_tokens": 40})
    assert price is not None and run.consumed["cost_usd"] == pytest.approx(price)


def test_the_gemini_apis_provider_is_google(switch: Any) -> None:
    pytest.importorskip("genai_prices")
    assert provider_of("https://generativelanguage.googleapis.com/v1beta") == "google"
    request = httpx2.Request(
        "POST", "https://generativelanguage.googleapis.com/v1beta/models/x:generateContent")
    gate = switch.gate(request, everywhere.library("httpx2"))
    assert gate is not None and gate.provider == "google"


@pytest.mark.parametrize("form", FORMS)
def test_a_whole_replys_usage_is_read_whatever_its_json_form(
        server: Server, switch: Any, client: genai.Client, form: str) -> None:
    reply = g.response("ok", g.usage(100, 30, cached=40))
    reply.form = form
    server.queue(reply)
    with nb.budget(tokens=1000) as run:
        assert generate(client).text == "ok"
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (130, 30)


def test_a_stream_is_charged_its_final_usage(server: Server, switch: Any,
                                            client: genai.Client) -> None:
    """Each chunk reports the usage so far; the last, which says why it finished, the final
    usage (thoughts included), which is what is charged; the thoughts' text is no answer."""
    server.queue(g.stream(["Pa", "ris."], g.usage(20, 2, thoughts=7), thoughts=("hmm",)))
    with nb.budget(tokens=100) as run:
        assert streamed(client) == "Paris."
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (29, 9)


# -- the output cap (S2-9, S3-10) --------------------------------------------------------------
def test_max_output_tokens_is_clamped_to_what_remains_and_set_when_absent_S2_9(
        server: Server, switch: Any, client: genai.Client) -> None:
    server.queue(g.response("x", g.usage(5, 70)), g.response("x", g.usage(5, 10)),
                 g.stream(["x"], g.usage(5, 1)))
    with nb.budget(output_tokens=100):
        generate(client, max_output_tokens=1000, temperature=0.5)
        generate(client)  # no generationConfig at all
        streamed(client)
    configs = [body.get("generationConfig") for body in server.bodies()]
    assert configs == [{"temperature": 0.5, "maxOutputTokens": 100}, {"maxOutputTokens": 30},
                       {"maxOutputTokens": 20}]


def test_each_candidate_may_write_up_to_the_cap_S3_10(server: Server, switch: Any,
                                                     client: genai.Client) -> None:
    """``candidateCount=2`` asks two candidates, each up to ``maxOutputTokens``: the worst case
    reserved is twice one's output, so the cap is clamped twice as low."""
    pytest.importorskip("genai_prices")
    caps = []
    for count in (1, 2):
        server.received.clear()
        with nb.budget(cost_usd=0.002):
            generate(client, max_output_tokens=100_000, candidate_count=count)
        caps.append(server.bodies()[0]["generationConfig"]["maxOutputTokens"])
    assert 100 < caps[1] < 100_000 and abs(caps[0] - 2 * caps[1]) <= 2


def test_a_model_without_a_price_is_refused_unsent_under_cost_usd(
        server: Server, switch: Any, client: genai.Client) -> None:
    with pytest.raises(nb.ConfigError) as refused, nb.budget(cost_usd=1):
        client.models.generate_content(model="tunedModels/house-model-7", contents=ASK)
    assert isinstance(refused.value, gemini_api.Unpriced)
    assert isinstance(refused.value, errors.APIError)
    assert "'tunedModels/house-model-7' at provider 'google'" in str(refused.value)
    assert "nbbudget[gemini]" in str(refused.value)
    assert server.received == []


# -- streams cut at the crossing (S3-9) --------------------------------------------------------
@pytest.mark.parametrize("running", [True, False], ids=["running-usage", "final-usage-only"])
@pytest.mark.parametrize("form", FORMS)
def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, switch: Any, client: genai.Client, form: str, running: bool) -> None:
    """Under ``output_tokens=5`` the sixth piece passes the limit, whether the chunks report
    the output so far (then charged as reported) or only the last does (then each piece is
    counted as a token), in every form the server may write its JSON in (that the SDK reads:
    before 3, it read an event's data only on one line)."""
    def reply() -> Reply:
        made = g.stream(PIECES, g.usage(10, 20), event_delay=0.002, running=running)
        made.form = form
        return made

    server.queue(reply())
    try:
        assert streamed(client) == "".join(PIECES)  # outside every run: the bare SDK
    except ValueError:  # its own failure to read the JSON
        pytest.skip(f"google-genai {genai.__version__} cannot read JSON written {form}")
    server.received.clear()
    server.queue(reply())
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5) as run:
        streamed(client, seen)
    assert caught.value.by == "output_tokens"
    assert isinstance(caught.value, gemini_api.Cut) and isinstance(caught.value, errors.APIError)
    assert caught.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert (run.consumed["output_tokens"], run.consumed["tokens"]) == (6, 16)
    server.wait_finished()
    assert len(server.received) == 1 and server.received[0].disconnected


def test_a_stream_on_the_older_httpx_is_released_when_cut_S3_9(server: Server,
                                                               switch: Any) -> None:
    """httpx (before httpx2) does not close a response whose reader raised, nor does the SDK:
    the cut closes it, so its connection is dropped and nothing is left watching it."""
    server.queue(g.stream(PIECES, g.usage(10, 20), event_delay=0.01))
    seen: list[str] = []
    with httpx.Client() as http, genai.Client(api_key="k", http_options=types.HttpOptions(
            base_url=server.url, httpx_client=http)) as client, \
            pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5):
        streamed(client, seen)
    assert caught.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    server.wait_finished()
    assert server.received[0].disconnected
    assert server.received[0].events_sent < len(PIECES)


def test_a_stream_cut_after_a_continuation_checkpoint_is_not_sent_again_S3_9(
        server: Server, switch: Any, client: genai.Client) -> None:
    """The SDK resumes a stream that failed after a chunk gave it a continuation token, with
    a new request: after a cut, that request is refused unsent, and the cut reaches the
    caller."""
    reply = g.stream(PIECES, g.usage(10, 20), event_delay=0.002)
    assert isinstance(reply.events, list)
    reply.events[2][1]["candidates"][0]["continuationToken"] = base64.b64encode(b"at-3").decode()
    server.queue(reply)
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5) as run:
        streamed(client)
    assert caught.value.by == "output_tokens"
    assert run.consumed["provider_calls"] == 1
    server.wait_finished()
    assert len(server.received) == 1


def test_thoughts_are_no_part_of_the_text_counted_or_salvaged_S3_9(
        server: Server, switch: Any, client: genai.Client) -> None:
    """A thinking model's thought summaries (parts marked ``thought``) are output its usage
    reports (``thoughtsTokenCount``), not the answer's text: the stream is cut where its
    answer passes the limit, and the text salvaged is the answer's, as the SDK's ``text``."""
    server.queue(g.stream(PIECES, g.usage(10, 20, thoughts=3), thoughts=("plan ",) * 3,
                          event_delay=0.002))
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5):
        streamed(client, seen)
    assert caught.value.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])


# -- usage that cannot be read (N-7) -----------------------------------------------------------
BAD = "@bad@"  # where a bad value goes in a reply, replaced by its JSON text once written
#: a malformed count, as the JSON text the server writes, and how the error shows it
VALUES = {"a string": ('"12"', "'12'"), "NaN": ("NaN", "nan"), "1e400": ("1e400", "inf"),
          "negative": ("-5", "-5")}
CASES = [*VALUES, "not an object", "no prompt count", "missing"]
MODES = ["sync", "stream", "async", "async-stream"]


def bad_reply(case: str, stream: bool) -> tuple[Reply, str]:
    """A reply (whole or streamed, PIECES) whose final usage has *case* wrong, and what the
    error says of it."""
    used: dict[str, Any] | str | None = g.usage(10, 20)
    said = "usageMetadata.candidatesTokenCount="
    if case == "missing":
        used, said = None, "no usageMetadata"
    elif case == "not an object":
        used, said = BAD, "usageMetadata='lots'"
    elif case == "no prompt count":  # a count of 0 is left out, but a prompt has tokens
        assert isinstance(used, dict)
        del used["promptTokenCount"]
        said = "no usageMetadata.promptTokenCount"
    else:
        assert isinstance(used, dict)
        used["candidatesTokenCount"] = BAD
        said += VALUES[case][1]
    text = '"lots"' if case == "not an object" else VALUES.get(case, ("", ""))[0]

    def written(data: dict[str, Any]) -> str:
        if used is None:
            data = {key: value for key, value in data.items() if key != "usageMetadata"}
        return dump(data).replace(f'"{BAD}"', text)

    if not stream:
        return Reply(raw=written(g.response_body("ok", used or {})).encode()), said
    made = g.stream(PIECES, g.usage(10, 20))
    assert isinstance(made.events, list)
    *rest, (_, last) = made.events
    if used is None:  # a server that reports no usage at all
        events: list[tuple[str | None, Any]] = [(None, written(data)) for _, data in rest]
    else:
        events = list(rest)
    events.append((None, written({**last, "usageMetadata": used})))
    return Reply(events=events, newline="\r\n"), said


def use(mode: str, server: Server, limits: dict[str, Any] | None,
        runs: list[nb.Budget] | None = None) -> str:
    """One call in *mode*, read to its end, in a run of *limits* (None: outside every run):
    its text."""
    stream = mode.endswith("stream")

    def run() -> Any:
        made = contextlib.nullcontext() if limits is None else nb.budget(**limits)
        if runs is not None and limits is not None:
            runs.append(made)
        return made

    if not mode.startswith("async"):
        with genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.url)
                          ) as client, run():
            return streamed(client) if stream else str(generate(client).text)

    async def work(aio: Any) -> str:
        with run():
            return await async_use(aio, stream)

    return in_async_client(server, work)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_usage_that_cannot_be_read_under_a_token_limit_cuts_naming_the_field_N_7(
        server: Server, switch: Any, case: str, mode: str) -> None:
    """The error is ``Cut``: `nb.BudgetCut` and the SDK's ``APIError``, which the SDK passes
    on unchanged; exactly one request reaches the server."""
    reply, said = bad_reply(case, mode.endswith("stream"))
    server.queue(reply)
    with pytest.raises(nb.BudgetCut) as caught:
        use(mode, server, {"tokens": 10_000})
    err = caught.value
    assert isinstance(err, gemini_api.Cut) and isinstance(err, errors.APIError)
    assert err.by == "tokens"
    assert f"google reply reported {said} for {MODEL}" in str(err), str(err)
    server.wait_finished()
    assert len(server.received) == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_usage_that_cannot_be_read_without_a_token_limit_reaches_the_caller_as_bare_N_7(
        server: Server, switch: Any, case: str, mode: str) -> None:
    """Without a token or cost limit the reply reaches the caller as the bare SDK would take
    it (its text, or the SDK's own error where the bare SDK fails on it), sent once, and the
    trace marks the call unmetered."""

    def outcome(limits: dict[str, Any] | None, runs: list[nb.Budget]) -> str:
        server.queue(bad_reply(case, mode.endswith("stream"))[0])
        try:
            return use(mode, server, limits, runs)
        except Exception as err:  # the SDK's own failure on the reply (NaN is no count)
            assert not isinstance(err, nb.BudgetError)
            return type(err).__name__

    bare = outcome(None, [])  # outside every run: the bare SDK's
    runs: list[nb.Budget] = []
    assert outcome({"provider_calls": 5}, runs) == bare
    server.wait_finished()
    assert len(server.received) == 2  # the bare call's and this one's
    [marked] = [e for e in runs[0].trace.events if e.kind == "unmetered"]
    assert marked.payload["provider"] == "google" and marked.payload["usage"]


# -- outside every run -------------------------------------------------------------------------
def test_outside_every_run_the_requests_and_replies_are_the_bare_sdks_byte_for_byte(
        server: Server, client: genai.Client) -> None:
    def sent() -> list[Any]:
        server.received.clear()
        server.queue(g.response("Paris.", g.usage(12, 3)),
                     g.stream(["Pa", "ris."], g.usage(12, 2)))
        reply = generate(client, max_output_tokens=7)
        chunks = [chunk.model_dump() for chunk in client.models.generate_content_stream(
            model=MODEL, contents=ASK)]
        return [(r.path, r.raw, r.headers) for r in server.received] + [
            reply.model_dump(), chunks]

    bare = sent()
    with nb.instrument():
        switched = sent()
    assert switched == bare


# -- async, through httpx2 --------------------------------------------------------------------
def test_the_async_client_is_bounded_alike(server: Server, switch: Any) -> None:
    server.queue(g.response("a", g.usage(10, 3)),
                 g.stream(PIECES, g.usage(10, 20), event_delay=0.002))
    seen: list[str] = []

    async def work(aio: Any) -> tuple[BaseException, nb.Budget]:
        run = nb.budget(output_tokens=10, provider_calls=3)
        try:
            with run:
                await async_use(aio, False)
                await async_use(aio, True, seen)
        except nb.BudgetCut as err:
            return err, run
        raise AssertionError("not cut")

    err, run = in_async_client(server, work)
    assert isinstance(err, gemini_api.Cut) and err.by == "output_tokens"
    assert err.salvage == "".join(PIECES[:8])  # type: ignore[attr-defined]  # 3 used before
    assert "".join(seen) == "".join(PIECES[:7])
    assert run.consumed["provider_calls"] == 2
    assert server.bodies()[-1]["generationConfig"] == {"maxOutputTokens": 7}
    server.wait_finished()
    assert server.received[-1].disconnected


def test_async_calls_refused_past_provider_calls_send_nothing_S4_6(server: Server,
                                                                  switch: Any) -> None:
    async def work(aio: Any) -> list[str]:
        async def call() -> str:
            try:
                await async_use(aio, False)
            except nb.BudgetExceeded as refused:
                assert isinstance(refused, errors.APIError)
                return "refused"
            return "sent"

        with nb.budget(provider_calls=4):
            return list(await asyncio.gather(*[call() for _ in range(12)]))

    outcomes = in_async_client(server, work)
    assert outcomes.count("sent") == 4 and outcomes.count("refused") == 8
    assert len(server.received) == 4
