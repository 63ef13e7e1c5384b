"""A kernel timer that sends a signal to one thread at a time on the monotonic clock: Linux's
``timer_create`` with ``SIGEV_THREAD_ID`` on ``CLOCK_MONOTONIC`` (the clock of
``time.monotonic_ns``), called through ctypes.

Used by `nbbudget.core.preempt`: a run's deadline on the main thread is its signal, sent by
the kernel at the deadline itself. The clock's timer thread, which sends it otherwise, wakes at
the deadline and then waits for the GIL while the work runs Python: by default up to a switch
interval (5 ms) late. A kernel timer needs no thread and no GIL (``signal.setitimer`` is one,
but it sends ``SIGALRM``, which code of the user's own may handle).

`thread_alarm` gives None where the platform has no such timer (not Linux, a C library
without ``timer_create``, a 32-bit ``time_t``): the caller keeps its own timer thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["ThreadAlarm", "thread_alarm"]

_CLOCK_MONOTONIC = 1
_SIGEV_THREAD_ID = 4  # Linux: the signal goes to the thread whose kernel id is given
_TIMER_ABSTIME = 1


class _Sigevent(ctypes.Structure):
    """``struct sigevent`` as Linux lays it out: 64 bytes, the thread id first in its union."""

    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("tid", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


class ThreadAlarm:
    """One kernel timer that sends *signum* to the thread whose kernel id (``native_id``) is
    *thread*, once, at the time `at` sets. Valid in the process that made it: a child made by
    ``os.fork`` has no timers (its owner makes another there)."""

    def __init__(self, lib: ctypes.PyDLL, signum: int, thread: int) -> None:
        self._settime = lib.timer_settime
        self._id = ctypes.c_void_p()
        event = _Sigevent(signo=signum, notify=_SIGEV_THREAD_ID, tid=thread)
        if lib.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._id)):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    def at(self, when_ns: int) -> None:
        """Send the signal when ``time.monotonic_ns()`` reaches *when_ns* (0: never), in place
        of any time set before. A time passed sends it at once."""
        value = self._spec.value
        value.sec, value.nsec = divmod(when_ns, 1_000_000_000) if when_ns > 0 else (0, 0)
        self._settime(self._id, _TIMER_ABSTIME, self._ref, None)


def thread_alarm(signum: int, thread: int) -> ThreadAlarm | None:
    """A `ThreadAlarm` sending *signum* to the thread of kernel id *thread*; None where the
    platform has none (the caller's own timer thread then sends it)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    lib = _library()
    if lib is None:
        return None
    lib.timer_create.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_void_p]
    try:
        return ThreadAlarm(lib, signum, thread)
    except OSError:
        return None


def _library() -> ctypes.PyDLL | None:
    """The C library that has ``timer_create``: libc itself since glibc 2.34, else librt
    (looked for only then: ``find_library`` runs ``ldconfig``)."""
    for name in (None, "rt"):
        # PyDLL: called holding the GIL. The calls return at once, and a call that let the
        # GIL go gave it to the clock's timer thread, just woken by the run's entering: the
        # thread then waited for it back (bench_preempt.py's empty block: 1.6x without)
        try:
            lib = ctypes.PyDLL(name if name is None else ctypes.util.find_library(name),
                               use_errno=True)
            lib.timer_create  # noqa: B018 - looked up: AttributeError where it is missing
        except (OSError, AttributeError):
            continue
        return lib
    return None
