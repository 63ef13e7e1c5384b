"""N-6 in a real kernel, driven as nbclient drives it: a ``%%budget`` cell that awaits at its
top level runs on the kernel's own event loop, so the cell's run is ``nb.current()`` in every
task it starts and what earlier cells bound to that loop (an ``asyncio.Event``, an
``AsyncOpenAI`` client talking to a local server in OpenAI's wire format) works in it; the
run's time and a cancel cancel the cell's task, which ends with the run's error.

The real clock, with margins for two busy cores."""

from __future__ import annotations

import pytest
from test_magic_kernel import run, started_kernel

pytest.importorskip("openai")
from wire import Server
from wire import openai_shapes as o

pytestmark = pytest.mark.realclock

#: what a cell may take past its --time on a busy machine, kernel round trip included
SLACK_S = 1.5


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    yield from started_kernel(tmp_path_factory)


def test_N_6_the_cells_run_is_current_after_an_await_and_in_every_task_it_starts(kernel):
    cell = run(kernel, "%%budget --steps 10 --no-widget\n"
                       "import asyncio, threading\n"
                       "run = nb.current()\n"
                       "await asyncio.sleep(0)\n"
                       "async def step():\n"
                       "    await asyncio.sleep(0.01)\n"
                       "    nb.current().step()\n"
                       "    return nb.current() is run\n"
                       "seen = await asyncio.gather(*(step() for _ in range(3)))\n"
                       "print(seen, nb.current() is run, threading.current_thread().name)\n"
                       "nb.current().consumed['steps']")
    assert cell.status == "ok", cell.reply
    said = cell.stdout.splitlines()
    assert said[0] == "[True, True, True] True MainThread"  # on the kernel's own loop
    assert said[1].endswith("completed, 0.0 s; steps 3/10")  # --no-widget's summary
    assert cell.result == "3"
    assert run(kernel, "print(nb.current())").stdout == "None\n"


def test_N_6_an_event_bound_to_the_kernels_loop_in_an_earlier_cell_works(kernel):
    run(kernel, "import asyncio\nready = asyncio.Event()\n"
                "try:\n    await asyncio.wait_for(ready.wait(), 0.01)\n"
                "except asyncio.TimeoutError:\n    pass")  # bound to the kernel's loop now
    cell = run(kernel, "%%budget --time 10s --no-widget\n"
                       "asyncio.get_running_loop().call_later(0.05, ready.set)\n"
                       "await ready.wait()\nprint('set')")
    assert (cell.status, cell.stdout.splitlines()[0]) == ("ok", "set"), cell.reply


def test_N_6_an_async_openai_client_made_in_an_earlier_cell_is_counted_by_the_cells_run(
        kernel):
    with Server() as server:
        server.queue(o.chat("warm", o.chat_usage(3, 1)), o.chat("done", o.chat_usage(10, 2)))
        made = run(kernel, f"import openai\nclient = nb.instrument(openai.AsyncOpenAI("
                           f"base_url={server.url!r}, api_key='test', max_retries=0))\n"
                           f"ask = dict(model='gpt-4o', messages=[{{'role': 'user', "
                           f"'content': 'hi'}}])\n"
                           f"(await client.chat.completions.create(**ask)).id is not None")
        assert made.result == "True", made.reply
        cell = run(kernel, "%%budget --tokens 100 --no-widget\n"
                           "reply = await client.chat.completions.create(**ask)\n"
                           "print(reply.choices[0].message.content)\n"
                           "nb.current().consumed['tokens']")
        run(kernel, "await client.close()")
    assert cell.status == "ok", cell.reply
    assert (cell.stdout.splitlines()[0], cell.result) == ("done", "12")
    assert len(server.received) == 2


@pytest.mark.parametrize("body", ["await asyncio.sleep(30)",
                                  "await asyncio.sleep(0)\nwhile True:\n    pass"],
                         ids=["awaiting", "holding the loop"])
def test_N_6_the_runs_time_ends_a_cell_that_awaits(kernel, body):
    cell = run(kernel, f"%%budget --time 1s --no-widget\nimport asyncio\n{body}")
    content = cell.reply["content"]
    assert (cell.status, content["ename"]) == ("error", "BudgetCut"), content
    assert "ran out of time: its time grant of 1000 ms" in content["evalue"]
    assert "CancelledError" not in content["evalue"]
    assert 1.0 <= cell.seconds < 1.0 + SLACK_S
    assert run(kernel, "await asyncio.sleep(0.01)\nprint('still here')").stdout == "still here\n"


def test_N_6_a_cancel_from_another_task_ends_the_cell_with_cancelled(kernel):
    cell = run(kernel, "%%budget --no-widget\nimport asyncio\n"
                       "run = nb.current()\n"
                       "asyncio.get_running_loop().call_later(0.3, run.cancel, 'enough')\n"
                       "await asyncio.Event().wait()")
    content = cell.reply["content"]
    assert content["ename"] == "Cancelled", content
    assert content["evalue"].endswith("was stopped: enough")
    assert cell.seconds < 0.3 + SLACK_S


def test_N_6_a_cell_that_awaits_under_detach_runs_as_its_jobs_work(kernel):
    cell = run(kernel, "%%budget --detach --budget 5s --no-widget\nimport asyncio\n"
                       "await asyncio.sleep(0.05)\nprint(nb.current() is not None)\n"
                       "'answer'")
    assert cell.status == "ok", cell.reply
    assert "True" in cell.stdout
    assert cell.envelope["data"] == "answer", cell.envelope  # the work's value


def test_N_6_with_autoawait_off_the_cell_runs_on_a_loop_of_its_own_in_its_run(kernel):
    run(kernel, "%autoawait False")
    try:
        cell = run(kernel, "%%budget --time 1s --no-widget\nimport asyncio, threading\n"
                           "await asyncio.sleep(0)\n"
                           "print(nb.current() is not None, threading.current_thread().name)\n"
                           "await asyncio.sleep(30)")
    finally:
        run(kernel, "%autoawait True")
    content = cell.reply["content"]
    assert cell.stdout.splitlines()[0] == "True nbbudget-await"
    assert (cell.status, content["ename"]) == ("error", "BudgetCut"), content
    assert 1.0 <= cell.seconds < 1.0 + SLACK_S
    threads = run(kernel, "import threading\n"
                          "print([t.name for t in threading.enumerate() if 'await' in t.name])")
    assert threads.stdout == "[]\n"  # the helper's loop was cancelled and ended with the cell


def test_N_6_the_docs_pydantic_ai_recipe_finds_the_cells_run(kernel):
    pytest.importorskip("pydantic_ai", minversion=None)
    made = run(kernel, "from pydantic_ai import Agent\n"
                       "from pydantic_ai.models.test import TestModel\n"
                       "from nbbudget.pydantic_ai import Budgeted\n"
                       "agent = Agent(TestModel(custom_output_text='planned'))")
    if made.status != "ok":
        pytest.skip(f"pydantic-ai's adapter does not load here: {made.reply['content']}")
    cell = run(kernel, "%%budget --turns 3 --no-widget\n"
                       "result = await agent.run('Plan the trip', capabilities=[Budgeted()])\n"
                       "print(result.output)\n"
                       "nb.current().consumed['turns']")
    assert cell.status == "ok", cell.reply
    assert cell.stdout.splitlines()[0] == "planned"
    assert cell.result == "1"
