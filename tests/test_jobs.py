"""Background jobs in a real kernel, driven as nbclient drives it: what ``%budget cancel`` says
and does, the states a cancelled job goes through, and the trace of a cancel (S2-3, N-2)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from test_magic_kernel import run

pytestmark = pytest.mark.realclock


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel of its own: no other test's jobs are in it."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items()
           if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS")}
    env["NBBUDGET_HOME"] = str(tmp_path_factory.mktemp("jobs-store"))
    kernels = tmp_path_factory.mktemp("kernels")
    (kernels / "under-test").mkdir()
    (kernels / "under-test" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kernel under test", "language": "python"}))
    km = KernelManager(kernel_name="under-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    try:
        run(kc, "%load_ext nbbudget\nimport nbbudget as nb")
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def detach(kernel, body: str) -> str:
    """Start *body* as a ``--detach --budget 1s`` cell that outlives its budget; its job id."""
    cell = run(kernel, "%%budget --detach --budget 1s\n" + body)
    assert cell.envelope is not None, cell.outputs
    assert cell.envelope["data"]["state"] == "running"
    return cell.envelope["data"]["job"]


def probe(kernel, job: str, expression: str) -> str:
    """The last line *expression* prints about ``j``, the job."""
    cell = run(kernel, f"j = nb.jobs[{job!r}]\nprint({expression})")
    assert cell.status == "ok", cell.outputs
    return cell.stdout.strip().splitlines()[-1]


def said(cell) -> str:
    """The last line a cell printed (a line about jobs that ended may come before it)."""
    return cell.stdout.strip().splitlines()[-1]


def cancel_kinds(kernel, job: str) -> str:
    return probe(kernel, job, "[e.kind for e in j.run.trace.events if 'cancel' in e.kind]")


def test_S2_3_a_cancelled_job_that_never_checks_runs_on_then_finishes_not_honoured(kernel):
    job = detach(kernel, "import time\ntime.sleep(4)\nprint('finished A')\n'A'\n")
    cancel = run(kernel, f"%budget cancel {job}")
    assert cancel.status == "ok"
    assert said(cancel) == (
        f"cancel requested for job {job}; it has not reached a budget check yet: it will stop "
        f"at its next one, or finish anyway (see %budget jobs)")
    assert probe(kernel, job, "j.state, j.cancel_status") == "running requested"
    assert cancel_kinds(kernel, job) == "['cancel_requested']"

    assert probe(kernel, job, "j.wait_done(20)") == "True"
    told = run(kernel, "pass").stdout  # the next cell says how the job ended
    assert f"nbbudget: job {job} " in told
    assert "ended since the last cell: done (cancel not honoured)" in told
    assert probe(kernel, job, "j.state, j.cancel_status, j.result()") == "done not honoured A"
    assert probe(kernel, job, "j.output_text.strip()") == "finished A"
    assert probe(kernel, job, "nb.jobs.to_frame().loc[j.id, 'cancel']") == "not honoured"
    assert cancel_kinds(kernel, job) == "['cancel_requested']"


def test_S2_3_a_cancelled_job_that_checks_stops_at_its_next_check(kernel):
    job = detach(kernel, "import time\nfor i in range(200):\n    time.sleep(0.05)\n"
                         "    nb.current().check()\n'B'\n")
    started = time.monotonic()
    cancel = run(kernel, f"%budget cancel {job}")
    assert time.monotonic() - started < 5
    assert said(cancel) == f"job {job} stopped at a budget check"
    assert probe(kernel, job, "j.state, j.cancel_status") == "cancelled stopped"
    assert cancel_kinds(kernel, job) == "['cancel_requested', 'cancel_observed']"
    assert probe(kernel, job, "nb.jobs.to_frame().loc[j.id, 'cancel']") == "stopped"


def test_cancelling_a_job_that_already_ended_says_so(kernel):
    job = detach(kernel, "import time\ntime.sleep(1.5)\n")
    assert probe(kernel, job, "j.wait_done(20)") == "True"
    cancel = run(kernel, f"%budget cancel {job}")
    assert said(cancel) == (
        f"job {job} had already ended (done); there was nothing to cancel")
    assert probe(kernel, job, "j.state, j.cancel_status") == "done None"
