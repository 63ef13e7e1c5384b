"""The IPython layer: ``%load_ext nbbudget``, ``%budget``, settings, and interactive detection
in a real kernel (N-1, S0-3, S0-5)."""

from __future__ import annotations

import contextvars
import json
import re
import threading

import pytest
from IPython.core.error import UsageError

import nbbudget as nb
from nbbudget.calls import call as _call
from nbbudget.calls import interactive as _interactive

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")



def test_load_ext_registers_budget_and_unload_ext_removes_every_hook(shell):
    assert "budget" in shell.magics_manager.magics["line"]
    assert _interactive._detector is not None and _call._default_budget is not None
    assert _call._default_cluster is not None
    shell.run_line_magic("unload_ext", "nbbudget")
    assert "budget" not in shell.magics_manager.magics["line"]
    assert _interactive._detector is None and _call._default_budget is None
    assert _call._default_cluster is None
    assert not [f for f in shell.events.callbacks["pre_run_cell"]
                if type(f).__name__ == "_EndedJobs"]
    assert not [c for c in shell.configurables if type(c).__name__ == "NBBudget"]
    assert not [t for t in shell.input_transformers_post if "nbbudget" in t.__module__]
    shell.run_line_magic("load_ext", "nbbudget")  # and it loads again


def test_budget_help_shows_every_subcommand(shell):
    doc = shell.magics_manager.magics["line"]["budget"].__doc__
    for word in ("jobs", "wait", "cancel", "--timeout", "%budget wait 1a2b-3"):
        assert word in doc


def test_budget_jobs_lists_a_detached_call_and_wait_gives_its_result(shell):
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "done"

    resp = nb.call(slow, detach=True, budget="50ms")
    assert resp.exit_code == 14
    job_id = resp.data["job"]
    table = shell.run_line_magic("budget", "jobs")
    assert table.frame.loc[job_id, "state"] == "running"
    assert table.frame.loc[job_id, "took"].endswith(" so far")
    release.set()
    assert shell.run_line_magic("budget", f"wait '{job_id}' --timeout '5'") == "done"
    assert shell.run_line_magic("budget", "jobs").frame.loc[job_id, "state"] == "done"


def test_budget_cancel_stops_a_cooperative_job_and_says_so(shell, capsys):
    def loop() -> None:
        run = nb.current()
        while True:
            run.step()
            threading.Event().wait(0.01)

    resp = nb.call(loop, detach=True, budget="50ms")
    job_id = resp.data["job"]
    shell.run_line_magic("budget", f"cancel {job_id}")
    assert capsys.readouterr().out == f"job {job_id} stopped\n"
    assert nb.jobs[job_id].wait_done(5)
    assert nb.jobs[job_id].state is nb.JobState.CANCELLED


def test_budget_cancel_says_when_a_job_ended_anyway_and_kept_its_result(shell, capsys):
    def never_checks() -> str:
        run = nb.current()
        for _ in range(1000):  # it sees the cancel (a flag, not a check) and returns anyway
            if run.cancelled:
                break
            threading.Event().wait(0.005)
        return "finished A"

    # cooperative: a cancel is seen at the flag, not raised into the loop (N-5)
    resp = nb.call(never_checks, detach=True, budget="50ms", preempt=False)
    job_id = resp.data["job"]
    shell.run_line_magic("budget", f"cancel {job_id}")
    assert capsys.readouterr().out == (
        f"job {job_id} ended (done) before the cancel reached it: the cancel was not "
        f"honoured, and its result is kept (nb.jobs[{job_id!r}])\n")
    assert nb.jobs[job_id].result() == "finished A"


