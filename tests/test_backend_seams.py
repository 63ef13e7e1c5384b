"""The seams a backend plugs into (``docs/architecture.md``, "How to add a backend"): a backend
implements the protocols of the layers below in full, by objects of its own; the run asks a
ledger for what only a cluster does (`ClusterLedger`, through ``Ledger.cluster``), never for
its class; the run and the call load a backend by name as objects that ``mypy --strict``
checks; and nothing outside ``nbbudget/backends/dask/`` imports ``distributed`` or names a
Dask class."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

import nbbudget as nb
from nbbudget.core.backends import load
from nbbudget.core.errors import ConfigError
from nbbudget.core.ledger import Account, Branch, LocalLedger
from nbbudget.run.branches import parallel_on

PACKAGE = Path(nb.__file__).resolve().parent
ROOT = PACKAGE.parent
DASK = PACKAGE / "backends" / "dask"


def outside_the_backend() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if DASK not in p.parents and p != PACKAGE / "dask.py"]


def test_only_the_dask_backend_imports_distributed_or_names_a_dask_class() -> None:
    """Every import of ``distributed`` (lazy and ``TYPE_CHECKING`` ones included) is under
    ``nbbudget/backends/dask/`` (or the public ``nbbudget.dask``), and no code outside it names
    a class of Dask or of the backend (``distributed.Client``, ``DaskLedger``, ...)."""
    found = []
    for path in outside_the_backend():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{where}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "distributed"]
            elif isinstance(node, ast.ImportFrom) and ({"distributed", "dask"} & set(
                    (node.module or "").split("."))):
                found.append(f"{where}: from {node.module} import ...")
            name = (node.id if isinstance(node, ast.Name) else node.attr
                    if isinstance(node, ast.Attribute) else None)
            if name is not None and name.startswith("Dask"):
                found.append(f"{where}:{node.lineno}: {name}")
            if isinstance(node, ast.Attribute) and node.attr == "Client" and isinstance(
                    node.value, ast.Name) and node.value.id in ("distributed", "dask"):
                found.append(f"{where}:{node.lineno}: {node.value.id}.Client")  # httpx's is not
    assert found == []


class Capable:
    """What only a cluster does (`ClusterLedger`), for a ledger kept here: a stand-in for a
    second backend, made of the protocols alone."""

    def __init__(self, ledger: LocalLedger) -> None:
        self.ledger = ledger
        self.stops: list[float] = []

    def branch(self, account: Account, name: str, remaining_ms: float | None) -> Branch:
        return Branch("run-key", f"home-of-{account.name}", name,
                      {"steps": account.limits.steps or 0}, remaining_ms, None)

    def stop_after(self, ms: float, stop: Any) -> None:
        self.stops.append(ms)

    def standing_stop(self) -> Mapping[str, Any] | None:
        return None


class CapableLedger(LocalLedger):
    """A local ledger that gives a `ClusterLedger` (no Dask class anywhere)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capable = Capable(self)

    @property
    def cluster(self) -> Capable:  # type: ignore[override]
        return self.capable


