"""What bounds a model request's input, for the adapters that reserve its worst case before it is
sent (S3-10): the LangChain handler, the Agents SDK hooks and the pydantic-ai capability. Each
sees the request as its framework holds it (messages, tool definitions, settings), not its
HTTP body, and bounds its input by the size of that in JSON (`json_size`); the price of the
bound is `nbbudget.run.prices.worst_case`'s."""

from __future__ import annotations

from typing import Any

__all__ = ["json_size"]


def json_size(value: Any) -> int:
    """The bytes of *value* in JSON (UTF-8): a token of its text takes at least one of them, in
    any form, so it bounds the tokens of the text it holds. Pydantic models and dataclasses (the
    frameworks' messages, parts and tool definitions) are written with their fields; anything
    else JSON cannot write, as its ``str()``. The three adapters bound a request's input with
    it; pydantic, which every one of their frameworks is built on, writes it."""
    from pydantic_core import to_json

    try:
        return len(to_json(value, fallback=str, serialize_unknown=True))
    except ValueError:  # a cycle, which a request cannot send as it is
        return len(str(value).encode())
