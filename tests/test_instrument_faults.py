"""``nb.instrument`` when things go wrong: many threads and tasks on one client as a limit is
passed, streams that end early (left by the caller, dropped by the network, ended without their
usage), replies that trickle in, and the SDKs' own waits before a retry; then a fault test of
every kind at once. Through the real OpenAI and Anthropic SDKs against the servers of
tests/wire, which count what they receive (S2-4, S3-3, S3-8, S3-9, S4-6, N-7)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")
import anthropic  # after the skips
import openai
from wire import Received, Reply, Server
from wire import anthropic_shapes as a
from wire import openai_shapes as o

import nbbudget as nb

ASK = [{"role": "user", "content": "plan the trip"}]
CLAUDE = "claude-3-5-haiku-latest"
#: one cent an output token, input free: a reply of 10 output tokens costs 0.10
PRICES = {"input": 0, "output": 10_000}
SDKS = {"openai": (openai.OpenAI, openai.AsyncOpenAI, openai.OpenAIError),
        "anthropic": (anthropic.Anthropic, anthropic.AsyncAnthropic, anthropic.AnthropicError)}


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server
        for client in _made:  # before the server waits for their connections to close
            client.close()
        _made.clear()


_made: list[Any] = []


def _client(sdk: str, server: Server, *, retries: int = 2, **options: Any) -> Any:
    made = SDKS[sdk][0](base_url=server.url, api_key="k", max_retries=retries)
    _made.append(made)
    return nb.instrument(made, **options)


def _reply(sdk: str, stream: bool, pieces: int = 10, delay: float = 0.0) -> Reply:
    """A reply of *pieces* text deltas and as many output tokens, one input token."""
    texts = [f"w{i} " for i in range(pieces)]
    if sdk == "openai":
        if stream:
            return o.chat_stream(texts, o.chat_usage(1, pieces), event_delay=delay)
        return o.chat("".join(texts), o.chat_usage(1, pieces))
    if stream:
        return a.message_stream(texts, a.usage(1, pieces), event_delay=delay)
    return a.message("".join(texts), a.usage(1, pieces))


def _call(client: Any, sdk: str, stream: bool) -> str:
    """One model call, its text read whole."""
    if sdk == "openai":
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="gpt-4o", messages=ASK, stream=True) if c.choices)
        return str(client.chat.completions.create(model="gpt-4o", messages=ASK)
                   .choices[0].message.content)
    if stream:
        with client.messages.stream(model=CLAUDE, max_tokens=100, messages=ASK) as events:
            return "".join(events.text_stream)
    return str(client.messages.create(model=CLAUDE, max_tokens=100, messages=ASK).content[0].text)


async def _acall(client: Any, sdk: str, stream: bool) -> str:
    """`_call` on an async client."""
    if sdk == "openai":
        if stream:
            return "".join([c.choices[0].delta.content or "" async for c in
                            await client.chat.completions.create(model="gpt-4o", messages=ASK,
                                                                 stream=True) if c.choices])
        reply = await client.chat.completions.create(model="gpt-4o", messages=ASK)
        return str(reply.choices[0].message.content)
    if stream:
        async with client.messages.stream(model=CLAUDE, max_tokens=100, messages=ASK) as events:
            return "".join([text async for text in events.text_stream])
    reply = await client.messages.create(model=CLAUDE, max_tokens=100, messages=ASK)
    return str(reply.content[0].text)


def _outcome(err: BaseException | None, sdk: str) -> str:
    """What reached a caller: ``ok``, the public error's name, or ``raw`` and the type of an
    error that should never reach one (nbbudget's ``Unwind``, a connection error)."""
    if err is None:
        return "ok"
    if isinstance(err, nb.BudgetError) and isinstance(err, SDKS[sdk][2]):
        return type(err).__name__
    return f"raw {type(err).__module__}.{type(err).__qualname__}"


def _in_threads(work: Callable[[], None], n: int, name: str) -> None:
    """Run *work* in *n* named threads, each in a copy of this context (the run current);
    wait for every one to end."""
    ended = [threading.Event() for _ in range(n)]

    def body(done: threading.Event) -> None:
        try:
            work()
        finally:
            done.set()

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(body, ended[i]),
                                name=f"{name}-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for done in ended:
        assert done.wait(30), "a caller thread did not end"


# -- every thread and task a cut reaches gets the public error -------------------------------
@pytest.mark.parametrize("sdk", list(SDKS))
def test_threads_sharing_a_client_as_tokens_are_passed_all_get_the_public_error_S3_3(
        server: Server, sdk: str) -> None:
    """Tokens are charged as replies report them (cost is reserved first, S3-10, and so is
    never passed while replies keep to their reservation): replies in flight together pass
    the limit, and every thread gets the API's Cut or Refused, never nbbudget's Unwind."""
    client = _client(sdk, server)
    lock = threading.Lock()
    for round_ in range(20):
        stream = bool(round_ % 2)
        server.default = _reply(sdk, stream, delay=0.001)
        seen: collections.Counter[str] = collections.Counter()

        def work(stream: bool = stream, seen: collections.Counter[str] = seen) -> None:
            for _ in range(3):
                err: BaseException | None = None
                try:
                    _call(client, sdk, stream)
                except BaseException as caught:  # what reached the caller
                    err = caught
                with lock:
                    seen[_outcome(err, sdk)] += 1

        # preempt=False: the block waits for its threads, whose tallies are read after it
        with pytest.raises(nb.BudgetCut), nb.budget(tokens=110, preempt=False) as run:
            _in_threads(work, 16, "caller")
        assert not [kind for kind in seen if kind.startswith("raw")], (round_, seen)
        assert seen["ok"] <= 10 and seen["ok"] + seen["Cut"] + seen["Refused"] == 48
        assert run.consumed["tokens"] <= 110 + 16 * 11  # each reply in flight passes it once


@pytest.mark.parametrize("sdk", list(SDKS))
def test_tasks_sharing_an_async_client_as_tokens_are_passed_all_get_the_public_error_S3_3(
        server: Server, sdk: str) -> None:
    async def rounds() -> list[collections.Counter[str]]:
        async with SDKS[sdk][1](base_url=server.url, api_key="k", max_retries=2) as bare:
            client = nb.instrument(bare)
            return [await one_round(client, bool(round_ % 2)) for round_ in range(20)]

    async def one_round(client: Any, stream: bool) -> collections.Counter[str]:
        server.default = _reply(sdk, stream, delay=0.001)
        seen: collections.Counter[str] = collections.Counter()

        async def work() -> None:
            for _ in range(2):
                err: BaseException | None = None
                try:
                    await _acall(client, sdk, stream)
                except Exception as caught:  # what reached the caller
                    err = caught
                except BaseException as caught:
                    seen[_outcome(caught, sdk)] += 1
                    raise
                seen[_outcome(err, sdk)] += 1

        with pytest.raises(nb.BudgetCut):
            async with nb.budget(tokens=110):
                await asyncio.gather(*[work() for _ in range(16)])
        return seen

    for round_, seen in enumerate(asyncio.run(rounds())):
        assert not [kind for kind in seen if kind.startswith("raw")], (round_, seen)
        assert seen["ok"] <= 10 and seen["ok"] + seen["Cut"] + seen["Refused"] == 32


# -- a stream that ends early is charged what arrived ----------------------------------------
#: each API: its SDK, its stream of 40 deltas (input 7, output 40), and how a caller opens it
#: (sync and async) and tells a text event
STREAMS: dict[str, tuple[str, Callable[..., Reply], Callable[[Any], Any], Callable[[Any], Any],
                         Callable[[Any], bool]]] = {
    "chat": ("openai",
             lambda **kw: o.chat_stream([f"w{i} " for i in range(40)], o.chat_usage(7, 40), **kw),
             lambda c: c.chat.completions.create(model="gpt-4o", messages=ASK, stream=True),
             lambda c: c.chat.completions.create(model="gpt-4o", messages=ASK, stream=True),
             lambda e: bool(e.choices and e.choices[0].delta.content)),
    "responses": ("openai",
                  lambda **kw: o.response_stream([f"w{i} " for i in range(40)],
                                                 o.response_usage(7, 40), **kw),
                  lambda c: c.responses.create(model="gpt-4o", input="plan", stream=True),
                  lambda c: c.responses.create(model="gpt-4o", input="plan", stream=True),
                  lambda e: e.type == "response.output_text.delta"),
    "messages": ("anthropic",
                 lambda **kw: a.message_stream([f"w{i} " for i in range(40)], a.usage(7, 40),
                                               **kw),
                 lambda c: c.messages.create(model=CLAUDE, max_tokens=1000, messages=ASK,
                                             stream=True),
                 lambda c: c.messages.create(model=CLAUDE, max_tokens=1000, messages=ASK,
                                             stream=True),
                 lambda e: e.type == "content_block_delta"),
}
#: the input a stream's API reports before its text (Anthropic's message_start), else 0
INPUT_FIRST = {"chat": 0, "responses": 0, "messages": 7}


def _leave_after(events: Any, is_text: Callable[[Any], bool], n: int) -> None:
    seen = 0
    for event in events:
        seen += is_text(event)
        if seen == n:
            break


async def _aleave_after(events: Any, is_text: Callable[[Any], bool], n: int) -> None:
    seen = 0
    async for event in events:
        seen += is_text(event)
        if seen == n:
            break


@pytest.mark.parametrize("how", ["closed", "kept"])
@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_left_with_break_is_charged_what_arrived_by_the_blocks_end_S3_9(
        server: Server, api: str, how: str) -> None:
    sdk, reply, opened, _, is_text = STREAMS[api]
    server.queue(reply())
    client = _client(sdk, server)
    with nb.budget(tokens=10_000) as run:
        events = opened(client)
        _leave_after(events, is_text, 15)
        if how == "closed":
            events.close()
        kept = events  # as a notebook's variable keeps it: nothing closes it
    assert 15 <= run.consumed["output_tokens"] < 40
    assert run.consumed["tokens"] == run.consumed["output_tokens"] + INPUT_FIRST[api]
    kept.close()  # its reply's socket is watched until then (S3-8)


@pytest.mark.parametrize("how", ["closed", "kept"])
@pytest.mark.parametrize("api", list(STREAMS))
def test_an_async_stream_left_with_break_is_charged_what_arrived_by_the_blocks_end_S3_9(
        server: Server, api: str, how: str) -> None:
    sdk, reply, _, opened, is_text = STREAMS[api]
    server.queue(reply())

    async def main() -> dict[str, float]:
        async with SDKS[sdk][1](base_url=server.url, api_key="k") as bare:
            client = nb.instrument(bare)
            async with nb.budget(tokens=10_000) as run:
                events = await opened(client)
                await _aleave_after(events, is_text, 15)
                if how == "closed":
                    await events.close()
            consumed = dict(run.consumed)  # before the loop's end closes what is left open
            await events.close()
            return consumed

    consumed = asyncio.run(main())
    assert 15 <= consumed["output_tokens"] < 40
    assert consumed["tokens"] == consumed["output_tokens"] + INPUT_FIRST[api]


@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_whose_connection_drops_is_charged_what_arrived_S3_9(server: Server,
                                                                      api: str) -> None:
    sdk, reply, opened, _, is_text = STREAMS[api]
    server.queue(dataclasses.replace(reply(), drop=25))  # its 25th event never comes
    client = _client(sdk, server)
    seen = 0
    with pytest.raises(SDKS[sdk][2]) as caught, nb.budget(tokens=10_000) as run:
        for event in opened(client):
            seen += is_text(event)
    assert not isinstance(caught.value, nb.BudgetError)  # the SDK's own, as without nbbudget
    assert seen >= 15 and run.consumed["output_tokens"] >= seen
    assert run.consumed["tokens"] == run.consumed["output_tokens"] + INPUT_FIRST[api]
    assert len(server.received) == 1  # a stream is not sent again


@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_that_ends_without_its_usage_is_charged_what_arrived_N_7(server: Server,
                                                                         api: str) -> None:
    sdk, reply, opened, _, is_text = STREAMS[api]
    whole = reply()
    body = {"stream": True, "stream_options": {"include_usage": True}}
    events = whole.events(body) if callable(whole.events) else whole.events
    assert events is not None
    kept = [(name, data) for name, data in events if not (
        isinstance(data, dict) and (data.get("usage") or data.get("type") in (
            "message_delta", "response.completed")))]
    server.queue(Reply(events=kept))
    client = _client(sdk, server)
    seen = 0
    with nb.budget(provider_calls=5) as run:  # no token limit: the stream reaches its end
        for event in opened(client):
            seen += is_text(event)
    assert seen == 40
    assert run.consumed["output_tokens"] == 40
    assert run.consumed["tokens"] == 40 + INPUT_FIRST[api]
    assert run.trace.latest("unmetered") is not None


# -- the run's time bounds the whole request (S3-8) ------------------------------------------
def _timed_call(sdk: str, client: Any, stream: bool, on_thread: bool) -> tuple[Any, float]:
    """Call once under ``time="1s"`` on this thread or another: what was raised, and after how
    long."""
    box: dict[str, Any] = {}

    def call() -> None:
        began = time.monotonic()
        try:
            with nb.budget(time="1s"):
                _call(client, sdk, stream)
        except BaseException as err:  # what reached the caller
            box["err"] = err
        box["took"] = time.monotonic() - began

    if on_thread:
        _in_threads(call, 1, "timed")
    else:
        call()
    return box.get("err"), box["took"]


@pytest.mark.parametrize("on_thread", [False, True], ids=["main-thread", "other-thread"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("sdk", list(SDKS))
def test_a_reply_that_trickles_in_is_cut_at_the_runs_deadline_S3_8(
        server: Server, sdk: str, stream: bool, on_thread: bool) -> None:
    reply = _reply(sdk, stream, pieces=200)
    reply.trickle = 0.01  # a byte every 10 ms: each read well within its timeout
    server.queue(reply)
    err, took = _timed_call(sdk, _client(sdk, server), stream, on_thread)
    assert isinstance(err, nb.BudgetCut) and isinstance(err, SDKS[sdk][2]), err
    assert err.by == "timeout"
    assert took < 1.5
    assert len(server.received) == 1


@pytest.mark.parametrize("header", [("retry-after", "5"), ("retry-after-ms", "5000"), None],
                         ids=["retry-after", "retry-after-ms", "backoff"])
@pytest.mark.parametrize("sdk", list(SDKS))
def test_a_wait_before_a_retry_past_the_deadline_is_a_cut_at_once_S3_8(
        server: Server, sdk: str, header: tuple[str, str] | None) -> None:
    error = Reply.error(429)
    error.headers = dict([header]) if header else {}
    server.queue(error, _reply(sdk, False))
    client = _client(sdk, server, retries=3)
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(
            time="1s" if header else "200ms") as run:
        _call(client, sdk, False)
    assert isinstance(caught.value, SDKS[sdk][2]) and caught.value.by == "timeout"
    assert time.monotonic() - began < 0.5
    assert len(server.received) == 1  # not retried
    assert run.consumed["provider_calls"] == 1
    assert run.outcome is not None and run.outcome.by == "timeout"


@pytest.mark.parametrize("sdk", list(SDKS))
def test_a_wait_before_a_retry_within_the_deadline_is_the_sdks_own_S4_6(
        server: Server, sdk: str) -> None:
    error = Reply.error(429)
    error.headers = {"retry-after-ms": "100"}
    server.queue(error, _reply(sdk, False))
    with nb.budget(time="2s") as run:
        _call(_client(sdk, server), sdk, False)
    assert len(server.received) == 2 and run.consumed["provider_calls"] == 2


@pytest.mark.parametrize("sdk", list(SDKS))
def test_the_guardrail_bounds_a_reply_that_trickles_in_without_a_time_limit_S3_8(
        server: Server, sdk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbbudget.integrations.models import clients

    monkeypatch.setattr(clients, "GUARDRAIL_MS", 500)  # one hour by default
    reply = _reply(sdk, False, pieces=200)
    reply.trickle = 0.01
    server.queue(reply)
    began = time.monotonic()
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(provider_calls=3):
        _call(_client(sdk, server), sdk, False)
    assert caught.value.by == "guardrail"
    assert time.monotonic() - began < 1.2
    assert len(server.received) == 1


# -- every fault at once ----------------------------------------------------------------------
FAULTS = ("429", "5xx", "dropped", "trickled", "bad usage", "good")


def _faulty(sdk: str, seed: int) -> Callable[[Received], Reply]:
    """A server's answer to each attempt, picked at random (seeded) among `FAULTS`."""
    pick = random.Random(seed)
    lock = threading.Lock()

    def answer(received: Received) -> Reply:
        stream = bool((received.body or {}).get("stream"))
        with lock:
            fault = pick.choice(FAULTS)
            wait = pick.choice(["0.01", "5"])
        if fault == "429":
            return Reply(body={"error": {"message": "slow down"}}, status=429,
                         headers={"retry-after": wait})
        if fault == "5xx":
            return Reply(body={"error": {"message": "oops"}}, status=503)
        reply = _reply(sdk, stream, pieces=8)
        if fault == "dropped":
            reply.drop = 5 if stream else 20
        elif fault == "trickled":
            reply.trickle = 0.002
        elif fault == "bad usage":
            reply.body = reply.body and {**reply.body, "usage": {"prompt_tokens": "12"}}
        return reply

    return answer


@pytest.mark.parametrize("sdk", list(SDKS))
def test_random_faults_on_many_threads_charge_every_attempt_and_pass_no_limit_S4_6(
        server: Server, sdk: str) -> None:
    client = _client(sdk, server, retries=2, prices=PRICES)
    lock = threading.Lock()
    for seed in range(3):
        server.answer = _faulty(sdk, seed)
        server.received.clear()
        seen: collections.Counter[str] = collections.Counter()

        def work(seen: collections.Counter[str] = seen) -> None:
            for i in range(4):
                err: BaseException | None = None
                try:
                    _call(client, sdk, bool(i % 2))
                except BaseException as caught:  # what reached the caller
                    err = caught
                public = err is None or isinstance(err, nb.BudgetError)
                with lock:  # the SDK's own errors (a 429 retried out, a drop) are its own
                    seen["sdk" if not public and isinstance(err, SDKS[sdk][2])
                         else _outcome(err, sdk)] += 1

        # preempt=False: the block waits for its threads, whose tallies are read after it
        run = nb.budget(provider_calls=40, cost_usd=2.0, time="4s", preempt=False)
        with contextlib.suppress(nb.BudgetError), run:
            _in_threads(work, 6, "chaos")
        server.wait_finished()
        assert not [kind for kind in seen if kind.startswith("raw")], (seed, seen)
        assert len(server.received) == run.consumed["provider_calls"] <= 40, (seed, seen)
        assert run.consumed.get("cost_usd", 0) <= 2.0 + 1e-9  # each reserved first (S3-10)
        assert run.consumed["run_ms"] < 5500
