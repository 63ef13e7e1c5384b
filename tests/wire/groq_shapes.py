"""Groq's reply shapes, from Groq's public API reference (``POST /openai/v1/chat/completions``):
a chat completion, whose ``usage`` adds Groq's timings (``queue_time``, ``prompt_time``,
``completion_time``, ``total_time``, in seconds) to the token counts and whose ``x_groq``
carries the request's id; and a stream of chunks (server-sent events ended by ``data:
[DONE]``) whose first chunk has ``x_groq.id`` and whose last, the one with ``finish_reason``,
has the request's usage in ``x_groq.usage`` (the API reference defines no ``stream_options``:
it is reported unasked). Groq's servers have also been seen to repeat it as a top-level
``usage`` in that chunk (``both=True``)."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["MODEL", "chat", "chat_stream", "usage"]

MODEL = "llama-3.3-70b-versatile"
_ID = "chatcmpl-f51b2cd2-bef7-417e-964e-a08f0b513c22"
_REQUEST = "req_01jbd6g2qdfw2adyrt2az8hz4w"
_CREATED = 1_730_241_104
_FINGERPRINT = "fp_179b0f92c9"


def usage(prompt: int, completion: int) -> dict[str, Any]:
    """A ``usage``: the token counts, and Groq's timings in seconds."""
    return {"queue_time": 0.037, "prompt_tokens": prompt, "prompt_time": 0.0007,
            "completion_tokens": completion, "completion_time": 0.46,
            "total_tokens": prompt + completion, "total_time": 0.4607}


def chat(text: str, used: dict[str, Any], model: str = MODEL) -> Reply:
    """A chat completion: the message, ``finish_reason``, ``usage`` and ``x_groq``."""
    return Reply(body={
        "id": _ID, "object": "chat.completion", "created": _CREATED, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": used, "usage_breakdown": None, "system_fingerprint": _FINGERPRINT,
        "x_groq": {"id": _REQUEST}, "service_tier": "on_demand"})


def chat_stream(pieces: list[str], used: dict[str, Any] | None, model: str = MODEL,
                event_delay: float = 0.0, both: bool = False) -> Reply:
    """A streamed chat completion: a chunk with the role (and ``x_groq.id``), one per piece of
    text, a last one with ``finish_reason`` and ``x_groq.usage`` *used* (and, with *both*, the
    same as ``usage``; none at all with None: a server that reports none), then ``[DONE]``."""
    base = {"id": _ID, "object": "chat.completion.chunk", "created": _CREATED, "model": model,
            "system_fingerprint": _FINGERPRINT}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}]}

    first = {**chunk({"role": "assistant", "content": ""}), "x_groq": {"id": _REQUEST}}
    events: list[tuple[str | None, Any]] = [(None, first)]
    events += [(None, chunk({"content": piece})) for piece in pieces]
    last = chunk({}, "stop")
    if used is not None:
        last["x_groq"] = {"id": _REQUEST, "usage": used}
        if both:
            last["usage"] = used
    events += [(None, last), (None, "[DONE]")]
    return Reply(events=events, event_delay=event_delay)
