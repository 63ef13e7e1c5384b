"""The status comm (``nbbudget.status``) in a real kernel, opened as a front end opens it: what
it pushes while a ``%%budget`` cell runs (throttled, its fraction rising, then "not running"),
that it says nothing while nothing changes, that it counts the kernel's background jobs, that a
close is obeyed at once even while a cell holds the kernel, and that a kernel without nbbudget
refuses it (the front end shows nothing).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import textwrap
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from test_magic_kernel import kernel, run  # noqa: F401 - a module-scoped kernel fixture

pytestmark = pytest.mark.realclock
TARGET = "nbbudget.status"
INTERVAL_S = 0.5  # NBBudget.status_interval_ms's default
THREADS = ("import threading\n"
           "print([t.name for t in threading.enumerate() if t.name == 'nbbudget-status'])")

#: about two seconds of steps under a 3 s time grant
STEPPING = """\
%%budget --time 3s --steps 100
import time
for i in range(20):
    nb.current().step()
    time.sleep(0.1)
"""


class Heard:
    """Every IOPub message read, with the time it was read."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.seen: list[dict[str, Any]] = []

    def until(self, done: Any, timeout: float) -> None:
        """Read until *done*(message) is true of a message; fail after *timeout* s."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"not heard within {timeout} s; last: {self.seen[-3:]}"
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(msg)
            if done(msg):
                return

    def quiet_for(self, seconds: float) -> None:
        """Read everything for *seconds*."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.seen.append(self.kc.get_iopub_msg(timeout=left))
            except queue.Empty:
                return

    def said(self, comm_id: str) -> list[dict[str, Any]]:
        """The comm's messages (their data, with the kernel's send time as ``_at``)."""
        return [dict(m["content"]["data"], _at=_sent_at(m)) for m in self.seen
                if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id]

    def closes(self, comm_id: str) -> list[dict[str, Any]]:
        return [m for m in self.seen
                if m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id]


def _sent_at(msg: dict[str, Any]) -> float:
    date = msg["header"]["date"]
    return (date if isinstance(date, datetime) else datetime.fromisoformat(date)).timestamp()


def _open(kc: Any, data: dict[str, Any] | None = None) -> tuple[str, str]:
    """Open a comm to the target as a front end does; its id and the request's id."""
    comm_id = uuid.uuid4().hex
    msg = kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": TARGET,
                                       "data": data or {}})
    kc.shell_channel.send(msg)
    return comm_id, msg["header"]["msg_id"]


def _close(kc: Any, comm_id: str) -> None:
    kc.shell_channel.send(kc.session.msg("comm_close", {"comm_id": comm_id, "data": {}}))


def _first(heard: Heard, comm_id: str, timeout: float = 30) -> dict[str, Any]:
    heard.until(lambda m: m["msg_type"] in ("comm_msg", "comm_close")
                and m["content"]["comm_id"] == comm_id, timeout)
    return heard.said(comm_id)[0]


def _idle(msg_id: str) -> Any:
    return lambda m: (m["msg_type"] == "status" and m["parent_header"].get("msg_id") == msg_id
                      and m["content"]["execution_state"] == "idle")


def _execute(kc: Any, heard: Heard, source: str, timeout: float = 60) -> tuple[float, float]:
    """Run *source* to the kernel's idle, reading IOPub into *heard*; when it started and
    ended (the kernel's clock, as the messages' dates)."""
    msg_id = kc.execute(textwrap.dedent(source), allow_stdin=False, stop_on_error=False)
    heard.until(lambda m: m["msg_type"] == "status" and m["parent_header"].get("msg_id")
                == msg_id and m["content"]["execution_state"] == "busy", timeout)
    began = _sent_at(heard.seen[-1])
    heard.until(_idle(msg_id), timeout)
    return began, _sent_at(heard.seen[-1])


def _status_threads(kc: Any) -> str:
    return run(kc, THREADS).stdout.strip().splitlines()[-1]


def _has_subshells(kc: Any) -> bool:
    msg_id = kc.kernel_info()
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return "kernel subshells" in (reply["content"].get("supported_features") or [])


