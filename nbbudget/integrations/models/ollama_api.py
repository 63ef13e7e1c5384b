"""Ollama's native API as ``nb.instrument()`` reads it: ``POST /api/chat`` and
``POST /api/generate`` (the ``ollama`` package, and any client of the API).

The model is the body's ``model``; the output cap is ``options.num_predict``, where a value of 0
or less (Ollama's default, -1, and -2) bounds nothing: under an ``output_tokens`` or
``cost_usd`` limit it is clamped as if not given, and the request's ``options`` are made when it
has none. A request streams unless its body says ``"stream": false`` (Ollama's default is to
stream), as newline-delimited JSON (``application/x-ndjson``, `shapes.NDJSON`): one object a
line, the text in ``message.content`` (chat) or ``response`` (generate), and ``"done": true`` on
the last, which carries the usage: ``prompt_eval_count`` (the input) and ``eval_count`` (the
output). A whole reply is that last object, with the whole text. A count that is missing or is
not a whole number >= 0 in a last object is `shapes.Unreadable` (N-7); the replies that load or
unload a model (``done_reason`` ``"load"``, ``"unload"``) report none, and used none.

The models it serves are local: genai-prices prices none of them, so under a ``cost_usd`` limit
a call is refused before it is sent (``Unpriced``) unless it is priced with ``prices=``.

The ``ollama`` package passes any error but httpx's own on to its caller unchanged, and never
retries: its caller gets nbbudget's errors as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import NDJSON, Shape, Unreadable, count

__all__ = ["CHAT", "GENERATE", "PROVIDER", "Cut", "Refused", "Unpriced"]

#: the provider's name, as the errors and the trace give it (genai-prices knows none by it)
PROVIDER = "ollama"
#: the replies that load or unload a model, with no usage: they generate nothing
_NO_GENERATION = ("load", "unload")


class Refused(BudgetExceeded):
    """A request the budget refused before it was sent (nbbudget's `BudgetExceeded`)."""


class Cut(BudgetCut):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _count(reply: Mapping[str, Any], key: str, required: bool) -> int:
    """*reply*[*key*], a count at the top level of a last object (named so in an error)."""
    try:
        return count(reply, key, required=required)
    except Unreadable as err:
        raise Unreadable(key, err.value) from None


def _usage(reply: Mapping[str, Any]) -> dict[str, float]:
    """A last object's figures (a whole reply is one)."""
    required = reply.get("done_reason") not in _NO_GENERATION
    return {"input_tokens": _count(reply, "prompt_eval_count", required),
            "output_tokens": _count(reply, "eval_count", required)}


def _stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    return _usage(event) if event.get("done") is True else None


def _streamed(path: str, body: dict[str, Any]) -> bool:
    return body.get("stream") is not False


def _uncapped(value: Any) -> bool:
    """A ``num_predict`` that bounds nothing: Ollama stops at it only when it is above 0."""
    return (type(value) is int or type(value) is float) and value <= 0


def _chat_text(event: Mapping[str, Any]) -> str:
    message = event.get("message")
    text = message.get("content") if type(message) is dict else None
    return text if type(text) is str else ""


def _generate_text(event: Mapping[str, Any]) -> str:
    text = event.get("response")
    return text if type(text) is str else ""


def _shape(name: str, path: str, text: Any, delta_bytes: int) -> Shape:
    # ``final``: a last object says ``"done":true``, and a JSON ``true`` is written with these
    # bytes in any form (a literal has no escapes): an object without them is none
    return Shape(
        name=name, path=path, cap_keys=("num_predict",), cap_in="options",
        ask_usage=lambda body: False, usage=_usage, stream_usage=_stream_usage,
        settles=lambda event: event.get("done") is True, final=(b"true",),
        stream_text=text, reply_text=text, hidden=lambda event: False,
        delta_bytes=delta_bytes, streamed=_streamed, framing=NDJSON, usage_in="",
        uncapped=_uncapped)


#: a chat completion (``POST /api/chat``), for `instrument`
CHAT = _shape("chat", "/api/chat", _chat_text, len('{"message":{"content":"x"}}\n'))
#: a completion (``POST /api/generate``), for `instrument`
GENERATE = _shape("generate", "/api/generate", _generate_text, len('{"response":"x"}\n'))
