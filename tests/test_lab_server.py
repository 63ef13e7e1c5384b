"""The Jupyter server extension (`nbbudget.jupyter.server`): the store's jobs and notebook runs
over REST, in a real Jupyter server (pytest-jupyter's ``jp_fetch``), with the server's own
token and XSRF checks; a real kernel of that server makes a detached job, the real ``nbbudget
run`` command a notebook run in the background, and a cancel of each reaches its owner (the
kernel, the runner process) and answers what happened, as ``nbbudget cancel`` and ``%budget
cancel`` say it.

pytest-jupyter's fixtures are imported here, not made a plugin of the whole suite: its autouse
fixtures (an event loop per test, the server's cleanup) then apply to this module only, whose
tests drive the server's event loop themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.auth import Authorizer
from pytest_jupyter.jupyter_server import *  # noqa: F403  (its fixtures, for this module only)
from tornado.httpclient import HTTPClientError

import nbbudget as nb
from nbbudget.calls.run_store import runner_alive
from nbbudget.jupyter.server import own_client

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.realclock


@pytest.fixture
def jp_server_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The server with nbbudget's extension enabled, as its config file in the wheel does;
    with the authorizer a test gives (``indirect``), if any."""
    config = json.loads((REPO / "jupyter-config/jupyter_server_config.d/nbbudget.json")
                        .read_text())
    authorizer = getattr(request, "param", None)
    if authorizer is not None:
        config["ServerApp"]["authorizer_class"] = authorizer
    return dict(config)


class ReadOnly(Authorizer):
    """A server's authorizer that lets its users read and nothing more (as JupyterHub's scopes
    can)."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return action == "read"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store of the test's own (conftest's, in a folder of its own name: pytest-jupyter's
    ``jp_home_dir`` is ``tmp_path / "home"``), a non-interactive caller, no budget in the
    environment."""
    folder = tmp_path / "store"
    monkeypatch.setenv("NBBUDGET_HOME", str(folder))
    monkeypatch.setenv("NBBUDGET_INTERACTIVE", "0")
    monkeypatch.delenv("AGENT_CALL_BUDGET_MS", raising=False)
    return folder


@dataclass
class Answer:
    """What the server answered: its status, its JSON body and its headers."""

    code: int
    body: Any
    headers: Any


class Server:
    """The test's view of the server: requests made on its event loop, answered in full."""

    def __init__(self, app: Any, fetch: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.fetch = fetch
        self.loop = loop

    def request(self, *parts: str, method: str = "GET", **kwargs: Any) -> Answer:
        if method == "POST":
            kwargs.setdefault("body", b"")
        async def fetch() -> Any:  # made on the running loop: an earlier test's asyncio.run
            return await self.fetch(*parts, method=method, request_timeout=60,  # left none set
                                    **kwargs)

        try:
            response = self.loop.run_until_complete(fetch())
        except HTTPClientError as exc:
            response = exc.response
            assert response is not None, exc
        body = json.loads(response.body) if response.body else None
        return Answer(response.code, body, response.headers)

    def get(self, *parts: str, **kwargs: Any) -> Answer:
        return self.request("nbbudget", *parts, **kwargs)

    def cancel(self, item_id: str, **kwargs: Any) -> Answer:
        return self.request("nbbudget", "jobs", item_id, "cancel", method="POST", **kwargs)

    def start_kernel(self) -> str:
        started = self.request("api", "kernels", method="POST",
                               body=json.dumps({"name": "python3"}))
        assert started.code == 201, started.body
        return str(started.body["id"])

    def execute(self, kernel_id: str, code: str, **expressions: str) -> dict[str, Any]:
        """Run *code* in the server's kernel *kernel_id*, as a notebook does, then evaluate
        *expressions* there; what each gives (its ``repr``), ``status`` the reply's."""
        return self.loop.run_until_complete(
            self._execute(kernel_id, textwrap.dedent(code), expressions))

    async def _execute(self, kernel_id: str, code: str,
                       expressions: dict[str, str]) -> dict[str, Any]:
        client = own_client(self.app.kernel_manager.get_kernel(kernel_id))
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)
        try:
            msg_id = client.execute(code, user_expressions=expressions)
            reply = await client.get_shell_msg(timeout=60)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = await client.get_shell_msg(timeout=60)
        finally:
            client.stop_channels()
        content = reply["content"]
        values = {name: value.get("data", {}).get("text/plain", value)
                  for name, value in content.get("user_expressions", {}).items()}
        return {"status": content["status"], **values}

    def wait_for(self, condition: Any, seconds: float = 30) -> None:
        """Let the server run until *condition* holds."""
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, "the condition never held"
            self.loop.run_until_complete(asyncio.sleep(0.05))


