"""What a call's task on a cluster prints, and its heartbeat, reach the kernel's job: while the
task runs, all of it by the time its result is answered, only its own thread's writes, and, in
a kernel that reattaches to it from the scheduler, what it printed before, then what comes
later, each once (N-2, for calls; `nbbudget.backends.dask.output`).

In-process clusters here, and worker processes for a task run again after its worker was
killed; the real-process test of ``test_dask_jobs.py`` checks the same across two kernel
processes and a worker process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

import cloudpickle
from conftest import wait_for

import nbbudget as nb
from nbbudget.backends.dask.runner import DaskRunner
from nbbudget.calls.jobs import Jobs
from nbbudget.calls.runner import Backend, use_backend

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # worker processes import no tests


def prints_until(marker: str, tag: str) -> str:
    print(f"{tag} begun")
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"{tag} ending", file=sys.stderr)
    return tag


def chatty(n: int) -> int:
    for i in range(n):
        print(f"line {i}")
    sys.stderr.write("last words\n")  # just before the task returns
    return n


def tagged(tag: str, n: int) -> str:
    for i in range(n):
        print(f"{tag} {i}")
        time.sleep(0.002)
    return tag


def silent_until(marker: str) -> str:
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "quiet"


def test_what_the_task_prints_reaches_the_job_while_it_runs_and_to_its_end(
        dask_client: Any, home: Any, in_kernel: Any, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    first = nb.call(prints_until, str(marker), "a", detach=True, budget="50ms",
                    cluster=dask_client)
    assert first.exit_code == 14
    job = nb.jobs[first.data["job"]]
    assert wait_for(lambda: "a begun" in job.output_text)
    print("the kernel's own line")  # the kernel's thread, not the task's: not the job's
    assert not job.done()  # it arrived while the task ran
    marker.touch()
    done = nb.call(prints_until, str(marker), "a", detach=True, budget="10s",
                   cluster=dask_client)
    assert done.ok and done.data == "a" and done.job is job
    assert job.output_text == "a begun\na ending\n"


def test_what_the_task_prints_just_before_it_returns_is_not_lost(dask_client: Any,
                                                                  home: Any) -> None:
    response = nb.call(chatty, 500, cluster=dask_client)  # its caller waits for the end
    assert response.ok and response.data == 500
    assert response.job is not None
    assert response.job.output_text == "".join(f"line {i}\n" for i in range(500)) + \
        "last words\n"
    assert len(response.job.output) < 500  # sent in batches, not one message per write


def test_tasks_running_at_once_on_one_worker_keep_their_own_output(
        dask_client: Any, home: Any, in_kernel: Any) -> None:
    calls = [nb.call(tagged, tag, 200, detach=True, budget="20ms", cluster=dask_client)
             for tag in ("left", "right")]
    for tag, first in zip(("left", "right"), calls, strict=True):
        job = nb.jobs[first.data["job"]] if first.exit_code == 14 else first.job
        done = nb.call(tagged, tag, 200, detach=True, budget="20s", cluster=dask_client)
        assert done.ok and done.data == tag
        assert job.output_text == "".join(f"{tag} {i}\n" for i in range(200))


def test_a_silent_task_says_it_is_alive_and_the_jobs_frame_shows_when(
        dask_client: Any, home: Any, in_kernel: Any, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    first = nb.call(silent_until, str(marker), detach=True, budget="50ms", cluster=dask_client)
    job = nb.jobs[first.data["job"]]
    assert wait_for(lambda: job.last_heartbeat is not None)
    beat = job.last_heartbeat
    assert beat is not None and abs(time.time() - beat) < 20
    assert wait_for(lambda: (job.last_heartbeat or 0) > beat)  # again, while silent
    assert not job.done() and job.output == []
    frame = nb.jobs.to_frame()
    shown = frame.loc[job.id, "heartbeat"]
    assert abs(shown.timestamp() - (job.last_heartbeat or 0)) < 1e-3
    marker.touch()
    assert nb.call(silent_until, str(marker), detach=True, budget="10s",
                   cluster=dask_client).ok


def test_a_kernel_that_reattaches_gets_what_was_printed_so_far_then_what_comes_later(
        dask_client: Any, home: Any, in_kernel: Any, tmp_path: Path) -> None:
    marker = tmp_path / "go"
    first = nb.call(prints_until, str(marker), "h", detach=True, budget="50ms", key="out-h",
                    cluster=dask_client)
    job = nb.jobs[first.data["job"]]
    assert wait_for(lambda: "h begun" in job.output_text)
    # a runner of its own, as a restarted kernel has: it finds the job on the scheduler
    with use_backend(Backend(DaskRunner(dask_client, Jobs(list)), nb.store)):
        second = nb.call(prints_until, str(marker), "h", detach=True, budget="50ms",
                         key="out-h")
        assert second.exit_code == 14 and second.job is not None and second.job is not job
        found = second.job
        assert found.output_text == "h begun\n"  # the history, at once
        assert found.last_heartbeat is not None and abs(time.time() - found.last_heartbeat) < 20
        marker.touch()
        third = nb.call(prints_until, str(marker), "h", detach=True, budget="10s", key="out-h")
        assert third.ok and third.data == "h" and third.job is found
        assert found.output_text == "h begun\nh ending\n"  # each once, in order
    assert job.wait_done(5) and job.output_text == "h begun\nh ending\n"


def prints_pid_until(marker: str) -> str:
    print(f"begun in {os.getpid()}")
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("ending")
    return "survived"


def test_a_task_run_again_after_its_worker_died_goes_on_in_the_same_output(
        home: Any, in_kernel: Any, tmp_path: Path) -> None:
    import signal

    from conftest import dask_cluster

    marker = tmp_path / "go"
    with dask_cluster(processes=True, n_workers=1, threads_per_worker=1) as client:
        first = nb.call(prints_pid_until, str(marker), detach=True, budget="50ms",
                        cluster=client)
        job = nb.jobs[first.data["job"]]
        assert wait_for(lambda: "begun in" in job.output_text, 60)
        dead = int(job.output_text.split()[2])
        os.kill(dead, signal.SIGKILL)  # its worker process (the nanny starts another)
        assert wait_for(lambda: job.output_text.count("begun in") == 2, 60)
        marker.touch()
        done = nb.call(prints_pid_until, str(marker), detach=True, budget="60s", cluster=client)
        assert done.ok and done.data == "survived" and done.job is job
        lines = job.output_text.splitlines()
        assert lines[0] == f"begun in {dead}"
        assert lines[1] == "[the task started again on the cluster: its worker was lost]"
        assert lines[2].startswith("begun in ") and lines[2] != lines[0]
        assert lines[3:] == ["ending"]
