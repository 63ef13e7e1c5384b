"""Running a ``%%budget`` cell: compiled on the main thread as ``%%time`` does, executed under
`nb.call` (in place, or on a worker whose output is tied to the cell that started it).

Rules: S0-1..S0-12 through `nb.call`, N-1, N-2.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["CompiledCell", "compile_cell", "pin_output"]


class CompiledCell:
    """A cell compiled like ``%%time`` compiles it: its body, and its last expression apart so
    that its value becomes ``Out[n]``."""

    def __init__(self, shell: Any, source: str) -> None:
        self.shell = shell
        self.source = source
        transformed = shell.transform_cell(source)
        filename = shell.compile.cache(transformed)
        tree = shell.transform_ast(shell.compile.ast_parse(transformed, filename=filename))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        self.body = shell.compile(tree, filename, "exec")
        self.last = shell.compile(last, filename, "eval") if last is not None else None
        self.transformed = transformed

    def run(self) -> Any:
        """Execute the cell in the user's namespace; the value of its last expression."""
        __tracebackhide__ = True
        ns = self.shell.user_ns
        exec(self.body, ns)
        return eval(self.last, ns) if self.last is not None else None

    def identity(self, flags: str) -> str:
        """The work a cell does: its transformed source and its flags, ``--budget`` and
        ``--timeout`` aside (S0-11)."""
        digest = hashlib.sha256(self.transformed.encode())
        digest.update(b"\0" + flags.encode())
        return f"cell:{digest.hexdigest()}"


def compile_cell(shell: Any, source: str) -> CompiledCell:
    return CompiledCell(shell, source)


def pin_output(shell: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """*fn*, whose output goes to the cell executing now even when it runs on another thread
    and after that cell has ended (N-2): ``set_thread_parent`` on ipykernel 7.4+, the private
    context variables of the streams and display publishers on 6.29-7.3; a plain shell (no
    kernel) needs nothing."""
    get_parent = getattr(shell, "get_parent", None)
    parent = get_parent() if get_parent is not None else None

    def pinned() -> Any:
        if not parent:
            return fn()
        tokens = _pin(shell, parent)
        try:
            return fn()
        finally:
            _unpin(shell, tokens)

    return pinned


def _pin(shell: Any, parent: dict[str, Any]) -> Any:
    setter = getattr(shell, "set_thread_parent", None)
    if setter is not None:  # ipykernel >= 7.4
        return ("public", setter(parent))
    tokens = []
    for target in (sys.stdout, sys.stderr, getattr(shell, "display_pub", None),
                   getattr(shell, "displayhook", None)):
        var = getattr(target, "_parent_header", None)
        if var is not None and hasattr(var, "set"):
            tokens.append((var, var.set(parent)))
    return ("private", tokens)


def _unpin(shell: Any, tokens: Any) -> None:
    kind, value = tokens
    if kind == "public":
        shell.reset_thread_parent(value)
        return
    for var, token in reversed(value):
        var.reset(token)
