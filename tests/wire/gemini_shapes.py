"""Gemini's reply shapes, from the Gemini API's public REST reference: a GenerateContentResponse
(``POST /v1beta/models/{model}:generateContent``) and the stream of them that
``:streamGenerateContent?alt=sse`` sends, each a server-sent event (``data: {...}``, lines ended
by CRLF as Google's servers end them), every chunk with the usage so far and the last one with
its ``finishReason`` and the final ``usageMetadata``. The JSON leaves out a count that is 0, as
proto3's JSON does."""

from __future__ import annotations

from typing import Any

from .server import Reply

__all__ = ["MODEL", "response", "response_body", "stream", "usage"]

MODEL = "gemini-2.5-flash"


def usage(prompt: int, candidates: int, *, cached: int = 0, thoughts: int = 0,
          tool_use: int = 0) -> dict[str, Any]:
    """A ``usageMetadata``: ``promptTokenCount`` includes the cached content
    (``cachedContentTokenCount``); ``totalTokenCount`` is every count's sum; counts of 0 are
    left out."""
    counts = {"promptTokenCount": prompt, "candidatesTokenCount": candidates,
              "totalTokenCount": prompt + candidates + thoughts + tool_use,
              "cachedContentTokenCount": cached, "thoughtsTokenCount": thoughts,
              "toolUsePromptTokenCount": tool_use}
    out: dict[str, Any] = {key: value for key, value in counts.items() if value}
    out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    if cached:
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    return out


def _candidate(parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return candidate


def response_body(text: str, used: dict[str, Any], model: str = MODEL) -> dict[str, Any]:
    """A GenerateContentResponse's JSON."""
    return {"candidates": [_candidate([{"text": text}], "STOP")], "usageMetadata": used,
            "modelVersion": model, "responseId": "resp-1"}


def response(text: str, used: dict[str, Any], model: str = MODEL) -> Reply:
    """A GenerateContentResponse (``:generateContent``)."""
    return Reply(body=response_body(text, used, model))


def stream(pieces: list[str], used: dict[str, Any], model: str = MODEL, *,
           event_delay: float = 0.0, running: bool = True, thoughts: tuple[str, ...] = ()
           ) -> Reply:
    """A streamed response (``:streamGenerateContent?alt=sse``): a chunk for each of
    *thoughts* (parts marked ``thought``), then one for each piece of text, the last with
    ``finishReason`` and the final usage *used*. Every other chunk carries the usage so far:
    the prompt's count and, when *running*, the output so far (one token a piece), as the
    Gemini API reports it."""
    prompt = used["promptTokenCount"]
    chunks: list[tuple[list[dict[str, Any]], int]] = [
        ([{"text": thought, "thought": True}], 0) for thought in thoughts]
    chunks += [([{"text": piece}], i + 1) for i, piece in enumerate(pieces)]
    events: list[tuple[str | None, Any]] = []
    for i, (parts, out) in enumerate(chunks):
        last = i == len(chunks) - 1
        so_far: dict[str, Any] = {"promptTokenCount": prompt}
        if running and out:
            so_far["candidatesTokenCount"] = out
        so_far["totalTokenCount"] = prompt + (out if running else 0)
        events.append((None, {"candidates": [_candidate(parts, "STOP" if last else None)],
                              "usageMetadata": used if last else so_far,
                              "modelVersion": model, "responseId": "resp-1"}))
    return Reply(events=events, event_delay=event_delay, newline="\r\n")
