"""The panel of a ``%%budget`` cell in a real kernel, as programs save it and as IOPub carries it
(N-3, N-2, S0-12): the state a cell ends in is drawn before the cell replies, so nbclient and
papermill save the panel that its envelope describes; what a detached job's panel sends later is
tied to its own cell, never to the cell running then; a finished panel has nothing left to
click.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import queue
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from test_magic_kernel import kernel  # noqa: F401 - a module-scoped kernel fixture

pytestmark = pytest.mark.realclock
MIME = "application/vnd.nbbudget.response+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
KERNEL = "nbbudget-under-test"

#: ten steps of 0.15 s: well past a 500 ms call budget, well within a 30 s one
SLOW_DETACH = """\
%%budget --detach --budget {budget} --steps 100
for i in range(10):
    nb.current().step()
    time.sleep(0.15)
'slow'"""
SLOW_RESUME = """\
%%budget --resume --budget {budget} --steps 100
done = nb.resume_state(0)
while done < 10:
    nb.current().step()
    time.sleep(0.15)
    done += 1
    nb.checkpoint(done)
done"""
#: (source, tags): each cell that goes INCOMPLETE is run again, as the same work, to its end
CELLS = [
    ("%load_ext nbbudget\nimport nbbudget as nb, time", []),
    ("%%budget --detach --budget 30s --steps 100\nfor i in range(3):\n    nb.current().step()\n"
     "    time.sleep(0.15)\n'quick'", []),
    (SLOW_DETACH.format(budget="500ms"), ["raises-exception"]),
    (SLOW_DETACH.format(budget="30s"), []),
    ("%%budget --resume --budget 30s --steps 100\ndone = nb.resume_state(0)\nwhile done < 3:\n"
     "    nb.current().step()\n    time.sleep(0.15)\n    done += 1\n    nb.checkpoint(done)\n"
     "done", []),
    (SLOW_RESUME.format(budget="500ms"), ["raises-exception"]),
    (SLOW_RESUME.format(budget="30s"), []),
    ("time.sleep(1.0)  # a cell for a late update to land on", []),
]


@pytest.fixture
def notebook_env(tmp_path, monkeypatch) -> Path:
    """A kernelspec of this Python (or ``$NBBUDGET_KERNEL_PYTHON``), a store of the test's own,
    and a program's settings: no forced mode, no budget in the environment."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [os.environ.get("NBBUDGET_KERNEL_PYTHON", sys.executable), "-m",
                 "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kernel under test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "store"))
    monkeypatch.delenv("NBBUDGET_INTERACTIVE", raising=False)
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    return tmp_path


def _notebook() -> Any:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "kernel under test",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source, metadata={"tags": tags})
                for source, tags in CELLS]
    return nb


