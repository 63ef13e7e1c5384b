"""What a call's task on a Dask cluster prints, its heartbeat and its checkpoints, shipped to the
kernel as events of the scheduler (``log_event`` on the worker, ``subscribe_topic`` in the
kernel), on two topics per task: ``nbbudget-output-<task key>`` and ``nbbudget-beat-<task key>``.

On the worker, `TaskOutput` has what the task's own thread writes to ``sys.stdout`` and
``sys.stderr`` routed into a buffer (`nbbudget.core.streams.diverted`: a worker runs several
tasks on threads at once, and what other threads write goes to the streams as before). Its
thread, ``nbbudget-output-<task key>``, sends the buffer at most every `FLUSH_S` seconds, and
the task sends what is left when it ends, before its value is returned, so nothing it printed
is lost: the worker sends both on the one ordered stream it has to the scheduler, and the
scheduler tells the kernel in that order. With nothing sent for `HEARTBEAT_S`, the thread
sends a heartbeat. Each message on the output topic carries its attempt (a task run again after
its worker died is another attempt) and a sequence number.

In the kernel, `Feed` listens from before the task is submitted: output into ``job.output``,
the time of the last message into ``job.last_heartbeat``, checkpoints to the call's store
(`Saver`, off the client's event loop). A kernel that reattaches to a running job listens, then
replays the history the scheduler keeps; the sequence numbers drop what it hears twice. The
scheduler keeps at most ``distributed.admin.low-level-log-length`` events per topic (1000 by
default) until the job's result is delivered (`forget`): a kernel that reattaches after more
batches than that gets a line saying how many were dropped, then the rest.

`distributed` is imported by the module that imports this one (`nbbudget.backends.dask.runner`),
only when a call is given a cluster.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...core import streams, workers
from ...core.errors import Cancelled

if TYPE_CHECKING:
    from distributed import Client

    from ...calls.jobs import Job
    from ...calls.runner import Checkpoints
    from ...calls.store import Checkpoint
    from ...run.budget import Budget

__all__ = ["FLUSH_S", "HEARTBEAT_S", "Feed", "Saver", "TaskOutput", "beat_topic", "forget",
           "history", "output_topic"]

#: how often at most a task's output is sent to the kernel (seconds; `TaskOutput`'s default)
FLUSH_S = 0.15
#: how often a task that sends nothing else says it is alive (seconds; `TaskOutput`'s default)
HEARTBEAT_S = 1.0

#: how `TaskOutput` sends a message on a topic (the worker's ``log_event``)
Send = Callable[[str, dict[str, Any]], None]


def output_topic(key: str) -> str:
    """The topic of the output (and checkpoints) of the task *key*: `TaskOutput` sends on it,
    `Feed` hears it, and the runner reads when it was last sent to
    (`nbbudget.backends.dask.runner.published_states`)."""
    return f"nbbudget-output-{key}"


def beat_topic(key: str) -> str:
    """The topic of the heartbeats of the task *key*, between the same three as
    `output_topic`."""
    return f"nbbudget-beat-{key}"


# -- on the worker --------------------------------------------------------------------------
class TaskOutput:
    """On a worker, around a task (``with TaskOutput(key, worker.log_event) as out:``): what
    its thread prints, sent in batches on its output topic, and its heartbeat; `send` sends a
    message of its own there (a checkpoint), after what was printed before it. Its thread ends
    with the block, which sends what is left before it returns. The task's run on the worker
    (`nbbudget.backends.dask.runner.run_work`) is its one user; what its thread writes reaches
    `write` through the router (`nbbudget.core.streams.diverted`)."""

    def __init__(self, key: str, send: Send, *, flush_s: float = FLUSH_S,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.topic, self.beat_topic = output_topic(key), beat_topic(key)
        self.attempt = uuid.uuid4().hex[:12]  #: this run of the task
        self._send = send
        self._flush_s, self._heartbeat_s = flush_s, heartbeat_s
        self._lock = threading.Lock()
        self._buffer: list[str] = []
        self._seq = 0
        self._sent = time.monotonic()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._pace, name=f"nbbudget-output-{key}",
                                        daemon=True)
        self._routing = contextlib.ExitStack()

    def write(self, text: str) -> int:
        """Keep *text* for the next batch (the router calls it with what the task's thread
        writes to ``sys.stdout`` or ``sys.stderr``)."""
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._buffer.append(text)
        return len(text)

    def send(self, body: dict[str, Any]) -> None:
        """Send *body* on the output topic, numbered, after what was printed before it (the
        task's call sends its checkpoints so, `nbbudget.backends.dask.runner.TaskCall`)."""
        with self._lock:
            self._flush_locked()
            self._emit(body)

    def flush(self) -> bool:
        """Send what was printed since the last batch; whether there was anything (its own
        thread, at most every *flush_s*, and the block's end)."""
        with self._lock:
            return self._flush_locked()

    def __enter__(self) -> TaskOutput:
        self._routing.enter_context(streams.diverted(self.write))
        self._beat()  # it started: the kernel hears it at once
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        self._thread.join()
        self._routing.close()
        self.flush()

    def _flush_locked(self) -> bool:
        if not self._buffer:
            return False
        text = "".join(self._buffer)
        self._buffer.clear()
        self._emit({"out": text})
        return True

    def _emit(self, body: dict[str, Any]) -> None:
        """(lock held)"""
        self._send(self.topic, {"a": self.attempt, "n": self._seq, **body})
        self._seq += 1
        self._sent = time.monotonic()

    def _beat(self) -> None:
        self._send(self.beat_topic, {"a": self.attempt})
        self._sent = time.monotonic()

    def _pace(self) -> None:
        while not self._ended.wait(self._flush_s):
            if not self.flush() and time.monotonic() - self._sent >= self._heartbeat_s:
                self._beat()


# -- in the kernel --------------------------------------------------------------------------
class Saver:
    """Saves the checkpoints a task ships, in order, through the call's *checkpoints*, off the
    client's event loop, with the state of the job's *run* (its limits, active time and
    notices, read here) and the counters the task counted at the checkpoint: the scheduler's
    counters less the permits the task still held unused in its leases, which the scheduler
    counts as spent until they come back. The runner gives one to the `Feed` of a call that may
    pause at checkpoints (`nbbudget.backends.dask.runner.DaskRunner`)."""

    def __init__(self, checkpoints: Checkpoints, run: Budget) -> None:
        self.checkpoints = checkpoints
        self.run = run
        self._pending: collections.deque[tuple[tuple[str, int], dict[str, Any]]] = (
            collections.deque())
        self._saved: dict[tuple[str, int], Checkpoint | BaseException] = {}
        self._saving = threading.Lock()

    def arrived(self, attempt: str, number: int, msg: dict[str, Any]) -> None:
        """A checkpoint arrived (the `Feed`, on the client's event loop): it is saved on a
        worker thread."""
        self._pending.append(((attempt, number), msg))
        workers.submit(self._drain)

    def saved(self, attempt: str, number: int) -> Checkpoint:
        """The checkpoint *number* of *attempt*, saved (now, if it has not been yet); its
        error if it could not be saved. The runner asks for it when the task answers that it
        paused there."""
        self._drain()
        found = self._saved.get((attempt, number))
        if found is None:
            raise RuntimeError(f"checkpoint {number} of the task never reached the kernel; "
                               f"make the identical call again to continue from the last one "
                               f"saved")
        if isinstance(found, BaseException):
            raise found
        return found

    def _drain(self) -> None:
        """Save the checkpoints that arrived, in order."""
        with self._saving:
            while self._pending:
                which, msg = self._pending.popleft()
                if self.run.cancelled:  # the run stopped before this checkpoint reached the
                    # kernel: not saved, as a checkpoint on a stopped run is not (its check
                    # raises), so that a work ended by its stop leaves no checkpoint behind
                    self._saved[which] = Cancelled(f"{self.run.name} stopped before its "
                                                   f"checkpoint {which[1]} reached the kernel")
                    continue
                try:
                    ledger = self.run.state()
                    ledger["counts"] = dict(msg["counts"])
                    ledger["notice_level"] = max(ledger["notice_level"], msg["notice_level"])
                    self._saved[which] = self.checkpoints.save(_state(msg, which[1]), ledger)
                except Exception as exc:  # noqa: BLE001 - kept: the pause at it raises it
                    self._saved[which] = exc


def _state(msg: dict[str, Any], number: int) -> Any:
    """The state of the checkpoint *msg*, read here."""
    try:
        return pickle.loads(msg["checkpoint"])  # noqa: S301 - the task's own state
    except Exception as exc:
        raise TypeError(f"the state of checkpoint {number} could not be read in the kernel "
                        f"({exc}): a checkpoint's state must be made of classes the kernel has "
                        f"too (the notebook's own, or importable ones)") from exc


class Feed:
    """In the kernel, a task's messages into its `Job`: output into ``job.output``, the time
    of the last message into ``job.last_heartbeat``, checkpoints to *saver*. `listen` before
    the task is submitted; `replay` the scheduler's history after `listen` when reattaching;
    `close` once the task ended. The runner makes one for each job it submits or reattaches to
    (`nbbudget.backends.dask.runner.DaskRunner`)."""

    def __init__(self, client: Client, key: str, job: Job, saver: Saver | None = None) -> None:
        self.client = client
        self.topics = (output_topic(key), beat_topic(key))
        self.saver = saver
        self._job = weakref.ref(job)
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}  # by attempt: the number of the next message
        self._held: list[dict[str, Any]] | None = None  # heard before the history, when replaying
        self._unheard: list[Callable[[], None]] = []

    def listen(self, replaying: bool = False) -> None:
        """Hear the task's messages from now on; *replaying*: hold them until `replay`."""
        from .scheduler import hear

        if replaying:
            self._held = []
        self._unheard = [hear(self.client, self.topics[0], self._heard),
                         hear(self.client, self.topics[1], self._beat)]

    def replay(self) -> None:
        """Take what the scheduler kept of the task's messages, then what was heard meanwhile,
        each once and in order."""
        try:
            out, beats, now = self.client.run_on_scheduler(  # type: ignore[no-untyped-call]
                history, self.topics)  # (distributed is untyped)
        except Exception:  # noqa: BLE001 - no history: what is heard from now on still comes
            out, beats, now = [], [], 0.0
        job = self._job()
        last = max((t for t, _ in [*out, *beats]), default=None)
        if job is not None and last is not None:  # its age, on the scheduler's clock
            job.last_heartbeat = max(job.last_heartbeat or 0.0, time.time() - (now - last))
        with self._lock:
            held, self._held = self._held or [], None
            for _, msg in out:
                self._take(msg)
            for msg in held:
                self._take(msg)

    def close(self) -> None:
        """Stop listening (the task ended: all it sent has been heard)."""
        unheard, self._unheard = self._unheard, []
        for each in unheard:
            with contextlib.suppress(Exception):  # a closed client hears nothing anyway
                each()

    def _heard(self, event: tuple[float, dict[str, Any]]) -> None:
        self._alive()
        with self._lock:
            if self._held is not None:
                self._held.append(event[1])
            else:
                self._take(event[1])

    def _beat(self, event: tuple[float, dict[str, Any]]) -> None:
        self._alive()

    def _alive(self) -> None:
        job = self._job()
        if job is not None:
            job.last_heartbeat = time.time()

    def _take(self, msg: dict[str, Any]) -> None:
        """One message, if it is the next of its attempt or later (lock held)."""
        job = self._job()
        attempt, n = msg["a"], int(msg["n"])
        expected = self._next.get(attempt)
        if job is None or (expected is not None and n < expected):
            return  # heard twice (in the history and live)
        if expected is None and self._next:
            job.output.append("[the task started again on the cluster: its worker was lost]\n")
        if n > (expected or 0):
            job.output.append(f"[{n - (expected or 0)} earlier messages of this job were no "
                              f"longer kept by the scheduler]\n")
        self._next[attempt] = n + 1
        if "out" in msg:
            job.output.append(msg["out"])
        elif "checkpoint" in msg and self.saver is not None:
            self.saver.arrived(attempt, int(msg["id"]), msg)


def history(topics: tuple[str, str], dask_scheduler: Any = None) -> tuple[Any, Any, float]:
    """Runs on the scheduler: the events it keeps of *topics* (output, heartbeats) and its
    clock now (to tell their age). `Feed.replay` asks for it."""
    return (list(dask_scheduler.get_events(topics[0])), list(dask_scheduler.get_events(topics[1])),
            time.time())


def forget(topics: tuple[str, ...], dask_scheduler: Any = None) -> None:
    """Runs on the scheduler: drop what it keeps of *topics* (the job was delivered). Dask has
    no public call for it; without its broker, nothing is dropped. The runner asks for it once
    a job's result went out."""
    broker = getattr(dask_scheduler, "_broker", None)
    kept = getattr(broker, "_topics", None)
    if isinstance(kept, dict):
        for topic in topics:
            kept.pop(topic, None)
