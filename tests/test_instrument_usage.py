"""``nb.instrument`` reads usage as each API defines it, whatever the server's JSON form (spaced,
indented, keys reordered, escaped, extra keys), and a reply whose usage is missing or malformed
is never free and never resent (N-7, S3-9): through the real OpenAI and Anthropic SDKs against
the local servers of tests/wire, which count the requests they receive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")
import anthropic  # after the skips
import openai
from wire import FORMS, Reply, Server, dump
from wire import anthropic_shapes as a
from wire import openai_shapes as o

import nbbudget as nb

ASK = [{"role": "user", "content": "plan the trip"}]
CLAUDE = "claude-3-5-haiku-latest"
PIECES = [f"w{i} " for i in range(20)]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as server:
        yield server
        for client in _made:  # before the server waits for their connections to close
            client.close()
        _made.clear()


_made: list[Any] = []


# -- the same reading whatever the JSON form -------------------------------------------------
def _chat_stream(client: Any) -> Iterator[str]:
    for chunk in client.chat.completions.create(model="gpt-4o", messages=ASK, stream=True):
        yield "".join(choice.delta.content or "" for choice in chunk.choices)


def _responses_stream(client: Any) -> Iterator[str]:
    for event in client.responses.create(model="gpt-4o", input="plan", stream=True):
        yield event.delta if event.type == "response.output_text.delta" else ""


def _messages_stream(client: Any) -> Iterator[str]:
    with client.messages.stream(model=CLAUDE, max_tokens=1000, messages=ASK) as stream:
        yield from stream.text_stream


#: each API: its SDK, its stream of PIECES (20 deltas, usage 10 in and 20 out) and how a
#: caller reads its text
STREAMS: dict[str, tuple[str, Callable[[], Reply], Callable[[Any], Iterator[str]]]] = {
    "chat": ("openai", lambda: o.chat_stream(PIECES, o.chat_usage(10, 20), event_delay=0.002),
             _chat_stream),
    "responses": ("openai", lambda: o.response_stream(PIECES, o.response_usage(10, 20),
                                                      event_delay=0.002), _responses_stream),
    "messages": ("anthropic", lambda: a.message_stream(PIECES, a.usage(10, 20),
                                                       event_delay=0.002), _messages_stream),
}


def _client(sdk: str, server: Server, **options: Any) -> Any:
    made: Any = (openai.OpenAI if sdk == "openai" else anthropic.Anthropic)(
        base_url=server.url, api_key="k", max_retries=2)
    _made.append(made)
    return nb.instrument(made, **options)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_is_cut_at_the_same_event_whatever_its_json_form_S3_9(
        server: Server, api: str, form: str) -> None:
    """Under ``output_tokens=5`` the sixth text delta passes the limit (an Anthropic stream's
    ``message_start`` reports one output token, which the count then includes): the stream is
    cut there, in every form the server may write its JSON in."""
    sdk, stream, read = STREAMS[api]
    reply = stream()
    reply.form = form
    server.queue(reply)
    seen: list[str] = []
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(output_tokens=5) as run:
        seen.extend(read(_client(sdk, server)))
    assert caught.value.by == "output_tokens"
    assert caught.value.salvage == "".join(PIECES[:6])
    assert "".join(seen) == "".join(PIECES[:5])
    assert run.consumed["output_tokens"] == 6
    server.wait_finished()
    assert len(server.received) == 1 and server.received[0].disconnected


def _call(api: str, client: Any) -> Any:
    if api == "chat":
        return client.chat.completions.create(model="gpt-4o", messages=ASK)
    if api == "responses":
        return client.responses.create(model="gpt-4o", input="plan")
    return client.messages.create(model=CLAUDE, max_tokens=1000, messages=ASK)


#: each API: its SDK and a whole reply that used 100 input tokens (40 of them cached) and 30
#: output tokens
REPLIES: dict[str, tuple[str, Callable[[], Reply]]] = {
    "chat": ("openai", lambda: o.chat("ok", o.chat_usage(100, 30, cached=40))),
    "responses": ("openai", lambda: o.response("ok", o.response_usage(100, 30, cached=40))),
    "messages": ("anthropic", lambda: a.message("ok", a.usage(60, 30, cache_read=40))),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("api", list(REPLIES))
def test_a_whole_replys_usage_is_read_whatever_its_json_form(server: Server, api: str,
                                                              form: str) -> None:
    sdk, make = REPLIES[api]
    reply = make()
    reply.form = form
    server.queue(reply)
    with nb.budget(tokens=1000) as run:
        _call(api, _client(sdk, server))
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (130, 30)


def test_a_responses_metadata_key_named_usage_is_not_the_replys_usage(server: Server) -> None:
    """Responses echoes the request's ``metadata`` after its ``usage``: the reply's usage is
    its top-level ``usage``, not the last key of that name in the body."""
    reply = o.response("ok", o.response_usage(1000, 98_000))
    reply.body["metadata"] = {"usage": "low"}
    server.queue(reply)
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(tokens=1000) as run:
        _call("responses", _client("openai", server))
    assert caught.value.by == "tokens"
    assert run.consumed["tokens"] == 99_000
    assert len(server.received) == 1


@pytest.mark.parametrize("api", list(REPLIES))
def test_an_extra_object_holding_a_usage_key_is_not_the_replys_usage(server: Server,
                                                                     api: str) -> None:
    sdk, make = REPLIES[api]
    reply = make()
    reply.body["x_gateway"] = {"usage": {"prompt_tokens": 0, "completion_tokens": 0,
                                         "input_tokens": 0, "output_tokens": 0}}
    server.queue(reply)
    with nb.budget(tokens=1000) as run:
        _call(api, _client(sdk, server))
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (130, 30)


# -- bad or missing usage: never free, never resent (N-7) -------------------------------------
BAD = "@bad@"  # where a bad value goes in a reply, replaced by its JSON text once written

#: a malformed value, as the JSON text the server writes, and how the error shows it
VALUES = {"a string": ('"12"', "'12'"), "NaN": ("NaN", "nan"), "1e400": ("1e400", "inf"),
          "negative": ("-5", "-5")}


def _bad_usage(api: str, case: str) -> tuple[dict[str, Any] | str | None, str]:
    """The usage of a reply of *api* with *case* wrong in it, and the field it names."""
    if api == "chat":
        usage: dict[str, Any] = o.chat_usage(10, 20)
        out, details = "completion_tokens", "prompt_tokens_details"
    elif api == "responses":
        usage = o.response_usage(10, 20)
        out, details = "output_tokens", "input_tokens_details"
    else:
        usage = a.usage(10, 20)
        out, details = "output_tokens", "usage"
    if case == "missing":
        return None, "usage"
    if case == "details not an object":
        if details == "usage":
            return BAD, "usage"
        usage[details] = BAD
        return usage, f"usage.{details}"
    usage[out] = BAD
    return usage, f"usage.{out}"


def _text(case: str) -> str:
    return '"lots"' if case == "details not an object" else VALUES[case][0] if (
        case in VALUES) else ""


def _reply(api: str, case: str, stream: bool) -> tuple[Reply, str]:
    """A reply of *api* (whole or streamed, 20 pieces) whose usage has *case* wrong, and the
    field its error names."""
    usage, field = _bad_usage(api, case)
    text = _text(case)
    if not stream:
        body = REPLIES[api][1]().body
        if usage is None:
            del body["usage"]
        else:
            body["usage"] = usage
        return Reply(raw=dump(body).replace(f'"{BAD}"', text).encode()), field
    if api == "chat":
        made = o.chat_stream(PIECES, {})

        def events(body: Any) -> list[tuple[str | None, Any]]:
            assert callable(made.events)
            out = made.events(body)
            *rest, last, done = out
            if usage is None:
                return [*rest, done]
            return [*rest, (None, dump({**last[1], "usage": usage}).replace(f'"{BAD}"', text)),
                    done]

        return Reply(events=events), field
    if api == "responses":
        made = o.response_stream(PIECES, o.response_usage(10, 20))
    else:
        made = a.message_stream(PIECES, a.usage(10, 20))
    assert isinstance(made.events, list)
    written: list[tuple[str | None, Any]] = []
    for name, data in made.events:
        if name == "response.completed":
            data = {**data, "response": {**data["response"]}}
            if usage is None:
                del data["response"]["usage"]
            else:
                data["response"]["usage"] = usage
        elif name == "message_delta":
            data = {key: value for key, value in data.items() if key != "usage"}
            if usage is not None:
                data["usage"] = BAD if usage == BAD else {"output_tokens": usage["output_tokens"]}
        written.append((name, dump(data).replace(f'"{BAD}"', text)))
    return Reply(events=written), field


def _use(api: str, client: Any, stream: bool) -> str:
    """Make one call of *api*, whole or streamed, read it all: its text."""
    if stream:
        read = STREAMS[api][2]
        return "".join(read(client))
    reply = _call(api, client)
    if api == "chat":
        return str(reply.choices[0].message.content)
    if api == "responses":
        return str(reply.output_text)
    return str(reply.content[0].text)


async def _use_async(api: str, client: Any, stream: bool) -> str:
    if api == "chat":
        if stream:
            return "".join([c.choices[0].delta.content or "" async for c in
                            await client.chat.completions.create(
                                model="gpt-4o", messages=ASK, stream=True) if c.choices])
        reply = await client.chat.completions.create(model="gpt-4o", messages=ASK)
        return str(reply.choices[0].message.content)
    if api == "responses":
        if stream:
            return "".join([e.delta async for e in await client.responses.create(
                model="gpt-4o", input="plan", stream=True)
                if e.type == "response.output_text.delta"])
        return str((await client.responses.create(model="gpt-4o", input="plan")).output_text)
    if stream:
        async with client.messages.stream(model=CLAUDE, max_tokens=1000,
                                          messages=ASK) as events:
            return "".join([text async for text in events.text_stream])
    reply = await client.messages.create(model=CLAUDE, max_tokens=1000, messages=ASK)
    return str(reply.content[0].text)


def _run_async(api: str, server: Server, stream: bool, limits: dict[str, Any],
               runs: list[nb.Budget] | None = None) -> str:
    sdk = REPLIES[api][0]

    async def main() -> str:
        bare: Any = (openai.AsyncOpenAI if sdk == "openai" else anthropic.AsyncAnthropic)(
            base_url=server.url, api_key="k", max_retries=2)
        async with bare:
            with nb.budget(**limits) as run:
                if runs is not None:
                    runs.append(run)
                return await _use_async(api, nb.instrument(bare), stream)

    return asyncio.run(main())


CASES = [*VALUES, "details not an object", "missing"]
MODES = ["sync", "async", "stream", "async-stream"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("api", list(REPLIES))
def test_bad_or_missing_usage_under_a_token_limit_stops_the_run_naming_the_field_N_7(
        server: Server, api: str, case: str, mode: str) -> None:
    """The error is the API module's ``Cut``: `nb.BudgetCut` and the SDK's own error, which
    the SDK passes on unchanged, never retried; exactly one request reaches the server."""
    stream = mode.endswith("stream")
    reply, field = _reply(api, case, stream)
    server.queue(reply)
    sdk = REPLIES[api][0]
    with pytest.raises(nb.BudgetCut) as caught:
        if mode.startswith("async"):
            _run_async(api, server, stream, {"tokens": 10_000})
        else:
            with nb.budget(tokens=10_000):
                _use(api, _client(sdk, server), stream)
    err = caught.value
    assert isinstance(err, openai.OpenAIError if sdk == "openai" else anthropic.AnthropicError)
    assert err.by == "tokens"
    assert f"{sdk} reply reported {field}=" in str(err) or (
        f"{sdk} reply reported no {field}" in str(err)), str(err)
    if case in VALUES:
        assert VALUES[case][1] in str(err)
    server.wait_finished()
    assert len(server.received) == 1


@pytest.mark.parametrize("limits", [{"cost_usd": 100.0}, {"output_tokens": 10_000}],
                         ids=["cost_usd", "output_tokens"])
@pytest.mark.parametrize("api", list(REPLIES))
def test_a_reply_without_usage_under_a_cost_or_output_limit_stops_the_run_N_7(
        server: Server, api: str, limits: dict[str, Any]) -> None:
    reply, _ = _reply(api, "missing", False)
    server.queue(reply)
    with pytest.raises(nb.BudgetCut) as caught, nb.budget(**limits) as run:
        _use(api, _client(REPLIES[api][0], server), False)
    assert caught.value.by == next(iter(limits))
    assert run.outcome is not None and run.outcome.by == next(iter(limits))
    assert len(server.received) == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("api", list(REPLIES))
def test_bad_or_missing_usage_without_a_token_limit_returns_the_reply_sent_once_N_7(
        server: Server, api: str, case: str, mode: str) -> None:
    stream = mode.endswith("stream")
    if api == "messages" and stream and case in ("missing", "details not an object"):
        pytest.skip("the bare SDK itself fails on a message_delta without a usage object")
    reply, _ = _reply(api, case, stream)
    server.queue(reply)
    runs: list[nb.Budget] = []
    if mode.startswith("async"):
        text = _run_async(api, server, stream, {"provider_calls": 5}, runs)
    else:
        with nb.budget(provider_calls=5) as run:
            runs.append(run)
            text = _use(api, _client(REPLIES[api][0], server), stream)
    assert text == ("".join(PIECES) if stream else "ok")
    server.wait_finished()
    assert len(server.received) == 1
    [marked] = [e for e in runs[0].trace.events if e.kind == "unmetered"]  # the call, once
    assert marked.payload["provider"] == REPLIES[api][0] and marked.payload["usage"]
