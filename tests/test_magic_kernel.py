"""``%%budget`` in a real kernel, driven as nbclient drives it (``allow_stdin`` false): the
call budget, detach, resume, the envelope, and how a cell ends (S0-1, S0-3, S0-5, S0-10, S0-11,
S0-12, N-1)."""

from __future__ import annotations

import json
import os
import queue
import sys
import textwrap
import time

import pytest

MIME = "application/vnd.nbbudget.response+json"
pytestmark = pytest.mark.realclock


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel of this Python, or of ``$NBBUDGET_KERNEL_PYTHON`` (``bash scripts/compat.sh``
    runs this module against kernels of older ipykernel releases that way)."""
    yield from started_kernel(tmp_path_factory, AGENT_CALL_BUDGET_MS="2000")


def started_kernel(tmp_path_factory, **env_vars: str):
    """Start a kernel with nbbudget loaded and a store of its own, yield its client, and shut it
    down: no NBBUDGET_INTERACTIVE or AGENT_CALL_BUDGET_MS from the outside, *env_vars* added."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items()
           if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS")}
    env["NBBUDGET_HOME"] = str(tmp_path_factory.mktemp("kernel-store"))
    env.update(env_vars)
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "under-test").mkdir()
    (kernels / "under-test" / "kernel.json").write_text(json.dumps({
        "argv": [os.environ.get("NBBUDGET_KERNEL_PYTHON", sys.executable), "-m",
                 "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kernel under test", "language": "python"}))
    km = KernelManager(kernel_name="under-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    kc.manager = km  # to interrupt the kernel with
    try:
        run(kc, "%load_ext nbbudget\nimport nbbudget as nb")
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


class Cell:
    """What a driver saw of one execution: the reply, the outputs, the time it took."""

    def __init__(self, reply: dict, outputs: list[dict], seconds: float) -> None:
        self.reply = reply
        self.outputs = outputs
        self.seconds = seconds

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    @property
    def envelope(self) -> dict | None:
        found = [o["content"]["data"][MIME] for o in self.outputs
                 if o["msg_type"] == "display_data" and MIME in o["content"]["data"]]
        return found[-1] if found else None

    @property
    def stdout(self) -> str:
        return "".join(o["content"]["text"] for o in self.outputs if o["msg_type"] == "stream")

    @property
    def result(self) -> str | None:
        found = [o["content"]["data"]["text/plain"] for o in self.outputs
                 if o["msg_type"] == "execute_result"]
        return found[-1] if found else None


def run(kc, code: str, timeout: float = 60) -> Cell:
    """Execute *code* as nbclient does and collect what it sends until the kernel is idle."""
    started = time.monotonic()
    msg_id = kc.execute(textwrap.dedent(code), allow_stdin=False, stop_on_error=False)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    seconds = time.monotonic() - started
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return Cell(reply, outputs, seconds)
        outputs.append(msg)


def test_S0_1_a_detach_cell_replies_incomplete_within_3s_and_its_work_completes(kernel):
    cell = run(kernel, """\
        %%budget --detach
        import time
        for i in range(100):
            time.sleep(0.1)
            nb.current().step()
        trained = "model"
        """)
    assert cell.seconds < 3.0
    assert cell.status == "error"  # a program stops here: the next cells need the result
    assert cell.reply["content"]["ename"] == "Incomplete"
    assert "make the identical call again" in cell.reply["content"]["evalue"]
    envelope = cell.envelope
    assert envelope["meta"]["exit_code"] == 14
    assert envelope["meta"]["budget_ms"] == 2000
    assert envelope["data"]["state"] == "running"
    deadline = time.monotonic() + 20
    told = ""
    while True:
        probe = run(kernel, "print('trained' in dir())")
        told += probe.stdout
        if probe.stdout.strip().endswith("True"):
            break
        assert time.monotonic() < deadline, "the detached cell never finished"
        time.sleep(0.5)
    told += run(kernel, "pass").stdout
    # N-2: a driver that drops late output still learns, at the next cell, that the job ended
    assert (f"job {envelope['data']['job']} (cell: for i in range(100)) ended since the last "
            f"cell: done") in told
    assert run(kernel, "trained").result == "'model'"


def test_S0_1_S0_11_a_resume_cell_pauses_past_its_budget_and_the_same_cell_continues(kernel):
    source = """\
        %%budget --resume{flags}
        import time
        done = nb.resume_state([])
        for item in range(len(done), 8):
            time.sleep(0.5)
            done = done + [item]
            seen.append(item)
            nb.checkpoint(done)
        done
        """
    run(kernel, "seen = []")
    first = run(kernel, source.format(flags=""))
    assert first.reply["content"]["ename"] == "Incomplete"
    assert first.envelope["data"]["state"] == "paused"
    assert 2.0 <= first.seconds < 3.5
    second = run(kernel, source.format(flags=" --budget 0"))  # the budget is not the work
    assert second.status == "ok"
    assert second.envelope["meta"]["budget_ms"] == 0
    assert second.result == str(list(range(8)))
    assert run(kernel, "seen").result == str(list(range(8)))  # each item once


def test_S0_3_the_budget_flag_beats_the_environment(kernel):
    cell = run(kernel, "%%budget --detach --budget 5s\n6 * 7")
    assert cell.status == "ok"
    assert cell.result == "42"
    assert cell.envelope["meta"]["budget_ms"] == 5000
    assert cell.envelope["ok"] is True


def test_S0_10_budget_without_detach_or_resume_is_a_usage_error(kernel):
    cell = run(kernel, "%%budget --budget 5s\n1")
    assert cell.status == "error"
    assert cell.reply["content"]["ename"] == "UsageError"
    assert "--budget 5s needs --detach or --resume" in cell.reply["content"]["evalue"]


# -- what a person types: quoted values, unclosed quotes, flags checked before the cell runs ------
@pytest.mark.parametrize("line, expression, value", [
    ('--time "5s"', "nb.current().limits.run_ms", "5000"),
    ("--time '5s'", "nb.current().limits.run_ms", "5000"),
    (r'--run-limits-json "{\"max_steps\": 3}"', "nb.current().limits.steps", "3"),
    ("--run-limits-json '{\"max_steps\": 3}' --steps \"2\"", "nb.current().limits.steps", "2"),
])
def test_flag_values_quoted_as_in_a_shell_are_read_without_their_quotes(kernel, line,
                                                                        expression, value):
    cell = run(kernel, f"%%budget {line} --no-widget\n{expression}")
    assert cell.status == "ok", cell.reply["content"]
    assert cell.result == value


def test_an_unclosed_quote_is_a_usage_error_naming_the_line_and_nothing_runs(kernel):
    cell = run(kernel, "%%budget --key 'nightly\nprint('ran')")
    assert cell.reply["content"]["ename"] == "UsageError"
    assert cell.reply["content"]["evalue"] == (
        '''cannot read %%budget "--key 'nightly": no closing quotation; quote a value as a '''
        '''shell does, e.g. --key 'my work' or --key "my work"''')
    assert "ran" not in cell.stdout


NEGATIVE = "--budget='-1s' is negative; a duration is 0 or more milliseconds"


@pytest.mark.parametrize("line, message", [
    ("--steps 0", "--steps 0 must be greater than 0; leave --steps out for no limit"),
    ("--cost inf", "--cost inf is not finite; leave --cost out for no limit"),
    ("--detach --timeout 0",
     "--timeout 0 would cancel the work at once; leave --timeout out for no limit"),
    ("--detach --runs-per-day 0",
     "--runs-per-day 0: use a whole number from 1 to 1000000; leave --runs-per-day out for no "
     "quota"),
    ("--detach --budget -1s", NEGATIVE),  # read as the value, not as an option
    ("--detach --budget=-1s", NEGATIVE),
])
def test_S3_4_a_bad_flag_is_named_as_written_with_what_a_flag_takes_for_none(kernel, line,
                                                                           message):
    cell = run(kernel, f"%%budget {line}\nprint('ran')")
    assert cell.reply["content"]["ename"] == "UsageError"
    assert cell.reply["content"]["evalue"] == message
    assert "ran" not in cell.stdout


def test_budget_with_no_command_names_its_commands(kernel):
    cell = run(kernel, "%budget")
    assert cell.reply["content"]["ename"] == "UsageError"
    assert cell.reply["content"]["evalue"] == (
        "%budget needs a command: jobs (list the background jobs), wait ID, cancel ID, status "
        "(what the last %%budget cell used) or trace (its events), e.g. %budget jobs; %budget? "
        "says more")


def test_S0_10_nb_call_and_the_magic_refuse_detach_with_resume_alike(kernel):
    call = run(kernel, "nb.call(print, 'ran', detach=True, resume=True)")
    assert (call.reply["content"]["ename"], call.reply["content"]["evalue"]) == (
        "ConfigError", "detach=True and resume=True exclude each other: choose how the work "
                       "outlives its budget")
    cell = run(kernel, "%%budget --detach --resume\nprint('ran')")
    assert (cell.reply["content"]["ename"], cell.reply["content"]["evalue"]) == (
        "UsageError", "--detach and --resume exclude each other: choose how the work outlives "
                      "its budget")
    assert "ran" not in call.stdout + cell.stdout


def test_a_trace_path_in_a_missing_folder_is_refused_before_the_cell_runs(kernel, tmp_path):
    target = tmp_path / "no" / "such" / "t.json"
    cell = run(kernel, f"%%budget --trace {target}\nprint('ran')")
    assert cell.reply["content"]["ename"] == "UsageError"
    assert cell.reply["content"]["evalue"] == (
        f"--trace {str(target)!r}: the folder {str(target.parent)!r} does not exist; create it "
        f"or choose another path")
    assert "ran" not in cell.stdout


@pytest.mark.parametrize("work", ["time.sleep(1.5)",  # ignores its signal
                                  "while True:\n    nb.current().step()\n    time.sleep(0.01)"])
def test_S4_7_a_wall_clock_that_fires_ends_the_cell_as_Cancelled_in_one_line(kernel, work):
    cell = run(kernel, f"%%budget --timeout 300ms --no-widget\nimport time\n{work}")
    content = cell.reply["content"]
    assert (cell.status, content["ename"]) == ("error", "Cancelled")
    assert "was cancelled: its wall-clock limit of 300 ms" in content["evalue"]
    errors = [o for o in cell.outputs if o["msg_type"] == "error"]
    assert errors[0]["content"]["traceback"] == [f"Cancelled: {content['evalue']}"]
    time.sleep(1.5)  # the work that ignored its signal ends before the next test


def test_S2_8_a_manifest_wall_clock_ends_the_cell_as_its_wall_clock_limit(kernel, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({
        "manifest_version": "nbbudget-manifest-v1", "run_limits": {"max_steps": 10**6},
        "turn": {"wallClock": 300, "under": 1000}, "transport": {"envelopeBytes": 65536},
    }), encoding="utf-8")
    cell = run(kernel, f"%%budget --manifest '{manifest}' --no-widget\nimport time\n"
                       f"while True:\n    nb.current().step()\n    time.sleep(0.01)")
    content = cell.reply["content"]
    assert (cell.status, content["ename"]) == ("error", "Cancelled")
    assert "was cancelled: its wall-clock limit of 300 ms" in content["evalue"]
    assert cell.seconds < 5


def test_a_spent_limit_ends_the_cell_with_one_line(kernel):
    cell = run(kernel, "%%budget --steps 2\nfor i in range(5):\n    nb.current().step()")
    assert cell.status == "error"
    content = cell.reply["content"]
    assert content["ename"] == "BudgetExceeded"
    errors = [o for o in cell.outputs if o["msg_type"] == "error"]
    assert len(errors[0]["content"]["traceback"]) == 1


def test_a_cells_own_error_shows_as_the_cells_error(kernel):
    cell = run(kernel, "%%budget --steps 10\n1 / 0")
    assert (cell.status, cell.reply["content"]["ename"]) == ("error", "ZeroDivisionError")


def test_S0_5_N_1_a_person_runs_without_a_default_budget(kernel):
    run(kernel, "%env NBBUDGET_INTERACTIVE=1")
    try:
        cell = run(kernel, "%%budget --detach\n'person'")
        assert cell.status == "ok"
        assert "budget_ms" not in cell.envelope["meta"]
    finally:
        run(kernel, "%env NBBUDGET_INTERACTIVE=")


def test_N_2_a_detached_cell_keeps_its_output_for_drivers_that_drop_it(kernel):
    cell = run(kernel, """\
        %%budget --detach --budget 300ms
        import time
        for i in range(6):
            print(f"tick {i}", flush=True)
            time.sleep(0.15)
        """)
    job = cell.envelope["data"]["job"]
    deadline = time.monotonic() + 10
    while run(kernel, f"print(nb.jobs[{job!r}].done())").stdout.strip().splitlines()[-1] != "True":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    kept = run(kernel, f"print(nb.jobs[{job!r}].output_text, end='')").stdout
    assert [line for line in kept.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(6)]
    listed = run(kernel, f"print(nb.jobs.to_frame().loc[{job!r}, 'output'], end='')").stdout
    assert "tick 5" in listed


def test_N_2_late_output_reaches_the_cell_that_started_the_work(kernel):
    """What a detached job prints after its cell has ended is sent as that cell's output (the
    originating request is its parent), so JupyterLab shows it under that cell."""
    msg_id = kernel.execute(textwrap.dedent("""\
        %%budget --detach --budget 300ms --no-widget
        import time
        for i in range(6):
            print(f"late {i}", flush=True)
            time.sleep(0.15)
        """), allow_stdin=False, stop_on_error=False)
    seen: list[str] = []
    ended = False
    deadline = time.monotonic() + 15
    while len(seen) < 6:
        assert time.monotonic() < deadline, f"late output under the cell: {seen}"
        try:
            msg = kernel.get_iopub_msg(timeout=1)
        except queue.Empty:  # nothing yet
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            ended = True
            seen_when_ended = len(seen)
        if msg["msg_type"] == "stream":
            seen += [line for line in msg["content"]["text"].splitlines()
                     if line.startswith("late")]
    assert seen == [f"late {i}" for i in range(6)]
    assert ended and seen_when_ended < 6  # some of it came after the cell had ended
    run(kernel, "pass")


def test_N_3_the_panel_widget_appears_in_the_cell_output_with_its_text(kernel):
    cell = run(kernel, "%%budget --steps 10\nnb.current().step()")
    shown = [o["content"]["data"] for o in cell.outputs if o["msg_type"] == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" in shown[0]
    assert shown[0]["text/plain"].startswith("nbbudget: starting")


def test_top_level_await_and_nested_magics_keep_working(kernel):
    cell = run(kernel, "%%budget --steps 10\nimport asyncio\n%time x = 1\n"
                       "await asyncio.sleep(0.01)\nx + 1")
    assert cell.status == "ok", cell.reply["content"]
    assert cell.result == "2"


def test_an_interrupt_while_the_cell_holds_its_caller_stops_the_run(kernel):
    source = """\
        %%budget --detach --budget 30s
        import time
        while True:
            nb.current().step()
            time.sleep(0.01)
        """
    msg_id = kernel.execute(textwrap.dedent(source), allow_stdin=False, stop_on_error=True)
    time.sleep(1.0)
    kernel.manager.interrupt_kernel()
    reply = kernel.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kernel.get_shell_msg(timeout=30)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    run(kernel, "pass")
    runs = "get_ipython().magics_manager.registry['BudgetMagics'].last_run"
    deadline = time.monotonic() + 10
    while run(kernel, f"print({runs}.outcome is not None)").stdout.strip().splitlines()[-1] \
            != "True":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert run(kernel, f"print({runs}.outcome.status)").stdout.strip() == "stopped"
