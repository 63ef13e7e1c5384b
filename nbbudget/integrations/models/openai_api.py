"""OpenAI's model APIs as ``nb.instrument`` reads them: Chat Completions and Responses.

Chat Completions (``POST /chat/completions``): the output cap is ``max_completion_tokens``, or
the older ``max_tokens`` when the request uses it; usage is ``prompt_tokens`` (cached input
included, ``prompt_tokens_details.cached_tokens``) and ``completion_tokens`` (reasoning
included). A stream reports usage only in a last chunk, when ``stream_options.include_usage``
is asked: the instrumented client asks it, and keeps that chunk (which has no choices), and the
``"usage": null`` every other chunk then carries, from a caller who did not. Responses
(``POST /responses``): ``max_output_tokens``; usage is ``input_tokens``
(``input_tokens_details.cached_tokens``) and ``output_tokens``; a stream reports it in
``response.completed`` (or ``response.incomplete``/``response.failed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openai import OpenAIError

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import Shape

__all__ = ["CHAT", "PROVIDER", "RESPONSES", "Cut", "Refused", "Unpriced"]

#: the provider's name in genai-prices
PROVIDER = "openai"


class Refused(BudgetExceeded, OpenAIError):
    """A request the budget refused before it was sent: nbbudget's `BudgetExceeded` and the
    SDK's `OpenAIError` at once (the SDK passes its own errors to the caller unchanged)."""


class Cut(BudgetCut, OpenAIError):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError, OpenAIError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _chat_ask_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                              "include_usage": True}
    return True


def _chat_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    details = usage.get("prompt_tokens_details") or {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_read_tokens": int(details.get("cached_tokens") or 0)}


def _chat_stream_usage(event: Mapping[str, Any]) -> dict[str, int] | None:
    usage = event.get("usage")
    return _chat_usage(usage) if isinstance(usage, dict) else None


def _chat_text(event: Mapping[str, Any]) -> str:
    choices = event.get("choices") or ()
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices)


def _chat_reply_text(body: Mapping[str, Any]) -> str:
    choices = body.get("choices") or ()
    return "".join((c.get("message") or {}).get("content") or "" for c in choices)


def _chat_hidden(event: Mapping[str, Any]) -> bool:
    return not event.get("choices") and isinstance(event.get("usage"), dict)


#: Chat Completions (``POST /chat/completions``), for `instrument`
CHAT = Shape(
    name="chat", path="/chat/completions", cap_keys=("max_tokens", "max_completion_tokens"),
    ask_usage=_chat_ask_usage,
    usage=_chat_usage, stream_usage=_chat_stream_usage, stream_text=_chat_text,
    reply_text=_chat_reply_text, hidden=_chat_hidden,
    text_marker=b'"content":"', empty_marker=b'"content":""', asked_field=b',"usage":null')


def _responses_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    details = usage.get("input_tokens_details") or {}
    return {"input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "cache_read_tokens": int(details.get("cached_tokens") or 0)}


def _responses_stream_usage(event: Mapping[str, Any]) -> dict[str, int] | None:
    response = event.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return _responses_usage(usage) if isinstance(usage, dict) else None


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
    stream_text=_responses_text, reply_text=_responses_reply_text, hidden=lambda event: False,
    text_marker=b'"type":"response.output_text.delta"')