class ThreadCluster:
    """A `Cluster` that runs each branch on a thread of its own, inside ``join(branch)``."""

    def __init__(self) -> None:
        self.branches: list[Branch] = []

    @property
    def ledger(self) -> type[CapableLedger]:
        return CapableLedger

    def parallel(self, join: Callable[[Branch], AbstractContextManager[Any]], branch: Branch,
                 items: Sequence[Callable[[], Any]], max_concurrency: int | None) -> list[Any]:
        self.branches.append(branch)
        outcomes: list[Any] = [None] * len(items)

        def run(index: int, fn: Callable[[], Any]) -> None:
            try:
                with join(branch):
                    outcomes[index] = fn()
            except Exception as exc:  # the branch's error is its outcome
                outcomes[index] = exc

        threads = [threading.Thread(target=run, args=(i, fn), name=f"test-branch-{i}")
                   for i, fn in enumerate(items)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        return outcomes


def current_name() -> str:
    run = nb.current()
    assert run is not None
    return run.name


def test_a_run_sends_its_branches_to_any_ledger_that_can_do_what_a_cluster_does() -> None:
    """The branches of a run go to its cluster by what its ledger can do (``Ledger.cluster``),
    whatever the ledger's class: the branch each runs in is what that ledger said of it."""
    cluster, joined = ThreadCluster(), []

    def join(branch: Branch) -> nb.Budget:
        run = nb.budget(steps=int(branch.limits["steps"]), name=branch.name)
        joined.append(run)
        return run

    with nb.budget(steps=7, name="fanout", ledger=CapableLedger) as run:
        seen = parallel_on(cluster, run, join, [lambda i=i: (i, current_name()) for i in range(3)],
                           max_concurrency=None, max_items=None, return_exceptions=False)
    assert seen == [(0, "fanout"), (1, "fanout"), (2, "fanout")]
    assert [b.home for b in cluster.branches] == ["home-of-fanout"]
    assert [r.limits.steps for r in joined] == [7, 7, 7]


def test_the_branches_of_a_run_kept_here_are_refused_a_cluster_with_the_fix() -> None:
    with nb.budget(steps=5, name="here") as run, pytest.raises(ConfigError) as refused:
        parallel_on(ThreadCluster(), run, lambda branch: nb.budget(), [lambda: 1],
                    max_concurrency=None, max_items=None, return_exceptions=False)
    assert "keeps its counters in this process" in str(refused.value)
    assert "cluster=" in str(refused.value)


def test_the_backend_is_loaded_by_name_as_the_objects_its_package_types() -> None:
    from nbbudget.calls.clusters import load_calls

    dask = pytest.importorskip("nbbudget.backends.dask")
    assert load("dask") is dask.RUNS is dask.BACKEND
    assert load_calls("dask") is dask.CALLS is dask.BACKEND
    with pytest.raises(ValueError, match="unknown backend 'ray'; nbbudget has dask"):
        load("ray")


def test_a_dask_ledger_gives_itself_as_what_a_cluster_does(dask_client: Any) -> None:
    pytest.importorskip("distributed")
    with nb.budget(steps=10, cluster=dask_client) as run:
        ledger = run.lowlevel.ledger
        assert ledger.cluster is ledger
        branch = ledger.cluster.branch(run.lowlevel.account, run.name, None)
        assert (branch.name, branch.limits) == (run.name, {"steps": 10})
    with nb.budget(steps=10) as here:
        assert here.lowlevel.ledger.cluster is None


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("mypy is not installed (the dev extra)")
    return subprocess.run([exe, "--strict", "--no-error-summary", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPYPATH": str(ROOT)}, check=False)


#: the files of the seams and of the Dask backend that mypy must find clean (``output.py``, the
#: stream router, is checked with the routers)
SEAMS = ("nbbudget/core/backends.py", "nbbudget/core/ledger.py", "nbbudget/calls/clusters.py",
         "nbbudget/calls/runner.py", "nbbudget/run/branches.py",
         "nbbudget/backends/dask/__init__.py", "nbbudget/backends/dask/ledger.py",
         "nbbudget/backends/dask/scheduler.py", "nbbudget/backends/dask/connect.py",
         "nbbudget/backends/dask/branches.py", "nbbudget/backends/dask/runner.py")


def test_mypy_checks_that_the_dask_backend_implements_every_protocol_in_full() -> None:
    """``mypy --strict`` reads the typed assignments of the backend (``RUNS: ClusterRuns``,
    ``CALLS: ClusterCalls``, ``type[Ledger] = DaskLedger``, ``type[JobRunner] = DaskRunner``)
    and finds nothing in the seams' files; DaskLedger and DaskRunner subclass no local one."""
    from nbbudget.backends.dask.ledger import DaskLedger
    from nbbudget.backends.dask.runner import DaskRunner
    from nbbudget.calls.runner import LocalRunner

    assert LocalLedger not in DaskLedger.__mro__ and LocalRunner not in DaskRunner.__mro__
    done = mypy(*SEAMS)
    errors = [line for line in done.stdout.splitlines() if line.startswith(SEAMS)]
    assert errors == [], done.stdout


def test_mypy_refuses_a_backend_that_lacks_part_of_a_protocol(tmp_path: Path) -> None:
    """The check can fail: a backend whose run side lacks ``joining`` is refused where it is
    assigned to ``RUNS``."""
    half = tmp_path / "half_backend.py"
    half.write_text(
        "from nbbudget.core.backends import Cluster, ClusterRuns\n\n\n"
        "class Half:\n"
        "    def cluster(self, cluster: object) -> Cluster:\n"
        "        raise NotImplementedError\n\n\n"
        "RUNS: ClusterRuns = Half()\n", encoding="utf-8")
    done = mypy(str(half))
    assert "half_backend.py:9: error: Incompatible types in assignment" in done.stdout, (
        done.stdout)
    assert re.search(r"half_backend\.py:9: note: +joining$", done.stdout, re.M), done.stdout