def _run_nbclient(folder: Path) -> Any:
    from nbclient import NotebookClient

    nb = _notebook()
    NotebookClient(nb, kernel_name=KERNEL, timeout=120,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def _run_papermill(folder: Path) -> Any:
    import papermill

    source, saved = folder / "panels.ipynb", folder / "panels-out.ipynb"
    nbformat.write(_notebook(), source)
    with pytest.raises(papermill.PapermillExecutionError) as raised:  # the INCOMPLETE cells
        papermill.execute_notebook(str(source), str(saved), kernel_name=KERNEL, cwd=str(folder),
                                   progress_bar=False, execution_timeout=120)
    assert raised.value.ename == "Incomplete"
    return nbformat.read(saved, as_version=4)


def _expected_state(envelope: dict[str, Any]) -> str:
    """What the panel must say for the envelope beside it."""
    if envelope["ok"]:
        return ": completed, "
    data = envelope["data"]
    if data["state"] == "running":
        return f": running in the background as job {data['job']}, "
    assert data["state"] == "paused", envelope
    return f": paused at checkpoint {data['checkpoint']}, "


def _widgets(models: dict[str, Any], model_id: str) -> list[dict[str, Any]]:
    """The saved state of a widget and of every widget inside it."""
    model = models[model_id]
    found = [model]
    for child in model["state"].get("children", []):
        found += _widgets(models, child.removeprefix("IPY_MODEL_"))
    return found


def _status_text(widgets: list[dict[str, Any]]) -> str:
    """The panel's status line: its first HTML widget (the models' details follow it)."""
    status = next(w["state"]["value"] for w in widgets if w["model_name"] == "HTMLModel")
    return html.unescape(re.sub(r"<[^>]+>", "", status.replace("<br>", "\n")))


@pytest.mark.parametrize("execute", [_run_nbclient, _run_papermill],
                         ids=["nbclient", "papermill"])
def test_N_3_a_saved_panel_shows_the_state_its_cells_envelope_says(execute, notebook_env):
    nb = execute(notebook_env)
    models = nb.metadata["widgets"][WIDGET_STATE]["state"]
    budget_cells = [c for c in nb.cells
                    if c.cell_type == "code" and c.source.startswith("%%budget")]
    assert len(budget_cells) == 6
    for cell in budget_cells:
        shown = [o.data for o in cell.outputs if o.output_type == "display_data"]
        panels = [d for d in shown if WIDGET in d]
        envelopes = [d[MIME] for d in shown if MIME in d]
        assert len(panels) == 1 and len(envelopes) == 1, cell.outputs
        state = _expected_state(envelopes[0])
        where = f"cell {cell.source.splitlines()[0]!r} ({state})"
        text = panels[0]["text/plain"]
        assert state in text, f"{where}: its panel reads {text!r}"
        widgets = _widgets(models, panels[0][WIDGET]["model_id"])
        # under the cell, the widget's line starts with the state (the text names the cell)
        assert _status_text(widgets).startswith(state.removeprefix(": ")), \
            f"{where}: its saved widget reads otherwise"
        enabled = [w["state"]["description"] for w in widgets
                   if w["model_name"] == "ButtonModel" and not w["state"].get("disabled")]
        if "running in the background" in state:
            assert enabled == ["Stop"], where  # the job goes on: it can still be stopped
        else:
            assert enabled == [], f"{where}: a finished panel with buttons {enabled}"
    last = nb.cells[-1]
    assert [o for o in last.outputs if o.output_type != "stream"] == []


# -- what IOPub carries: every panel message is tied to the cell that showed the panel -----------
def _execute_recording(kc, sources: list[str], seen: list[dict[str, Any]]) -> list[str]:
    """Run each source in turn as nbclient would, keeping every IOPub message (whatever its
    parent) in *seen*; the request ids."""
    ids = []
    for source in sources:
        msg_id = kc.execute(textwrap.dedent(source), allow_stdin=False, stop_on_error=False)
        ids.append(msg_id)
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            seen.append(msg)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                    and msg["content"]["execution_state"] == "idle":
                break
    return ids


def test_N_2_a_panels_later_updates_are_tied_to_its_own_cell(kernel):  # noqa: F811
    seen: list[dict[str, Any]] = []
    _execute_recording(kernel, [
        "import time",
        SLOW_DETACH.format(budget="500ms").replace("'slow'", "'slow again'"),
        SLOW_DETACH.format(budget="30s").replace("'slow'", "'slow again'"),
        "time.sleep(1.0)",
        SLOW_RESUME.format(budget="500ms").replace("done", "count"),
        SLOW_RESUME.format(budget="30s").replace("done", "count"),
        "time.sleep(1.0)",
    ], seen)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # whatever is still to come
        try:
            seen.append(kernel.get_iopub_msg(timeout=0.5))
        except queue.Empty:  # quiet
            break
    owner: dict[str, str] = {}  # a widget's comm or a display id -> the cell that made it
    for msg in seen:
        content, parent = msg["content"], msg["parent_header"].get("msg_id")
        if msg["msg_type"] == "comm_open":
            owner[content["comm_id"]] = parent
        if msg["msg_type"] == "display_data" and (content.get("transient") or {}).get(
                "display_id"):
            owner.setdefault(content["transient"]["display_id"], parent)
    sent = 0
    for msg in seen:
        content, parent = msg["content"], msg["parent_header"].get("msg_id")
        if msg["msg_type"] == "comm_msg":
            key = content["comm_id"]
        elif msg["msg_type"] == "update_display_data":
            key = content["transient"]["display_id"]
        else:
            continue
        sent += 1
        assert parent == owner[key], (
            f"a {msg['msg_type']} of the panel of request {owner[key]} was sent as part of "
            f"request {parent}: {json.dumps(content)[:300]}")
    assert sent > 0


# -- Stop while the cell holds the kernel --------------------------------------------------------
#: about thirty seconds of steps, unless stopped: run here, or on a worker while the cell waits
#: its call budget
HOLDING = {
    "a foreground cell": "%%budget --steps 300 --time 60s",
    "a detached cell in its wait": "%%budget --detach --budget 60s --steps 300",
}
STEPS = """
for tick in range(300):{note}
    nb.current().step()
    time.sleep(0.1)
"""
CLICK = {"method": "custom", "content": {"event": "click"}}  # what ipywidgets sends for a click
STOP_WAITS = "interrupt the kernel to stop now"


def _features(kc) -> list[str]:
    """What the kernel says it supports (its kernel_info)."""
    msg_id = kc.kernel_info()
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return list(reply["content"].get("supported_features") or [])


def _ipykernel(kc) -> tuple[int, int]:
    from test_magic_kernel import run

    said = run(kc, "import ipykernel; print(ipykernel.__version__)").stdout.splitlines()[-1]
    major, minor = said.split(".")[:2]  # (the line before it may tell of a job that ended)
    return int(major), int(minor)


def _front_end_subshell(kc) -> str:
    """A subshell made as JupyterLab makes the one it sends widget messages to."""
    msg = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(msg)
    while True:
        reply = kc.control_channel.get_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return str(reply["content"]["subshell_id"])


def _buttons(kc, msg_id: str, seen: list[dict[str, Any]], until: float) -> dict[str, Any]:
    """The state of the buttons of the panel of request *msg_id*, by comm id, once its Stop
    button has been opened; every IOPub message read is kept in *seen*."""
    buttons: dict[str, Any] = {}
    while not any(state["description"] in ("Stop", STOP_WAITS) for state in buttons.values()):
        assert time.monotonic() < until, "the panel showed no Stop button"
        msg = kc.get_iopub_msg(timeout=30)
        seen.append(msg)
        content = msg["content"]
        if msg["msg_type"] == "comm_open" and msg["parent_header"].get("msg_id") == msg_id \
                and content["data"]["state"].get("_model_name") == "ButtonModel":
            buttons[content["comm_id"]] = content["data"]["state"]
    return buttons


def _click(kc, comm_id: str, subshell: str | None) -> None:
    """Click a button as a front end does: a comm message on the shell channel, addressed to
    *subshell* (None: to none, as a front end without comms over subshells sends it)."""
    msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": CLICK})
    if subshell is not None:
        msg["header"]["subshell_id"] = subshell
    kc.shell_channel.send(msg)


def _reply(kc, msg_id: str, timeout: float) -> dict[str, Any]:
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def _panel_text(seen: list[dict[str, Any]], msg_id: str) -> str:
    """The text the panel of request *msg_id* showed last."""
    shown = [m["content"]["data"]["text/plain"] for m in seen
             if m["msg_type"] in ("display_data", "update_display_data")
             and m["parent_header"].get("msg_id") == msg_id
             and m["content"]["data"]["text/plain"].startswith("nbbudget cell")]
    return shown[-1]


@pytest.mark.parametrize("addressed", ["to the front end's subshell", "to no subshell"])
@pytest.mark.parametrize("holding", list(HOLDING))
def test_N_3_stop_2s_into_a_cell_ends_it_within_1s(kernel, holding, addressed):  # noqa: F811
    if "kernel subshells" not in _features(kernel):
        pytest.skip("a kernel without subshells handles the click after the cell (see below)")
    if addressed == "to no subshell" and _ipykernel(kernel) < (7, 4):
        pytest.skip("before 7.4, ipykernel handles a comm message where the front end sends it")
    subshell = _front_end_subshell(kernel) if addressed != "to no subshell" else None
    from test_magic_kernel import run

    run(kernel, "import time")
    seen: list[dict[str, Any]] = []
    started = time.monotonic()
    source = HOLDING[holding] + STEPS.format(note=f"  # {holding}, stopped {addressed}")
    msg_id = kernel.execute(source, allow_stdin=False, stop_on_error=False)
    [stop] = [comm for comm, state in _buttons(kernel, msg_id, seen, started + 20).items()
              if state["description"] == "Stop"]
    time.sleep(max(0.0, started + 2 - time.monotonic()))
    _click(kernel, stop, subshell)
    clicked = time.monotonic()
    reply = _reply(kernel, msg_id, timeout=40)
    took = time.monotonic() - clicked
    assert took < 1.0, f"the cell ended {took:.1f} s after the click"
    assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "Cancelled")
    assert "stopped from the panel" in reply["content"]["evalue"]
    while not (seen[-1]["msg_type"] == "status" and seen[-1]["parent_header"].get("msg_id")
               == msg_id and seen[-1]["content"]["execution_state"] == "idle"):
        seen.append(kernel.get_iopub_msg(timeout=10))
    assert ": stopped, " in _panel_text(seen, msg_id)


