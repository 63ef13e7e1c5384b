"""S4-12: a quota of starts per calendar day (UTC), by work, kept in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import nbbudget as nb
from nbbudget.calls import call as _call
from nbbudget.testing import FakeClock

pytestmark = pytest.mark.usefixtures("quick_idle_workers", "home")

NOON = time.mktime((2026, 11, 30, 12, 0, 0, 0, 0, 0)) - time.timezone  # 12:00 UTC


@pytest.fixture
def day(monkeypatch):
    """The wall clock the quota dates starts by; ``day[0]`` is the time now."""
    now = [NOON]
    monkeypatch.setattr(_call, "_wall", lambda: now[0])
    return now


def test_S4_12_starts_past_the_quota_are_refused_and_run_nothing(any_store, day):
    ran: list[int] = []

    def job(n: int) -> int:
        ran.append(n)
        return n

    first = nb.call(job, 1, runs_per_day=2)
    second = nb.call(job, 1, runs_per_day=2)
    third = nb.call(job, 1, runs_per_day=2)
    assert (first.ok, second.ok) == (True, True)
    assert ran == [1, 1]  # the third start ran nothing
    assert third.ok is False and third.exit_code == 1
    assert third.error["code"] == "RunsPerDayExceeded"
    assert "already started 2 times on 2026-11-30 (UTC)" in third.error["message"]
    assert "raise runs_per_day" in third.error["message"]
    assert any_store.store.runs_on(_call._identity(job, (1,), {}, None), "2026-11-30") == 2


def test_S4_12_the_quota_is_per_work_and_per_utc_day(any_store, day):
    def job(n: int) -> int:
        return n

    assert nb.call(job, 1, runs_per_day=1).ok
    assert nb.call(job, 2, runs_per_day=1).ok  # other arguments: other work
    assert nb.call(job, 3, key="nightly", runs_per_day=1).ok
    assert not nb.call(job, 4, key="nightly", runs_per_day=1).ok  # the same key: the same work
    assert not nb.call(job, 1, runs_per_day=1).ok
    day[0] = NOON + 11.5 * 3600  # 23:30 UTC: still the same day
    assert not nb.call(job, 1, runs_per_day=1).ok
    day[0] = NOON + 12 * 3600  # 00:00 UTC: a new day
    assert nb.call(job, 1, runs_per_day=1).ok


def test_S4_12_a_continuation_is_not_a_new_start(any_store, day):
    """A paused call continued by the identical call, and a reattach, count once."""
    clock = FakeClock()

    def crunch() -> list[int]:
        done = nb.resume_state([])
        assert clock.waiting.wait(5)
        for item in range(len(done), 4):
            done = [*done, item]
            clock.advance("600ms")
            nb.checkpoint(done)
        return done

    first = nb.call(crunch, resume=True, budget="1s", clock=clock, runs_per_day=1)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    clock.waiting.clear()
    second = nb.call(crunch, resume=True, budget="5s", clock=clock, runs_per_day=1)
    assert (second.ok, second.data) == (True, [0, 1, 2, 3])
    again = nb.call(crunch, resume=True, budget=0, clock=clock, runs_per_day=1)
    assert again.error["code"] == "RunsPerDayExceeded"  # delivered: a new start today is not


def test_S4_12_concurrent_starts_never_pass_the_quota(any_store, day):
    """16 threads (each with its own connection, on SQLite) start the same work against a
    quota of 5."""
    db = any_store.store
    barrier = threading.Barrier(16)
    granted: list[int | None] = []
    lock = threading.Lock()

    def start() -> None:
        barrier.wait()
        got = db.take_run("fn:same", "2026-11-30", 5)
        with lock:
            granted.append(got)
        any_store.close_thread()

    threads = [threading.Thread(target=start, name=f"quota-{i}") for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(g for g in granted if g is not None) == [1, 2, 3, 4, 5]
    assert granted.count(None) == 11
    assert db.runs_on("fn:same", "2026-11-30") == 5


def test_S4_12_the_quota_survives_a_restart(home):
    """Two processes in turn (two kernels, or one restarted) share the day's count."""
    code = ("import nbbudget as nb\n"
            "r = nb.call(print, 'hello', key='report', runs_per_day=1)\n"
            "print(r.error['code'] if r.error else 'ran')\n")
    env = {**os.environ, "NBBUDGET_HOME": str(home), "NBBUDGET_INTERACTIVE": "0"}
    outs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=60, check=True).stdout for _ in range(2)]
    assert outs == ["hello\nran\n", "RunsPerDayExceeded\n"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", 2_000_000])
def test_S4_12_a_bad_quota_is_a_config_error_naming_it(bad):
    with pytest.raises(nb.ConfigError, match=r"runs_per_day="):
        nb.call(print, runs_per_day=bad)
