"""OpenAI's model APIs as ``nb.instrument`` reads them: Chat Completions, Responses and
Embeddings.

Chat Completions (``POST /chat/completions``): the output cap is ``max_completion_tokens``, or
the older ``max_tokens`` when the request uses it; usage is ``prompt_tokens`` (cached input
included, ``prompt_tokens_details.cached_tokens``) and ``completion_tokens`` (reasoning
included). A stream reports usage only in a last chunk, when ``stream_options.include_usage``
is asked: the instrumented client asks it, and keeps that chunk (which has no choices), and the
``"usage": null`` every other chunk then carries, from a caller who did not. Responses
(``POST /responses``): ``max_output_tokens``; usage is ``input_tokens``
(``input_tokens_details.cached_tokens``) and ``output_tokens``; a stream reports it in
``response.completed`` (or ``response.incomplete``/``response.failed``). Token counts are whole
numbers >= 0 and the details objects; anything else is `shapes.Unreadable`. A server that reports
what a call cost in ``usage.cost`` (OpenRouter, in a whole reply and in a stream's usage) has it
read as ``cost_usd`` (`shapes.reported_cost`: a finite number >= 0, else unreadable).
Embeddings (``POST /embeddings``) generate no text: a request has no output cap and never
streams, and its usage is ``prompt_tokens``, its input (`shapes.Shape.generates`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from openai import OpenAIError as _SdkError
except ImportError:  # the wire format, spoken by another library: nbbudget's errors
    _SdkError = Exception  # type: ignore[assignment,misc]

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import Shape, Unreadable, count, details, reported_cost

__all__ = ["CHAT", "EMBEDDINGS", "MAX_RETRY_AFTER", "PROVIDER", "RESPONSES", "Cut", "Refused",
           "Unpriced"]

#: the provider's name in genai-prices
PROVIDER = "openai"
#: the longest ``Retry-After`` (seconds) the SDK waits before a retry: it does not retry a
#: request asked to wait longer (``openai._constants.MAX_RETRY_AFTER_DELAY``)
MAX_RETRY_AFTER = 120.0


class Refused(BudgetExceeded, _SdkError):
    """A request the budget refused before it was sent: nbbudget's `BudgetExceeded` and the
    SDK's `OpenAIError` at once (the SDK passes its own errors to the caller unchanged)."""


class Cut(BudgetCut, _SdkError):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError, _SdkError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _chat_ask_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                              "include_usage": True}
    return True


def _chat_usage(usage: Mapping[str, Any]) -> dict[str, float]:
    cached = details(usage, "prompt_tokens_details")
    return reported_cost(usage, {
        "input_tokens": count(usage, "prompt_tokens"),
        "output_tokens": count(usage, "completion_tokens"),
        "cache_read_tokens": count(cached, "cached_tokens", "usage.prompt_tokens_details",
                                   required=False)})


def _chat_stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    usage = event.get("usage")
    if usage is None:
        return None
    if type(usage) is not dict:
        raise Unreadable("usage", usage)
    return _chat_usage(usage)


def _chat_settles(event: Mapping[str, Any]) -> bool:
    return event.get("usage") is not None


def _chat_text(event: Mapping[str, Any]) -> str:
    choices = event.get("choices") or ()
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices)


def _chat_reply_text(body: Mapping[str, Any]) -> str:
    choices = body.get("choices") or ()
    return "".join((c.get("message") or {}).get("content") or "" for c in choices)


def _chat_hidden(event: Mapping[str, Any]) -> bool:
    return not event.get("choices") and event.get("usage") is not None


#: Chat Completions (``POST /chat/completions``), for `instrument`
CHAT = Shape(
    name="chat", path="/chat/completions", cap_keys=("max_tokens", "max_completion_tokens"),
    ask_usage=_chat_ask_usage,
    usage=_chat_usage, stream_usage=_chat_stream_usage, settles=_chat_settles,
    stream_text=_chat_text, reply_text=_chat_reply_text, hidden=_chat_hidden,
    delta_bytes=len('"content":"x"'), asked_field=b',"usage":null', done=b"[DONE]")


def _responses_usage(usage: Mapping[str, Any]) -> dict[str, float]:
    cached = details(usage, "input_tokens_details")
    return reported_cost(usage, {
        "input_tokens": count(usage, "input_tokens"),
        "output_tokens": count(usage, "output_tokens"),
        "cache_read_tokens": count(cached, "cached_tokens", "usage.input_tokens_details",
                                   required=False)})


#: the events that end a response's stream, reporting its usage
_ENDS = ("response.completed", "response.incomplete", "response.failed")


def _responses_stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    response = event.get("response")
    usage = response.get("usage") if type(response) is dict else None
    if usage is None:
        if event.get("type") in _ENDS:
            raise Unreadable("usage")
        return None
    if type(usage) is not dict:
        raise Unreadable("usage", usage)
    return _responses_usage(usage)


def _responses_settles(event: Mapping[str, Any]) -> bool:
    return event.get("type") in _ENDS


def _responses_text(event: Mapping[str, Any]) -> str:
    if event.get("type") == "response.output_text.delta":
        return str(event.get("delta") or "")
    return ""


def _responses_reply_text(body: Mapping[str, Any]) -> str:
    return "".join(part.get("text") or "" for item in body.get("output") or ()
                   if item.get("type") == "message" for part in item.get("content") or ()
                   if part.get("type") == "output_text")


#: Responses (``POST /responses``), for `instrument`
RESPONSES = Shape(
    name="responses", path="/responses", cap_keys=("max_output_tokens",),
    ask_usage=lambda body: False, usage=_responses_usage, stream_usage=_responses_stream_usage,
    settles=_responses_settles, final=tuple(end.encode() for end in _ENDS),
    stream_text=_responses_text,
    reply_text=_responses_reply_text, hidden=lambda event: False,
    delta_bytes=len('"type":"response.output_text.delta""delta":"x"'))


def _embeddings_usage(usage: Mapping[str, Any]) -> dict[str, float]:
    return reported_cost(usage, {"input_tokens": count(usage, "prompt_tokens"),
                                 "output_tokens": 0})


#: Embeddings (``POST /embeddings``), for `instrument`: no text generated, no cap, no stream
EMBEDDINGS = Shape(
    name="embeddings", path="/embeddings", cap_keys=(), generates=False,
    ask_usage=lambda body: False, usage=_embeddings_usage, stream_usage=lambda event: None,
    settles=lambda event: False, stream_text=lambda event: "",
    reply_text=lambda body: "", hidden=lambda event: False, delta_bytes=1,
    streamed=lambda path, body: False)
