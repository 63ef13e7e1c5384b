"""Model clients bounded by a run: ``nb.instrument(client)`` for the OpenAI and Anthropic SDKs
(the ``openai`` and ``anthropic`` extras). `instrument` is the mechanism; ``openai_api`` and
``anthropic_api`` describe each API's shapes (``shapes.Shape``)."""

from .instrument import instrument

__all__ = ["instrument"]
