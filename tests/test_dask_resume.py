"""``nb.call(fn, ..., resume=True, cluster=...)``: the work runs as a task on the cluster; each
``nb.checkpoint(state)`` there goes to the kernel, which signs and saves it in its store as a
checkpoint made on its own threads is; once the caller's budget has run out, the task pauses at
its next checkpoint and the call answers INCOMPLETE (``paused``, S0-1, S0-2); the identical call
continues from it, on the cluster, with the run's counters and limits as saved (S4-4), and a
checkpoint that fails its signature is refused unchanged (S4-5)."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("distributed")

import cloudpickle
from stores import SQLiteHeld, execute, rows

import nbbudget as nb

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker processes import no tests


def counts(n: int) -> int:
    """Steps to *n*, a checkpoint after each step, from where the last checkpoint left off."""
    i = nb.resume_state({"i": 0})["i"]
    print(f"from {i}")
    run = nb.current()
    assert run is not None
    while i < n:
        run.step()
        time.sleep(0.02)
        i += 1
        nb.checkpoint({"i": i})
    return i


def test_a_resumable_call_on_a_cluster_pauses_then_continues_from_its_checkpoint(
        dask_client: Any, home: Any) -> None:
    first = nb.call(counts, 60, resume=True, budget="300ms", limits=nb.Limits(steps=1_000),
                    cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    assert first.job is not None
    identity = first.job.identity
    saved = nb.store().load_checkpoint(identity)  # signed and kept in the kernel's store
    assert saved is not None and saved.id == first.data["checkpoint"]
    done_before = saved.state["i"]
    assert 0 < done_before < 60
    # the steps the task took, not the unused rest of its lease
    assert saved.ledger["counts"]["steps"] == done_before
    assert first.job.output_text == "from 0\n"

    second = nb.call(counts, 60, resume=True, budget="30s", limits=nb.Limits(steps=1_000),
                     cluster=dask_client)
    assert second.ok and second.data == 60
    assert second.job is not None and second.job.output_text == f"from {done_before}\n"
    assert nb.store().load_checkpoint(identity) is None  # delivered: the next call starts anew


def test_each_checkpoint_is_saved_while_the_task_runs_with_the_steps_taken_by_then(
        dask_client: Any, home: Any) -> None:
    """A checkpoint counts the steps the task took, not the permits its lease still held."""
    seen: list[tuple[int, float]] = []
    ended = threading.Event()

    def watch() -> None:
        db = nb.store()
        while not ended.wait(0.01):
            for row in rows(db.path):
                saved = db.load_checkpoint(row[0])
                if saved is not None:
                    seen.append((saved.state["i"], saved.ledger["counts"].get("steps", 0)))
        db.close()  # this thread's connection

    watcher = threading.Thread(target=watch, name="test-checkpoint-watcher")
    watcher.start()
    try:
        done = nb.call(counts, 60, resume=True, budget="30s", limits=nb.Limits(steps=1_000),
                       cluster=dask_client)
    finally:
        ended.set()
        watcher.join()
    assert done.ok and done.data == 60
    assert len({i for i, _ in seen}) > 3  # saved one by one while the task ran
    assert all(steps == i for i, steps in seen), seen


def test_a_continuation_on_a_cluster_keeps_the_saved_counters_and_limits(
        dask_client: Any, home: Any) -> None:
    """S4-4: the run's 40 steps are spent across continuations; raising the limit at the
    continuation gives none back."""
    first = nb.call(counts, 60, resume=True, budget="300ms", limits=nb.Limits(steps=40),
                    cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    second = nb.call(counts, 60, resume=True, budget="30s", limits=nb.Limits(steps=1_000),
                     cluster=dask_client)
    assert not second.ok and second.error["code"] == "StepBudgetExceeded"
    assert "limit of 40" in second.error["message"]


def test_work_that_says_it_cannot_finish_in_time_pauses_at_its_first_checkpoint(
        dask_client: Any, home: Any) -> None:
    first = nb.call(counts, 60, resume=True, budget="20s", estimate_ms="1h",
                    cluster=dask_client)  # S0-7
    assert first.exit_code == 14 and first.data["state"] == "paused"
    assert first.job is not None
    saved = nb.store().load_checkpoint(first.job.identity)
    assert saved is not None and saved.state == {"i": 1}


def test_a_checkpoint_that_fails_its_signature_is_refused_unchanged_on_a_cluster(
        dask_client: Any, home: Any) -> None:
    first = nb.call(counts, 60, resume=True, budget="300ms", cluster=dask_client)
    assert first.exit_code == 14 and first.job is not None
    held = SQLiteHeld(nb.store())
    execute(held.store.path, "UPDATE checkpoints SET tag = ? WHERE identity = ?",
            b"\0" * 32, first.job.identity)
    before = held.row(first.job.identity)
    second = nb.call(counts, 60, resume=True, budget="30s", cluster=dask_client)
    assert not second.ok and second.error["code"] == "checkpoint_refused"
    assert held.row(first.job.identity) == before  # never migrated, reset or rewritten


def test_resume_state_and_checkpoint_in_a_detached_task_start_fresh_and_save_nothing(
        dask_client: Any, home: Any) -> None:
    def work() -> str:
        nb.checkpoint({"kept": False})  # declared only detach: it does nothing
        return str(nb.resume_state("fresh"))

    response = nb.call(work, detach=True, budget="10s", cluster=dask_client)
    assert response.ok and response.data == "fresh"
    assert nb.store().jobs() == [] and response.job is not None
    assert nb.store().load_checkpoint(response.job.identity) is None


@dataclass
class Progress:
    """A state of a class of the caller's own (a notebook's), shipped by value."""

    i: int


def counts_progress(n: int) -> int:
    done = nb.resume_state(Progress(0))
    run = nb.current()
    assert run is not None
    while done.i < n:
        run.step()
        time.sleep(0.02)
        done = Progress(done.i + 1)
        nb.checkpoint(done)
    return done.i


def test_a_resumable_call_pauses_and_continues_across_worker_processes(
        dask_process_client: Any, home: Any) -> None:
    first = nb.call(counts_progress, 40, resume=True, budget="500ms",
                    cluster=dask_process_client)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    assert first.job is not None
    saved = nb.store().load_checkpoint(first.job.identity)
    assert saved is not None and 0 < saved.state.i < 40
    second = nb.call(counts_progress, 40, resume=True, budget="60s",
                     cluster=dask_process_client)
    assert second.ok and second.data == 40


def timed_out(ms: int) -> str:
    return (f"counts was cancelled: its wall-clock limit of {ms} ms, counted from its first "
            f"start across every continuation, ran out")


def test_a_continuation_on_a_cluster_has_only_what_is_left_of_its_timeout(
        dask_client: Any, home: Any) -> None:
    """S0-6: the timeout counts from the work's first start (kept in its checkpoint), so a
    continuation gets what is left of it, never a fresh one; once nothing is left, the
    identical call answers cancelled at once and starts nothing."""
    limits = nb.Limits(steps=1_000)
    started = time.monotonic()
    first = nb.call(counts, 200, resume=True, budget="200ms", timeout="1500ms", limits=limits,
                    cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    time.sleep(max(0.0, 1.2 - (time.monotonic() - started)))  # about 0.3 s of it left
    resumed = time.monotonic()
    second = nb.call(counts, 200, resume=True, budget="30s", timeout="1500ms", limits=limits,
                     cluster=dask_client)
    assert second.exit_code == 124 and second.error == {"code": "cancelled",
                                                        "message": timed_out(1500)}
    assert time.monotonic() - resumed < 1.2  # not a fresh 1500 ms
    assert second.job is not None and second.job.wait_done(10)
    assert second.job.state is nb.JobState.CANCELLED
    saved = nb.store().load_checkpoint(second.job.identity)
    assert saved is None  # the work is over: the next identical call starts anew


def test_a_continuation_whose_timeout_ran_out_while_paused_is_cancelled_at_once(
        dask_client: Any, home: Any) -> None:
    limits = nb.Limits(steps=1_000)
    started = time.monotonic()
    first = nb.call(counts, 60, resume=True, budget="200ms", timeout="1s", limits=limits,
                    cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "paused"
    assert first.job is not None
    identity = first.job.identity
    time.sleep(max(0.0, 1.1 - (time.monotonic() - started)))  # its timeout ran out meanwhile
    second = nb.call(counts, 60, resume=True, budget="30s", timeout="1s", limits=limits,
                     cluster=dask_client)
    assert second.exit_code == 124 and second.data == {"state": "cancelled"}
    assert second.error == {"code": "cancelled", "message": timed_out(1000)}
    assert second.job is None  # nothing was started on the cluster
    assert nb.store().load_checkpoint(identity) is None  # the work is over
    third = nb.call(counts, 60, resume=True, budget="30s", timeout="10s", limits=limits,
                    cluster=dask_client)
    assert third.ok and third.data == 60
    assert third.job is not None and third.job.output_text == "from 0\n"  # started anew