#: a detached cell that goes on in the background for about a minute, unless stopped
DETACHED = """\
%%budget --detach --budget 500ms --steps 1000
for tick in range(600):{note}
    nb.current().step()
    time.sleep(0.1)
"""


def _detach(kc, note: str) -> tuple[str, str, list[dict[str, Any]]]:
    """Run DETACHED until it has answered INCOMPLETE and the kernel is idle: its request id,
    its job and what IOPub carried."""
    from test_magic_kernel import run

    run(kc, "import time")
    seen: list[dict[str, Any]] = []
    msg_id = kc.execute(DETACHED.format(note=note), allow_stdin=False, stop_on_error=False)
    assert _reply(kc, msg_id, timeout=30)["content"]["ename"] == "Incomplete"
    while not (seen and seen[-1]["msg_type"] == "status" and seen[-1]["parent_header"].get(
            "msg_id") == msg_id and seen[-1]["content"]["execution_state"] == "idle"):
        seen.append(kc.get_iopub_msg(timeout=10))
    [envelope] = [m["content"]["data"][MIME] for m in seen if m["msg_type"] == "display_data"
                  and MIME in m["content"]["data"]]
    return msg_id, envelope["data"]["job"], seen


def _job_state(kc, job: str, wanted: str) -> str:
    from test_magic_kernel import run

    deadline = time.monotonic() + 10
    while True:
        state = run(kc, f"print(nb.jobs[{job!r}].state.value)").stdout.splitlines()[-1]
        if state == wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def test_N_3_where_clicks_wait_for_the_cell_stop_says_to_interrupt(kernel):  # noqa: F811
    if "kernel subshells" in _features(kernel):
        pytest.skip("a kernel with subshells handles the click during the cell (see above)")
    msg_id, job, seen = _detach(kernel, "  # on a kernel without subshells")
    opened = {m["content"]["comm_id"]: m["content"]["data"]["state"] for m in seen
              if m["msg_type"] == "comm_open" and m["parent_header"].get("msg_id") == msg_id
              and m["content"]["data"]["state"].get("_model_name") == "ButtonModel"}
    assert [(s["description"], s["disabled"]) for s in opened.values()] == [(STOP_WAITS, True)]
    [stop] = opened
    # once the cell is over a click is handled at once: Stop is Stop again, and stops the job
    state = dict(opened[stop])
    for msg in seen:
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == stop:
            state.update(msg["content"]["data"].get("state", {}))
    assert (state["description"], state["disabled"]) == ("Stop", False)
    _click(kernel, stop, None)
    assert _job_state(kernel, job, "cancelled") == "cancelled"


