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

Two providers serve Chat Completions of their own, read by their own shapes (`chat_of`), as
their API references define them; neither is asked for a stream's usage, which both report
unasked in the stream's last chunk, the one with ``finish_reason``. Mistral (`MISTRAL_CHAT`,
``https://api.mistral.ai/v1``) refuses with 422 any field it does not define, OpenAI's
``max_completion_tokens`` and ``stream_options`` among them: its cap is ``max_tokens``, and
its last chunk carries ``usage``. Groq (`GROQ_CHAT`, ``https://api.groq.com/openai/v1``)
defines no ``stream_options``: its last chunk carries the usage in ``x_groq.usage`` (and, from
some of its servers, the same as ``usage``, read first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

try:
    from openai import OpenAIError as _SdkError
except ImportError:  # the wire format, spoken by another library: nbbudget's errors
    _SdkError = Exception  # type: ignore[assignment,misc]

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import Shape, Unreadable, count, details, reported_cost

__all__ = ["CHAT", "EMBEDDINGS", "GROQ", "GROQ_CHAT", "MAX_RETRY_AFTER", "MISTRAL",
           "MISTRAL_CHAT", "PROVIDER", "RESPONSES", "Cut", "Refused", "Unpriced", "chat_of",
           "provider_at"]

#: the provider's name in genai-prices
PROVIDER = "openai"
#: the names in genai-prices of the providers whose Chat Completions have shapes of their own
MISTRAL, GROQ = "mistral", "groq"
#: where each of them serves its API: a base URL there (or below it) is theirs, also where
#: genai-prices, which resolves a base URL to its provider, is not installed
_SERVED_AT = {"https://api.mistral.ai": MISTRAL, "https://api.groq.com": GROQ}
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


def _chat_usage(usage: Mapping[str, Any], where: str = "usage") -> dict[str, float]:
    """The figures of a completion's usage object, found at *where* (named by `Unreadable`)."""
    cached = details(usage, "prompt_tokens_details", where)
    return reported_cost(usage, {
        "input_tokens": count(usage, "prompt_tokens", where),
        "output_tokens": count(usage, "completion_tokens", where),
        "cache_read_tokens": count(cached, "cached_tokens", f"{where}.prompt_tokens_details",
                                   required=False)}, where)


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


def _unasked(body: dict[str, Any]) -> bool:
    """A stream whose API reports its usage unasked: its body is left as it is."""
    return False


#: Mistral's Chat Completions (``POST /v1/chat/completions``), as OpenAI's but: the cap is
#: ``max_tokens``, the only one it takes; a stream is sent as the caller asked it, and its last
#: chunk's ``usage`` is read
MISTRAL_CHAT = dataclasses.replace(CHAT, cap_keys=("max_tokens",), ask_usage=_unasked)


def _groq_usage(event: Mapping[str, Any]) -> Any:
    """A Groq chunk's usage: its ``usage``, else its ``x_groq.usage``; None when neither."""
    usage = event.get("usage")
    if usage is None:
        extra = event.get("x_groq")
        if type(extra) is dict:
            usage = extra.get("usage")
    return usage


def _groq_stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    usage = _groq_usage(event)
    if usage is None:
        return None
    where = "usage" if event.get("usage") is not None else "x_groq.usage"
    if type(usage) is not dict:
        raise Unreadable(where, usage)
    return _chat_usage(usage, where)


#: Groq's Chat Completions (``POST /openai/v1/chat/completions``), as OpenAI's but: a stream is
#: sent as the caller asked it, and its last chunk's ``usage`` or ``x_groq.usage`` is read
GROQ_CHAT = dataclasses.replace(CHAT, ask_usage=_unasked, stream_usage=_groq_stream_usage,
                                settles=lambda event: _groq_usage(event) is not None)

_CHATS = {MISTRAL: MISTRAL_CHAT, GROQ: GROQ_CHAT}


def provider_at(base_url: str) -> str | None:
    """The provider whose own Chat Completions are served at *base_url* (Mistral's or Groq's
    URL, or one below it), or None."""
    return next((provider for url, provider in _SERVED_AT.items()
                 if base_url == url or base_url.startswith(url + "/")), None)


def chat_of(provider: str) -> Shape:
    """The Chat Completions shape of *provider* (a genai-prices provider id): Mistral's,
    Groq's, or else OpenAI's."""
    return _CHATS.get(provider, CHAT)


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
