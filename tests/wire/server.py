"""A scripted HTTP server on 127.0.0.1, in one named thread, that answers what a test queues.

Each request takes the next queued `Reply` (or the default): a JSON body, or a stream of events
(chunked, one event per chunk, ``event_delay`` seconds apart) framed as server-sent events or as
newline-delimited JSON (``framing``), each JSON written in one of the valid forms of `FORMS`,
after ``delay`` seconds, with any
status (a 429 or 500 carries ``retry-after-ms`` so the SDK's own retry waits a millisecond). A
reply may also fail as a server or a network does: its bytes trickle in (``trickle`` seconds
between bytes), or the connection drops after part of it (``drop``). The server records every
request it received (`Received`: path, headers, JSON body) and, for a streamed reply, how many
events it wrote and whether the client closed the connection before the last one. Instead of a
queue, ``answer`` (a function of the request) may pick each reply, as a fault test does.
``with Server() as server:`` starts it and, at the end, stops the thread and joins the threads
of its connections (close the clients first).
"""

from __future__ import annotations

import collections
import contextlib
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FORMS", "FRAMINGS", "LINE_FORMS", "Received", "Reply", "Server", "dump",
           "event_message"]

Events = list[tuple[str | None, Any]]

#: the ways a server may write the same JSON, all valid: ``compact`` (no white space),
#: ``spaced`` (``json.dumps``' default separators, as many Python servers write it),
#: ``indented`` (two spaces, as OpenAI's whole replies come), ``reordered`` (every object's keys
#: in reverse order, compact), ``escaped`` (compact, with the first character of every key and
#: every ``/`` escaped: ``\u0075sage``, ``\/``)
FORMS = ("compact", "spaced", "indented", "reordered", "escaped")
#: the forms a line of newline-delimited JSON may take: all but ``indented``, which spans lines
LINE_FORMS = tuple(form for form in FORMS if form != "indented")
#: how a stream's events are framed: server-sent events, newline-delimited JSON (Ollama's), or
#: AWS's binary event stream (Bedrock's ConverseStream)
FRAMINGS = {"sse": "text/event-stream", "ndjson": "application/x-ndjson",
            "eventstream": "application/vnd.amazon.eventstream"}


def dump(data: Any, form: str = "compact") -> str:
    """*data* as JSON in *form* (one of `FORMS`)."""
    if form == "compact":
        return json.dumps(data, separators=(",", ":"))
    if form == "spaced":
        return json.dumps(data)
    if form == "indented":
        return json.dumps(data, indent=2)
    if form == "reordered":
        return json.dumps(_reversed(data), separators=(",", ":"))
    if form == "escaped":
        return _escaped(data)
    raise ValueError(f"form={form!r}: give one of {', '.join(FORMS)}")


def _header(name: str, value: str) -> bytes:
    """A string header of an AWS event stream message (type 7)."""
    raw = value.encode()
    return (bytes([len(name)]) + name.encode() + b"\x07" + len(raw).to_bytes(2, "big") + raw)


def event_message(event_type: str, payload: bytes, message_type: str = "event") -> bytes:
    """One message of AWS's event stream (``application/vnd.amazon.eventstream``), from its
    public description: the total length and the headers' length (4 bytes each, big-endian),
    their CRC32, the headers (``:event-type``, ``:content-type``, ``:message-type``; an
    exception's names ``:exception-type``), the payload, the CRC32 of all before it."""
    kind = ":exception-type" if message_type == "exception" else ":event-type"
    headers = (_header(kind, event_type) + _header(":content-type", "application/json")
               + _header(":message-type", message_type))
    total = 12 + len(headers) + len(payload) + 4
    prelude = total.to_bytes(4, "big") + len(headers).to_bytes(4, "big")
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    message = prelude + headers + payload
    return message + zlib.crc32(message).to_bytes(4, "big")


def _reversed(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: _reversed(data[key]) for key in reversed(data)}
    if isinstance(data, list):
        return [_reversed(item) for item in data]
    return data


