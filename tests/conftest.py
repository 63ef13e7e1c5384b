"""Shared pytest fixtures and hooks for the nbbudget test suite.

Every test must leave no thread running: nbbudget starts background threads (its timer thread,
named ``nbbudget-timer...``, among them) and each of them must end once it has nothing left
to do. A thread that outlives its test, or the whole test run, is a bug.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from nbbudget.core.ledger import LocalLedger


class SessionDaskLedger:
    """The Dask ledger (`nbbudget.backends.dask.ledger`) on an in-process cluster started at its
    first use and closed at the end of the session: a ledger factory like `LocalLedger`."""

    __name__ = "DaskLedger"

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.factory: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.factory is None:
            from nbbudget.backends.dask.ledger import OnCluster

            self.factory = OnCluster(self.stack.enter_context(dask_cluster(processes=False)))
        return self.factory(*args, **kwargs)

    def close(self) -> None:
        self.factory = None
        self.stack.close()


DASK_LEDGER = SessionDaskLedger() if importlib.util.find_spec("distributed") else None

#: Every implementation of the ledger (`nbbudget.core.ledger.Ledger`): the ledger's semantic tests
#: and the run-level rule tests run over each, through the `ledger` fixture. A new one is a line.
#: A test that cannot apply to one is marked ``@pytest.mark.ledgers("local", reason=...)``.
LEDGERS: list[Any] = [LocalLedger, *([DASK_LEDGER] if DASK_LEDGER else [])]
#: each charge of a ledger kept elsewhere is a round trip: its model-based tests draw fewer
#: examples (``examples``)
_REMOTE_EXAMPLES = 0.15


def keeps_windows(ledger: Any) -> bool:
    """Whether *ledger* keeps windows that suspend (S3-1): a cluster's ledger does not."""
    return ledger is not DASK_LEDGER


def examples(ledger: Any, local: int) -> int:
    """How many examples a Hypothesis test draws on *ledger*, *local* on the local one."""
    return local if ledger is LocalLedger else max(10, int(local * _REMOTE_EXAMPLES))

