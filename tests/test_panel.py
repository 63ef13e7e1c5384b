"""The live panel (N-3): a bar per armed axis, the clocks and the state, Stop and Pause, and a
text summary wherever widgets cannot render."""

from __future__ import annotations

import time

import pytest
from IPython.utils.capture import capture_output

import nbbudget as nb
from nbbudget.jupyter.clicks import Route
from nbbudget.jupyter.panel import STOP_WAITS, Panel, line, run_summary, summary
from nbbudget.testing import FakeClock

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")
WIDGET = "application/vnd.jupyter.widget-view+json"
MIME = "application/vnd.nbbudget.response+json"



def test_N_3_the_panel_follows_the_run_axis_by_axis():
    clock = FakeClock()
    limits = nb.Limits(steps=10, tokens=100)
    panel = Panel(limits, widgets=True)
    view = panel._view
    assert set(view.bars) == {"steps", "tokens"}
    with nb.budget(limits, clock=clock, name="cell") as run:
        panel.attach(run)
        run.charge("steps", 5)
        _draw(panel, run)
        assert (view.bars["steps"].value, view.labels["steps"].value) == (0.5, "5 / 10")
        assert view.bars["steps"].bar_style == "info"
        run.charge("tokens", 85)  # past the first notice threshold
        _draw(panel, run)
        assert view.bars["tokens"].bar_style == "warning"
        run.charge("tokens", 12)  # past the second
        _draw(panel, run)
        assert view.bars["steps"].bar_style == "danger"
    panel.end_cell()
    assert {b.bar_style for b in view.bars.values()} == {"success"}
    # under its cell, beside its bars, the panel says what they do not: the state and the time
    assert view.status.value == "<b>completed, 0.0 s</b>"
    assert panel.text == "nbbudget cell: completed, 0.0 s; steps 5/10, tokens 97/100"


def _draw(panel, run):
    panel._draw(run.snapshot(), line(run.snapshot()))


def test_N_3_every_axis_is_named_whole_and_the_bars_line_up():
    panel = Panel(nb.Limits(steps=10, provider_calls=5, agent_invocations=2, tokens=100),
                  widgets=True)
    bars = panel._view.bars
    assert {kind: bar.description for kind, bar in bars.items()} == {
        "steps": "steps", "provider_calls": "provider_calls",
        "agent_invocations": "agent_invocations", "tokens": "tokens"}
    # one column for the names, as wide as the longest (17 characters) and a little more
    assert {bar.style.description_width for bar in bars.values()} == {"19ch"}


def test_N_3_the_text_summary_names_the_state_and_each_axis():
    clock = FakeClock()
    with pytest.raises(nb.BudgetCut), nb.budget(steps=3, time="2s", clock=clock,
                                               name="etl") as run:
        run.step()
        clock.advance("2s")
        run.step()
    # --time is the time it was given: it ran out of time (a timeout is --timeout's word)
    assert summary(run.snapshot()) == ("nbbudget etl: failed (out of time), 2.0 s; "
                                       "time 2.0 s/2.0 s, steps 1/3")
    assert line(run.snapshot()) == "failed (out of time), 2.0 s"
    assert run.outcome.by == "timeout"  # the contract's value stays


def test_N_3_a_cut_by_a_limit_names_the_limit():
    with pytest.raises(nb.BudgetExceeded), nb.budget(steps=1, clock=FakeClock(),
                                                     name="etl") as run:
        run.step()
        run.step()
    assert summary(run.snapshot()) == "nbbudget etl: failed (by steps), 0.0 s; steps 1/1"