def _escaped(data: Any) -> str:
    if isinstance(data, dict):
        return "{" + ",".join(
            f'"\\u{ord(key[0]):04x}' + json.dumps(key)[2:].replace("/", "\\/") + ":"
            + _escaped(value) if key else '"":' + _escaped(value)
            for key, value in data.items()) + "}"
    if isinstance(data, list):
        return "[" + ",".join(_escaped(item) for item in data) + "]"
    return json.dumps(data).replace("/", "\\/")


@dataclass
class Reply:
    """One scripted answer: ``body`` (JSON) or ``events`` (``(event name or None, data)``
    pairs sent as server-sent events, or, with ``framing="ndjson"``, each data a line of JSON,
    the names unused; a data that is a str is sent as is, e.g. ``[DONE]``), or for either a
    function of the request's JSON body that returns it (a reply that depends on what was
    asked, as ``stream_options`` or the output cap)."""

    body: Any = None
    events: Events | Callable[[Any], Events] | None = None
    status: int = 200
    delay: float = 0.0
    event_delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # the body's exact bytes, sent instead of ``body`` as JSON
    #: how its JSON is written (`FORMS`); None: a body as ``json.dumps`` writes it by default,
    #: events compact
    form: str | None = None
    #: seconds between two bytes of the body (of each event, for a stream): a reply that
    #: trickles in, each byte well within a read timeout
    trickle: float = 0.0
    #: drop the connection (no last chunk, no more bytes) after this many events, or, for a
    #: body, after this many of its bytes
    drop: int | None = None
    #: what ends each line of a server-sent event: ``"\n"``, or ``"\r\n"`` as Google's
    #: servers write them
    newline: str = "\n"
    #: how ``events`` are framed (`FRAMINGS`): ``sse`` or ``ndjson``
    framing: str = "sse"

    def content(self, asked: Any = None) -> bytes:
        """The bytes of a JSON body, for a request of JSON body *asked*."""
        if self.raw is not None:
            return self.raw
        body = self.body(asked) if callable(self.body) else self.body
        return dump(body, self.form or "spaced").encode()

    def written(self, body: Any) -> list[bytes]:
        """The events of this reply to a request of JSON *body*, each as the server writes it
        (compact JSON unless ``form`` says otherwise), framed as ``framing`` says; for an
        in-memory transport too (httpx2's ``MockTransport``), in tests and benchmarks."""
        events = self.events(body) if callable(self.events) else self.events or []
        if self.framing not in FRAMINGS:
            raise ValueError(f"framing={self.framing!r}: give one of {', '.join(FRAMINGS)}")
        if self.framing == "ndjson" and self.form not in (None, *LINE_FORMS):
            raise ValueError(f"form={self.form!r} spans lines: newline-delimited JSON takes "
                             f"one of {', '.join(LINE_FORMS)}")
        out = []
        for name, data in events:
            text = data if isinstance(data, str) else dump(data, self.form or "compact")
            if self.framing == "ndjson":
                out.append(f"{text}\n".encode())
                continue
            if self.framing == "eventstream":
                out.append(event_message(name or "", text.encode()))
                continue
            end = self.newline
            lines = "".join(f"data: {line}{end}" for line in text.split("\n"))  # one per line
            out.append(((f"event: {name}{end}" if name else "") + lines + end).encode())
        return out

    @classmethod
    def error(cls, status: int, message: str = "try again", kind: str = "rate_limit_error"
              ) -> Reply:
        """An error status whose retry the SDK waits one millisecond for."""
        return cls(body={"type": "error", "error": {"type": kind, "message": message}},
                   status=status, headers={"retry-after-ms": "1", "x-should-retry": "true"})


