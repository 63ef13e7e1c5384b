"""Amazon Bedrock's Converse reply shapes, from its public API reference (``Converse``,
``ConverseStream``): a whole reply (``output.message``, ``stopReason``, ``usage``,
``metrics``), and a stream of AWS event stream messages (``messageStart``,
``contentBlockDelta`` per piece of text, ``contentBlockStop``, ``messageStop``, then
``metadata`` with the usage), each event's payload carrying the padding field ``p`` as the
service writes it."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["converse", "stream", "usage"]


def usage(inp: int, out: int, read: int = 0, written: int = 0) -> dict[str, Any]:
    """A ``usage`` object: ``inputTokens`` without the cached input, which is counted apart."""
    used: dict[str, Any] = {"inputTokens": inp, "outputTokens": out,
                            "totalTokens": inp + out + read + written}
    if read or written:
        used.update(cacheReadInputTokens=read, cacheWriteInputTokens=written)
    return used


def converse(text: str, used: dict[str, Any] | None, form: str | None = None) -> Reply:
    """A whole ``Converse`` reply (no ``usage`` at all with None)."""
    body: dict[str, Any] = {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn", "metrics": {"latencyMs": 212}}
    if used is not None:
        body["usage"] = used
    return Reply(body=body, form=form)


def stream(pieces: list[str], used: dict[str, Any] | None, event_delay: float = 0.0,
           form: str | None = None, drop: int | None = None) -> Reply:
    """A ``ConverseStream`` reply: its events, the last ``metadata`` with *used* (a stream that
    ends without it with None)."""
    events: list[tuple[str | None, Any]] = [("messageStart", {"p": "abcd", "role": "assistant"})]
    events += [("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece},
                                      "p": "abcdefgh"}) for piece in pieces]
    events += [("contentBlockStop", {"contentBlockIndex": 0, "p": "ab"}),
               ("messageStop", {"p": "abcdef", "stopReason": "end_turn"})]
    if used is not None:
        events.append(("metadata", {"metrics": {"latencyMs": 301}, "p": "abc", "usage": used}))
    return Reply(events=events, event_delay=event_delay, framing="eventstream", form=form,
                 drop=drop)
