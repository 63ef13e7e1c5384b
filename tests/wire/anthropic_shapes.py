"""Anthropic's reply shapes, from its public API reference: a Message (``POST /v1/messages``)
and its stream of events (``message_start`` with the input usage, ``content_block_delta``
text deltas, ``message_delta`` with the output usage, ``message_stop``)."""

from __future__ import annotations

import json
from typing import Any

from .server import Reply

__all__ = ["message", "message_stream", "tool_use_stream", "usage"]


def usage(inp: int, out: int, *, cache_read: int = 0, cache_write: int = 0) -> dict[str, Any]:
    """A message's ``usage``: ``input_tokens`` counts only the uncached input; the cached
    input is ``cache_read_input_tokens`` and ``cache_creation_input_tokens``."""
    return {"input_tokens": inp, "output_tokens": out,
            "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read}


def _message(text: str, used: dict[str, Any], model: str, stop: str | None,
             id: str = "msg_1") -> dict[str, Any]:
    return {"id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop, "stop_sequence": None, "usage": used}


def message(text: str, used: dict[str, Any], model: str = "claude-3-5-haiku-latest") -> Reply:
    """A message."""
    return Reply(body=_message(text, used, model, "end_turn"))


def message_stream(pieces: list[str], used: dict[str, Any],
                   model: str = "claude-3-5-haiku-latest", event_delay: float = 0.0,
                   id: str = "msg_1") -> Reply:
    """A streamed message: ``message_start`` (its usage: the input, and one output token),
    a text block with one ``text_delta`` per piece, ``message_delta`` with the output
    tokens, ``message_stop``."""
    start = {**used, "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start",
                           "message": _message("", start, model, None, id)}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": piece}})
               for piece in pieces]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": used["output_tokens"]}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return Reply(events=events, event_delay=event_delay)


def tool_use_stream(name: str, arguments: dict[str, Any], used: dict[str, Any],
                    model: str = "claude-sonnet-4-5", id: str = "msg_1",
                    tool_id: str = "toolu_1") -> Reply:
    """A streamed message that asks for one tool: ``message_start``, a ``tool_use`` block whose
    input comes as one ``input_json_delta``, ``message_delta`` (``stop_reason``
    ``tool_use``, the output tokens), ``message_stop``."""
    start = {**used, "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start",
                           "message": _message("", start, model, None, id)}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
            "type": "tool_use", "id": tool_id, "name": name, "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(arguments)}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": used["output_tokens"]}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return Reply(events=events)