@pytest.mark.parametrize("line, message", [
    ("wait", "%budget wait needs a job id, e.g. %budget wait 1a2b-3 (see %budget jobs)"),
    ("wait nope", "no job 'nope' in this process"),
    ("frobnicate", "invalid choice: 'frobnicate'"),
    ("wait '1a2b-3", "cannot read %budget \"wait '1a2b-3\": no closing quotation; quote a value"),
])
def test_bad_budget_commands_are_usage_errors(shell, line, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        shell.run_line_magic("budget", line)


def test_S0_3_the_configured_default_budget_comes_after_the_environment(shell, monkeypatch):
    shell.run_line_magic("config", "NBBudget.default_budget_ms = 7000")
    assert nb.call(lambda: 1, detach=True).meta["budget_ms"] == 7000
    monkeypatch.setenv("AGENT_CALL_BUDGET_MS", "3000")
    assert nb.call(lambda: 1, detach=True).meta["budget_ms"] == 3000
    assert nb.call(lambda: 1, detach=True, budget="1s").meta["budget_ms"] == 1000


def test_N_1_the_setting_decides_after_the_environment(shell, monkeypatch):
    monkeypatch.delenv("NBBUDGET_INTERACTIVE")
    shell.run_line_magic("config", "NBBudget.interactive = True")
    assert "budget_ms" not in nb.call(lambda: 1, detach=True).meta  # S0-5: a person
    shell.run_line_magic("config", "NBBudget.interactive = False")
    assert nb.call(lambda: 1, detach=True).meta["budget_ms"] == 30000
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "1")  # the environment comes first
    assert "budget_ms" not in nb.call(lambda: 1, detach=True).meta


