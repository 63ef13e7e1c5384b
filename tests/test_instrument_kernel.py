"""``%load_ext nbbudget`` bounds every model call of the kernel (``NBBudget.instrument``, on by
default): a ``%%budget --provider-calls 2`` cell that calls three times, through a bare OpenAI
client, LangChain's ``ChatOpenAI`` or ``litellm.completion``, fails at the third, naming the
limit, with nothing sent; ``%config NBBudget.instrument = False`` turns it off, and the same cell
makes its three calls. A real kernel through jupyter_client, the real SDKs against the loopback
server of ``tests/wire``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
from test_magic_kernel import run, started_kernel
from wire import Server
from wire import openai_shapes as o

pytestmark = pytest.mark.realclock

CELL = """%%budget --provider-calls 2
import openai
client = openai.OpenAI(base_url={url!r}, api_key="k", max_retries=0)
for _ in range(3):
    client.chat.completions.create(model="gpt-4o-mini",
                                   messages=[{{"role": "user", "content": "plan the trip"}}])
"""
#: the same three calls through LangChain's ChatOpenAI (no handler) and through LiteLLM
THROUGH = {
    "langchain": """%%budget --provider-calls 2
from langchain_openai import ChatOpenAI
gpt = ChatOpenAI(model="gpt-4o-mini", base_url={url!r}, api_key="k", max_retries=0)
for _ in range(3):
    gpt.invoke("plan the trip")
""",
    "litellm": """%%budget --provider-calls 2
import litellm
for _ in range(3):
    litellm.completion(model="openai/gpt-4o-mini", api_base={url!r}, api_key="k",
                       messages=[{{"role": "user", "content": "plan the trip"}}])
""",
}


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from started_kernel(tmp_path_factory)


def refused(cell: Any, server: Server) -> None:
    """The cell failed at its third call, in the magic's one line naming the limit, with two
    requests sent."""
    assert cell.status == "error", cell.outputs
    error = next(m["content"] for m in cell.outputs if m["msg_type"] == "error")
    assert len(error["traceback"]) == 1, error["traceback"]  # the magic's one line
    assert "provider_calls" in error["traceback"][0]
    assert len(server.received) == 2  # the third was refused before it was sent


def test_a_budget_cell_bounds_a_bare_client_and_the_setting_turns_it_off(kernel: Any) -> None:
    with Server(default=o.chat("Paris.", o.chat_usage(12, 3))) as server:
        refused(run(kernel, CELL.format(url=server.url)), server)  # on since %load_ext

        server.received.clear()
        assert run(kernel, "%config NBBudget.instrument = False").status == "ok"
        cell = run(kernel, CELL.format(url=server.url))
        assert cell.status == "ok", cell.outputs
        assert len(server.received) == 3

        server.received.clear()
        assert run(kernel, "%config NBBudget.instrument = True").status == "ok"
        refused(run(kernel, CELL.format(url=server.url)), server)


@pytest.mark.parametrize("library", sorted(THROUGH))
def test_a_budget_cell_bounds_the_model_calls_a_library_makes_with_its_own_client(
        kernel: Any, library: str) -> None:
    pytest.importorskip({"langchain": "langchain_openai"}.get(library, library))
    with Server(default=o.chat("Paris.", o.chat_usage(12, 3))) as server:
        refused(run(kernel, THROUGH[library].format(url=server.url), timeout=120), server)
