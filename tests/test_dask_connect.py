"""A call that names its cluster by address keeps its budget while the first connection is made
(S0-1): the connection is made on a thread of its own, and a scheduler that has not answered
when the budget runs out is answered with ``cluster_unanswered``, nothing run; the connection
goes on, and the next call uses it. A caller with no budget waits for the connection, and is
given its error when it fails. Real clock, a real socket and a real in-process cluster.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from conftest import dask_cluster, wait_for

pytest.importorskip("distributed")

import nbbudget as nb
from nbbudget.core.dask_ledger import on_cluster

pytestmark = pytest.mark.realclock


def connecting() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("nbbudget-connect-")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_S0_1_a_first_call_to_a_scheduler_not_up_yet_answers_in_budget_and_the_next_uses_it(
        home: Any) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    ran: list[int] = []
    started = time.monotonic()
    response = nb.call(ran.append, 1, detach=True, budget="200ms", cluster=address)
    took = time.monotonic() - started
    print(f"\nanswered in {took * 1000:.0f} ms on a 200 ms budget")
    assert took < 0.2 + 0.3
    assert response.exit_code == 1 and not response.ok
    assert response.error["code"] == "cluster_unanswered"
    assert address in response.error["message"] and "200 ms" in response.error["message"]
    assert isinstance(response.refusal, nb.ClusterUnanswered)
    assert response.meta["budget_ms"] == 200
    assert ran == []  # nothing ran
    assert len(connecting()) == 1  # the connection goes on
    again = nb.call(ran.append, 2, detach=True, budget="100ms", cluster=address)
    assert again.error["code"] == "cluster_unanswered" and ran == []
    assert len(connecting()) == 1  # the same connection, not a second one
    # the scheduler comes up: the connection, still trying, is made, and serves the next call
    with dask_cluster(processes=False, scheduler_port=port, n_workers=1, threads_per_worker=1):
        try:
            assert wait_for(lambda: not connecting(), 20)
            answered = nb.call(lambda: "ran", detach=True, budget="30s", cluster=address)
            assert answered.ok and answered.data == "ran", answered
            assert connecting() == []  # no new connection
        finally:
            on_cluster(address).client.close()


def test_a_run_on_an_address_waits_for_its_connection(dask_client: Any) -> None:
    address = dask_client.scheduler.address
    with nb.budget(steps=3, cluster=address) as run:  # no call budget: as long as it takes
        run.step()
    try:
        assert run.consumed["steps"] == 1
    finally:
        on_cluster(address).client.close()