@pytest.fixture
def server(home: Path, jp_serverapp: Any, jp_fetch: Any, jp_asyncio_loop: Any) -> Server:
    """A Jupyter server with the extension, whose user's store is the test's own (``home``)."""
    return Server(jp_serverapp, jp_fetch, jp_asyncio_loop)


@pytest.fixture
def runners(home: Path) -> Iterator[None]:
    """Runners of ``nbbudget run`` left alive by a failed test are killed after it (their
    kernels follow them)."""
    yield
    pids: list[tuple[int]] = []
    with suppress(sqlite3.DatabaseError), closing(sqlite3.connect(home / "nbbudget.db")) as db:
        pids = db.execute("SELECT pid FROM notebook_runs WHERE pid IS NOT NULL").fetchall()
    for (pid,) in pids:
        if runner_alive(pid):
            os.kill(pid, signal.SIGKILL)


#: a detached job in the kernel: its work checks its budget every 20 ms until it is cancelled
#: (or two minutes pass)
DETACH = """\
    import time
    import nbbudget as nb

    def train():
        run = nb.current()
        for _ in range(6000):
            time.sleep(0.02)
            run.step()
        return "trained"

    resp = nb.call(train, detach=True, budget="50ms")
"""


def detached_job(server: Server, kernel_id: str) -> str:
    """A job detached in the kernel *kernel_id*, once its record is in the store."""
    reply = server.execute(kernel_id, DETACH, job="resp.data['job']",
                           state="resp.data['state']")
    assert (reply["status"], reply["state"]) == ("ok", "'running'"), reply
    job_id = reply["job"].strip("'")
    server.wait_for(lambda: server.get("jobs", job_id).code == 200)
    return job_id


def background_run(server: Server, home: Path, folder: Path, seconds: float = 60) -> str:
    """A notebook run that ``nbbudget run`` left going on in the background, once it runs its
    long cell: its id."""
    notebook = folder / "slow.ipynb"
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": source} for source in ("import time", f"time.sleep({seconds})")]
    notebook.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}}}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGENT_CALL_BUDGET_MS", "NBBUDGET_INTERACTIVE", "PYTEST_CURRENT_TEST")}
    env["NBBUDGET_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "nbbudget", "run", notebook.name, "--budget",
                           "1s", "--json"], env=env, cwd=folder, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 14, done.stdout + done.stderr
    run_id = str(json.loads(done.stdout)["data"]["job"])
    server.wait_for(lambda: server.get("jobs", run_id).body["cell"] == 1, seconds=60)
    return run_id


def unmoving(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """*rows* less what moves by itself while a job runs (``elapsed_s``)."""
    return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in rows]


