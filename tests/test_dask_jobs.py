"""Calls on a cluster: ``nb.call(fn, ..., detach=True, cluster=...)`` runs the work as a task on
a Dask cluster. When the call's budget runs out, the task's future is published under the
work's identity before the call answers INCOMPLETE (S0-1, S0-2); the identical call, from this
kernel or from a new process after the first one died, reattaches and delivers the result
exactly once, and the next identical call starts anew (S0-11). An error in the work is a
failure with its code and message, never a silent success.

In-process cluster for most; an external scheduler (worker processes) that outlives two real
"kernel" processes for the acceptance test.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

import cloudpickle
import pandas as pd
from conftest import wait_for

import nbbudget as nb
from nbbudget.backends.dask.runner import PREFIX, DaskRunner
from nbbudget.calls.jobs import Jobs
from nbbudget.calls.runner import Backend, use_backend

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker processes import no tests


def slow(seconds: float, tag: str) -> str:
    run = nb.current()
    assert run is not None  # the work runs inside its own run on the worker
    time.sleep(seconds)
    return f"done {tag}"


def steps(n: int) -> int:
    run = nb.current()
    assert run is not None
    for _ in range(n):
        run.step()
    return n


def fails(seconds: float) -> None:
    time.sleep(seconds)
    raise ValueError("the work broke on the worker")


def published(client: Any) -> list[str]:
    return [name for name in client.list_datasets() if str(name).startswith(PREFIX)]


def test_a_call_within_its_budget_runs_on_the_cluster_and_answers_its_result(
        dask_client: Any, home: Any) -> None:
    response = nb.call(steps, 50, detach=True, budget="10s", limits=nb.Limits(steps=100),
                       cluster=dask_client)
    assert response.ok and response.data == 50 and response.exit_code == 0
    assert published(dask_client) == []


def test_the_work_is_bounded_by_its_limits_on_the_worker(dask_client: Any, home: Any) -> None:
    response = nb.call(steps, 50, detach=True, budget="10s", limits=nb.Limits(steps=10),
                       cluster=dask_client)
    assert not response.ok and response.exit_code == 1
    assert response.error["code"] == "StepBudgetExceeded"
    assert "limit of 10" in response.error["message"]


def test_detach_then_reattach_delivers_once_and_the_next_call_starts_anew(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 0.6, "a", detach=True, budget="100ms", cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "running"
    job_id = first.data["job"]
    assert nb.jobs[job_id].state is nb.JobState.RUNNING
    assert len(published(dask_client)) == 1  # published before the call answered

    second = nb.call(slow, 0.6, "a", detach=True, budget="10s", cluster=dask_client)
    assert second.ok and second.exit_code == 0 and second.data == "done a"
    assert second.job is not None and second.job.id == job_id  # the same job, reattached
    assert published(dask_client) == []  # unpublished at delivery

    started = time.monotonic()
    third = nb.call(slow, 0.6, "a", detach=True, budget="100ms", cluster=dask_client)
    assert third.exit_code == 14 and third.data["job"] != job_id  # started anew
    assert time.monotonic() - started < 0.5
    assert nb.call(slow, 0.6, "a", detach=True, budget="10s", cluster=dask_client).ok


def test_a_result_taken_through_nb_jobs_is_unpublished_and_the_next_call_starts_anew(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    """S0-11 on a cluster: once a job's result went out through ``nb.jobs[id].result()``, no
    kernel finds it on the scheduler again; the identical call, the job forgotten here too,
    starts the work anew."""
    first = nb.call(slow, 0.3, "r", detach=True, budget="50ms", cluster=dask_client)
    assert first.exit_code == 14 and len(published(dask_client)) == 1
    job_id = first.data["job"]
    assert nb.jobs[job_id].result(timeout=10) == "done r"
    assert published(dask_client) == []
    del first  # nothing holds the job any more: the identical call does not reattach
    gc.collect()
    again = nb.call(slow, 0.3, "r", detach=True, budget="50ms", cluster=dask_client)
    assert again.exit_code == 14 and again.data["job"] != job_id  # started anew
    assert nb.call(slow, 0.3, "r", detach=True, budget="10s", cluster=dask_client).ok


def test_a_job_that_ended_goes_to_one_identical_call(dask_client: Any, home: Any,
                                                      in_kernel: Any) -> None:
    first = nb.call(slow, 0.3, "b", detach=True, budget="50ms", cluster=dask_client)
    assert first.exit_code == 14
    assert nb.jobs[first.data["job"]].wait_done(5)
    second = nb.call(slow, 0.3, "b", detach=True, budget="10s", cluster=dask_client)
    assert second.ok and second.job.id == first.data["job"]
    third = nb.call(slow, 0.3, "b", detach=True, budget="50ms", cluster=dask_client)
    assert third.exit_code == 14 and third.data["job"] != first.data["job"]
    assert nb.jobs[third.data["job"]].wait_done(5)
    assert nb.call(slow, 0.3, "b", detach=True, budget="10s", cluster=dask_client).ok


def test_a_published_job_is_found_on_the_scheduler_by_a_runner_that_never_saw_it(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 0.4, "c", detach=True, budget="50ms", key="job-c",
                    cluster=dask_client)
    assert first.exit_code == 14
    # a runner of its own, as a restarted kernel has: nothing of the first job in its memory
    fresh = DaskRunner(dask_client, Jobs(list))
    with use_backend(Backend(fresh, nb.store)):
        found = nb.call(slow, 0.4, "c", detach=True, budget="10s", key="job-c")
        assert found.ok and found.data == "done c"
        assert found.job is not nb.jobs[first.data["job"]]
        assert published(dask_client) == []
        again = nb.call(slow, 0.4, "c", detach=True, budget="50ms", key="job-c")
        assert again.exit_code == 14  # delivered once: the next identical call starts anew
        assert nb.call(slow, 0.4, "c", detach=True, budget="10s", key="job-c").ok
    assert nb.jobs[first.data["job"]].wait_done(5)


def test_a_job_reattached_from_the_scheduler_may_run_out_of_budget_again(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 0.8, "e", detach=True, budget="20ms", key="job-e",
                    cluster=dask_client)
    assert first.exit_code == 14
    with use_backend(Backend(DaskRunner(dask_client, Jobs(list)), nb.store)):
        second = nb.call(slow, 0.8, "e", detach=True, budget="50ms", key="job-e")
        assert second.exit_code == 14 and second.data["state"] == "running"
        assert len(published(dask_client)) == 1  # still published, for the next call
        third = nb.call(slow, 0.8, "e", detach=True, budget="10s", key="job-e")
        assert third.ok and third.data == "done e" and third.job is second.job
    assert published(dask_client) == []
    assert nb.jobs[first.data["job"]].wait_done(5)


@dataclass
class SameWork:
    """The work of a detached job as a runner sees it (what a restarted kernel's call has)."""

    identity: str
    label: str = "same"
    limits: nb.Limits = field(default_factory=nb.Limits)
    notices: tuple[float, float] | None = (0.8, 0.95)
    timeout_ms: int | None = None
    detach: bool = True
    resume: bool = False
    budget_ms: int | None = 1_000
    estimate_ms: int | None = None


def test_an_ended_published_job_goes_to_exactly_one_of_two_kernels(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 0.2, "d", detach=True, budget="20ms", key="job-d",
                    cluster=dask_client)
    job = nb.jobs[first.data["job"]]
    assert job.wait_done(5)
    time.sleep(0.1)  # the scheduler has the task in memory
    work = SameWork(job.identity)
    kernels = [DaskRunner(dask_client, Jobs(list)) for _ in range(2)]
    barrier, found = threading.Barrier(2), [None, None]

    def reattach(i: int) -> None:
        barrier.wait()
        found[i] = kernels[i].reattach(work)

    threads = [threading.Thread(target=reattach, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [(k, j) for k, j in zip(kernels, found, strict=True) if j is not None]
    assert len(winners) == 1
    runner, won = winners[0]
    assert won.wait_done(5) and won.result() == "done d"
    runner.deliver(work, won)
    assert published(dask_client) == []


def test_an_error_in_the_job_is_reported_as_a_failure_with_its_message(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(fails, 0.3, detach=True, budget="50ms", cluster=dask_client)
    assert first.exit_code == 14
    second = nb.call(fails, 0.3, detach=True, budget="10s", cluster=dask_client)
    assert not second.ok and second.exit_code == 1
    assert second.error == {"code": "ValueError", "message": "the work broke on the worker"}
    assert nb.jobs[first.data["job"]].state is nb.JobState.FAILED
    assert published(dask_client) == []


def test_a_cancelled_job_whose_task_never_checks_runs_to_its_end_and_says_so(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 0.3, "x", detach=True, budget="20ms", cluster=dask_client)
    job = nb.jobs[first.data["job"]]
    assert job.cancel() == "requested"
    again = nb.call(slow, 0.3, "x", detach=True, budget="10s", cluster=dask_client)
    assert again.ok and again.data == "done x"  # the task ran to its end
    assert job.cancel_status == "not honoured"


def steps_slowly(n: int) -> int:
    run = nb.current()
    assert run is not None
    for _ in range(n):
        run.step()
        time.sleep(0.01)
    return n


def cancel_reaches_the_task(client: Any) -> None:
    first = nb.call(steps_slowly, 500, detach=True, budget="100ms", cluster=client,
                    limits=nb.Limits(steps=1_000))
    assert first.exit_code == 14
    job = nb.jobs[first.data["job"]]
    deadline, taken = time.monotonic() + 20, 0.0
    while not taken and time.monotonic() < deadline:  # until the task has started stepping
        time.sleep(0.05)
        taken = job.run.snapshot().consumed.get("steps", 0)
    assert taken > 0  # the task's steps (and its lease) show here, read from the scheduler
    assert job.cancel("enough", wait=10) == "stopped"
    assert job.state is nb.JobState.CANCELLED and job.cancel_honoured is True
    assert job.run.outcome is not None and job.run.outcome.status == "stopped"
    # it stopped at a step long before its end (while it ran, the figure counted its lease)
    assert 0 < job.run.snapshot().consumed["steps"] < 500
    again = nb.call(steps_slowly, 500, detach=True, budget="10s", cluster=client,
                    limits=nb.Limits(steps=1_000))
    assert not again.ok and again.exit_code == 130 and again.error["code"] == "stopped"


def test_a_cancel_of_a_job_on_a_cluster_stops_its_task_at_its_next_step(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    cancel_reaches_the_task(dask_client)


def test_a_cancel_of_a_job_on_worker_processes_stops_its_task_at_its_next_step(
        dask_process_client: Any, home: Any, in_kernel: Any) -> None:
    cancel_reaches_the_task(dask_process_client)


def test_a_cancel_from_a_kernel_that_found_the_job_on_the_scheduler_reaches_its_task(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    limits = nb.Limits(steps=1_000)
    first = nb.call(steps_slowly, 500, detach=True, budget="100ms", key="job-k", limits=limits,
                    cluster=dask_client)
    assert first.exit_code == 14
    job = nb.jobs[first.data["job"]]
    # a runner of its own, as a restarted kernel has: it finds the job on the scheduler
    with use_backend(Backend(DaskRunner(dask_client, Jobs(list)), nb.store)):
        second = nb.call(steps_slowly, 500, detach=True, budget="50ms", key="job-k",
                         limits=limits)
        assert second.exit_code == 14 and second.job is not None and second.job is not job
        found = second.job
        deadline, taken = time.monotonic() + 20, 0.0
        while not taken and time.monotonic() < deadline:  # the task's counters show here
            time.sleep(0.05)
            taken = found.run.snapshot().consumed.get("steps", 0)
        assert taken > 0
        assert found.cancel("from the new kernel", wait=10) == "stopped"
        assert found.state is nb.JobState.CANCELLED and found.cancel_honoured is True
        assert 0 < found.run.snapshot().consumed["steps"] < 500
    assert job.wait_done(10) and job.state is nb.JobState.CANCELLED  # the same task stopped


def test_a_kernel_connected_to_the_cluster_lists_the_jobs_published_there(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    first = nb.call(slow, 1.5, "l", detach=True, budget="20ms", key="job-l", cluster=dask_client)
    job_id = first.data["job"]
    # a restarted kernel's nb.jobs and runner: no job in this process, no record in its store
    elsewhere = Jobs(list)
    runner = DaskRunner(dask_client, elsewhere)
    frame = elsewhere.to_frame()
    assert job_id in frame.index and len(frame) == len(published(dask_client))  # (and others')
    assert frame.loc[job_id, "label"] == "job-l" and frame.loc[job_id, "state"] == "running"
    assert frame.loc[job_id, "pid"] == os.getpid()  # the kernel that started it
    # when its task last said it is alive: once the task has begun on a worker (on a busy
    # machine that can come after the call's 20 ms)
    assert wait_for(lambda: not pd.isna(elsewhere.to_frame().loc[job_id, "heartbeat"]))
    heard = elsewhere.to_frame().loc[job_id, "heartbeat"]
    assert abs(heard.timestamp() - time.time()) < 20
    with use_backend(Backend(runner, nb.store)):
        assert nb.call(slow, 1.5, "l", detach=True, budget="10s", key="job-l").ok
    assert job_id not in elsewhere.to_frame().index  # delivered: no longer published
    assert nb.jobs[job_id].wait_done(5)


def test_detaching_to_a_cluster_inside_the_kernel_warns_that_the_job_dies_with_it(
        dask_client: Any, home: Any) -> None:
    with pytest.warns(RuntimeWarning, match="dies with the kernel.*external scheduler"):
        first = nb.call(slow, 0.3, "w", detach=True, budget="50ms", cluster=dask_client)
    assert first.exit_code == 14
    assert nb.call(slow, 0.3, "w", detach=True, budget="10s", cluster=dask_client).ok


def test_a_call_that_declares_no_interruption_runs_on_the_cluster_until_it_ends(
        dask_client: Any, home: Any) -> None:
    response = nb.call(slow, 0.1, "sync", cluster=dask_client)
    assert response.ok and response.data == "done sync"


def test_an_interactive_detached_call_without_a_budget_runs_on_the_cluster(
        dask_client: Any, home: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "1")
    response = nb.call(steps, 5, detach=True, cluster=dask_client)
    assert response.ok and response.data == 5


# -- the whole work's timeout= on the scheduler's clock (S0-6, S4-7) ---------------------------
def counted(path: str, n: int) -> int:
    """Steps to *n*, slowly, writing how many it took to *path* after each one."""
    run = nb.current()
    assert run is not None
    for i in range(n):
        run.step()
        Path(path).write_text(str(i + 1))
        time.sleep(0.01)
    return n


def timed_out(label: str, ms: int) -> str:
    return (f"{label} was cancelled: its wall-clock limit of {ms} ms, counted from its first "
            f"start across every continuation, ran out")


def stopped_counting(path: Path) -> int:
    """How many steps the work at *path* took, once it no longer takes any."""
    deadline, last = time.monotonic() + 20, -1
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else "0"
        if not text:  # read as it was being written
            continue
        now = int(text)
        if now == last:
            return now
        last = now
        time.sleep(0.3)  # 30 steps' time: a task still stepping is seen to
    raise AssertionError("the work never stopped")


def test_a_timeout_on_a_cluster_cancels_the_task_and_answers_as_a_local_call(
        dask_client: Any, home: Any, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    started = time.monotonic()
    response = nb.call(counted, str(counter), 2_000, detach=True, budget="30s", timeout="600ms",
                       limits=nb.Limits(steps=10_000), cluster=dask_client)
    took = time.monotonic() - started
    assert response.exit_code == 124 and not response.ok
    assert response.error == {"code": "cancelled", "message": timed_out("counted", 600)}
    assert response.data["state"] == "cancelled"
    assert 0.55 < took < 10  # at its timeout, long before its budget or its end
    job = response.job
    assert job is not None and job.wait_done(10) and job.state is nb.JobState.CANCELLED
    assert job.run.outcome is not None and job.run.outcome.status == "cancelled"
    assert job.run.outcome.by == "wall-clock"
    assert 0 < stopped_counting(counter) < 2_000  # the task stopped at a step


def test_a_call_that_declares_no_interruption_keeps_its_timeout_on_a_cluster(
        dask_client: Any, home: Any, tmp_path: Path) -> None:
    """S0-10: with no budget, the timeout is what frees the caller."""
    counter = tmp_path / "count"
    response = nb.call(counted, str(counter), 2_000, timeout="500ms",
                       limits=nb.Limits(steps=10_000), cluster=dask_client)
    assert response.exit_code == 124 and response.error == {
        "code": "cancelled", "message": timed_out("counted", 500)}
    assert 0 < stopped_counting(counter) < 2_000


def test_a_detached_job_on_a_cluster_is_cancelled_at_its_timeout(
        dask_client: Any, home: Any, in_kernel: Any, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    started = time.monotonic()
    first = nb.call(counted, str(counter), 2_000, detach=True, budget="100ms", timeout="800ms",
                    limits=nb.Limits(steps=10_000), cluster=dask_client)
    assert first.exit_code == 14 and first.data["state"] == "running"
    job = nb.jobs[first.data["job"]]
    assert job.wait_done(20)
    assert time.monotonic() - started > 0.75  # not before its timeout
    assert job.state is nb.JobState.CANCELLED and str(job.exception()) == timed_out(
        "counted", 800)
    assert job.run.outcome is not None and job.run.outcome.status == "cancelled"
    assert 0 < stopped_counting(counter) < 2_000
    deadline = time.monotonic() + 10  # its record says so (written off the caller's path)
    while nb.jobs.to_frame().loc[job.id, "state"] != "cancelled":
        assert time.monotonic() < deadline, nb.jobs.to_frame().loc[job.id].to_dict()
        time.sleep(0.05)
    again = nb.call(counted, str(counter), 2_000, detach=True, budget="10s", timeout="800ms",
                    limits=nb.Limits(steps=10_000), cluster=dask_client)
    assert again.exit_code == 124 and again.error == {"code": "cancelled",
                                                      "message": timed_out("counted", 800)}
    assert PREFIX + job.identity not in published(dask_client)  # delivered: unpublished


def test_cluster_none_is_the_local_backend(home: Any) -> None:
    response = nb.call(lambda: os.getpid(), detach=True, budget="5s", cluster=None)
    assert response.ok and response.data == os.getpid()


def test_cluster_takes_a_client_or_an_address(home: Any) -> None:
    with pytest.raises(nb.ConfigError, match="cluster= takes"):
        nb.call(slow, 0.1, "x", detach=True, budget="1s", cluster=42)


# -- an external scheduler that outlives the kernel ---------------------------------------------
WORK = '''
import os, time

def work(marker, seconds):
    with open(marker, "a") as out:
        out.write(f"started in {os.getpid()}\\n")
    print("begun on the worker", flush=True)
    time.sleep(seconds)
    print("ending on the worker")
    return "finished"
'''

KERNEL = '''
import json, os, sys, time
import nbbudget as nb
import jobwork

address, marker, budget = sys.argv[1:4]
while True:  # a first connection that outlasts the budget answers starting (S0-1)
    started = time.monotonic()
    response = nb.call(jobwork.work, marker, 2.0, detach=True, budget=budget, cluster=address)
    if not isinstance(response.data, dict) or response.data.get("state") != "starting":
        break
job = response.job
print(json.dumps({"exit_code": response.exit_code, "data": response.data,
                  "error": response.error, "pid": os.getpid(),
                  "output": job.output_text if job is not None else None,
                  "heartbeat": job.last_heartbeat if job is not None else None,
                  "ms": (time.monotonic() - started) * 1000}), flush=True)
os._exit(0)  # the kernel dies: no client closed, nothing cleaned up
'''


def kernel(tmp_path: Path, address: str, marker: Path, budget: str) -> dict[str, Any]:
    import json

    env = {**os.environ, "NBBUDGET_HOME": str(tmp_path / "home"), "NBBUDGET_INTERACTIVE": "0",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(nb.__file__).parents[1])])}
    env.pop("AGENT_CALL_BUDGET_MS", None)
    done = subprocess.run([sys.executable, "-c", KERNEL, address, str(marker), budget],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "dies with the kernel" not in done.stderr  # an external scheduler: no warning
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_reattach_after_the_first_kernel_exited_delivers_the_result_and_the_work_ran_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import dask_cluster

    (tmp_path / "jobwork.py").write_text(WORK)
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker processes import the work too
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    marker = tmp_path / "started.txt"
    with dask_cluster(processes=True, n_workers=1, threads_per_worker=1) as client:
        address = client.scheduler.address
        first = kernel(tmp_path, address, marker, "200ms")
        assert first["exit_code"] == 14 and first["data"]["state"] == "running"
        assert published(client) != []  # the job outlived its kernel, published
        second = kernel(tmp_path, address, marker, "30s")
        assert second["pid"] != first["pid"]
        assert second["exit_code"] == 0 and second["data"] == "finished", second
        assert marker.read_text().count("started") == 1  # the work ran once
        # what the worker process printed before this kernel began, then what came later
        assert second["output"] == "begun on the worker\nending on the worker\n"
        assert second["heartbeat"] is not None
        assert published(client) == []  # delivered: the next identical call starts anew
        third = kernel(tmp_path, address, marker, "200ms")
        assert third["exit_code"] == 14
        deadline = time.monotonic() + 20  # its task starts when the worker gets to it
        while marker.read_text().count("started") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text().count("started") == 2  # started anew, once
        print(f"detach answered in {first['ms']:.0f} ms on a 200 ms budget; a new kernel "
              f"reattached and delivered in {second['ms']:.0f} ms")


TIMED_WORK = '''
import time
from pathlib import Path
import nbbudget as nb

def counted(path, n):
    run = nb.current()
    for i in range(n):
        run.step()
        Path(path).write_text(str(i + 1))
        time.sleep(0.01)
    return n
'''

TIMED_KERNEL = '''
import json, os, sys
import nbbudget as nb
import timedwork

address, counter = sys.argv[1:3]
# the timed call's wall clock counts from its first start, its first connection included
# (S0-6), and two busy cores can take longer than its 1500 ms to connect: its work would be
# cancelled before it reached the cluster. So a call that waits for it connects first (and has
# the worker import the work), and the timed call finds the cluster connected.
warm = nb.call(timedwork.counted, counter + ".warm", 1, detach=True, budget="60s",
               cluster=address)
assert warm.ok, warm
response = nb.call(timedwork.counted, counter, 2_000, detach=True, budget="200ms",
                   timeout="1500ms", key="job-t", limits=nb.Limits(steps=10_000),
                   cluster=address)
print(json.dumps({"exit_code": response.exit_code, "data": response.data}), flush=True)
os._exit(0)  # the kernel dies at once: its own timer goes with it
'''


def runs_on_the_ledger(dask_scheduler: Any) -> list[str]:
    """Runs on the scheduler: the keys of the runs its ledger holds."""
    from nbbudget.backends.dask.scheduler import LEDGER_NAME

    return list(dask_scheduler.plugins[LEDGER_NAME].books)


def test_a_job_whose_kernel_died_is_cancelled_at_its_timeout_by_the_scheduler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from conftest import dask_cluster

    from nbbudget.backends.dask.scheduler import Channel

    (tmp_path / "timedwork.py").write_text(TIMED_WORK)
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker processes import the work too
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("NBBUDGET_HOME", str(tmp_path / "home"))
    counter = tmp_path / "count"
    with dask_cluster(processes=True, n_workers=1, threads_per_worker=1) as client:
        env = {**os.environ, "NBBUDGET_INTERACTIVE": "0", "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(Path(nb.__file__).parents[1])])}
        done = subprocess.run([sys.executable, "-c", TIMED_KERNEL, client.scheduler.address,
                               str(counter)], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        first = json.loads(done.stdout.strip().splitlines()[-1])
        assert first["exit_code"] == 14 and first["data"]["state"] == "running"
        assert len(published(client)) == 1  # the job outlived its kernel
        # with no kernel left, the task stops at a step: the scheduler's clock stopped it
        assert 0 < stopped_counting(counter) < 2_000
        [run] = client.run_on_scheduler(runs_on_the_ledger)  # the dead kernel's run
        journal = Channel.of(client).call("nbb_journal", run=run)["events"]
        [stop] = [e for e in journal if e["event"] == "stopped"]
        assert stop["cause"] == "timeout"  # the scheduler's timer, not a kernel's cancel
        assert stop["how"] == {"status": "cancelled", "message": timed_out("job-t", 1500),
                               "by": "wall-clock", "code": "Cancelled"}
        import timedwork  # type: ignore[import-not-found]  # written above

        # a restarted kernel finds the job ended, cancelled, and answers as a local call does
        with use_backend(Backend(DaskRunner(client, Jobs(list)), nb.store)):
            again = nb.call(timedwork.counted, str(counter), 2_000, detach=True, budget="10s",
                            timeout="1500ms", key="job-t", limits=nb.Limits(steps=10_000))
        assert again.exit_code == 124 and again.data["state"] == "cancelled"
        assert again.error == {"code": "cancelled", "message": timed_out("job-t", 1500)}
        assert again.job is not None and again.job.wait_done(10)
        assert again.job.state is nb.JobState.CANCELLED
        assert published(client) == []