# -- N-1 in a real kernel ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from jupyter_client.manager import start_new_kernel

    home = tmp_path_factory.mktemp("kernel-home")
    env_overrides = {"NBBUDGET_HOME": str(home)}
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS")}
    km, kc = start_new_kernel(kernel_name="python3", env={**env, **env_overrides})
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _execute_with_metadata(kc, code: str, *, allow_stdin: bool, metadata: dict) -> str:
    """Send an execute_request carrying *metadata* (as JupyterLab sends ``cellId``)."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": allow_stdin, "stop_on_error": True}
    msg = kc.session.msg("execute_request", content, metadata=metadata)
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    out = []
    while True:
        reply = kc.get_iopub_msg(timeout=30)
        if reply["parent_header"].get("msg_id") != msg_id:
            continue
        if reply["msg_type"] == "stream":
            out.append(reply["content"]["text"])
        if reply["msg_type"] == "error":
            raise AssertionError("\n".join(reply["content"]["traceback"]))
        if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            return "".join(out)


PROBE = "%load_ext nbbudget\nfrom nbbudget.calls.interactive import is_interactive\n" \
        "print(is_interactive())"


@pytest.mark.parametrize("allow_stdin, metadata, expected", [
    (False, {}, "False"),                       # nbclient, papermill, nbval
    (True, {"cellId": "c-1"}, "True"),          # JupyterLab, Notebook 7
    (True, {}, "False"),                        # an agent harness: stdin, but no cell
])
def test_N_1_a_kernel_tells_a_person_from_a_program_by_the_request(kernel, allow_stdin,
                                                                    metadata, expected):
    out = _execute_with_metadata(kernel, PROBE, allow_stdin=allow_stdin, metadata=metadata)
    assert out.strip().splitlines()[-1] == expected


def test_N_2_the_next_cell_says_which_jobs_ended_since_the_last_one(shell, capsys):
    release = threading.Event()
    resp = nb.call(lambda: release.wait(5), detach=True, budget="50ms", key="ends-later")
    job = nb.jobs[resp.data["job"]]
    shell.run_cell("pass")
    assert "ended since the last cell" not in capsys.readouterr().out
    release.set()
    assert job.wait_done(5)
    shell.run_cell("pass")
    assert capsys.readouterr().out.splitlines()[0] == (
        f"nbbudget: job {job.id} (ends-later) ended since the last cell: done; "
        f"see nb.jobs[{job.id!r}]")
    shell.run_cell("pass")
    assert "ended since" not in capsys.readouterr().out  # said once


def test_N_4_budget_status_and_trace_show_the_last_cell_run_as_frames(shell, capsys):
    shell.run_line_magic("budget", "jobs")  # no cell yet: jobs still work
    for command in ("status", "trace"):
        assert shell.run_line_magic("budget", command) is None
        assert capsys.readouterr().out == (f"No %%budget cell has run yet in this kernel; "
                                           f"%budget {command} shows the last one's run.\n")
    result = shell.run_cell("%%budget --steps 10 --tokens 100\n"
                            "import nbbudget as nb\n"
                            "for _ in range(4):\n    nb.current().step()\n"
                            "nb.current().charge('tokens', 30)")
    assert result.error_in_exec is None
    status = shell.run_line_magic("budget", "status")
    assert status.loc["steps", "consumed"] == 4 and status.loc["tokens", "remaining"] == 70
    trace = shell.run_line_magic("budget", "trace")
    assert list(trace["kind"]) == ["outcome"]
    assert trace["t_ms"][0] == round(trace["t_ms"][0], 2)  # short times


def test_N_4_status_of_a_cell_without_limits_is_a_sentence(shell, capsys):
    shell.run_cell("%%budget --no-widget\nimport time\ntime.sleep(1.25)")
    capsys.readouterr()
    assert shell.run_line_magic("budget", "status") is None
    assert re.fullmatch(r"The last %%budget cell \(cell: time.sleep\(1.25\)\) set no limits, "
                        r"so there is no use per limit to show; it ran 1\.\d s \(completed\)\.\n",
                        capsys.readouterr().out)


def test_S4_2_configured_limits_apply_and_a_cell_may_only_restrict_them(shell):
    shell.run_line_magic("config", "NBBudget.limits = {'max_steps': 3}")
    result = shell.run_cell("%%budget\nimport nbbudget as nb\nfor _ in range(5):\n"
                            "    nb.current().step()")
    assert isinstance(result.error_in_exec, nb.BudgetExceeded)
    assert result.error_in_exec.limit == 3
    result = shell.run_cell("%%budget --steps 10\npass")
    assert isinstance(result.error_in_exec, UsageError)
    assert "steps=10 would widen the limit steps=3" in str(result.error_in_exec)
    result = shell.run_cell("%%budget --run-limits-json '{\"steps\": 2}'\npass")
    assert result.error_in_exec is None


def test_a_cell_line_is_expanded_as_ipython_expands_a_magics_line(shell, capsys):
    """$name and {expression} from the user's namespace, $$ and }} as themselves escaped; a
    line whose braces do not expand (JSON) is left as it is."""
    shell.run_cell("n = 3")
    said = []
    for line in ("--steps $n", "--steps {n + 1}", "--run-limits-json '{\"steps\": 2}'"):
        assert shell.run_cell(f"%%budget --no-widget {line}\npass").error_in_exec is None
        said.append(capsys.readouterr().out.rsplit("; ", 1)[-1].strip())
    assert said == ["steps 0/3", "steps 0/4", "steps 0/2"]
    # the frame IPython reads: two above run_cell_magic's (here g's, where m is)
    shell.run_cell("def g():\n    m = 7\n    def f():\n        get_ipython().run_cell_magic("
                   "'budget', '--no-widget --steps $m', 'pass')\n    f()\ng()")
    assert capsys.readouterr().out.rstrip().endswith("; steps 0/7")
    result = shell.run_cell("%%budget --no-widget --steps $$n\npass")
    assert "invalid int value: '$n'" in str(result.error_in_exec)  # $$n: a literal $n
    assert shell.run_cell("%%budget --no-widget --detach --key 'a}}b'\npass").success
    assert nb.last_response.job is not None and nb.last_response.job.label == "a}b"


def test_a_cell_line_read_once_is_read_again_when_the_settings_or_its_files_change(
        shell, tmp_path):
    """The same line under new settings, a manifest changed on disk, and a --trace target
    whose folder is gone: each cell sees them as they are now."""
    magics = shell.magics_manager.registry["BudgetMagics"]
    cell = "%%budget --no-widget\npass"
    shell.run_cell(cell)
    assert magics.last_run.limits == nb.Limits()
    shell.run_line_magic("config", "NBBudget.limits = {'max_steps': 3}")
    shell.run_cell(cell)
    assert magics.last_run.limits == nb.Limits(steps=3)
    shell.run_line_magic("config", "NBBudget.approach_notice = [0.5, 0.6]")
    shell.run_cell("%%budget --steps 2 --no-widget\nimport nbbudget as nb\n"
                   "nb.current().step()")
    assert magics.last_run.notice_level == 1
    manifest = tmp_path / "manifest.json"
    for steps in (2, 1):
        manifest.write_text(json.dumps({"manifest_version": "nbbudget-manifest-v1",
                                        "run_limits": {"max_steps": steps}}))
        assert shell.run_cell(f"%%budget --no-widget --manifest {manifest}\npass"
                              ).error_in_exec is None
        assert magics.last_run.limits == nb.Limits(steps=steps)
    folder = tmp_path / "traces"
    folder.mkdir()
    line = f"%%budget --no-widget --trace {folder / 'run.json'}\npass"
    assert shell.run_cell(line).error_in_exec is None
    (folder / "run.json").unlink()
    folder.rmdir()
    result = shell.run_cell(line)
    assert isinstance(result.error_in_exec, UsageError)
    assert "does not exist" in str(result.error_in_exec)


def test_the_configured_home_is_used_when_NBBUDGET_HOME_is_unset(shell, monkeypatch, tmp_path):
    monkeypatch.delenv("NBBUDGET_HOME")
    shell.run_line_magic("config", f"NBBudget.home = {str(tmp_path / 'configured')!r}")
    assert nb.store().folder == (tmp_path / "configured").resolve()


@pytest.mark.parametrize("line, message", [
    ("--detach --resume", "--detach and --resume exclude each other"),
    ("--steps 0", "--steps 0 must be greater than 0; leave --steps out for no limit"),
    ("--cost inf", "--cost inf is not finite; leave --cost out for no limit"),
    ("--run-limits-json '{\"max_steps\": 0}'",
     "steps=0 must be greater than 0; use null for no limit"),
    ("--steps lots", "argument --steps: invalid int value: 'lots'"),
    ("--time soon", "--time='soon' is not a duration"),
    ("--run-limits-json '{\"stepz\": 1}'", "unknown run limit 'stepz'"),
    ("--manifest /nowhere.json", "cannot read manifest '/nowhere.json'"),
    ("--runs-per-day 0", "--runs-per-day 0: use a whole number from 1 to 1000000; leave "
                         "--runs-per-day out for no quota"),
    ("--timeout 0", "--timeout 0 would cancel the work at once; leave --timeout out for no "
                    "limit"),
    ("--detach --key ''", "--key '': use a non-empty string that names the work"),
    ("--detach --budget -1s", "--budget='-1s' is negative; a duration is 0 or more milliseconds"),
    ("--detach --budget=-1s", "--budget='-1s' is negative; a duration is 0 or more milliseconds"),
    ("--time -1s", "--time='-1s' is negative; a duration is 0 or more milliseconds"),
    ("--budget 5s", "--budget 5s needs --detach or --resume: only a call that can detach or "
                    "pause can return before its work ends; drop --budget or declare one of "
                    "them (see: nbbudget explain S0-10)"),
    ("--time '5s", """cannot read %%budget "--time '5s": no closing quotation"""),
    ("--key x\\", "cannot read %%budget '--key x\\\\': no escaped character"),
    ("--trace /no/such/t.json", "--trace '/no/such/t.json': the folder '/no/such' does not exist"),
    ("--time '5 days'", "--time='5 days' is not a duration"),
    ("--manifest ''", "cannot read manifest ''"),
    ("--trace ''", "--trace '' is not a file path"),
])
def test_bad_cell_flags_are_usage_errors_naming_the_value(shell, line, message):
    result = shell.run_cell(f"%%budget {line}\npass")
    assert isinstance(result.error_in_exec, UsageError)
    assert message in str(result.error_in_exec)


def test_budget_cell_help_lists_every_flag_with_an_example(shell):
    doc = shell.magics_manager.magics["cell"]["budget"].__doc__
    for flag in ("--budget", "--detach", "--resume", "--key", "--timeout", "--time", "--steps",
                 "--tool-calls", "--agent-invocations", "--provider-calls", "--turns",
                 "--tokens", "--output-tokens", "--cost", "--run-limits-json", "--manifest",
                 "--runs-per-day", "--trace", "--no-widget", "%%budget --detach --budget 2s"):
        assert flag in doc, flag


def test_S3_5_the_configured_approach_notices_apply_to_a_cells_run(shell):
    shell.run_line_magic("config", "NBBudget.approach_notice = [0.5, 0.6]")
    shell.run_cell("%%budget --steps 10 --no-widget\nimport nbbudget as nb\n"
                   "nb.current().charge('steps', 5)")
    run = shell.magics_manager.registry["BudgetMagics"].last_run
    assert run.notice_level == 1
    shell.run_line_magic("config", "NBBudget.approach_notice = [0.9, 0.5]")
    result = shell.run_cell("%%budget --steps 10\npass")
    assert isinstance(result.error_in_exec, UsageError)
    assert "NBBudget.approach_notice: notices=(0.9, 0.5)" in str(result.error_in_exec)


def test_a_configured_cluster_keeps_a_cells_counters_and_runs_its_branches(shell):
    pytest.importorskip("distributed")
    from conftest import dask_cluster

    from nbbudget.backends.dask.ledger import DaskLedger, on_cluster

    with dask_cluster(processes=False) as client:
        address = client.scheduler.address
        shell.run_line_magic("config", f"NBBudget.cluster = {address!r}")
        try:
            result = shell.run_cell(
                "%%budget --steps 100 --no-widget\nimport nbbudget as nb\n"
                "def branch(n):\n    for _ in range(n):\n        nb.current().step()\n"
                "    return n\nnb.current().map(branch, [10, 20])")
            assert result.error_in_exec is None and result.result == [10, 20]
            run = shell.magics_manager.registry["BudgetMagics"].last_run
            assert isinstance(run.lowlevel.ledger, DaskLedger)
            assert run.consumed["steps"] == 30
        finally:
            on_cluster(address).client.close()


def test_a_configured_cluster_is_where_nb_call_runs_its_work(shell):
    pytest.importorskip("distributed")
    from conftest import dask_cluster

    from nbbudget.backends.dask.ledger import on_cluster

    def where() -> str:
        from distributed import get_worker

        return str(get_worker().address)

    with dask_cluster(processes=False) as client:
        address = client.scheduler.address
        assert nb.call(where, detach=True, budget="10s").error is not None  # here: no worker
        shell.run_line_magic("config", f"NBBudget.cluster = {address!r}")
        try:
            response = nb.call(where, detach=True, budget="10s")
            assert response.ok and response.data in client.scheduler_info()["workers"]
        finally:
            on_cluster(address).client.close()


def test_a_detached_cells_body_stays_in_the_kernel_when_a_cluster_is_configured(shell):
    """A cell's body runs in the kernel, in its namespace; only the functions and branches it
    sends go to the cluster (a configured cluster is the default of nb.call, not of cells)."""
    pytest.importorskip("distributed")
    from conftest import dask_cluster

    from nbbudget.backends.dask.ledger import on_cluster

    with dask_cluster(processes=False) as client:
        address = client.scheduler.address
        shell.run_line_magic("config", f"NBBudget.cluster = {address!r}")
        try:
            shell.user_ns["here"] = []
            result = shell.run_cell("%%budget --detach --budget 10s --no-widget\n"
                                    "import threading\nhere.append(threading.current_thread().name)"
                                    "\n'done'")
            assert result.error_in_exec is None and result.result == "done"
            assert len(shell.user_ns["here"]) == 1  # the kernel's own list, appended to here
            assert shell.user_ns["here"][0].startswith("nbbudget-worker-")
        finally:
            on_cluster(address).client.close()


def test_S4_12_a_cell_over_its_runs_per_day_stops_with_one_line_and_runs_nothing(shell):
    cell = "%%budget --runs-per-day 2 --no-widget\nimport builtins\nbuiltins.ran_here += 1"
    import builtins

    builtins.ran_here = 0
    try:
        assert shell.run_cell(cell).error_in_exec is None
        assert shell.run_cell(cell.replace("--runs-per-day 2", "--runs-per-day=2")).success
        result = shell.run_cell(cell)
        assert builtins.ran_here == 2  # the third start ran nothing
    finally:
        del builtins.ran_here
    err = result.error_in_exec
    assert isinstance(err, nb.RunsPerDayExceeded) and isinstance(err, nb.BudgetError)
    assert "already started 2 times on" in str(err) and "raise runs_per_day" in str(err)
    assert err._render_traceback_() == [f"RunsPerDayExceeded: {err}"]


@pytest.mark.parametrize(("line", "same"), [
    ("--run-limits-json '{\"steps\": 5}'", r'--run-limits-json "{\"steps\": 5}"'),
    ("--time 5s --steps 5", "--steps '5' --time \"5s\""),
    ("--cost 1.5 --key 'a b'", '--key="a b" --cost "1.5"'),
])
def test_a_flag_quoted_or_placed_otherwise_reads_the_same(shell, line, same):
    first = shell.run_cell(f"%%budget {line} --no-widget\nimport nbbudget as nb\nnb.current()")
    second = shell.run_cell(f"%%budget {same} --no-widget\nimport nbbudget as nb\nnb.current()")
    assert first.result.limits == second.result.limits != nb.Limits()


RESUMABLE = ("import nbbudget as nb, time\n"
             "done = nb.resume_state(0)\n"
             "time.sleep(0.3)\n"
             "nb.checkpoint(done + 1)\n"
             "done + 1")


def test_S0_11_the_same_flags_however_quoted_name_the_same_work(shell):
    first = shell.run_cell(f"%%budget --resume --budget 100ms --steps 5 --no-widget\n{RESUMABLE}")
    assert type(first.error_in_exec).__name__ == "Incomplete"
    other = shell.run_cell(f"%%budget --resume --budget 5s --steps 6 --no-widget\n{RESUMABLE}")
    assert other.result == 1  # another limit is other work: it starts anew
    again = shell.run_cell(f"%%budget --resume --budget 5s --steps '5' --no-widget\n{RESUMABLE}")
    assert again.result == 2  # continued from the checkpoint of the first


def test_S0_6_a_continuation_after_the_wall_clock_ran_out_ends_as_Cancelled(shell):
    line = "%%budget --resume --budget 50ms --timeout 2s --no-widget"
    first = shell.run_cell(f"{line}\n{RESUMABLE}")
    assert type(first.error_in_exec).__name__ == "Incomplete"
    threading.Event().wait(2.2)  # past the wall clock, counted from the first start
    again = shell.run_cell(f"{line}\n{RESUMABLE}")
    err = again.error_in_exec
    assert type(err) is nb.Cancelled
    assert "its wall-clock limit of 2000 ms, counted from its first start" in str(err)
    assert err._render_traceback_() == [f"Cancelled: {err}"]


def test_S4_5_a_refused_checkpoint_ends_the_cell_with_its_code_not_as_a_usage_error(shell):
    identity = _call._identity(print, (), {}, "refused-work")
    nb.store().save_checkpoint(identity, "half way", ledger={"version": "nbbudget-ledger-v0"},
                               first_start=0.0, label="refused-work")
    result = shell.run_cell("%%budget --resume --key refused-work --no-widget\nprint('ran')")
    err = result.error_in_exec
    assert type(err) is nb.CheckpointRefused and err.code == "checkpoint_refused"
    assert str(err).startswith(f"checkpoint {identity!r} in ")
    assert err._render_traceback_() == [f"CheckpointRefused: {err}"]


def test_budget_jobs_on_a_damaged_store_lists_the_kernels_jobs_and_names_the_damage(
        shell, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "damaged"
    folder.mkdir()
    (folder / "secret").write_text("0" * 64)  # a store that held records...
    (folder / "nbbudget.db").write_bytes(b"")  # ...and lost them
    monkeypatch.setenv("NBBUDGET_HOME", str(folder))
    shown = shell.run_line_magic("budget", "jobs")
    said = capsys.readouterr().out + (repr(shown) if shown is not None else "")
    assert (f"(the store's jobs are not listed: the nbbudget store "
            f"{str(folder / 'nbbudget.db')!r} is damaged") in said
    assert "Restore it from a backup, or move the folder" in said
    assert (folder / "nbbudget.db").read_bytes() == b""  # left as it is


def test_S2_1_a_budget_cell_inside_an_active_run_runs_as_a_grant_of_it(shell):
    """Under ``nbbudget run`` every cell runs inside the notebook's run: a %%budget cell there
    is a grant of it, its steps counted on the run too, its deadline within the run's."""
    from nbbudget.run.budget import activate
    from nbbudget.testing import FakeClock

    run = nb.budget(steps=3, time="1h", name="notebook", clock=FakeClock())

    def cell_in_the_run():
        activate(run)
        shell.run_cell("%%budget --steps 5 --time 2h --no-widget\nimport nbbudget as nb\n"
                       "inner = nb.current()\ninner.step()\ninner.step()")
        return shell.run_cell("%%budget --steps 5 --no-widget\nnb.current().step()\n"
                              "nb.current().step()")

    second = contextvars.copy_context().run(cell_in_the_run)  # `run` stays current only there
    inner = shell.user_ns["inner"]
    assert isinstance(inner, nb.Grant)
    assert inner.remaining_ms <= 3_600_000  # S2-1: no later than the run's own deadline
    assert isinstance(second.error_in_exec, nb.BudgetExceeded)  # the run's 3 steps, shared
    assert (second.error_in_exec.scope, run.consumed["steps"]) == ("run", 3)
    assert nb.current() is None


