"""What the instrumented clients need to know of one model API: where a request names its model
and its output cap, how a reply and a stream's events report usage, where a stream's text is.

`Shape` is that description; ``openai_api`` and ``anthropic_api`` each give theirs, and
``instrument`` (the mechanism) reads nothing of an API but through it. Usage is read into the
figures of `nbbudget.integrations.prices.FIGURES` (``input_tokens`` counts every input token,
cached ones included; ``output_tokens`` includes reasoning).

Streams are scanned as bytes, not parsed: each API's events are compact JSON, so a text delta is
found by a marker (``text_marker``, less ``empty_marker``) counted in C, and only the few
events that carry usage (``usage_marker``) are parsed. Reading a reply's usage parses only its
``usage`` object, found from the end of the body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any

__all__ = ["Shape", "events_of", "reply_usage", "request_body"]

_USAGE_KEY = re.compile(r'\s*:\s*')  # what follows the key "usage"
# (text, index) -> (value, end), in C; typeshed types make_scanner's argument oddly
_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]


@dataclass(frozen=True)
class Shape:
    """One endpoint of a model API (Chat Completions, Responses, Messages).

    ``cap_keys``: the request's output-cap field, the first of these the body has, else the
    last; ``ask_usage(body)``: make a streamed request report its usage, True when the caller
    had not asked for it (the usage event is then kept from the caller); ``usage(obj)``: a
    reply's ``usage`` object as figures;
    ``stream_usage(event)``: the figures an event reports, or None; ``stream_text(event)``: the
    text an event adds; ``reply_text(body)``: the text of a whole reply; ``hidden(event)``: an
    event the caller did not ask for (the usage event asked for by ``ask_usage``);
    ``asked_field``: the bytes every other event then carries that the caller did not ask for
    either (removed, so the caller reads the stream it asked for).
    """

    name: str
    path: str
    cap_keys: tuple[str, ...]
    ask_usage: Callable[[dict[str, Any]], bool]
    usage: Callable[[Mapping[str, Any]], dict[str, int]]
    stream_usage: Callable[[Mapping[str, Any]], dict[str, int] | None]
    stream_text: Callable[[Mapping[str, Any]], str]
    reply_text: Callable[[Mapping[str, Any]], str]
    hidden: Callable[[Mapping[str, Any]], bool]
    text_marker: bytes
    empty_marker: bytes = b""
    usage_marker: bytes = b'"usage":{'
    asked_field: bytes = b""


def request_body(content: bytes) -> Any:
    """A request's JSON body, which the SDK serialised compactly, for the instrumented clients
    (``clients``), which read every request's model and output cap: read with the C scanner
    alone (`json.loads` adds its encoding detection and a second pass for the end), else with
    `json.loads` (white space around it; a body that is not JSON raises ValueError)."""
    text = content.decode()
    try:
        body, end = _scan(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        body = json.loads(text)
    return body


def reply_usage(shape: Shape, content: bytes) -> dict[str, int] | None:
    """The figures of a whole reply's ``usage``, parsing only that object (the last ``usage``
    key of the body: the text before it cannot hold an unescaped ``"usage"``), or None."""
    at = content.rfind(b'"usage"')
    if at < 0:
        return None
    text = content[at + 7:].decode()
    if text[:2] == ":{":  # compact
        start = 1
    elif text[:3] == ": {":  # as json.dumps writes it
        start = 2
    else:
        key = _USAGE_KEY.match(text)
        if key is None:
            return None
        start = key.end()
    try:
        obj, _ = _scan(text, start)
    except (StopIteration, ValueError):
        return None
    return shape.usage(obj) if type(obj) is dict else None


def events_of(data: bytes | bytearray, start: int = 0, end: int | None = None
              ) -> list[tuple[int, int, Any]]:
    """The server-sent events in ``data[start:end]``, each as ``(start, end, JSON data)``;
    an event whose data is not JSON (``[DONE]``) has None."""
    out: list[tuple[int, int, Any]] = []
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        cut = data.find(b"\n\n", pos, end)
        cut_crlf = data.find(b"\r\n\r\n", pos, end)
        if cut < 0 and cut_crlf < 0:
            stop = end
        elif cut_crlf < 0 or 0 <= cut < cut_crlf:
            stop = cut + 2
        else:
            stop = cut_crlf + 4
        lines = [line[5:].strip() for line in bytes(data[pos:stop]).splitlines()
                 if line.startswith(b"data:")]
        value: Any = None
        if lines:
            try:
                value = json.loads(b"\n".join(lines))
            except ValueError:
                value = None
        out.append((pos, stop, value))
        pos = stop
    return out