@dataclass
class Received:
    """A request as the server got it, and what it sent back."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""  # the body's bytes as they came
    status: int = 0
    events_sent: int = 0
    events_total: int = 0
    disconnected: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Server:
    """The server; ``url`` is its base URL, ``received`` every request in arrival order."""

    def __init__(self, default: Reply | None = None,
                 answer: Callable[[Received], Reply] | None = None) -> None:
        self.default = default
        self.answer = answer
        self.received: list[Received] = []
        self._replies: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()  # cuts a scripted delay short when the server stops
        self._httpd = _Listener(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = False  # server_close() joins every request's thread
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="wire-server",
                                        kwargs={"poll_interval": 0.05})

    def queue(self, *replies: Reply) -> None:
        """Answer the next requests with *replies*, in order (then with the default)."""
        with self._lock:
            self._replies.extend(replies)

    def bodies(self, path_end: str = "") -> list[Any]:
        """The JSON bodies received at paths ending with *path_end*."""
        return [r.body for r in self.received if r.path.endswith(path_end)]

    def wait_finished(self, timeout: float = 5.0) -> None:
        """Wait until every request received so far has been answered or abandoned."""
        end = time.monotonic() + timeout
        for received in list(self.received):
            received.done.wait(max(0.0, end - time.monotonic()))

    def __enter__(self) -> Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.received.append(received)
            if self._replies:
                return self._replies.popleft()
        if self.answer is not None:
            return self.answer(received)
        if self.default is None:
            return Reply(body={"error": {"message": "nothing queued"}}, status=599)
        return self.default


class _Listener(ThreadingHTTPServer):
    #: connections waiting to be accepted: socketserver's 5 drops a burst of clients' first
    #: packets (16 threads connecting at once), which the kernel sends again a second later
    request_queue_size = 128


class _Dropped(Exception):
    """The reply's connection is dropped here."""


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # a connection kept open and idle this long is closed
        # writes are buffered until a flush: a reply's head and body leave in one write, as
        # a server's usually do, so that a client reads them in as many reads every time (the
        # benchmark counts a client's instructions); a stream flushes each event
        wbufsize = -1

        def setup(self) -> None:
            super().setup()
            # each write goes out at once (no Nagle delay waiting for the client's ACK)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            # every reply carries the same Date: a test that compares two runs' replies byte
            # for byte (bare SDK against switched) must not differ because a second turned
            return "Mon, 07 Dec 2026 12:00:00 GMT"

        def finish(self) -> None:
            # a client that left (a cut stream, a dropped reply) is no error of the server's
            with contextlib.suppress(OSError):
                super().finish()

        def handle(self) -> None:
            with contextlib.suppress(ConnectionError):
                super().handle()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            received = Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()},
                                json.loads(raw) if raw else None, raw=raw)
            reply = server._next(received)
            try:
                self._answer(reply, received)
            except (BrokenPipeError, ConnectionResetError):
                received.disconnected = True
                self.close_connection = True
            except _Dropped:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
            finally:
                received.done.set()

        do_GET = do_POST

        def _answer(self, reply: Reply, received: Received) -> None:
            if reply.delay:
                server._closing.wait(reply.delay)
            received.status = reply.status
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            if reply.events is None:
                data = reply.content(received.body)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if reply.drop is not None:
                    self._write(data[:reply.drop], reply.trickle)
                    raise _Dropped
                self._write(data, reply.trickle)
                return
            self.send_header("Content-Type", FRAMINGS[reply.framing])
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = reply.written(received.body)
            received.events_total = len(events)
            for chunk in events:
                if received.events_sent == reply.drop:
                    raise _Dropped
                self.wfile.write(b"%x\r\n" % len(chunk))
                self._write(chunk, reply.trickle)
                self.wfile.write(b"\r\n")
                self.wfile.flush()
                received.events_sent += 1
                if reply.event_delay:
                    server._closing.wait(reply.event_delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _write(self, data: bytes, trickle: float) -> None:
            """*data*, at once, or a byte at a time *trickle* seconds apart."""
            if not trickle:
                self.wfile.write(data)
                return
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                if server._closing.wait(trickle):
                    raise _Dropped

    return Handler