def test_N_3_the_summary_of_a_run_says_what_its_snapshot_says():
    clock = FakeClock()
    ready = nb.budget(clock=clock, name="ready")  # never entered
    with nb.budget(clock=clock, name="plain") as plain:  # no limits, nothing built
        clock.advance("1.25s")
        running = run_summary(plain)
        assert running == summary(plain.snapshot()) == "nbbudget plain: running, 1.2 s"
    with nb.budget(steps=5, clock=clock, name="armed") as armed:  # limits, nothing spent
        clock.advance("60ms")
    with nb.budget(clock=clock, name="built") as built:  # parts built by a charge
        built.charge("tool_calls")
        clock.advance("2.05s")
    with pytest.raises(nb.BudgetExceeded), nb.budget(steps=1, clock=clock, name="cut") as cut:
        cut.step()
        cut.step()
    with nb.budget(nb.Limits(), clock=clock, name="empty") as empty:  # no limits, not the same
        pass                                                            # object as NO_LIMITS
    said = {run.name: run_summary(run) for run in (ready, plain, armed, built, cut, empty)}
    assert said == {run.name: summary(run.snapshot())
                    for run in (ready, plain, armed, built, cut, empty)}
    assert said == {"ready": "nbbudget ready: ready, 0.0 s",
                    "plain": "nbbudget plain: completed, 1.2 s",
                    "armed": "nbbudget armed: completed, 0.1 s; steps 0/5",
                    "built": "nbbudget built: completed, 2.0 s",
                    "cut": "nbbudget cut: failed (by steps), 0.0 s; steps 1/1",
                    "empty": "nbbudget empty: completed, 0.0 s"}


def test_N_3_the_panel_shows_time_as_time():
    clock = FakeClock()
    panel = Panel(nb.Limits(run_ms=60_000), widgets=True)
    view = panel._view
    assert (view.bars["run_ms"].description, view.labels["run_ms"].value) == ("time",
                                                                              "0 ms / 1 min")
    with pytest.raises(nb.BudgetCut), nb.budget(time="1m", clock=clock, name="cell") as run:
        panel.attach(run)
        clock.advance(6415)
        _draw(panel, run)
        assert view.labels["run_ms"].value == "6.4 s / 1 min"
        clock.advance(60_000 - 6415)  # the whole minute
        run.check()
    panel.end_cell()
    assert view.labels["run_ms"].value == "1 min / 1 min"
    assert panel.text == "nbbudget cell: failed (out of time), 60.0 s; time 1 min/1 min"
    assert panel._view.status.value == "<b>failed (out of time), 60.0 s</b>"


def test_N_3_stop_only_sets_an_event_and_the_updater_stops_the_run():
    panel = Panel(nb.Limits(steps=10**6), widgets=True)
    panel.start()
    with pytest.raises(nb.Cancelled), nb.budget(steps=10**6) as run:
        panel.attach(run)
        panel._view.stop.click()
        assert panel.stop_requested.is_set()
        for _ in range(500):  # the updater acts within its interval
            if run.cancelled:
                break
            time.sleep(0.01)
        run.step()
    assert run.outcome.status == "stopped"
    panel.end_cell()
    panel._thread.join(5)
    assert not panel._thread.is_alive()
    # a stop the person asked for is no error: its bars are not drawn red
    assert {bar.bar_style for bar in panel._view.bars.values()} == {""}
    assert panel._view.status.value.startswith("<b>stopped, ")


def test_N_3_a_cell_shows_the_widget_and_its_text_then_the_final_state(shell):
    with capture_output() as captured:
        result = shell.run_cell("%%budget --steps 5\nimport nbbudget as nb\n"
                                "for _ in range(3):\n    nb.current().step()")
    assert result.error_in_exec is None
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    panel._thread.join(5)
    first = captured.outputs[0].data
    assert WIDGET in first and first["text/plain"].startswith("nbbudget: starting")
    assert panel.text.startswith("nbbudget cell: for _ in range(3): completed, ")
    assert panel.text.endswith("; steps 3/5")


def test_N_3_a_finished_panel_has_no_stop_or_pause_left_to_click(shell):
    with capture_output():
        result = shell.run_cell("%%budget --resume --budget 10s --steps 5\nimport nbbudget as nb\n"
                                "nb.current().step()\nnb.checkpoint(1)")
    assert result.error_in_exec is None
    view = shell.magics_manager.registry["BudgetMagics"].last_panel._view
    assert _enabled_buttons(view.box) == []
    assert [(b.description, b.disabled) for b in view.buttons] == [("Stop", True),
                                                                   ("Pause", True)]
    assert view.row.children == (view.status,)  # and they are gone from the panel


def _enabled_buttons(widget):
    import ipywidgets

    if isinstance(widget, ipywidgets.Button):
        return [] if widget.disabled else [widget.description]
    return [name for child in getattr(widget, "children", ()) for name in _enabled_buttons(child)]


