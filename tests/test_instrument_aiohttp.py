"""``nb.instrument()`` with no client bounds the requests sent through aiohttp: google-genai's
async client (``client.aio``), which sends through aiohttp wherever aiohttp is installed, through
the real SDK against the loopback server of ``tests/wire`` (S2-9, S3-8, S3-9, S3-10, S4-6)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

pytest.importorskip("google.genai")
pytest.importorskip("aiohttp")
import aiohttp
from google import genai
from google.genai import errors, types
from wire import Reply, Server
from wire import gemini_shapes as g

import nbbudget as nb
from nbbudget.integrations.models import gemini_api

pytestmark = pytest.mark.skipif(not hasattr(aiohttp, "ClientMiddlewareType"),
                                reason="aiohttp before 3.12 has no client middlewares")
MODEL = g.MODEL
ASK = "plan the trip"
PIECES = [f"w{i} " for i in range(20)]
_T = TypeVar("_T")


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=g.response("Paris.", g.usage(12, 3))) as server:
        yield server


def in_aio(server: Server, work: Callable[[Any], Awaitable[_T]]) -> _T:
    """*work* of google-genai's async client of *server*, as the SDK makes it (its aiohttp
    session, closed at the end), in a new event loop."""
    async def main() -> _T:
        with genai.Client(api_key="k", http_options=types.HttpOptions(base_url=server.url)
                          ) as client:
            async with client.aio as aio:
                return await work(aio)

    return asyncio.run(main())


async def call(aio: Any, stream: bool = False, seen: list[str] | None = None,
               **config: Any) -> str:
    """One call, whole or streamed, read to its end: its text (each chunk's added to *seen*)."""
    seen = [] if seen is None else seen
    if not stream:
        reply = await aio.models.generate_content(model=MODEL, contents=ASK,
                                                  config=config or None)
        return str(reply.text)
    async for chunk in await aio.models.generate_content_stream(model=MODEL, contents=ASK,
                                                                config=config or None):
        seen.append(chunk.text or "")
    return "".join(seen)


def test_the_sdk_sends_through_aiohttp_sessions_made_with_the_middleware(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """What these tests rest on: the async client sends through an aiohttp session of its own,
    which the switch made with its middleware, last."""
    from nbbudget.integrations.models import aio as layer

    made: list[Any] = []
    init = aiohttp.ClientSession.__init__

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(tuple(kwargs.get("middlewares", ())))
        init(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", recorded)
    with nb.instrument():
        assert in_aio(server, call) == "Paris."
    assert len(made) == 1 and len(made[0]) == 1  # the switch's middleware, and no other
    assert made[0][0].__module__ == layer.__name__


# -- permits (S4-6) ----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_provider_calls_2_refuses_the_third_call_with_nothing_sent_S4_6(
        server: Server, switch: Any, stream: bool) -> None:
    server.default = g.stream(["Pa", "ris."], g.usage(12, 2)) if stream else server.default

    async def work(aio: Any) -> tuple[BaseException, nb.Budget]:
        run = nb.budget(provider_calls=2)
        try:
            with run:
                for _ in range(3):
                    await call(aio, stream)
        except nb.BudgetExceeded as err:
            return err, run
        raise AssertionError("not refused")

    refused, run = in_aio(server, work)
    assert len(server.received) == 2
    assert (run.consumed["provider_calls"], run.consumed["turns"]) == (2, 2)
    assert isinstance(refused, gemini_api.Refused) and isinstance(refused, errors.APIError)
    assert refused.kind == "provider_calls"  # type: ignore[attr-defined]


# -- usage, as the server reports it -----------------------------------------------------------
def test_tokens_are_charged_as_the_server_reports_them(server: Server, switch: Any) -> None:
    server.queue(g.response("ok", g.usage(100, 20, cached=40, thoughts=10, tool_use=5)),
                 g.stream(["Pa", "ris."], g.usage(20, 2, thoughts=7), thoughts=("hmm",)))

    async def work(aio: Any) -> tuple[list[str], nb.Budget]:
        with nb.budget(tokens=1000) as run:
            texts = [await call(aio), await call(aio, stream=True)]
        return texts, run

    texts, run = in_aio(server, work)
    assert texts == ["ok", "Paris."]
    # 100 + 5 in and 20 + 10 out; then 20 in and 2 + 7 out
    assert (run.consumed["tokens"], run.consumed["output_tokens"]) == (135 + 29, 30 + 9)


# -- the output cap (S2-9) ---------------------------------------------------------------------
def test_max_output_tokens_is_clamped_in_the_body_sent_S2_9(server: Server, switch: Any) -> None:
    server.queue(g.response("x", g.usage(5, 70)), g.response("x", g.usage(5, 10)),
                 g.stream(["x"], g.usage(5, 1)))

    async def work(aio: Any) -> None:
        with nb.budget(output_tokens=100):
            await call(aio, max_output_tokens=1000, temperature=0.5)
            await call(aio)  # no generationConfig at all
            await call(aio, stream=True)

    in_aio(server, work)
    configs = [body.get("generationConfig") for body in server.bodies()]
    assert configs == [{"temperature": 0.5, "maxOutputTokens": 100}, {"maxOutputTokens": 30},
                       {"maxOutputTokens": 20}]
    for received in server.received:  # the new body, with its own length
        assert int(received.headers["content-length"]) == len(received.raw)


# -- streams cut at the crossing (S3-9) --------------------------------------------------------
@pytest.mark.parametrize("running", [True, False], ids=["running-usage", "final-usage-only"])
def test_a_stream_is_cut_at_the_crossing_with_the_text_so_far_S3_9(
        server: Server, switch: Any, running: bool) -> None:
    server.queue(g.stream(PIECES, g.usage(10, 20), event_delay=0.002, running=running))
    seen: list[str] = []

    async def work(aio: Any) -> tuple[BaseException, nb.Budget]:
        run = nb.budget(output_tokens=5)
        try:
            with run:
                await call(aio, stream=True, seen=seen)
        except nb.BudgetCut as err:
            return err, run
        raise AssertionError("not cut")

    cut, run = in_aio(server, work)
    assert isinstance(cut, gemini_api.Cut) and isinstance(cut, errors.APIError)
    assert cut.by == "output_tokens"  # type: ignore[attr-defined]
    assert cut.salvage == "".join(PIECES[:6])  # type: ignore[attr-defined]
    assert "".join(seen) == "".join(PIECES[:5])
    assert (run.consumed["output_tokens"], run.consumed["tokens"]) == (6, 16)
    server.wait_finished()
    assert len(server.received) == 1 and server.received[0].disconnected


# -- an error status (S3-10) -------------------------------------------------------------------
def test_an_error_status_gives_the_reservation_back_S3_10(server: Server, switch: Any) -> None:
    """Under ``cost_usd`` a request reserves its worst case before it is sent; a reply of an
    error status used nothing, so the whole reservation goes back: the next request may
    reserve it all again."""
    pytest.importorskip("genai_prices")
    server.queue(*[Reply(body={"error": {"code": 500, "message": "oops", "status": "INTERNAL"}},
                         status=500) for _ in range(3)])

    async def work(aio: Any) -> tuple[list[str], nb.Budget]:
        outcomes = []
        with nb.budget(cost_usd=0.01) as run:
            for _ in range(3):
                try:
                    await call(aio, max_output_tokens=100_000)
                except errors.ServerError as err:
                    outcomes.append(str(err.code))
        return outcomes, run

    outcomes, run = in_aio(server, work)
    assert outcomes == ["500"] * 3
    caps = [body["generationConfig"]["maxOutputTokens"] for body in server.bodies()]
    assert caps[0] < 100_000 and caps == [caps[0]] * 3  # each reserved the whole budget
    assert run.consumed.get("cost_usd", 0) == 0
    assert run.consumed["provider_calls"] == 3


# -- the run's time (S3-8) ---------------------------------------------------------------------
def test_a_request_is_bounded_by_the_runs_remaining_time_S3_8(server: Server,
                                                             switch: Any) -> None:
    server.queue(Reply(body=g.response_body("late", g.usage(1, 1)), delay=5.0))

    async def work(aio: Any) -> BaseException:
        try:
            with nb.budget(time="300ms"):
                await call(aio)
        except nb.BudgetCut as err:
            return err
        raise AssertionError("not cut")

    began = time.monotonic()
    cut = in_aio(server, work)
    assert cut.by == "timeout"  # type: ignore[attr-defined]
    assert time.monotonic() - began < 2.0
    assert len(server.received) == 1


# -- outside every run, and what is no model call ----------------------------------------------
def test_outside_every_run_the_requests_and_replies_are_the_bare_sdks_byte_for_byte(
        server: Server) -> None:
    def sent() -> list[Any]:
        server.received.clear()
        server.queue(g.response("Paris.", g.usage(12, 3)),
                     g.stream(["Pa", "ris."], g.usage(12, 2)))

        async def work(aio: Any) -> list[Any]:
            reply = await aio.models.generate_content(
                model=MODEL, contents=ASK, config={"max_output_tokens": 7})
            chunks = [chunk.model_dump() async for chunk in
                      await aio.models.generate_content_stream(model=MODEL, contents=ASK)]
            return [reply.model_dump(), chunks]

        replies = in_aio(server, work)
        return [(r.path, r.raw, r.headers) for r in server.received] + replies

    bare = sent()
    with nb.instrument():
        switched = sent()
    assert switched == bare


def test_a_post_to_another_path_in_a_run_passes_untouched(server: Server, switch: Any) -> None:
    """A plain aiohttp POST that is no model endpoint's, in a run: sent as it is, counted
    nowhere, even under a limit of one provider call."""
    body = json.dumps({"model": MODEL, "maxOutputTokens": 10**6}).encode()

    async def work() -> nb.Budget:
        async with aiohttp.ClientSession() as session:
            with nb.budget(provider_calls=1, output_tokens=5) as run:
                for _ in range(3):
                    async with session.post(f"{server.url}/v1/files:upload", data=body) as reply:
                        await reply.read()
        return run

    run = asyncio.run(work())
    assert [r.raw for r in server.received] == [body] * 3
    assert run.consumed.get("provider_calls", 0) == 0


def test_undo_puts_client_session_init_back(server: Server) -> None:
    """Off, sessions are made as aiohttp makes them; one made while the switch was on keeps
    the middleware, which then passes every request on."""
    original = aiohttp.ClientSession.__init__
    switch = nb.instrument()
    try:
        assert aiohttp.ClientSession.__init__ is not original

        async def work() -> nb.Budget:
            session = aiohttp.ClientSession()  # made while on
            switch.undo()
            assert aiohttp.ClientSession.__init__ is original
            async with session:
                with nb.budget(provider_calls=1) as run:
                    for _ in range(2):
                        async with session.post(
                                f"{server.url}/v1beta/models/{MODEL}:generateContent",
                                json={"contents": []}) as reply:
                            await reply.read()
            return run

        run = asyncio.run(work())
    finally:
        switch.undo()
    assert aiohttp.ClientSession.__init__ is original
    assert len(server.received) == 2
    assert run.consumed.get("provider_calls", 0) == 0


def test_aiohttp_imported_after_the_switch_is_switched_as_it_is_imported() -> None:
    code = ("import sys, nbbudget as nb\n"
            "assert 'aiohttp' not in sys.modules\n"
            "switch = nb.instrument()\n"
            "import aiohttp\n"
            "init = aiohttp.ClientSession.__init__\n"
            "assert init.__wrapped__ and 'aiohttp' in repr(switch)\n"
            "switch.undo()\n"
            "assert not hasattr(aiohttp.ClientSession.__init__, '__wrapped__')\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr
