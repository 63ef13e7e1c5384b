"""The process-wide switch (``everywhere``) on aiohttp: a client middleware (aiohttp 3.12 or
newer) that the switch adds to every ``aiohttp.ClientSession`` made while it is on, last, so
that it sees each request as it goes to the wire. ``google-genai``'s async client sends through
aiohttp wherever aiohttp is installed.

**Outside every run** (and once the switch is off) the middleware calls the next handler and
nothing else: the request and its reply are the library's own, byte for byte.

**A model request made in a run** (a ``POST`` whose path ends as a model API's endpoint does and
whose JSON body names a model, as ``everywhere`` reads it) goes through the gate of ``clients``
(`clients.Gate.admit`), as a request on httpx does:

- its permits are taken before it is sent, and a refusal raises the API module's ``Refused``
  (for Gemini, ``gemini_api.Refused``, which google-genai passes on) with nothing sent;
- its output cap is clamped in its body (``ClientRequest.update_body``), and its worst case
  reserved under ``cost_usd``;
- a whole reply is read here (``ClientResponse.read``, which keeps the body for the caller) and
  its usage charged; an error status gives the reservation back;
- a stream's body (``ClientResponse.content``, which google-genai reads with ``iter_any``) is
  read through the stream meter of ``clients``: whole events pass on, usage is charged as it
  comes and the stream is cut, its connection closed, where it passes a limit (S3-9);
- the request, its reply and each read of its stream are bounded by the run's remaining time
  and the guardrail (S3-8) with asyncio's timeouts: the run's cut raises there. aiohttp's own
  ``ClientTimeout`` is fixed before a middleware runs and is left as the caller gave it.

A request an async gate of httpx is sending (LiteLLM's httpx transport over aiohttp,
`clients.opening`) and one an adapter has claimed pass untouched: each is counted once.

Not reached: a session made before the switch was turned on (its middlewares are fixed when it
is made: turn the switch on first, as loading the IPython extension does), and a request given
its own ``middlewares=``, which replace the session's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp

from ...core.errors import BudgetCut
from ...core.lowlevel import Unwind
from ...run.budget import current
from ..claims import claimed
from .clients import Attempt, Gate, Library, Meter, Read, opening
from .shapes import request_content

__all__ = ["AIOHTTP", "Aiohttp", "middleware"]

_T = TypeVar("_T")
#: what aiohttp raises for a timeout or a connection that failed
_FAILED = (aiohttp.ClientError, asyncio.TimeoutError)


class Aiohttp(Library):
    """aiohttp, as the gates of the switch know an HTTP library: what it raises. Its requests
    reach the gate through `middleware` (`Gate.admit`), never through ``clients.send``: it has
    none of the stream classes or wrapper clients of httpx's."""

    def __init__(self, module: Any) -> None:
        super().__init__(module, (ValueError,), module.ClientError,
                         (module.ClientConnectorError,))


AIOHTTP = Aiohttp(aiohttp)


async def _within(awaitable: Awaitable[_T], deadline: float) -> _T:
    """*awaitable*, given until *deadline* (``time.monotonic()``); asyncio's TimeoutError
    past it."""
    left = max(deadline - time.monotonic(), 0.0)
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(left):
            return await awaitable
    return await asyncio.wait_for(awaitable, left)  # pragma: no cover  (Python 3.10)


_Handler = Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]]
_Middleware = Callable[[aiohttp.ClientRequest, _Handler], Awaitable[aiohttp.ClientResponse]]


def middleware(gate_of: Callable[[Any, Library], Gate | None]) -> _Middleware:
    """The switch's client middleware: a model request made in a run through its gate, the one
    *gate_of* (the switch's ``gate``: None when the request is no model call, or the switch is
    off) gives; any other request to the next handler as it is."""

    async def middleware_(request: aiohttp.ClientRequest,
                          handler: _Handler) -> aiohttp.ClientResponse:
        return await _through(request, handler, gate_of)

    return middleware_