def test_a_budgeted_cell_is_pushed_live_throttled_then_said_to_end(kernel):  # noqa: F811
    assert _status_threads(kernel) == "[]"  # no front end has opened the comm: no thread
    said = run(kernel, "import ipykernel; print(ipykernel.__version__)").stdout.split()[-1]
    tied = tuple(int(x) for x in said.split(".")[:2]) >= (7, 1)  # comms tied to a request
    heard = Heard(kernel)
    comm_id, open_id = _open(kernel)
    first = _first(heard, comm_id)
    assert {k: v for k, v in first.items() if k != "_at"} == {
        "running": False, "name": None, "time_left_s": None, "axis": None, "fraction": None,
        "label": "", "jobs": 0}
    began, ended = _execute(kernel, heard, STEPPING)
    heard.until(lambda m: m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
                and not m["content"]["data"]["running"] and _sent_at(m) >= ended - 0.05, 10)
    said = heard.said(comm_id)
    live = [s for s in said if s["running"]]
    assert len(live) >= 2, said
    assert all(s["name"].startswith("cell: ") and s["axis"] == "steps" for s in live)
    fractions = [s["fraction"] for s in live]
    assert fractions == sorted(fractions) and fractions[-1] > fractions[0], fractions
    lefts = [s["time_left_s"] for s in live]
    assert lefts == sorted(lefts, reverse=True) and all(0 < x <= 3 for x in lefts), lefts
    assert all(s["label"] == f"{_spoken(s['time_left_s'])} left, steps "
               f"{s['fraction'] * 100:.0f}%" for s in live), [s["label"] for s in live]
    # throttled: never two messages within the interval (the kernel's send times)
    times = [s["_at"] for s in said]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= INTERVAL_S * 0.9, gaps
    seconds = ended - began
    assert len(live) <= seconds / INTERVAL_S + 1, (len(live), seconds)
    print(f"\nstatus comm: {len(live)} messages in a {seconds:.2f} s cell "
          f"({len(live) / seconds:.2f} per second), then {len(said) - len(live) - 1} after it")
    last = said[-1]
    assert (last["running"], last["label"], last["jobs"]) == (False, "", 0)
    if tied:  # the messages belong to the comm's request, not to the cell run meanwhile
        parents = {m["parent_header"].get("msg_id") for m in heard.seen
                   if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id}
        assert parents == {open_id}, parents
    # nothing changes: nothing is sent
    before = len(said)
    heard.quiet_for(2.0)
    assert len(heard.said(comm_id)) == before, heard.said(comm_id)[before:]
    _close(kernel, comm_id)


def _spoken(seconds: float) -> str:
    from nbbudget.core.duration import spoken

    return spoken(seconds * 1000)


def test_the_job_count_follows_a_detached_cell_and_its_end(kernel):  # noqa: F811
    heard = Heard(kernel)
    comm_id, _ = _open(kernel)
    assert _first(heard, comm_id)["jobs"] == 0
    _execute(kernel, heard, """\
        %%budget --detach --budget 500ms --steps 100
        import time
        for i in range(10):
            nb.current().step()
            time.sleep(0.15)
        """)
    counted = lambda n: lambda m: (m["msg_type"] == "comm_msg"  # noqa: E731
                                   and m["content"]["comm_id"] == comm_id
                                   and m["content"]["data"]["jobs"] == n)
    heard.until(counted(1), 10)
    assert not heard.said(comm_id)[-1]["running"]  # the cell is over; its job goes on
    heard.until(counted(0), 20)  # the job ends (about a second later) while the kernel idles
    counts = [s["jobs"] for s in heard.said(comm_id)]
    assert counts[0] == 0 and 1 in counts and counts[-1] == 0, counts
    _close(kernel, comm_id)


def test_a_close_stops_the_messages_at_once_and_ends_the_thread(kernel):  # noqa: F811
    heard = Heard(kernel)
    comm_id, _ = _open(kernel)
    _first(heard, comm_id)
    msg_id = kernel.execute(textwrap.dedent("""\
        %%budget --time 30s --steps 1000
        import time
        for i in range(40):
            nb.current().step()
            time.sleep(0.1)
        """), allow_stdin=False, stop_on_error=False)
    heard.until(lambda m: len([s for s in heard.said(comm_id) if s["running"]]) >= 2, 30)
    _close(kernel, comm_id)
    closed = time.time()
    heard.until(_idle(msg_id), 60)
    # with subshells the close is handled while the cell runs; without, once it has ended
    after = [s for s in heard.said(comm_id) if s["_at"] > closed + 1.0]
    if _has_subshells(kernel):
        assert after == [], after
    heard.quiet_for(1.0)
    assert [s for s in heard.said(comm_id) if s["_at"] > time.time() - 0.9] == []
    assert _status_threads(kernel) == "[]"


