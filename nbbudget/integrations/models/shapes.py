"""What the instrumented clients need to know of one model API: where a request names its model
and its output cap, how a reply and a stream's events report usage, where a stream's text is.

`Shape` is that description; ``openai_api`` and ``anthropic_api`` each give theirs, and
``instrument`` (the mechanism) reads nothing of an API but through it. Usage is read into the
figures of `nbbudget.run.prices.FIGURES` (``input_tokens`` counts every input token,
cached ones included; ``output_tokens`` includes reasoning), and ``cost_usd`` where the reply
reports what it cost (OpenRouter's ``usage.cost``, `reported_cost`).

Usage is read as the API defines it, from the parsed JSON: a whole reply's top-level ``usage``
(`reply_usage`), a stream event's as its API places it. A count that is not a whole number
>= 0, details that are not an object, or usage missing where the API reports it raise
`Unreadable`, naming the field and the value; so does a reported cost that is not a finite
number >= 0. A stream's meter (``clients``) parses an event
only when its bytes may hold usage (`may_hold_usage`, which proves it cannot otherwise) or when
its text deltas must be counted exactly (``Shape.delta_bytes`` bounds how many the bytes not
yet counted can hold, whatever their JSON form). A stream is cut into events by its API's
`Framing`: server-sent events (`SSE`: OpenAI, Anthropic), one JSON object a line (`NDJSON`:
Ollama), or AWS's binary event stream (`EVENT_STREAM`: Bedrock's ``ConverseStream``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any

__all__ = ["EVENT_STREAM", "MISSING", "NDJSON", "SSE", "Framing", "Shape", "Unreadable", "count",
           "details", "ends", "events_of", "lines_of", "may_hold_usage", "messages_of",
           "reply_usage", "reported_cost", "request_body", "request_content"]

# (text, index) -> (value, end), in C; typeshed types make_scanner's argument oddly
_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]


class _Missing:
    def __repr__(self) -> str:
        return "missing"


#: the value of a field a reply does not have
MISSING: Any = _Missing()


class Unreadable(ValueError):
    """A reply's usage that cannot be read: ``field`` (``usage.prompt_tokens``) and ``value``
    (`MISSING` when the reply has none)."""

    def __init__(self, field: str, value: Any = MISSING) -> None:
        self.field, self.value = field, value
        super().__init__(self.said())

    def said(self) -> str:
        """What the reply reported, in words: ``usage.output_tokens='12'``, ``no usage``."""
        if self.value is MISSING:
            return f"no {self.field}"
        return f"{self.field}={self.value!r}"


def count(usage: Mapping[str, Any], key: str, where: str = "usage", *,
          required: bool = True) -> int:
    """*usage*[*key*], a count of tokens: a whole number >= 0 (a float only when whole and
    finite), 0 when absent and not *required*; else `Unreadable`."""
    value = usage.get(key)
    if type(value) is int and value >= 0:
        return value
    if value is None:
        if required:
            raise Unreadable(f"{where}.{key}", MISSING if key not in usage else None)
        return 0
    if type(value) is float and 0 <= value < math.inf and value.is_integer():
        return int(value)
    raise Unreadable(f"{where}.{key}", value)


def details(usage: Mapping[str, Any], key: str, where: str = "usage") -> Mapping[str, Any]:
    """*usage*[*key*], an object of details (``prompt_tokens_details``): {} when absent or
    null; else `Unreadable`."""
    value = usage.get(key)
    if value is None:
        return {}
    if type(value) is dict:
        return value
    raise Unreadable(f"{where}.{key}", value)


def reported_cost(usage: Mapping[str, Any], figures: dict[str, float],
                  where: str = "usage") -> dict[str, float]:
    """*figures*, with the cost in dollars *usage* reports (``cost``: OpenRouter's, in a whole
    reply and in a stream's last usage) as ``cost_usd`` when it reports one: a finite number
    >= 0, else `Unreadable`. The OpenAI shapes read it; the model clients charge it in place
    of a price from genai-prices (``prices=`` still wins)."""
    value = usage.get("cost")
    if value is None:
        return figures
    if (type(value) is float or type(value) is int) and 0 <= value < math.inf:
        figures["cost_usd"] = float(value)
        return figures
    raise Unreadable(f"{where}.cost", value)


def _sse_whole(chunk: bytes) -> int:
    lf, crlf = chunk.rfind(b"\n\n"), chunk.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _ndjson_whole(chunk: bytes) -> int:
    return chunk.rfind(b"\n") + 1


@dataclass(frozen=True)
class Framing:
    """How a stream's bytes are cut into events, for a stream's meter (``clients``), which
    passes on whole events only.

    ``whole(chunk)``: the length of *chunk*'s whole events (the rest waits for the next chunk;
    in a framing of ``text``, the meter asks only of a chunk that does not end with a blank
    line, which ends an event in each of them); ``flush``: the bytes that end a last event the
    stream did not end; ``events(data)``: the events of *data*, each as ``(start, end, parsed
    JSON or None)``; ``text``: its events are lines of text (a binary framing's bytes may end
    with a blank line's inside an event).
    """

    name: str
    whole: Callable[[bytes], int]
    flush: bytes
    events: Callable[[bytes], list[tuple[int, int, Any]]]
    text: bool = True


@dataclass(frozen=True)
class Shape:
    """One endpoint of a model API (Chat Completions, Responses, Messages).

    ``cap_keys``: the request's output-cap field, the first of these the body has, else the
    last; ``ask_usage(body)``: make a streamed request report its usage, True when the caller
    had not asked for it (the usage event is then kept from the caller); ``usage(obj)``: a
    reply's ``usage`` object as figures (`Unreadable` when it cannot be read);
    ``stream_usage(event)``: the figures an event reports, or None (`Unreadable` likewise);
    ``settles(event)``: the event reports the stream's final usage; ``stream_text(event)``: the
    text an event adds (a text delta when not empty); ``reply_text(body)``: the text of a whole
    reply; ``hidden(event)``: an event the caller did not ask for (the usage event asked for by
    ``ask_usage``); ``asked_field``: the bytes every other event then carries, compact, that
    the caller did not ask for either (removed, so the caller reads the stream it asked for);
    ``delta_bytes``: the fewest bytes one text delta takes in any JSON form (white space and
    escapes only add bytes), so that *n* bytes hold at most ``n / delta_bytes`` deltas;
    ``final``: the bytes that name the events reporting the final usage (their types), which
    are parsed even without a ``usage`` (none is then unreadable usage); ``done``: the data of a
    last event that ends the stream where the SDK stops reading
    (Chat's ``[DONE]``), or empty. ``cap_in``: the object of the body that holds the cap keys
    (Gemini's ``generationConfig``), or empty for the body itself; ``model_of(path, body)``:
    the model a request names, where it is not its body's ``model`` (Gemini names it in the
    path); ``streamed(path, body)``: whether it asks for a stream, where that is not its body's
    ``stream`` being true. ``usage_in``: the key of a whole reply's object of usage
    (Gemini's ``usageMetadata``), or empty for the reply itself (Ollama's counts are
    top-level); ``choices``: the key, in the object that holds the cap, of how many replies a
    request asks for, each up to the cap (Chat's ``n``, Gemini's ``candidateCount``);
    ``framing``: how its stream is cut into events, where it is not as server-sent events
    (`SSE`): `NDJSON`; ``uncapped(value)``: whether a cap the request gives bounds nothing
    (Ollama's ``num_predict`` of 0 or less): it is then clamped as if none were given.
    ``generates``: whether it generates text (False: an embedding, which has no output cap and
    no turn, and takes only its ``provider_calls`` permit and its input's worst case).
    ``signed``: whether a request may come signed over its body (AWS's SigV4, as LiteLLM signs
    Bedrock's and sends them on httpx): the gate then never changes it.
    """

    name: str
    path: str
    cap_keys: tuple[str, ...]
    ask_usage: Callable[[dict[str, Any]], bool]
    usage: Callable[[Mapping[str, Any]], dict[str, float]]
    stream_usage: Callable[[Mapping[str, Any]], dict[str, float] | None]
    settles: Callable[[Mapping[str, Any]], bool]
    stream_text: Callable[[Mapping[str, Any]], str]
    reply_text: Callable[[Mapping[str, Any]], str]
    hidden: Callable[[Mapping[str, Any]], bool]
    delta_bytes: int
    asked_field: bytes = b""
    final: tuple[bytes, ...] = ()
    done: bytes = b""
    cap_in: str = ""
    model_of: Callable[[str, dict[str, Any]], Any] | None = None
    streamed: Callable[[str, dict[str, Any]], bool] | None = None
    choices: str = "n"
    framing: Framing | None = None
    usage_in: str = "usage"
    uncapped: Callable[[Any], bool] | None = None
    generates: bool = True
    signed: bool = False


def request_content(body: Any) -> bytes:
    """A request body the gate changed (its cap clamped, its model degraded, usage asked of a
    stream), as the bytes to send: compact JSON, as the SDKs write it. Used by ``clients`` and
    by the aiohttp and botocore layers of the process-wide switch (``aio``, ``boto``)."""
    return json.dumps(body, separators=(",", ":")).encode()


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


def reply_usage(shape: Shape, content: bytes) -> dict[str, float]:
    """The figures of a whole reply's top-level usage object (``Shape.usage_in``: ``usage``,
    Gemini's ``usageMetadata``, or the reply itself where empty, as Ollama's) and its reported
    cost, where the shape reads one (``cost_usd``), the body parsed as JSON (the C scanner, as
    `request_body`); `Unreadable` when the body is not a JSON object, has no usage object or its
    figures cannot be read."""
    key = shape.usage_in
    named = key or "usage"
    try:
        body = request_body(content)
    except ValueError:
        raise Unreadable(named, MISSING) from None
    if type(body) is not dict:
        raise Unreadable(named, MISSING)
    usage = body.get(key) if key else body
    if type(usage) is not dict:
        raise Unreadable(named, MISSING if usage is None else usage)
    return shape.usage(usage)


def ends(shape: Shape, data: bytes) -> bool:
    """Whether *data* holds the event that ends *shape*'s stream (``Shape.done``)."""
    done = shape.done
    return bool(done) and done in data and any(
        line[5:].strip() == done for line in data.splitlines() if line.startswith(b"data:"))


def may_hold_usage(data: bytes) -> bool:
    """Whether the JSON in *data* may hold a key ``usage`` whose value is not null, whatever
    its form: False is a proof that it holds none. A key ``usage`` is written with these bytes
    unless a letter of it is escaped (``\\u0075``); every ``usage`` found is then part of a
    ``"usage":null`` whose quote after ``usage`` is unescaped, so it is a key whose value is
    null (or lies in a longer key, as ``x\\"usage``)."""
    n = data.count(b"usage")
    return (n != 0 and n != data.count(b'"usage":null')) or b"\\u" in data


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


def lines_of(data: bytes | bytearray, start: int = 0, end: int | None = None
             ) -> list[tuple[int, int, Any]]:
    """The lines of newline-delimited JSON in ``data[start:end]``, each as ``(start, end,
    JSON)``; a line that is not JSON (or blank) has None."""
    out: list[tuple[int, int, Any]] = []
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        cut = data.find(b"\n", pos, end)
        stop = end if cut < 0 else cut + 1
        line = bytes(data[pos:stop]).strip()
        value: Any = None
        if line:
            try:
                value = json.loads(line)
            except ValueError:
                value = None
        out.append((pos, stop, value))
        pos = stop
    return out


#: server-sent events (OpenAI, Anthropic): an event ends with a blank line, its data on
#: ``data:`` lines
SSE = Framing("server-sent events", _sse_whole, b"\n\n", events_of)
#: newline-delimited JSON (Ollama's ``application/x-ndjson``): one JSON object a line
NDJSON = Framing("newline-delimited JSON", _ndjson_whole, b"\n", lines_of)


# -- AWS's event stream (``application/vnd.amazon.eventstream``) ---------------------------------
# A message: its total length and its headers' length (4 bytes each, big-endian), the CRC32 of
# those 8 bytes, the headers, the payload, the CRC32 of all before it. A header: its name's
# length (1 byte), the name, its value's type (1 byte), the value: a string's (type 7) and
# bytes' (type 6) after their length (2 bytes); the other types are of fixed size.
_PRELUDE, _CRC = 12, 4
#: the size of a header value of each fixed-size type (0, 1: booleans; 2 to 5: integers of 1,
#: 2, 4, 8 bytes; 8: a timestamp; 9: a UUID)
_FIXED = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


def _message_ends(chunk: bytes) -> int:
    """The length of *chunk*'s whole messages of an event stream (a length below a message's
    least, which no server writes, passes the rest on as it is: the SDK's parser says what is
    wrong with it)."""
    pos, size = 0, len(chunk)
    while pos + 4 <= size:
        total = int.from_bytes(chunk[pos:pos + 4], "big")
        if total < _PRELUDE + _CRC:
            return size
        if pos + total > size:
            break
        pos += total
    return pos


def _headers(data: bytes | bytearray, pos: int, end: int) -> dict[str, Any]:
    """The headers in ``data[pos:end]``: strings decoded, bytes as they are, numbers read."""
    out: dict[str, Any] = {}
    while pos < end:
        n = data[pos]
        name = bytes(data[pos + 1:pos + 1 + n]).decode("utf-8", "replace")
        pos += 1 + n
        kind = data[pos]
        pos += 1
        if kind in (6, 7):
            length = int.from_bytes(data[pos:pos + 2], "big")
            raw = bytes(data[pos + 2:pos + 2 + length])
            out[name] = raw.decode("utf-8", "replace") if kind == 7 else raw
            pos += 2 + length
        elif kind in _FIXED:
            out[name] = kind == 0 if kind < 2 else int.from_bytes(
                data[pos:pos + _FIXED[kind]], "big", signed=kind != 9)
            pos += _FIXED[kind]
        else:
            break  # a type no version of the format has: the SDK's parser refuses it
    return out


def messages_of(data: bytes | bytearray, start: int = 0, end: int | None = None
                ) -> list[tuple[int, int, Any]]:
    """The messages of an AWS event stream in ``data[start:end]``, each as ``(start, end,
    event)``: an event (``:message-type`` ``event``, or none) as the SDK hands it on, ``{event
    type: JSON payload}`` (``{"contentBlockDelta": {...}}``); None for an exception's message or
    a payload that is not JSON. A last message not whole is ``(start, end, None)``."""
    out: list[tuple[int, int, Any]] = []
    end = len(data) if end is None else end
    pos = start
    while pos < end:
        total = int.from_bytes(data[pos:pos + 4], "big") if pos + 4 <= end else 0
        if total < _PRELUDE + _CRC or pos + total > end:
            out.append((pos, end, None))
            break
        stop = pos + total
        first = pos + _PRELUDE + int.from_bytes(data[pos + 4:pos + 8], "big")
        headers = _headers(data, pos + _PRELUDE, first)
        value: Any = None
        kind = headers.get(":event-type")
        if headers.get(":message-type", "event") == "event" and type(kind) is str:
            try:
                value = {kind: json.loads(bytes(data[first:stop - _CRC]) or b"{}")}
            except ValueError:
                value = None
        out.append((pos, stop, value))
        pos = stop
    return out


#: AWS's binary event stream (Bedrock's ``ConverseStream``, ``application/vnd.amazon.
#: eventstream``): each message says its length; an event is ``{type: payload}``, as botocore
#: gives it to its caller
EVENT_STREAM = Framing("event stream", _message_ends, b"", messages_of, text=False)
