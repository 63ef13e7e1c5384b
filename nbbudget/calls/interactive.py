"""Is a person waiting on this call, or a program (N-1)? Decided once per call, here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..core.errors import ConfigError

__all__ = ["is_interactive", "set_detector"]

#: set by the IPython layer: returns True/False for the request being executed, None if unknown
_detector: Callable[[], bool | None] | None = None


def set_detector(detector: Callable[[], bool | None] | None) -> None:
    """Install (or remove, with None) the kernel-side detector of the IPython layer."""
    global _detector
    _detector = detector


def is_interactive() -> bool:
    """``NBBUDGET_INTERACTIVE=1|0`` first (read now), then the kernel's detector (the traitlets
    setting and the request's ``cellId``/``allow_stdin``), then whether stdin is a TTY."""
    forced = os.environ.get("NBBUDGET_INTERACTIVE", "").strip()
    if forced in ("1", "0"):
        return forced == "1"
    if forced:
        raise ConfigError(f"NBBUDGET_INTERACTIVE={forced!r}: use 1 (a person) or 0 (a program), "
                          f"or leave it unset to detect")
    if _detector is not None:
        found = _detector()
        if found is not None:
            return found
    stdin = sys.stdin
    try:
        return bool(stdin is not None and stdin.isatty())
    except (ValueError, OSError):  # a closed or detached stdin
        return False