def test_an_interval_is_asked_at_open_and_a_bad_one_is_refused(kernel):  # noqa: F811
    heard = Heard(kernel)
    comm_id, _ = _open(kernel, {"interval_ms": 50})
    heard.until(lambda m: heard.closes(comm_id) != [], 30)
    error = heard.closes(comm_id)[0]["content"]["data"]["error"]
    assert "interval_ms 50 is not a number of ms from 100 to 60000" in error
    assert heard.said(comm_id) == []
    comm_id, _ = _open(kernel, {"interval_ms": 1000})
    _first(heard, comm_id)
    _execute(kernel, heard, STEPPING)
    heard.quiet_for(1.5)
    times = [s["_at"] for s in heard.said(comm_id)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= 3 and min(gaps) >= 0.9, gaps
    _close(kernel, comm_id)


@pytest.fixture
def plain_kernel(tmp_path):
    """A kernel of this Python in which nbbudget was never loaded."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = tmp_path / "kernels" / "plain"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [os.environ.get("NBBUDGET_KERNEL_PYTHON", sys.executable), "-m",
                 "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain kernel", "language": "python"}))
    km = KernelManager(kernel_name="plain", kernel_spec_manager=KernelSpecManager(
        kernel_dirs=[str(tmp_path / "kernels")]))
    km.start_kernel(env={**os.environ, "NBBUDGET_HOME": str(tmp_path / "store")})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_kernel_that_never_loaded_nbbudget_closes_the_comm_unanswered(plain_kernel):
    heard = Heard(plain_kernel)
    comm_id, _ = _open(plain_kernel)
    heard.until(lambda m: heard.closes(comm_id) != [], 30)  # the front end shows nothing
    heard.quiet_for(1.0)
    assert heard.said(comm_id) == []


def test_a_kernel_that_unloads_nbbudget_closes_and_refuses_the_comm(kernel):  # noqa: F811
    heard = Heard(kernel)
    open_before, _ = _open(kernel)
    _first(heard, open_before)
    _execute(kernel, heard, "%unload_ext nbbudget")
    try:
        assert heard.closes(open_before) != []  # unloading closed it, within its cell
        comm_id, _ = _open(kernel)
        heard.until(lambda m: heard.closes(comm_id) != [], 30)  # the front end shows nothing
        assert heard.said(comm_id) == []
        assert _status_threads(kernel) == "[]"
    finally:
        run(kernel, "%load_ext nbbudget")
    comm_id, _ = _open(kernel)  # loaded again: answered again
    assert _first(heard, comm_id)["running"] is False
    _close(kernel, comm_id)


# -- what a message says, on a fake clock ----------------------------------------------------------
def test_a_message_says_the_time_left_and_the_most_used_other_axis():
    import nbbudget as nb
    from nbbudget.jupyter.status import message
    from nbbudget.testing import FakeClock

    assert message(None, 2) == {"running": False, "name": None, "time_left_s": None,
                                "axis": None, "fraction": None, "label": "", "jobs": 2}
    clock = FakeClock()
    with nb.budget(time="20s", steps=100, tool_calls=10, clock=clock, name="cell: etl") as run:
        for _ in range(64):
            run.step()
        clock.advance("8s")
        said = message(run.snapshot(), 0)
        assert said == {"running": True, "name": "cell: etl", "time_left_s": 12.0,
                        "axis": "steps", "fraction": 0.64, "label": "12 s left, steps 64%",
                        "jobs": 0}
    assert message(run.snapshot(), 0)["running"] is False  # its run has ended
    with nb.budget(time="10s", clock=clock, name="cell: wait") as run:
        clock.advance(2500)
        said = message(run.snapshot(), 1)  # the time grant alone: it is the axis too
        assert (said["time_left_s"], said["axis"], said["fraction"], said["label"]) == (
            7.5, "time", 0.25, "7.5 s left, time 25%")
    with nb.budget(clock=clock, name="cell: free") as run:
        assert message(run.snapshot(), 0)["label"] == "running"  # no limits: nothing to count