def pyproject() -> dict[str, Any]:
    """The repository's ``pyproject.toml``, read with ``tomllib`` (``tomli`` before Python 3.11,
    from the test extra)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    return tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(
        encoding="utf-8"))


#: How long a thread started during a test may take to end after the test returns.
THREAD_GRACE_SECONDS = 2.0
#: How often the fixture looks again while it waits.
THREAD_POLL_SECONDS = 0.01
#: Threads a live Dask cluster owns in this process: its event loop, its workers' task threads,
#: the watchers of its worker processes, and the profiler of its event loop (distributed starts
#: it on every Python but 3.11, where it leaves profiling off). The per-test check lets them be
#: while a cluster made by `dask_cluster` is alive; the cluster checks that they end when it
#: closes.
DASK_THREADS = ("IO loop", "Dask-Default-Threads", "AsyncProcess Dask", "QueueFeederThread",
                "Profile")
#: distributed's offload executor: one thread for the whole process, from its first use; it is
#: shut down at the end of the session, before the last check.
DASK_OFFLOAD = "Dask-Offload"
#: distributed's thread for the done-callbacks of futures (a detached call's job is settled on
#: it): one for the whole process, from its first use, shut down at the end of the session
DASK_CALLBACK = "Dask-Callback-Thread"
#: LiteLLM's logging thread pool (``litellm_core_utils.thread_pool_executor.executor``): one for
#: the process, its threads from its first use, shut down at the end of the session
LITELLM_LOGGING = "litellm-logging"
_clusters_alive = [0]


def _exempt(t: threading.Thread) -> bool:
    return t.name.startswith((DASK_OFFLOAD, DASK_CALLBACK, LITELLM_LOGGING)) or (
        _clusters_alive[0] > 0 and any(name in t.name for name in DASK_THREADS))


def _wait_for_threads(
    candidates: Iterable[threading.Thread], grace: float
) -> list[threading.Thread]:
    """Wait up to ``grace`` seconds for ``candidates`` to end; return those still alive."""
    deadline = time.monotonic() + grace
    alive = [t for t in candidates if t.is_alive()]
    while alive and time.monotonic() < deadline:
        time.sleep(THREAD_POLL_SECONDS)
        alive = [t for t in alive if t.is_alive()]
    return alive


def _describe(threads: Iterable[threading.Thread]) -> str:
    """One line per thread: its name, whether it is a daemon and where it is running."""
    frames = sys._current_frames()
    lines = []
    for t in threads:
        where = ""
        innermost = frames.get(t.ident) if t.ident is not None else None
        # Point at the innermost frame outside the threading module itself, if there is one.
        frame = innermost
        while frame is not None and frame.f_code.co_filename == threading.__file__:
            frame = frame.f_back
        frame = frame or innermost
        if frame is not None:
            code = frame.f_code
            where = f" at {code.co_filename}:{frame.f_lineno} in {code.co_name}()"
        lines.append(f"  - {t.name!r} (daemon={t.daemon}){where}")
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def no_thread_left_running() -> Iterator[None]:
    """Fail the test if a thread it started is still running after it.

    The threads alive before the test are recorded; after the test, every thread that was
    not among them gets up to ``THREAD_GRACE_SECONDS`` to end (polled every 10 ms). The
    library's own ``nbbudget-timer`` thread gets no special treatment: it exits when it has
    nothing scheduled, so it has to be gone by then too.
    """
    before = set(threading.enumerate())
    yield
    started = [t for t in threading.enumerate() if t not in before and not _exempt(t)]
    leftover = _wait_for_threads(started, THREAD_GRACE_SECONDS)
    if leftover:
        names = ", ".join(repr(t.name) for t in leftover)
        pytest.fail(
            f"test left {len(leftover)} thread(s) running {THREAD_GRACE_SECONDS:g}s after it "
            f"ended: {names}\n{_describe(leftover)}",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def model_calls_switch_left_as_found() -> Iterator[None]:
    """Fail the test if it left ``nb.instrument()``'s process-wide switch on (a test that loads
    the IPython extension in this process turns it on, and must unload it): every later test's
    bare model clients would be counted. It is turned off, so that the next test starts clean."""
    yield
    everywhere = sys.modules.get("nbbudget.integrations.models.everywhere")
    switch = everywhere.installed() if everywhere is not None else None
    if switch is not None:
        switch.undo()
        pytest.fail("test left nb.instrument()'s process-wide switch on: undo it (or unload "
                    "the IPython extension)", pytrace=False)


@pytest.fixture
def switch() -> Iterator[Any]:
    """``nb.instrument()``'s process-wide switch, on for the test (the tests of each model
    library under it take it); once it is off, each HTTP client class has its own ``send``
    back, aiohttp's ``ClientSession`` its own ``__init__``, and botocore's endpoint and HTTP
    session their own methods."""
    import nbbudget as nb

    classes = [getattr(module, name) for module in (sys.modules.get("httpx2"),
                                                    sys.modules.get("httpx"))
               if module is not None for name in ("Client", "AsyncClient")]
    sends = {cls: cls.send for cls in classes}
    aiohttp = sys.modules.get("aiohttp")  # its sessions' __init__, which adds the middleware
    init = None if aiohttp is None else aiohttp.ClientSession.__init__
    endpoint = sys.modules.get("botocore.endpoint")  # botocore's, which admit and send
    boto = None if endpoint is None else (endpoint.Endpoint.create_request,
                                          endpoint.URLLib3Session.send)
    with nb.instrument() as on:
        yield on
    assert {cls: cls.send for cls in classes} == sends
    assert aiohttp is None or aiohttp.ClientSession.__init__ is init
    assert endpoint is None or (endpoint.Endpoint.create_request,
                                endpoint.URLLib3Session.send) == boto


def _ledger_id(factory: Any) -> str:
    """A ledger's test id: its class name less ``Ledger`` (``LocalLedger`` is ``local``)."""
    return str(factory.__name__).removesuffix("Ledger").lower()


@pytest.fixture(scope="session", params=LEDGERS, ids=_ledger_id)
def ledger(request: pytest.FixtureRequest) -> Any:
    """A ledger factory, once per implementation: build runs with ``nb.budget(...,
    ledger=ledger)`` (and ``nb.Budget.resume(..., ledger=ledger)``). Session-scoped, so that
    Hypothesis tests may take it too."""
    return request.param


@pytest.fixture(scope="session", autouse=True)
def quick_idle_workers() -> Iterator[None]:
    """Idle workers (of calls and tools) end after ``IDLE_SECONDS``; a short wait keeps each
    test's thread check quick."""
    from nbbudget.core import workers as _workers

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_workers, "IDLE_SECONDS", 0.05)
        try:  # the instrumented model clients' watch of their replies' deadlines, alike
            from nbbudget.integrations.models.clients import _Watch
        except ImportError:  # without httpx2
            pass
        else:
            patch.setattr(_Watch, "IDLE_S", 0.05)
        yield


