"""Background jobs in a real kernel, driven as nbclient drives it: what ``%budget cancel`` says
and does, the states a cancelled job goes through, and the trace of a cancel (S2-3, N-2)."""

from __future__ import annotations

import re
import time

import pytest
from test_magic_kernel import run, started_kernel

pytestmark = pytest.mark.realclock


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel of its own: no other test's jobs are in it."""
    yield from started_kernel(tmp_path_factory)


def detach(kernel, body: str) -> str:
    """Start *body* as a ``--detach --budget 1s --cooperative`` cell that outlives its budget;
    its job id. Cooperative: these tests show a cancel met at budget checks (S2-3); a stop
    raised into work that never checks is `test_preempt_kernel`'s (N-5)."""
    cell = run(kernel, "%%budget --detach --budget 1s --cooperative\n" + body)
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


def jobs_view(kernel) -> tuple[str, str]:
    """The ``text/plain`` and ``text/html`` of ``%budget jobs``."""
    cell = run(kernel, "%budget jobs")
    assert cell.status == "ok", cell.outputs
    data = next(o["content"]["data"] for o in cell.outputs if o["msg_type"] == "execute_result")
    return data["text/plain"], data.get("text/html", "")


def test_N_4_budget_jobs_says_so_in_a_sentence_when_there_is_no_job(kernel):
    """First in this module: its kernel has no job yet."""
    text, html = jobs_view(kernel)
    assert text == "no background jobs in this kernel or its store"
    assert "no background jobs in this kernel or its store" in html


def test_S2_3_a_cancelled_job_that_never_checks_runs_on_then_finishes_not_honoured(kernel):
    job = detach(kernel, "import time\ntime.sleep(4)\nprint('finished A')\n'A'\n")
    cancel = run(kernel, f"%budget cancel {job}")
    assert cancel.status == "ok"
    assert said(cancel) == (
        f"cancel requested for job {job}; it has not stopped yet: it stops at its next bytecode "
        f"once out of a call Python cannot interrupt (a sleep or a read on its thread, C code), "
        f"or at its next budget check if it is cooperative, or finishes anyway (see %budget "
        f"jobs)")
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
    assert said(cancel) == f"job {job} stopped"
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


def test_N_4_budget_jobs_reads_well_as_text_and_as_html(kernel):
    failing = detach(kernel, "import time\ntime.sleep(1.5)\nprint('step 1 of 2')\n"
                             "raise ValueError('row 7 is malformed')\n")
    running = detach(kernel, "import time\nprint('warming up')\ntime.sleep(10)\n")
    assert probe(kernel, failing, "j.wait_done(20)") == "True"
    text, html = jobs_view(kernel)
    for shown in (text, html):
        assert "NaT" not in shown and "None" not in shown and "nan" not in shown
    lines = text.splitlines()
    assert lines[0].split() == ["id", "label", "state", "cancel", "started", "took", "kernel",
                                "error", "output"]
    row = {line.split()[0]: line for line in lines[1:]}
    assert re.search(r"cell: time.sleep\(1.5\) +failed +\d\d:\d\d:\d\d +\d\.\d s +this +"
                     r"ValueError: row 7 is malformed +step 1 of 2$", row[failing])
    assert re.search(r"cell: print\('warming up'\) +running +\d\d:\d\d:\d\d +[\d.]+ s so "
                     r"far +this +warming up$", row[running])
    assert re.search(r"not honoured +\d\d:\d\d:\d\d", text)  # the first test's job
    assert "<table" in html and f"<td>{running}</td>" in html
    assert "<td>ValueError: row 7 is malformed</td>" in html


@pytest.mark.parametrize("seconds, said", [
    (0.0123, "12 ms"), (0.85, "850 ms"), (3.21, "3.2 s"), (42.4, "42 s"), (125, "2 min 5 s"),
    (60, "1 min"), (3780, "1 h 3 min"), (7200, "2 h"), (-0.5, "0 ms"),
])
def test_a_duration_reads_as_a_person_says_it(seconds, said):
    from nbbudget.core.duration import spoken

    assert spoken(seconds * 1000) == said


def test_a_start_time_is_short_today_and_dated_another_day():
    from nbbudget.calls.jobs_frame import _clock_time

    now = time.mktime((2026, 11, 30, 14, 2, 31, 0, 0, -1))
    assert _clock_time(now - 60, now) == "14:01:31"
    assert _clock_time(now - 86400, now) == "Nov 29 14:02"


def test_N_4_another_kernel_lists_a_job_with_the_times_the_kernel_that_ran_it_shows(
        tmp_path_factory):
    """One source for a job's times: the record in the store carries the job's own start and
    end, so every kernel sharing the store shows the same start and duration."""
    shared = str(tmp_path_factory.mktemp("shared-store"))
    kernels = [started_kernel(tmp_path_factory, NBBUDGET_HOME=shared) for _ in range(2)]
    ran_it, other = (next(kernel) for kernel in kernels)
    try:
        job = detach(ran_it, "import time\ntime.sleep(2.5)\n")  # recorded once it detached
        assert probe(ran_it, job, "j.wait_done(20)") == "True"
        times = f"print(nb.jobs.to_frame().loc[{job!r}, ['state', 'created', 'ended']].tolist())"
        here, there = (run(kc, times) for kc in (ran_it, other))
        assert here.status == there.status == "ok", (here.outputs, there.outputs)
        assert there.stdout.splitlines()[-1] == here.stdout.splitlines()[-1]
        assert "'done', Timestamp(" in here.stdout

        rows = []
        for kc in (ran_it, other):
            text, _ = jobs_view(kc)
            header, *lines = text.splitlines()
            row = next(line for line in lines if line.startswith(job))
            started = header.index("started")
            rows.append(row[started:header.index("kernel")].split())  # started, took
        assert rows[0] == rows[1]
        started, took, unit = rows[0]
        assert re.fullmatch(r"\d\d:\d\d:\d\d", started) and unit == "s"
        assert 2.5 <= float(took) < 6  # from the call's start: its budget of 1 s included
    finally:
        for kernel in kernels:
            kernel.close()
