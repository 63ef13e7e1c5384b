"""Model clients bounded by a run: ``nb.instrument(client)`` for the OpenAI and Anthropic SDKs
(the ``openai`` and ``anthropic`` extras). ``clients`` holds the mechanism, `instrument`;
``openai_api`` and ``anthropic_api`` describe each API's shapes (``shapes.Shape``)."""

from .clients import instrument

__all__ = ["instrument"]
