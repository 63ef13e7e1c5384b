"""``%config NBBudget.instrument = True`` bounds every model call of the kernel: a ``%%budget``
cell that calls a bare OpenAI client three times under ``--provider-calls 2`` fails at the third,
naming the limit, with nothing sent; off (the default), the same cell makes its three calls. A
real kernel through jupyter_client, the real SDK against the loopback server of ``tests/wire``."""

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


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from started_kernel(tmp_path_factory)


def test_a_budget_cell_bounds_a_bare_client_and_the_setting_turns_it_off(kernel: Any) -> None:
    with Server(default=o.chat("Paris.", o.chat_usage(12, 3))) as server:
        cell = run(kernel, CELL.format(url=server.url))  # off by default: not counted
        assert cell.status == "ok", cell.outputs
        assert len(server.received) == 3
        server.received.clear()
        assert run(kernel, "%config NBBudget.instrument = True").status == "ok"
        cell = run(kernel, CELL.format(url=server.url))
        assert cell.status == "error"
        error = next(m["content"] for m in cell.outputs if m["msg_type"] == "error")
        assert len(error["traceback"]) == 1  # the magic's one line
        assert "provider_calls" in error["traceback"][0]
        assert len(server.received) == 2  # the third was refused before it was sent

        server.received.clear()
        off = run(kernel, "%config NBBudget.instrument = False")
        assert off.status == "ok"
        cell = run(kernel, CELL.format(url=server.url))
        assert cell.status == "ok", cell.outputs
        assert len(server.received) == 3

        server.received.clear()
        assert run(kernel, "%config NBBudget.instrument = True").status == "ok"
        cell = run(kernel, CELL.format(url=server.url))
        assert cell.status == "error"
        assert len(server.received) == 2
        assert run(kernel, "%config NBBudget.instrument = False").status == "ok"
