"""Amazon Bedrock's Converse API as ``nb.instrument()`` reads it: ``Converse`` and
``ConverseStream`` (``POST /model/{modelId}/converse`` and ``.../converse-stream`` at
``bedrock-runtime``), as boto3's ``bedrock-runtime`` client (botocore) speaks it.

The model is named in the path (``amazon.nova-lite-v1:0``, an inference profile
``us.anthropic.claude-...``, or its ARN), percent-encoded as botocore writes it. The output cap
is ``inferenceConfig.maxTokens``. Usage is the reply's ``usage``: ``inputTokens`` counts only
the input read neither from nor into the cache, so the input is ``inputTokens +
cacheReadInputTokens + cacheWriteInputTokens`` (as Anthropic's); ``outputTokens`` includes
reasoning. A stream is AWS's binary event stream (`shapes.EVENT_STREAM`): its text in
``contentBlockDelta`` events (``delta.text``, and ``delta.reasoningContent.text``), its usage
in the last event, ``metadata``. A count that is missing or is not a whole number >= 0, and a
``metadata`` without ``usage``, are `shapes.Unreadable` (N-7).

genai-prices prices Bedrock's models as provider ``aws`` (its model ids, the inference profiles
and their ARNs).

botocore passes an error raised while it prepares or sends a request on to its caller as it
is, and retries none of nbbudget's: the caller gets these errors unchanged.

A request that comes to a gate signed (LiteLLM signs Bedrock's requests with SigV4 and sends
them on httpx, where the switch sees them) is never changed (`shapes.Shape.signed`): its output
cap is not clamped (its worst case, at the cap it asks, is reserved or refused whole), and a
stream is cut at the crossing as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from .shapes import EVENT_STREAM, MISSING, Shape, Unreadable, count

__all__ = ["CONVERSE", "CONVERSE_STREAM", "EXTRA", "PROVIDER", "Cut", "Refused", "Unpriced"]

#: the provider's name in genai-prices
PROVIDER = "aws"
#: the extra of nbbudget that installs boto3 and genai-prices
EXTRA = "bedrock"
_MODEL = "/model/"


class Refused(BudgetExceeded):
    """A request the budget refused before it was sent (nbbudget's `BudgetExceeded`)."""


class Cut(BudgetCut):
    """A request or stream cut by the budget; ``salvage`` is the text received so far."""

    salvage: str = ""


class Unpriced(ConfigError):
    """A request naming a model with no known price while ``cost_usd`` is limited."""


def _model(path: str, body: dict[str, Any]) -> str | None:
    """The model *path* names: what lies between ``/model/`` and the operation, decoded."""
    at = path.find(_MODEL)
    if at < 0:
        return None
    named = path[at + len(_MODEL):path.rfind("/")]
    return unquote(named) or None


def _usage(usage: Mapping[str, Any]) -> dict[str, float]:
    """A ``usage`` object as figures."""
    read = count(usage, "cacheReadInputTokens", required=False)
    written = count(usage, "cacheWriteInputTokens", required=False)
    return {"input_tokens": count(usage, "inputTokens") + read + written,
            "output_tokens": count(usage, "outputTokens"),
            "cache_read_tokens": read, "cache_write_tokens": written}


def _stream_usage(event: Mapping[str, Any]) -> dict[str, float] | None:
    """The ``metadata`` event's usage; None for every other event."""
    metadata = event.get("metadata")
    if metadata is None:
        return None
    if type(metadata) is not dict:
        raise Unreadable("metadata", metadata)
    usage = metadata.get("usage", MISSING)
    if type(usage) is not dict:
        raise Unreadable("metadata.usage", usage)
    return _usage(usage)


def _stream_text(event: Mapping[str, Any]) -> str:
    """The text a ``contentBlockDelta`` event adds: its text, or its reasoning's."""
    block = event.get("contentBlockDelta")
    delta = block.get("delta") if type(block) is dict else None
    if type(delta) is not dict:
        return ""
    text = delta.get("text")
    if type(text) is str:
        return text
    reasoning = delta.get("reasoningContent")
    text = reasoning.get("text") if type(reasoning) is dict else None
    return text if type(text) is str else ""


def _reply_text(body: Mapping[str, Any]) -> str:
    """The text of a whole reply: its message's text blocks."""
    output = body.get("output")
    message = output.get("message") if type(output) is dict else None
    content = message.get("content") if type(message) is dict else None
    return "".join(block["text"] for block in content if type(block) is dict and type(
        block.get("text")) is str) if type(content) is list else ""


def _shape(name: str, operation: str, streamed: bool) -> Shape:
    # ``delta_bytes``: the fewest bytes of a message holding one text delta, in any form: its
    # prelude and CRC, the ``:event-type`` header botocore reads it by, and the least payload
    return Shape(
        name=name, path="/" + operation, cap_keys=("maxTokens",), cap_in="inferenceConfig",
        ask_usage=lambda body: False, usage=_usage, stream_usage=_stream_usage,
        settles=lambda event: "metadata" in event, final=(b"metadata",),
        stream_text=_stream_text, reply_text=_reply_text, hidden=lambda event: False,
        delta_bytes=12 + 4 + len(b"\x0b:event-type\x07\x00\x11contentBlockDelta")
        + len('{"delta":{"text":"x"}}'),
        model_of=_model, streamed=lambda path, body: streamed, framing=EVENT_STREAM,
        signed=True)


#: ``Converse``: a whole reply, for `instrument`
CONVERSE = _shape("converse", "converse", False)
#: ``ConverseStream``: an event stream, for `instrument`
CONVERSE_STREAM = _shape("converse-stream", "converse-stream", True)