# -- listing ----------------------------------------------------------------------------------
def test_the_list_has_a_kernels_detached_job_and_a_background_notebook_run(
        server, home, jp_root_dir, runners):
    kernel_id = server.start_kernel()
    job_id = detached_job(server, kernel_id)
    run_id = background_run(server, home, jp_root_dir)  # in the server's root: it can open it
    kernel_pid = server.app.kernel_manager.get_kernel(kernel_id).provisioner.pid

    listed = server.get("jobs")
    assert listed.code == 200
    assert listed.headers["Content-Type"] == "application/json"
    rows = {row["id"]: row for row in listed.body}
    assert set(rows) == {job_id, run_id}
    assert [row["id"] for row in listed.body] == [run_id, job_id]  # newest first
    job, run = rows[job_id], rows[run_id]
    assert {k: job[k] for k in ("kind", "state", "name", "pid", "kernel", "error", "output",
                                "cancellable", "ended")} == {
        "kind": "job", "state": "running", "name": "train", "pid": kernel_pid,
        "kernel": kernel_id, "error": None, "output": None, "cancellable": True, "ended": None}
    assert run["kind"] == "run" and run["state"] == "running" and run["kernel"] is None
    assert run["name"] == str(jp_root_dir / "slow.ipynb")
    assert run["output"] == str(jp_root_dir / "slow.out.ipynb")
    assert run["output_path"] == "slow.out.ipynb"  # as the contents API names it
    assert job["output_path"] is None
    assert run["mode"] == "detach" and run["cells"] == 2 and run["cancellable"] is True
    assert isinstance(run["pid"], int) and runner_alive(run["pid"])
    for row in (job, run):
        assert row["started"].endswith("Z") and row["elapsed_s"] > 0
    assert run["heartbeat"].endswith("Z")  # the runner's last word, at its last cell

    mine = server.get("jobs", params={"kernel": kernel_id}).body  # what the status bar counts
    assert [row["id"] for row in mine] == [job_id]
    assert server.get("jobs", job_id).body["id"] == job_id
    assert server.get("jobs", run_id).body["id"] == run_id

    assert server.cancel(job_id).body["outcome"] == "stopped"  # nothing left running
    assert server.cancel(run_id).body["outcome"] == "stopped"


# -- cancel -----------------------------------------------------------------------------------
def test_a_cancel_reaches_the_kernel_that_runs_the_job_which_stops_at_a_budget_check(server):
    kernel_id = server.start_kernel()
    job_id = detached_job(server, kernel_id)

    cancelled = server.cancel(job_id)
    assert cancelled.code == 200
    assert cancelled.body == {"id": job_id, "kind": "job", "outcome": "stopped",
                              "state": "cancelled",
                              "message": f"job {job_id} stopped"}
    server.wait_for(lambda: server.get("jobs", job_id).body["state"] == "cancelled")
    row = server.get("jobs", job_id).body
    assert row["cancellable"] is False and row["ended"] is not None
    # the kernel says the same of its job
    reply = server.execute(kernel_id, "", cancel=f"nb.jobs[{job_id!r}].cancel_status",
                           state=f"nb.jobs[{job_id!r}].state.value")
    assert (reply["cancel"], reply["state"]) == ("'stopped'", "'cancelled'")

    again = server.cancel(job_id)
    assert again.code == 200
    assert again.body == {"id": job_id, "kind": "job", "outcome": "ended", "state": "cancelled",
                          "message": f"job {job_id} had already ended (cancelled); there was "
                                     f"nothing to cancel"}
    assert server.get("jobs", job_id).body == row  # nothing changed


def test_a_kernel_busy_with_a_cell_takes_the_cancel_when_the_cell_ends(server):
    kernel_id = server.start_kernel()
    job_id = detached_job(server, kernel_id)

    async def cancel_while_a_cell_runs() -> tuple[Any, float]:
        client = own_client(server.app.kernel_manager.get_kernel(kernel_id))
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)
        try:
            cell = client.execute("time.sleep(8)")
            started = time.monotonic()
            try:
                answer = await server.fetch("nbbudget", "jobs", job_id, "cancel",
                                            method="POST", body=b"", request_timeout=60)
            finally:
                answered_after = time.monotonic() - started
                reply = await client.get_shell_msg(timeout=60)
                while reply["parent_header"].get("msg_id") != cell:
                    reply = await client.get_shell_msg(timeout=60)
        finally:
            client.stop_channels()
        return answer, answered_after

    answer, answered_after = server.loop.run_until_complete(cancel_while_a_cell_runs())
    assert 4.5 < answered_after < 8  # the server waited 5 s, not for the cell
    assert json.loads(answer.body) == {
        "id": job_id, "kind": "job", "outcome": "requested", "state": "running",
        "message": f"cancel requested for job {job_id}; its kernel is busy and takes the "
                   f"cancel when its running cell ends (see %budget jobs)"}
    # the cell has ended: the kernel took the cancel, and the job stopped
    server.wait_for(lambda: server.get("jobs", job_id).body["state"] == "cancelled")
    reply = server.execute(kernel_id, "", cancel=f"nb.jobs[{job_id!r}].cancel_status")
    assert reply["cancel"] == "'stopped'"


