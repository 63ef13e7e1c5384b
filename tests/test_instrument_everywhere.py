"""``nb.instrument()`` with no client: every model call the process makes, through any client of
the OpenAI or Anthropic SDK on httpx2 or on the older httpx, made before or after the switch, is
a provider call of the run current when it is made; outside every run the requests are the
bare library's, byte for byte. Real SDKs against the loopback server of ``tests/wire``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
import httpx  # noqa: E402  (the older library, beside httpx2)
import httpx2  # noqa: E402
from wire import Reply, Server  # noqa: E402
from wire import anthropic_shapes as a  # noqa: E402
from wire import openai_shapes as o  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations.models import anthropic_api, everywhere, openai_api  # noqa: E402

ASK = [{"role": "user", "content": "plan the trip"}]
SENDS = {cls: cls.send for cls in (httpx2.Client, httpx2.AsyncClient, httpx.Client,
                                   httpx.AsyncClient)}


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=o.chat("Paris.", o.chat_usage(12, 3))) as server:
        yield server


def chat(client: Any, **kwargs: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=ASK, **kwargs)


def three_calls_under_two(call: Any, server: Server) -> BaseException:
    """Three calls in a run allowed two: the third is refused with nothing sent."""
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=2) as run:
        for _ in range(3):
            call()
    assert len(server.received) == 2
    assert run.consumed["provider_calls"] == 2
    assert refused.value.kind == "provider_calls"
    return refused.value


def test_a_bare_openai_client_is_bounded_with_no_wrapping(server: Server, switch: Any) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    with client:
        error = three_calls_under_two(lambda: chat(client), server)
    assert isinstance(error, openai_api.Refused)  # the SDK's own error as well: passed on
    assert isinstance(error, openai.OpenAIError)


def test_usage_is_charged_as_the_reply_reports_it(server: Server, switch: Any) -> None:
    with openai.OpenAI(base_url=server.url, api_key="k") as client, \
            nb.budget(tokens=1000) as run:
        chat(client)
        chat(client.with_options(timeout=30))  # a copy of the client: the same
    used = {k: v for k, v in run.consumed.items() if k not in ("run_ms", "cost_usd")}
    assert used == {"provider_calls": 2, "turns": 2, "tokens": 30, "output_tokens": 6}
    if "cost_usd" in run.consumed:  # genai-prices' price of the model at OpenAI's
        assert run.consumed["cost_usd"] > 0


def test_a_bare_anthropic_client_is_bounded_with_no_wrapping(switch: Any) -> None:
    with Server(default=a.message("Paris.", a.usage(12, 3))) as server, \
            anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client:
        error = three_calls_under_two(lambda: client.messages.create(
            model="claude-3-5-haiku-latest", max_tokens=50, messages=ASK), server)
    assert isinstance(error, anthropic_api.Refused)


def test_a_client_made_before_the_switch_is_bounded_too(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    with nb.instrument() as switch, client:
        assert switch is everywhere.installed()
        three_calls_under_two(lambda: chat(client), server)


def test_an_openai_client_on_the_older_httpx_is_bounded(server: Server, switch: Any) -> None:
    with httpx.Client() as http, \
            openai.OpenAI(base_url=server.url, api_key="k", http_client=http) as client:
        three_calls_under_two(lambda: chat(client), server)


def test_async_clients_on_either_library_are_bounded(server: Server, switch: Any) -> None:
    async def three(http: Any) -> None:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0,
                                      **({"http_client": http} if http else {})) as client:
            for _ in range(3):
                await chat(client)

    for http in (None, httpx.AsyncClient()):
        server.received.clear()
        three_calls_under_two(lambda http=http: asyncio.run(three(http)), server)


def test_a_stream_is_cut_at_the_crossing_S3_9(server: Server, switch: Any) -> None:
    server.queue(o.chat_stream(["a ", "b ", "c ", "d ", "e "], o.chat_usage(5, 5)))
    seen = []
    with openai.OpenAI(base_url=server.url, api_key="k") as client, \
            pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=2):
        for chunk in chat(client, stream=True):
            seen.extend(choice.delta.content for choice in chunk.choices
                        if choice.delta.content)
    assert cut.value.by == "output_tokens"
    assert seen == ["a ", "b "]
    assert cut.value.salvage == "a b c "  # type: ignore[attr-defined]


def test_an_instrumented_client_is_counted_once(server: Server, switch: Any) -> None:
    with openai.OpenAI(base_url=server.url, api_key="k") as bare, \
            nb.budget(provider_calls=10) as run:
        chat(nb.instrument(bare))
        chat(bare)
    assert run.consumed["provider_calls"] == 2
    assert len(server.received) == 2


def test_outside_every_run_the_requests_are_the_bare_librarys_byte_for_byte(
        server: Server) -> None:
    def sent() -> list[tuple[bytes, dict[str, str]]]:
        server.received.clear()
        with openai.OpenAI(base_url=server.url, api_key="k") as client:
            reply = chat(client, max_tokens=7)
            streamed = [c.model_dump() for c in chat(client, stream=True)]
        assert reply.choices[0].message.content == "Paris."
        return [(r.raw, {k: v for k, v in r.headers.items() if k != "x-stainless-read-timeout"})
                for r in server.received] + [(repr(streamed).encode(), {})]

    bare = sent()
    with nb.instrument():
        switched = sent()
    assert switched == bare


def test_requests_that_are_no_model_call_pass_untouched_inside_a_run(server: Server,
                                                                      switch: Any) -> None:
    server.default = Reply(body={"ok": True})
    with httpx2.Client(base_url=server.url) as http, nb.budget(provider_calls=1) as run:
        for _ in range(3):
            http.post("/v1/files", json={"purpose": "batch"})  # not a model endpoint
            http.post("/v1/responses", json={"input": "no model named"})  # no model: not one
            http.get("/v1/chat/completions")
    assert len(server.received) == 9
    assert "provider_calls" not in run.consumed and "tokens" not in run.consumed


def test_calling_it_again_changes_nothing_and_undo_turns_it_off(server: Server) -> None:
    first = nb.instrument()
    try:
        assert nb.instrument() is first
        assert httpx2.Client.send is not SENDS[httpx2.Client]
        with openai.OpenAI(base_url=server.url, api_key="k") as client, \
                nb.budget(provider_calls=10) as run:
            chat(client)
        assert run.consumed["provider_calls"] == 1  # switched on once: counted once
    finally:
        first.undo()
    first.undo()  # twice: nothing more
    assert everywhere.installed() is None
    with openai.OpenAI(base_url=server.url, api_key="k") as client, \
            nb.budget(provider_calls=1) as run:
        chat(client)
        chat(client)  # off: not counted
    assert "provider_calls" not in run.consumed


def test_options_need_a_client() -> None:
    with pytest.raises(nb.ConfigError, match="no prices="):
        nb.instrument(prices="free")


def test_a_library_imported_after_the_switch_is_switched_as_it_is_imported() -> None:
    code = ("import sys, nbbudget as nb\n"
            "assert 'httpx2' not in sys.modules\n"
            "switch = nb.instrument()\n"
            "import httpx2, httpx\n"
            "assert httpx2.Client.send.__wrapped__ and httpx.AsyncClient.send.__wrapped__\n"
            "import importlib.resources\n"
            "assert importlib.resources.files('httpx2')\n"  # its loader answers as its own
            "switch.undo()\n"
            "assert not hasattr(httpx2.Client.send, '__wrapped__')\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_provider_is_resolved_from_the_requests_url(switch: Any) -> None:
    pytest.importorskip("genai_prices")
    request = httpx2.Request("POST", "https://openrouter.ai/api/v1/chat/completions")
    gate = switch.gate(request, everywhere.library("httpx2"))
    assert gate is not None and gate.provider == "openrouter"
    local = switch.gate(httpx2.Request("POST", "http://127.0.0.1:9/v1/messages"),
                        everywhere.library("httpx2"))
    assert local is not None and local.provider == "anthropic"


def test_langchains_chat_models_are_bounded_with_no_handler(switch: Any) -> None:
    """LangChain's ChatOpenAI and ChatAnthropic make their own SDK clients: no callback handler,
    no wrapping, and the third call under provider_calls=2 is refused unsent."""
    langchain_openai = pytest.importorskip("langchain_openai")
    langchain_anthropic = pytest.importorskip("langchain_anthropic")
    with Server(default=o.chat("Paris.", o.chat_usage(12, 3))) as server:
        gpt = langchain_openai.ChatOpenAI(model="gpt-4o-mini", base_url=server.url,
                                          api_key="k", max_retries=0)
        error = three_calls_under_two(lambda: gpt.invoke("plan the trip"), server)
        assert isinstance(error, openai_api.Refused)
    with Server(default=a.message("Paris.", a.usage(12, 3))) as server:
        claude = langchain_anthropic.ChatAnthropic(model="claude-3-5-haiku-latest",
                                                   base_url=server.url, api_key="k",
                                                   max_retries=0)
        with nb.budget(tokens=1000) as run:
            reply = claude.invoke("plan the trip")
        assert reply.content == "Paris."
        assert run.consumed["tokens"] == 15
        server.received.clear()
        three_calls_under_two(lambda: claude.invoke("plan the trip"), server)