async def _through(request: aiohttp.ClientRequest, handler: _Handler,
                   gate_of: Callable[[Any, Library], Gate | None]) -> aiohttp.ClientResponse:
    """`middleware`'s work."""
    run = current()
    if run is None or request.method != "POST" or opening.get():
        return await handler(request)
    gate = gate_of(request, AIOHTTP)
    if gate is None or claimed(request, run.lowlevel):
        return await handler(request)
    body = request.body
    if not isinstance(body, aiohttp.BytesPayload):  # a stream or a form: not a model call's
        return await handler(request)
    admitted = gate.admit(run, request.url.path, await body.as_bytes(), request.headers)
    if admitted is None:
        return await handler(request)
    attempt, changed = admitted
    if changed is not None:
        await request.update_body(request_content(changed))
    try:
        response = await _within(handler(request), attempt.deadline)
        if response.status >= 400:
            attempt.release()  # an error status: the API bills nothing
            attempt.waits(request, SimpleNamespace(
                status_code=response.status, headers=response.headers, close=response.close))
            return response
        if attempt.stream:
            response.content = _Content(response.content, Meter(attempt),  # type: ignore[assignment]
                                        response)
            return response
        content = await _within(response.read(), attempt.deadline)
    except _FAILED as err:  # a timeout (the run's, or aiohttp's own), or a failed connection
        if isinstance(err, AIOHTTP.never_sent):
            attempt.release()  # never sent: nothing billed
        attempt.timed_out()
        raise
    attempt.answered(Read(response.status, content))
    return response


class _Content:
    """A streamed reply's body (``ClientResponse.content``), read through its meter: the
    reading methods of aiohttp's ``StreamReader``, each handing on whole events only, charged
    (or cut: the response is then closed, and the API's ``Cut`` raises) as they come. Its other
    attributes are the original reader's."""

    def __init__(self, inner: aiohttp.StreamReader, meter: Meter,
                 response: aiohttp.ClientResponse) -> None:
        self.inner, self.meter, self.response = inner, meter, response
        self.buffer = b""  # metered bytes not read yet
        self.done = False  # the original reader is at its end
        self.closed = False

    async def _pull(self) -> bytes:
        """The next metered bytes, b"" at the end."""
        meter = self.meter
        attempt: Attempt = meter.attempt
        try:
            while not self.done:
                try:
                    chunk = await _within(self.inner.readany(), meter.deadline)
                except _FAILED:  # a timeout, or the connection lost
                    self._close()
                    attempt.timed_out(meter.salvage())
                    raise
                if not chunk:
                    self.done = True
                    return meter.finish()
                out = meter.feed(chunk)
                if out:
                    return out
        except (BudgetCut, Unwind):  # cut (S3-9, N-7): its connection is closed
            self._close()
            raise
        return b""

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.meter.close()
        finally:
            self.response.close()

    async def readany(self) -> bytes:
        if self.buffer:
            out, self.buffer = self.buffer, b""
            return out
        return await self._pull()

    async def read(self, n: int = -1) -> bytes:
        if n < 0:
            parts = [self.buffer]
            self.buffer = b""
            while chunk := await self._pull():
                parts.append(chunk)
            return b"".join(parts)
        while not self.buffer and not self.done:
            self.buffer = await self._pull()
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    async def readline(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = await self._pull()
            if not chunk:
                out, self.buffer = self.buffer, b""
                return out
            self.buffer += chunk
        end = self.buffer.index(b"\n") + 1
        out, self.buffer = self.buffer[:end], self.buffer[end:]
        return out

    async def readchunk(self) -> tuple[bytes, bool]:
        return await self.readany(), False

    async def _iterate(self, read: Callable[[], Awaitable[bytes]]) -> AsyncIterator[bytes]:
        while chunk := await read():
            yield chunk

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._iterate(self.readany)

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._iterate(lambda: self.read(n))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate(self.readline)

    def at_eof(self) -> bool:
        return self.done and not self.buffer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # exception(), set_exception(), total_bytes, ...
