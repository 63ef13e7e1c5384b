"""The pydantic-ai adapter and the pydantic-ai release installed: it bounds a release with a hook
before every attempt at a model request, and refuses at import one without it, never bounding
nothing in silence (on Python 3.10 the test extra installs such a release, 2.54 to 2.63)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

capabilities = pytest.importorskip("pydantic_ai.capabilities")
HAS_HOOK = hasattr(capabilities.AbstractCapability, "prepare_model_request")


def import_adapter() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import nbbudget.pydantic_ai"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(HAS_HOOK, reason="this pydantic-ai has the hook the adapter needs")
def test_the_adapter_refuses_at_import_a_pydantic_ai_without_a_hook_before_each_request() -> None:
    done = import_adapter()
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"ImportError: nbbudget.pydantic_ai needs pydantic-ai 2.64 or newer, and "
        f"pydantic-ai-slim {version('pydantic-ai-slim')} is installed: it has no hook before "
        f"each model request, so the budget could not bound provider_calls or max_tokens. "
        f"Upgrade it (pip install 'pydantic-ai-slim>=2.64', Python 3.11 or newer)"
    )


@pytest.mark.skipif(not HAS_HOOK, reason="this pydantic-ai lacks the hook the adapter needs")
def test_the_adapter_imports_with_a_pydantic_ai_that_has_the_hook() -> None:
    done = import_adapter()
    assert (done.returncode, done.stderr) == (0, "")