def test_a_stop_that_reaches_the_top_of_a_cell_shows_its_public_error_in_one_line(shell, capsys):
    """A run made current outside a ``with`` block (a notebook's under ``nbbudget run``): when
    its time grant is spent, the next check raises at the top of a cell, and IPython shows the
    error a ``with`` block would have raised, in one line."""
    from nbbudget.run.budget import activate
    from nbbudget.testing import FakeClock

    clock = FakeClock()
    run = nb.budget(time="1s", name="notebook", clock=clock)

    def cell_in_the_run():
        activate(run)
        clock.advance("2s")
        return shell.run_cell("import nbbudget as nb\nnb.current().check()")

    result = contextvars.copy_context().run(cell_in_the_run)
    assert result.error_in_exec is not None
    shown = capsys.readouterr().out.strip().splitlines()
    assert shown == ["BudgetCut: notebook ran out of time: its time grant of 1000 ms is spent; "
                     "give it more time or do less work"]


def test_a_cells_name_is_its_first_telling_line_of_code_without_its_comment(shell):
    shell.run_cell("%%budget --steps 5 --no-widget\nimport nbbudget as nb\n"
                   "for row in 'a#b':      # one per row\n    nb.current().step()")
    magics = shell.magics_manager.registry["BudgetMagics"]
    assert magics.last_run.name == "cell: for row in 'a#b'"


def test_N_6_a_cell_that_awaits_is_awaited_by_the_shell_in_its_run(shell):
    result = shell.run_cell("%%budget --steps 5 --no-widget\nimport asyncio\n"
                            "import nbbudget as nb\n"
                            "async def step():\n    nb.current().step()\n"
                            "    return nb.current()\n"
                            "run = await asyncio.create_task(step())\n"
                            "run is nb.current(), run.consumed['steps']")
    assert result.success, result.error_in_exec
    assert result.result == (True, 1)
    transformed = shell.transform_cell("%%budget --steps 5\nawait x")
    assert transformed.startswith("await get_ipython().find_cell_magic('budget')")
    assert shell.transform_cell("%%budget --steps 5\nx") == (
        "get_ipython().run_cell_magic('budget', '--steps 5', 'x\\n')\n")  # no await: as it was