def test_a_cancel_of_a_notebook_run_stops_its_running_cell_and_says_where(
        server, home, tmp_path, runners):
    run_id = background_run(server, home, tmp_path)

    cancelled = server.cancel(run_id)
    assert cancelled.code == 200
    output = tmp_path / "slow.out.ipynb"
    assert cancelled.body == {
        "id": run_id, "kind": "run", "outcome": "stopped", "state": "cancelled",
        "message": f"run {run_id} cancelled at cell 2 of 2; the notebook as far as it got is in "
                   f"{output}"}
    row = server.get("jobs", run_id).body
    assert (row["state"], row["cancellable"], row["heartbeat"]) == ("cancelled", False, None)
    assert row["output_path"] is None  # saved outside the server's root: it cannot be opened
    server.wait_for(lambda: not runner_alive(row["pid"]))  # the runner has ended

    again = server.cancel(run_id)
    assert again.body == {"id": run_id, "kind": "run", "outcome": "ended",
                          "state": "cancelled",
                          "message": f"run {run_id} has already ended: cancelled"}
    assert server.get("jobs", run_id).body == row  # nothing changed


def test_a_job_of_a_process_that_is_not_a_kernel_of_this_server_is_refused_naming_it(
        server, home):
    import threading

    release = threading.Event()
    resp = nb.call(release.wait, 60, detach=True, budget="20ms")  # this process's job
    job_id = resp.data["job"]
    try:
        server.wait_for(lambda: server.get("jobs", job_id).code == 200)
        before = unmoving(server.get("jobs").body)
        refused = server.cancel(job_id)
        assert refused.code == 409
        assert refused.body == {
            "code": "not_this_server",
            "message": f"job {job_id} runs in process {os.getpid()}, which is not a kernel "
                       f"of this Jupyter server; cancel it where it runs: %budget cancel "
                       f"{job_id}"}
        assert unmoving(server.get("jobs").body) == before
        assert not resp.job.done()
    finally:
        release.set()
        assert resp.job.result(timeout=10) is True