@pytest.fixture
def home(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store of the test's own, a non-interactive caller, no budget in the environment."""
    folder = tmp_path / "home"
    monkeypatch.setenv("NBBUDGET_HOME", str(folder))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    return folder



def wait_for(condition: Callable[[], bool], seconds: float = 20) -> bool:
    """Whether *condition* came true within *seconds* (looked at every 20 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True

@contextmanager
def dask_cluster(processes: bool, **kwargs: Any) -> Iterator[Any]:
    """A client of a new `LocalCluster` of 2 workers with 2 threads each (unless *kwargs* say
    otherwise), in this process or in worker processes; closed on leaving, and then none of its
    threads may be left."""
    from distributed import Client, LocalCluster

    before = set(threading.enumerate())
    _clusters_alive[0] += 1
    try:
        with LocalCluster(processes=processes, **{"n_workers": 2, "threads_per_worker": 2,
                                                  "dashboard_address": ":0", **kwargs}
                          ) as cluster, Client(cluster) as client:
            yield client
    finally:
        _clusters_alive[0] -= 1
    started = [t for t in threading.enumerate()
               if t not in before
               and not t.name.startswith((DASK_OFFLOAD, DASK_CALLBACK, LITELLM_LOGGING))]
    leftover = _wait_for_threads(started, THREAD_GRACE_SECONDS)
    if leftover:
        pytest.fail(f"a closed Dask cluster left threads running:\n{_describe(leftover)}",
                    pytrace=False)


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A client of an in-process cluster (2 workers x 2 threads) for a test module."""
    with dask_cluster(processes=False) as client:
        yield client


@pytest.fixture(scope="module")
def dask_process_client() -> Iterator[Any]:
    """A client of a cluster of 2 worker processes (2 threads each) for a test module."""
    with dask_cluster(processes=True) as client:
        yield client


@pytest.fixture
def in_kernel() -> Iterator[None]:
    """Calls on an in-process cluster warn that their detached jobs die with the kernel; the
    tests that take this fixture are about the rest."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the job .* was detached to a Dask cluster",
                                RuntimeWarning)
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress", action="store_true",
                     help="also run the long stress runs (tests marked stress)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``ledgers(name, ..., reason=...)`` runs only over those ledgers; over the
    others it is skipped, with the reason. One marked ``diverges(name, ..., reason=...)`` shows
    where those ledgers break a rule: a strict xfail over them, an ordinary test over others.
    One marked ``stress`` runs only with ``--stress``."""
    for item in items:
        if item.get_closest_marker("stress") is not None and not config.getoption("--stress"):
            item.add_marker(pytest.mark.skip(reason="a long stress run: give pytest --stress"))
        callspec = getattr(item, "callspec", None)
        if callspec is None or "ledger" not in callspec.params:
            continue
        name = _ledger_id(callspec.params["ledger"])
        only, diverges = item.get_closest_marker("ledgers"), item.get_closest_marker("diverges")
        if only is not None and name not in only.args:
            item.add_marker(pytest.mark.skip(reason=only.kwargs["reason"]))
        if diverges is not None and name in diverges.args:
            item.add_marker(pytest.mark.xfail(strict=True, reason=diverges.kwargs["reason"]))


def _stop_dask_offload() -> None:
    utils = sys.modules.get("distributed.utils")
    executor = getattr(utils, "_offload_executor", None)
    if executor is not None:
        executor.shutdown(wait=True)
    client = sys.modules.get("distributed.client")
    callbacks = getattr(getattr(client, "Future", None), "_cb_executor", None)
    if callbacks is not None:
        callbacks.shutdown(wait=True)


def _stop_litellm_logging() -> None:
    pool = sys.modules.get("litellm.litellm_core_utils.thread_pool_executor")
    executor = getattr(pool, "executor", None)
    if executor is not None:
        executor.shutdown(wait=True)


@pytest.fixture(params=["sqlite", "memory"])
def any_store(request: pytest.FixtureRequest, home: Any) -> Iterator[Any]:
    """The test runs once on each implementation of the store (``tests/stores.py``): the
    SQLite store of its ``NBBUDGET_HOME``, and a `nbbudget.testing.MemoryStore`. Its calls run
    on a local runner of its own, so that no detached job of another test (the same work, run
    on the other store) is reattached. ``any_store.store`` is the store."""
    from stores import MemoryHeld, SQLiteHeld

    import nbbudget as nb
    from nbbudget.calls.runner import Backend, LocalRunner, use_backend
    from nbbudget.testing import MemoryStore

    held = SQLiteHeld(nb.store()) if request.param == "sqlite" else MemoryHeld(MemoryStore())
    opener = nb.store if request.param == "sqlite" else lambda: held.store
    with use_backend(Backend(LocalRunner(nb.jobs), opener)):
        yield held


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any thread other than the main thread is still alive at its end.

    This also catches threads started outside a test (at import or collection time) that the
    per-test fixture cannot see.
    """
    if DASK_LEDGER is not None:
        DASK_LEDGER.close()
    _stop_dask_offload()
    _stop_litellm_logging()
    main = threading.main_thread()
    others = [t for t in threading.enumerate() if t is not main]
    leftover = _wait_for_threads(others, THREAD_GRACE_SECONDS)
    if not leftover:
        return
    message = (
        f"threads still alive at the end of the test run: "
        f"{', '.join(repr(t.name) for t in leftover)}\n{_describe(leftover)}"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message, file=sys.stderr)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def shell() -> Iterator[Any]:
    """IPython's shell (its singleton) with nbbudget's extension loaded, unloaded after the test;
    no history thread, so that every test ends with no thread, and the ``%config`` settings,
    which live on the shared shell, dropped."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "nbbudget")
    yield ip
    ip.run_line_magic("unload_ext", "nbbudget")
    ip.config.pop("NBBudget", None)