def test_N_3_a_panel_whose_cell_ran_nothing_says_so_and_offers_nothing(shell):
    with capture_output() as captured:
        result = shell.run_cell("%%budget --detach --budget 10s --timeout 5s --steps 5 "
                                "--runs-per-day 1\npass")
        assert result.error_in_exec is None
        result = shell.run_cell("%%budget --detach --budget 10s --timeout 5s --steps 5 "
                                "--runs-per-day 1\npass")
    assert isinstance(result.error_in_exec, nb.RunsPerDayExceeded)
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    assert panel.text == "nbbudget: nothing ran"
    assert _enabled_buttons(panel._view.box) == []
    assert any(o.data.get("text/plain") == "nbbudget: nothing ran" for o in captured.outputs)


def test_N_3_no_widget_shows_text_only(shell):
    with capture_output() as captured:
        shell.run_cell("%%budget --no-widget --steps 5\npass")
    assert captured.outputs == []
    assert captured.stdout.startswith("nbbudget cell: pass: completed, ")
    assert captured.stdout.endswith("; steps 0/5\n")


def test_N_3_a_cell_out_of_its_time_says_so_in_every_line_a_person_reads(shell):
    with capture_output() as captured:
        result = shell.run_cell("%%budget --no-widget --time 200ms\nwhile True:\n    pass")
    assert isinstance(result.error_in_exec, nb.BudgetCut)
    assert result.error_in_exec.by == "timeout"
    assert captured.stdout.startswith("nbbudget cell: while True: failed (out of time), ")
    with capture_output() as captured:
        result = shell.run_cell("%%budget --no-widget --detach --budget 10s --time 200ms\n"
                                "while True:\n    pass")
    assert isinstance(result.error_in_exec, nb.BudgetCut)
    [envelope] = [o.data for o in captured.outputs if MIME in o.data]
    assert envelope[MIME]["error"]["code"] == "budget_cut_timeout"  # the JSON keeps its code
    assert envelope["text/plain"].startswith("nbbudget: failed (out of time) in ")
    assert "timeout" not in envelope["text/plain"] + captured.stdout


def test_N_3_a_widget_failure_never_breaks_the_cell(shell, monkeypatch):
    import ipywidgets

    def broken(*args, **kwargs):
        raise RuntimeError("no widgets today")

    monkeypatch.setattr(ipywidgets, "FloatProgress", broken)
    with capture_output() as captured:
        result = shell.run_cell("%%budget --steps 5\n6 * 7")
    assert result.error_in_exec is None and result.result == 42
    assert captured.outputs == []
    assert "completed" in captured.stdout


def test_N_3_stop_on_the_panel_stops_a_detached_cell(shell):
    with capture_output():
        result = shell.run_cell("%%budget --detach --budget 100ms\nimport nbbudget as nb, time\n"
                                "while True:\n    nb.current().check()\n    time.sleep(0.01)")
    assert type(result.error_in_exec).__name__ == "Incomplete"
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    panel._view.stop.click()
    job = nb.last_response.job
    assert job.wait_done(5)
    assert job.state is nb.JobState.CANCELLED
    panel._thread.join(5)
    assert not panel._thread.is_alive()
    # the job named, stopped, and why: the stop that was asked for, not an error
    status = panel._view.status.value
    assert status.startswith(f"<b>job {job.id} stopped, ")
    assert status.endswith("</b><br>stopped from the panel")
    assert "Cancelled" not in panel.text
    assert {bar.bar_style for bar in panel._view.bars.values()} <= {""}


def test_N_2_a_detached_cells_result_and_final_state_reach_its_panel(shell):
    with capture_output():
        result = shell.run_cell("%%budget --detach --budget 50ms\nimport time\n"
                                "time.sleep(0.3)\n'model'")
    assert type(result.error_in_exec).__name__ == "Incomplete"
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    panel._thread.join(5)
    assert not panel._thread.is_alive()
    job = nb.last_response.job
    assert f": job {job.id} completed, " in panel.text
    assert panel.text.endswith("\nresult: 'model'")
    # where the widget renders, its text/plain is not shown: the result is in the widget too
    assert panel._view.status.value.startswith(f"<b>job {job.id} completed, ")
    assert panel._view.status.value.endswith("<br>result: &#x27;model&#x27;")