def test_a_job_whose_process_died_is_listed_lost_and_its_cancel_says_it_ended(server, home):
    script = textwrap.dedent("""\
        import os, sys, threading, time
        import nbbudget as nb
        resp = nb.call(threading.Event().wait, 60, detach=True, budget="20ms")
        print(resp.data["job"], flush=True)
        while not any(r["id"] == resp.data["job"] for r in nb.store().jobs()):
            time.sleep(0.02)
        os._exit(0)  # the process dies with its job running
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()

    row = server.get("jobs", job_id).body
    assert (row["state"], row["cancellable"], row["ended"], row["elapsed_s"]) == (
        "lost", False, None, None)
    cancelled = server.cancel(job_id)
    assert cancelled.body == {"id": job_id, "kind": "job", "outcome": "ended", "state": "lost",
                              "message": f"job {job_id} had already ended (lost); there was "
                                         f"nothing to cancel"}
    assert server.get("jobs", job_id).body == row


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_unknown_id_is_404_and_a_malformed_one_400_each_naming_it_and_changing_nothing(
        server, home, method):
    assert server.get("jobs").body == []
    ask = server.cancel if method == "POST" else (lambda item: server.get("jobs", item))
    unknown = ask("run-0123abcd")
    assert unknown.code == 404
    assert unknown.body == {
        "code": "unknown_id",
        "message": f"no job or notebook run 'run-0123abcd' in the store at "
                   f"{home / 'nbbudget.db'}; GET /nbbudget/jobs lists them"}
    assert ask("1a2b-3").code == 404
    malformed = ask("job 3; drop")
    assert malformed.code == 400
    assert malformed.body == {
        "code": "bad_id",
        "message": "'job 3; drop' is not the id of a job (such as 1a2b-3) or of a notebook run "
                   "(such as run-1a2b3c4d); GET /nbbudget/jobs lists them"}
    assert ask("RUN-0123ABCD").code == 400
    assert server.get("jobs").body == []


def test_an_unknown_kernel_is_404_naming_it(server):
    refused = server.get("jobs", params={"kernel": "no-such-kernel"})
    assert refused.code == 404
    assert refused.body == {"code": "unknown_kernel", "message": "no kernel 'no-such-kernel' in "
                            "this server; GET /api/kernels lists them"}


def test_a_damaged_store_is_a_500_with_its_message_and_code(server, home):
    home.mkdir(mode=0o700)
    (home / "secret").write_bytes(b"x" * 32)
    (home / "nbbudget.db").write_bytes(b"")
    for answer in (server.get("jobs"), server.get("jobs", "run-0123abcd"),
                   server.cancel("run-0123abcd")):
        assert answer.code == 500
        assert answer.body["code"] == "store_damaged"
        assert answer.body["message"].startswith(
            f"the nbbudget store {str(home / 'nbbudget.db')!r} is damaged: it is empty")
    assert (home / "nbbudget.db").read_bytes() == b""  # left as it is


def test_a_store_locked_by_another_process_is_a_503_within_a_second(server, home):
    assert server.get("jobs").body == []  # the store is made
    locker = sqlite3.connect(home / "nbbudget.db", isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")  # a write that hangs, in another connection
        started = time.monotonic()
        busy = server.get("jobs")
        waited = time.monotonic() - started
        assert busy.code == 503
        assert busy.headers["Retry-After"] == "5"
        assert busy.body["code"] == "store_busy"
        assert busy.body["message"].startswith(
            f"the nbbudget store {str(home / 'nbbudget.db')!r} stayed locked for 1 s by ")
        assert 0.9 < waited < 5  # the server's own busy timeout, not the store's 10 s
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert server.get("jobs").code == 200


# -- the server's own checks ------------------------------------------------------------------
def test_a_request_without_the_token_is_refused(server):
    for answer in (server.get("jobs", headers={"Authorization": ""}),
                   server.get("jobs", "run-0123abcd", headers={"Authorization": ""}),
                   server.cancel("run-0123abcd", headers={"Authorization": ""})):
        assert answer.code == 403
    assert server.get("jobs", headers={"Authorization": "token not-the-token"}).code == 403


@pytest.mark.parametrize("jp_server_config", [ReadOnly], indirect=True)
def test_the_servers_authorizer_decides_as_for_kernels_reading_is_not_cancelling(server, home):
    import threading

    release = threading.Event()
    resp = nb.call(release.wait, 60, detach=True, budget="20ms")
    job_id = resp.data["job"]
    try:
        server.wait_for(lambda: server.get("jobs", job_id).code == 200)
        assert [row["id"] for row in server.get("jobs").body] == [job_id]
        refused = server.cancel(job_id)
        assert refused.code == 403
        assert not resp.job.done() and server.get("jobs", job_id).body["state"] == "running"
    finally:
        release.set()
        assert resp.job.result(timeout=10) is True


def test_a_post_with_the_login_cookie_but_without_the_xsrf_token_is_refused(server):
    token = server.app.identity_provider.token
    logged_in = server.get("jobs", params={"token": token}, headers={"Authorization": ""})
    assert logged_in.code == 200
    cookies = [c.split(";")[0] for c in logged_in.headers.get_list("Set-Cookie")]
    login = next(c for c in cookies if c.startswith("username-"))
    browser = {"Authorization": "", "Cookie": login}
    assert server.get("jobs", headers=browser).code == 200  # the cookie logs in

    refused = server.cancel("run-0123abcd", headers=browser)
    assert refused.code == 403
    assert "_xsrf" in refused.body["message"]
    xsrf = "5f" * 16
    allowed = server.cancel("run-0123abcd", headers={
        "Authorization": "", "Cookie": f"{login}; _xsrf={xsrf}", "X-XSRFToken": xsrf})
    assert allowed.code == 404  # past the checks: the run is unknown
    assert urllib.parse.unquote(allowed.body["message"]).startswith(
        "no job or notebook run 'run-0123abcd'")
