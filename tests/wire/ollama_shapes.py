"""Ollama's reply shapes, from its public API reference (``docs/api.md``): a chat completion
(``POST /api/chat``) and a completion (``POST /api/generate``), each a whole reply (``"stream":
false``) or a stream of newline-delimited JSON objects (``application/x-ndjson``; Ollama streams
unless asked not to), whose last (``"done": true``) carries the statistics: ``prompt_eval_count``
(the prompt's tokens), ``eval_count`` (the response's) and the durations in nanoseconds; and the
reply that loads a model (``done_reason`` ``"load"``), which has none."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["chat", "chat_stream", "generate", "generate_stream", "loaded", "usage"]

CREATED = "2024-12-06T00:46:58.265747Z"


def usage(prompt: int, output: int) -> dict[str, Any]:
    """The statistics of a last object: its counts of tokens and its durations."""
    return {"total_duration": 4_883_583_458, "load_duration": 1_334_875,
            "prompt_eval_count": prompt, "prompt_eval_duration": 342_546_000,
            "eval_count": output, "eval_duration": 4_535_599_000}


def _message(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def chat(text: str, used: dict[str, Any], model: str = "llama3.2") -> Reply:
    """A whole chat completion: the message, ``done``, and the statistics."""
    return Reply(body={"model": model, "created_at": CREATED, "message": _message(text),
                       "done_reason": "stop", "done": True, **used})


def chat_stream(pieces: list[str], used: dict[str, Any] | None, model: str = "llama3.2",
                event_delay: float = 0.0, form: str | None = None) -> Reply:
    """A streamed chat completion: an object per piece of text (``"done": false``), then a last
    one with an empty message, ``done_reason``, ``"done": true`` and the statistics *used*
    (none at all with None: a stream that ends without its last object)."""
    events: list[tuple[str | None, Any]] = [
        (None, {"model": model, "created_at": CREATED, "message": _message(piece),
                "done": False}) for piece in pieces]
    if used is not None:
        events.append((None, {"model": model, "created_at": CREATED, "message": _message(""),
                              "done_reason": "stop", "done": True, **used}))
    return Reply(events=events, event_delay=event_delay, framing="ndjson", form=form)


def generate(text: str, used: dict[str, Any], model: str = "llama3.2") -> Reply:
    """A whole completion: the response, ``done``, the context and the statistics."""
    return Reply(body={"model": model, "created_at": CREATED, "response": text, "done": True,
                       "done_reason": "stop", "context": [1, 2, 3], **used})


def generate_stream(pieces: list[str], used: dict[str, Any], model: str = "llama3.2",
                    event_delay: float = 0.0, form: str | None = None) -> Reply:
    """A streamed completion: an object per piece of ``response``, then a last one with an
    empty ``response``, the context and the statistics."""
    events: list[tuple[str | None, Any]] = [
        (None, {"model": model, "created_at": CREATED, "response": piece, "done": False})
        for piece in pieces]
    events.append((None, {"model": model, "created_at": CREATED, "response": "", "done": True,
                          "done_reason": "stop", "context": [1, 2, 3], **used}))
    return Reply(events=events, event_delay=event_delay, framing="ndjson", form=form)


def loaded(model: str = "llama3.2") -> Reply:
    """The reply to a chat request with no messages, which loads the model: one object, even
    when a stream was asked, with no statistics."""
    return Reply(body={"model": model, "created_at": CREATED, "message": _message(""),
                       "done_reason": "load", "done": True})