def test_S2_3_a_detached_panel_says_when_its_job_finished_without_honouring_a_cancel(shell):
    with capture_output():
        result = shell.run_cell("%%budget --detach --budget 50ms --cooperative\nimport time\n"
                                "time.sleep(0.4)\n'finished A'")
    assert type(result.error_in_exec).__name__ == "Incomplete"
    job = nb.last_response.job
    assert job.cancel("cancelled from a test") == "requested"  # the work never checks
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    panel._thread.join(5)
    assert not panel._thread.is_alive()
    assert job.cancel_status == "not honoured"
    first = panel.text.splitlines()[0]
    assert f": job {job.id} done (finished anyway: the cancel was not honoured)," in first
    assert "stopped" not in first
    assert panel.text.endswith("\nresult: 'finished A'")


#: a kernel that would handle a click only after the cell that holds it (ipykernel 6.29)
CLICKS_WAIT = Route(None, during_cell=False)


def test_N_3_where_a_click_waits_for_the_cell_stop_says_to_interrupt_and_pause_is_not_offered():
    panel = Panel(nb.Limits(steps=10), widgets=True, pausable=True, route=CLICKS_WAIT)
    view = panel._view
    assert [(b.description, b.disabled) for b in view.buttons] == [(STOP_WAITS, True)]
    assert STOP_WAITS == "interrupt the kernel to stop now"
    with nb.budget(steps=10) as run:
        panel.attach(run)
        run.step()
        _draw(panel, run)
        assert [(b.description, b.disabled) for b in view.buttons] == [(STOP_WAITS, True)]
    panel.end_cell()
    assert view.row.children == (view.status,)  # the run ended with its cell: nothing to stop


def test_N_3_where_a_click_waits_for_the_cell_stop_works_once_its_job_goes_on(shell):
    shell.magics_manager.registry["BudgetMagics"].clicks.route = lambda: CLICKS_WAIT
    with capture_output():
        result = shell.run_cell("%%budget --detach --budget 100ms\nimport nbbudget as nb, time\n"
                                "while True:  # until stopped\n    nb.current().check()\n"
                                "    time.sleep(0.01)")
    assert type(result.error_in_exec).__name__ == "Incomplete"
    panel = shell.magics_manager.registry["BudgetMagics"].last_panel
    assert [(b.description, b.disabled) for b in panel._view.buttons] == [("Stop", False)]
    panel._view.stop.click()
    job = nb.last_response.job
    assert job.wait_done(5)
    assert job.state is nb.JobState.CANCELLED
    panel._thread.join(5)
    assert not panel._thread.is_alive()


class _Kernel:
    """What `KeepBusy` needs of an ipykernel: its status publisher and its shell's request."""

    def __init__(self):
        self.sent = []
        self.parent = {"header": {"msg_id": "cell", "msg_type": "execute_request"}}

    def _publish_status(self, status, channel, parent=None):
        parent = parent or self.parent
        self.sent.append((status, parent["header"]["msg_id"]))

    def get_parent(self, channel=None):
        return self.parent


def _beside(publish, request):
    """A request answered on another thread (a subshell's, the control thread)."""
    import threading

    parent = {"header": {"msg_id": request, "msg_type": "comm_msg"}}
    thread = threading.Thread(target=lambda: [publish(s, "shell", parent)
                                              for s in ("busy", "idle")])
    thread.start()
    thread.join()


def test_N_3_the_kernel_stays_busy_while_its_main_shell_runs_a_request():
    from nbbudget.jupyter.status import KeepBusy

    kernel = _Kernel()
    keep = KeepBusy(kernel)
    assert keep.install() and not keep.install()
    kernel._publish_status("busy", "shell")  # the main shell starts the cell
    _beside(kernel._publish_status, "click")
    assert kernel.sent == [("busy", "cell"), ("busy", "click"), ("idle", "click"),
                           ("busy", "cell")]
    kernel._publish_status("idle", "shell")  # the cell ends
    _beside(kernel._publish_status, "close")
    assert kernel.sent[-3:] == [("idle", "cell"), ("busy", "close"), ("idle", "close")]
    assert keep.restored == 1
    keep.uninstall()
    assert "_publish_status" not in vars(kernel)  # the kernel's own publisher again