def test_N_2_a_detached_cell_stopped_later_no_longer_offers_its_result(kernel):  # noqa: F811
    if _ipykernel(kernel) < (7, 1):
        pytest.skip("before ipykernel 7.1 a cell's display cannot be updated after it ended")
    msg_id, job, seen = _detach(kernel, "  # stopped after its cell")
    [stop] = [m["content"]["comm_id"] for m in seen if m["msg_type"] == "comm_open"
              and m["parent_header"].get("msg_id") == msg_id
              and m["content"]["data"]["state"].get("description") == "Stop"]
    _click(kernel, stop, None)
    deadline = time.monotonic() + 10
    lines = []
    while not any("no result" in line for line in lines) and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            msg = kernel.get_iopub_msg(timeout=0.5)
            if msg["msg_type"] == "update_display_data" and MIME in msg["content"]["data"]:
                assert msg["content"]["data"][MIME]["data"] == {
                    "state": "running", "job": job, "next": (
                        f"make the identical call again to wait for the result "
                        f"(or nb.jobs[{job!r}].result())")}  # the envelope the call answered
                lines.append(msg["content"]["data"]["text/plain"])
    assert lines and lines[-1].startswith("INCOMPLETE (exit 14): running after ")
    assert lines[-1].endswith(f"; job {job} was then stopped: there is no result to wait for")
    assert _job_state(kernel, job, "cancelled") == "cancelled"


