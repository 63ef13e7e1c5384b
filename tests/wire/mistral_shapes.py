"""Mistral's reply shapes, from Mistral's public API reference (``POST /v1/chat/completions``):
a chat completion, and a stream of chunks (server-sent events ended by ``data: [DONE]``) whose
last chunk, the one with ``finish_reason``, carries the request's ``usage`` unasked (Mistral's
API has no ``stream_options``). Usage is ``prompt_tokens``, ``completion_tokens`` and
``total_tokens``. `FIELDS` are the fields a request may have: the API refuses any other with
422 (``extra_forbidden``), as it refuses OpenAI's ``max_completion_tokens`` and
``stream_options``."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["FIELDS", "MODEL", "chat", "chat_stream", "usage"]

MODEL = "mistral-small-latest"
#: the fields of a chat completion request, as the API reference lists them
FIELDS = frozenset({
    "model", "messages", "temperature", "top_p", "max_tokens", "stream", "stop", "random_seed",
    "metadata", "response_format", "tools", "tool_choice", "presence_penalty",
    "frequency_penalty", "n", "prediction", "parallel_tool_calls", "prompt_mode", "safe_prompt",
    "reasoning_effort", "guardrails", "prompt_cache_key", "service_tier", "min_tokens",
    "repetition_penalty", "top_k", "logprobs", "top_logprobs", "prompt_logprobs",
    "top_prompt_logprobs"})
_ID = "cmpl-e5cc70bb28c444948073e77776eb30ef"
_CREATED = 1_702_256_327


def usage(prompt: int, completion: int) -> dict[str, Any]:
    """A ``usage``: the prompt's tokens, the completion's and their sum."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def chat(text: str, used: dict[str, Any], model: str = MODEL) -> Reply:
    """A chat completion: the message, ``finish_reason`` and ``usage``."""
    return Reply(body={
        "id": _ID, "object": "chat.completion", "model": model, "usage": used,
        "created": _CREATED,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                             "tool_calls": None, "prefix": False},
                     "finish_reason": "stop"}]})


def chat_stream(pieces: list[str], used: dict[str, Any] | None, model: str = MODEL,
                event_delay: float = 0.0) -> Reply:
    """A streamed chat completion: a chunk with the role, one per piece of text, a last one
    with ``finish_reason`` and the usage *used* (no ``usage`` at all with None: a server that
    reports none), then ``[DONE]``."""
    base = {"id": _ID, "object": "chat.completion.chunk", "created": _CREATED, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    events += [(None, chunk({"content": piece})) for piece in pieces]
    last = chunk({"content": ""}, "stop")
    if used is not None:
        last["usage"] = used
    events += [(None, last), (None, "[DONE]")]
    return Reply(events=events, event_delay=event_delay)
