"""OpenAI's reply shapes, from its public API reference: Chat Completions (a completion, and a
stream of chunks ending with a usage chunk when ``stream_options.include_usage`` is asked) and
Responses (a response object, and its stream of typed events)."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["chat", "chat_stream", "chat_usage", "embeddings", "response", "response_stream",
           "response_usage"]


def chat_usage(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0
               ) -> dict[str, Any]:
    """A completion's ``usage``: prompt tokens include the cached ones, completion tokens the
    reasoning ones."""
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0,
                                          "rejected_prediction_tokens": 0}}


def chat(text: str, usage: dict[str, Any], model: str = "gpt-4o-mini") -> Reply:
    """A chat completion (``POST /chat/completions``)."""
    return Reply(body={
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000,
        "model": model, "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                             "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": usage})


def chat_stream(pieces: list[str], usage: dict[str, Any], model: str = "gpt-4o-mini",
                event_delay: float = 0.0) -> Reply:
    """A streamed chat completion: a role chunk, one chunk per piece of text, a finish chunk,
    then, when the request asked ``stream_options.include_usage``, a chunk with no choices and
    the usage (every other chunk then says ``"usage": null``), and ``[DONE]``."""

    def events(body: Any) -> list[tuple[str | None, Any]]:
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": 1_700_000_000, "model": model, "system_fingerprint": "fp_1"}
        extra = {"usage": None} if with_usage else {}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}], **extra}

        out: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant",
                                                            "content": ""}))]
        out += [(None, chunk({"content": piece})) for piece in pieces]
        out.append((None, chunk({}, "stop")))
        if with_usage:
            out.append((None, {**base, "choices": [], "usage": usage}))
        out.append((None, "[DONE]"))
        return out

    return Reply(events=events, event_delay=event_delay)


def response_usage(inp: int, out: int, *, cached: int = 0, reasoning: int = 0
                   ) -> dict[str, Any]:
    """A response's ``usage``: input tokens include the cached ones, output the reasoning."""
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": inp + out}


def _response(text: str, usage: dict[str, Any] | None, model: str, status: str
              ) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    return {
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "status": status,
        "error": None, "incomplete_details": None, "instructions": None,
        "max_output_tokens": None, "model": model,
        "output": [{"type": "message", "id": "msg_1", "status": status, "role": "assistant",
                    "content": content}] if text else [],
        "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": True, "temperature": 1.0,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
        "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": None, "metadata": {}}


def response(text: str, usage: dict[str, Any], model: str = "gpt-4.1-mini") -> Reply:
    """A response (``POST /responses``)."""
    return Reply(body=_response(text, usage, model, "completed"))


def response_stream(pieces: list[str], usage: dict[str, Any], model: str = "gpt-4.1-mini",
                    event_delay: float = 0.0) -> Reply:
    """A streamed response: ``response.created``, the output item and content part, one
    ``response.output_text.delta`` per piece, the ``done`` events, ``response.completed``
    with the usage."""
    text = "".join(pieces)
    events: list[tuple[str | None, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    add("response.created", response=_response("", None, model, "in_progress"))
    add("response.output_item.added", output_index=0,
        item={"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant",
              "content": []})
    add("response.content_part.added", item_id="msg_1", output_index=0, content_index=0,
        part={"type": "output_text", "text": "", "annotations": []})
    for piece in pieces:
        add("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0,
            delta=piece, logprobs=[])
    add("response.output_text.done", item_id="msg_1", output_index=0, content_index=0,
        text=text, logprobs=[])
    add("response.content_part.done", item_id="msg_1", output_index=0, content_index=0,
        part={"type": "output_text", "text": text, "annotations": []})
    add("response.output_item.done", output_index=0,
        item={"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
              "content": [{"type": "output_text", "text": text, "annotations": []}]})
    add("response.completed", response=_response(text, usage, model, "completed"))
    return Reply(events=events, event_delay=event_delay)


def embeddings(count: int, prompt_tokens: int, model: str = "text-embedding-3-small",
               dimensions: int = 4) -> Reply:
    """An Embeddings reply (``POST /embeddings``): *count* embeddings of *dimensions* floats,
    and its usage: ``prompt_tokens`` and ``total_tokens``, the same (an embedding generates
    no tokens)."""
    return Reply(body={"object": "list", "model": model, "data": [
        {"object": "embedding", "index": i, "embedding": [0.25 * (i + 1)] * dimensions}
        for i in range(count)], "usage": {"prompt_tokens": prompt_tokens,
                                          "total_tokens": prompt_tokens}})