# -- the kernel's state while a panel's clicks and the status bar are answered ------------------
def _statuses(seen: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The IOPub statuses in the order sent: (state, the request's id, the request's type)."""
    return [(m["content"]["execution_state"], m["parent_header"].get("msg_id", ""),
             m["parent_header"].get("msg_type", "")) for m in seen if m["msg_type"] == "status"]


def _iopub_until_idle(kc, msg_id: str, seen: list[dict[str, Any]]) -> None:
    while not (seen and seen[-1]["msg_type"] == "status" and seen[-1]["parent_header"].get(
            "msg_id") == msg_id and seen[-1]["content"]["execution_state"] == "idle"):
        seen.append(kc.get_iopub_msg(timeout=30))


def test_N_3_the_kernel_reads_busy_while_a_cell_runs_and_requests_beside_it_are_answered(
        kernel):  # noqa: F811
    """A front end (JupyterLab, the Jupyter server) takes the last IOPub status for the whole
    kernel's. Requests answered beside the main shell while a cell runs (a subshell made, a
    comm opened and closed on it, as JupyterLab does for a panel's widgets and the status
    bar) each end with their own idle; the kernel's state is the cell's again at once."""
    if "kernel subshells" not in _features(kernel):
        pytest.skip("a kernel without subshells answers these requests after the cell")
    from test_magic_kernel import run

    run(kernel, "import time")
    seen: list[dict[str, Any]] = []
    started = time.monotonic()
    msg_id = kernel.execute("%%budget --steps 100\nfor tick in range(30):  # three seconds\n"
                            "    nb.current().step()\n    time.sleep(0.1)",
                            allow_stdin=False, stop_on_error=False)
    _buttons(kernel, msg_id, seen, started + 20)  # the cell runs, its panel is shown
    subshell = _front_end_subshell(kernel)  # on the control channel
    comm = kernel.session.msg("comm_open", {"comm_id": "status-bar-1",
                                            "target_name": "nbbudget.status", "data": {}})
    comm["header"]["subshell_id"] = subshell
    kernel.shell_channel.send(comm)
    time.sleep(0.5)
    close = kernel.session.msg("comm_close", {"comm_id": "status-bar-1", "data": {}})
    close["header"]["subshell_id"] = subshell
    kernel.shell_channel.send(close)
    _iopub_until_idle(kernel, msg_id, seen)
    assert time.monotonic() - started < 10  # the cell ran its three seconds, no more

    statuses = _statuses(seen)
    first = statuses.index(("busy", msg_id, "execute_request"))
    during = statuses[first:-1]  # the cell's own idle is the last
    others = [(state, kind) for state, parent, kind in during if parent != msg_id]
    assert {kind for _, kind in others} >= {"create_subshell_request", "comm_open",
                                            "comm_close"}, others
    assert ("idle", "comm_open") in others  # each request got its own idle
    for index, (state, _, kind) in enumerate(during):
        if state == "idle":  # another request's: the cell's busy follows it at once
            assert during[index + 1] == ("busy", msg_id, "execute_request"), (kind, during)
    assert during[-1][0] == "busy"  # what a front end shows until the cell ends

    # once the cell has ended, a request beside it leaves the kernel idle
    info = kernel.session.msg("kernel_info_request", {})
    kernel.control_channel.send(info)
    after: list[dict[str, Any]] = []
    _iopub_until_idle(kernel, info["header"]["msg_id"], after)
    with contextlib.suppress(queue.Empty):
        while True:
            after.append(kernel.get_iopub_msg(timeout=0.5))
    assert [state for state, _, _ in _statuses(after)][-1] == "idle", _statuses(after)
