"""Local HTTP servers that speak the model providers' wire formats, for tests and benchmarks.

`Server` is one scripted HTTP server on 127.0.0.1; `openai_shapes`, `anthropic_shapes`,
`gemini_shapes`, `ollama_shapes`, `bedrock_shapes`, `mistral_shapes` and `groq_shapes` hold the
reply shapes of each provider's public API reference.
"""

from .server import FORMS, FRAMINGS, LINE_FORMS, Received, Reply, Server, dump, event_message

__all__ = ["FORMS", "FRAMINGS", "LINE_FORMS", "Received", "Reply", "Server", "dump",
           "event_message"]
