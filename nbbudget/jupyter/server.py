"""The Jupyter server extension: the jobs and notebook runs of the server user's store over
REST, for JupyterLab's Budgets panel and status bar, behind the server's own authentication and
XSRF checks.

Enabled by ``jupyter-config/jupyter_server_config.d/nbbudget.json``, which the wheel installs
(``pip install 'nbbudget[lab]'``); ``jupyter server extension disable nbbudget.jupyter.server``
turns it off. The endpoints, under the server's base URL:

- ``GET /nbbudget/jobs``: every job and notebook run of the store (`nbbudget.calls.background`
  rows), newest first, each with ``kernel``: the id of this server's kernel that runs it, or
  null; ``?kernel=ID`` keeps that kernel's only (what the status bar counts).
- ``GET /nbbudget/jobs/ID``: one of them.
- ``POST /nbbudget/jobs/ID/cancel``: cancel it, and answer what happened (a `Cancel`:
  ``ended``, ``stopped``, ``finished`` or ``requested``), as ``nbbudget cancel`` and ``%budget
  cancel`` say it. A notebook run is cancelled through its row, which its runner reads; a job
  through the kernel that runs it, which this server asks with a silent request (a job of a
  process that is not one of this server's kernels is answered 409, naming it).

An id that is neither a job's nor a run's is 400, an unknown one 404, both naming it and
changing nothing; a store locked past its busy timeout is 503, a damaged one 500, each with
the store's own message and ``code``. The store is the one ``nbbudget jobs`` reads:
``NBBUDGET_HOME`` of the server's environment, else ``nbbudget`` in Jupyter's data directory.

The handlers run on the server's event loop and read the store there (a listing of 500 records
takes about 10 ms): the extension opens the store with a busy timeout of `BUSY_TIMEOUT_S`, so
a store another process keeps locked holds the server at most that long before it answers 503.
A cancel waits for a run to end, or for a kernel to answer, on the event loop, without holding
it; it starts no thread.
"""

from __future__ import annotations

import ast
import asyncio
import json
import queue
import time
from pathlib import Path
from typing import Any

import tornado.web
from jupyter_client.session import Session
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from ..calls import background as _background
from ..calls.jobs import JobState
from ..calls.run_store import Runs
from ..calls.store import SQLiteStore, StoreBusy, StoreDamaged, home
from ..core.errors import ConfigError

__all__ = ["own_client"]

#: how long a statement of the server's on the store waits for a lock another process holds
#: (SQLite's busy timeout) before the request is answered 503: the event loop waits with it
BUSY_TIMEOUT_S = 1.0
#: how long a cancel waits for the kernel that runs the job to answer; a kernel busy with a
#: cell answers when the cell ends, and the cancel is then answered ``requested``
KERNEL_ANSWER_S = 5.0
_POLL_S = 0.05
#: what the kernel runs to cancel one of its jobs: a user expression of a silent request
_CANCEL_EXPRESSION = ("__import__('nbbudget.calls.background', fromlist=['cancel_here'])"
                      ".cancel_here({job_id!r})")


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbbudget.jupyter.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    web_app = serverapp.web_app
    web_app.settings["nbbudget_stores"] = {}
    base = url_path_join(web_app.settings["base_url"], "nbbudget")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "jobs"), _JobsHandler),
        (url_path_join(base, "jobs", "([^/]+)"), _JobHandler),
        (url_path_join(base, "jobs", "([^/]+)", "cancel"), _CancelHandler),
    ])
    serverapp.log.info("nbbudget: the store's jobs and runs are served at %s", base)


class _Handler(APIHandler):
    """What every endpoint shares: the store, the kernels of this server, JSON answers. The
    jobs are the kernels' work, so a server's authorizer (JupyterHub's scopes, say) decides
    on them as on the kernels: reading them is ``read`` on ``kernels``, a cancel, which has
    the kernel run code, ``execute``."""

    auth_resource = "kernels"

    def _answer(self, status: int, payload: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._answer(status, {"message": message, "code": code})

    def _store(self) -> SQLiteStore | None:
        """The store, or None once the refusal is answered. One per folder for the server's
        life, opened with the short busy timeout; a store that cannot be opened (damaged) is
        tried again at the next request."""
        stores: dict[Path, SQLiteStore] = self.settings["nbbudget_stores"]
        folder = home().resolve()
        found = stores.get(folder)
        if found is None:
            try:
                found = stores[folder] = SQLiteStore(folder, busy_timeout_s=BUSY_TIMEOUT_S)
            except ConfigError as exc:
                self._store_refused(exc)
                return None
        return found

    def _store_refused(self, exc: ConfigError) -> None:
        if isinstance(exc, StoreBusy):
            self.set_header("Retry-After", "5")
            self._refuse(503, str(exc), exc.code)
        elif isinstance(exc, StoreDamaged):
            self._refuse(500, str(exc), exc.code)
        else:
            self._refuse(500, str(exc), "store_unavailable")

    def _kernels(self) -> dict[int, str]:
        """The kernels of this server that run as a process here, by pid."""
        manager = self.kernel_manager
        found = {}
        for kernel_id in manager.list_kernel_ids():
            pid = getattr(manager.get_kernel(kernel_id).provisioner, "pid", None)
            if isinstance(pid, int):
                found[pid] = kernel_id
        return found

    def _shown(self, row: dict[str, Any], kernels: dict[int, str]) -> dict[str, Any]:
        """*row* as the panel reads it: with the id of this server's kernel that runs a job,
        and a run's saved notebook as a path under the server's root (what JupyterLab opens),
        null when it is saved outside the root."""
        return {**row, "kernel": kernels.get(row["pid"]) if row["kind"] == "job" else None,
                "output_path": _under_root(row.get("output"),
                                           self.settings.get("server_root_dir"))}

    def _checked_id(self, item_id: str) -> bool:
        why = _background.check_id(item_id)
        if why is not None:
            self._refuse(400, why, "bad_id")
        return why is None

    def _unknown(self, item_id: str, db: SQLiteStore) -> None:
        self._refuse(404, f"no job or notebook run {item_id!r} in the store at {db.location}; "
                          f"GET /nbbudget/jobs lists them", "unknown_id")


class _JobsHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    def get(self) -> None:
        kernel = self.get_argument("kernel", None)
        if kernel is not None and kernel not in self.kernel_manager:
            self._refuse(404, f"no kernel {kernel!r} in this server; GET /api/kernels lists "
                              f"them", "unknown_kernel")
            return
        db = self._store()
        if db is None:
            return
        try:
            rows = _background.rows(db)
        except ConfigError as exc:
            self._store_refused(exc)
            return
        kernels = self._kernels()
        shown = [self._shown(row, kernels) for row in rows]
        if kernel is not None:
            shown = [row for row in shown if row["kernel"] == kernel]
        self._answer(200, shown)


class _JobHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    def get(self, item_id: str) -> None:
        if not self._checked_id(item_id):
            return
        db = self._store()
        if db is None:
            return
        try:
            row = _background.find(db, item_id)
        except ConfigError as exc:
            self._store_refused(exc)
            return
        if row is None:
            self._unknown(item_id, db)
            return
        self._answer(200, self._shown(row, self._kernels()))


class _CancelHandler(_Handler):
    # (authorized with an action is typed as returning a method, not a decorator)
    @tornado.web.authenticated
    @authorized(action="execute")  # type: ignore[untyped-decorator]
    async def post(self, item_id: str) -> None:
        if not self._checked_id(item_id):
            return
        db = self._store()
        if db is None:
            return
        try:
            row = _background.find(db, item_id)
            if row is None:
                self._unknown(item_id, db)
            elif row["kind"] == "run":
                self._answer(200, (await self._cancel_run(Runs(db), item_id)).to_dict())
            else:
                await self._cancel_job(row)
        except ConfigError as exc:
            self._store_refused(exc)

    async def _cancel_run(self, runs: Runs, run_id: str) -> _background.Cancel:
        """As ``nbbudget cancel`` does, waiting on the event loop, not blocking it."""
        record = runs.get(run_id)
        assert record is not None  # a run is never deleted while it can be cancelled
        ended = _background.run_ended(runs, record)
        if ended is not None:
            return ended
        runs.request_cancel(run_id)
        until = time.monotonic() + _background.CANCEL_WAIT_S
        while not record.state.final and time.monotonic() < until:
            await asyncio.sleep(_POLL_S)
            record = runs.check(runs.get(run_id) or record)
        return _background.run_cancelled(record)

    async def _cancel_job(self, row: dict[str, Any]) -> None:
        """Carry the cancel to the kernel that runs the job, and answer what it says."""
        if not row["cancellable"]:
            self._answer(200, _background.job_ended(row["id"], row["state"]).to_dict())
            return
        kernel_id = self._kernels().get(row["pid"])
        if kernel_id is None:
            self._refuse(409, f"job {row['id']} runs in process {row['pid']}, which is not a "
                              f"kernel of this Jupyter server; cancel it where it runs: "
                              f"%budget cancel {row['id']}", "not_this_server")
            return
        answer = await _ask_kernel(self.kernel_manager.get_kernel(kernel_id), row["id"])
        if answer is None:
            self._answer(200, _background.Cancel(
                row["id"], "job", "requested", JobState.RUNNING.value,
                f"cancel requested for job {row['id']}; its kernel is busy and takes the "
                f"cancel when its running cell ends (see %budget jobs)").to_dict())
        elif "outcome" in answer:
            self._answer(200, answer)
        else:
            self._refuse(502, f"the kernel of job {row['id']} could not cancel it: "
                              f"{answer['error']}", "kernel_error")


def _under_root(path: str | None, root: str | None) -> str | None:
    """*path* relative to the server's root folder *root*, with ``/`` between its parts (the
    contents API's paths), or None when either is missing or *path* lies outside *root*."""
    if not path or not root:
        return None
    try:
        inside = Path(path).resolve().relative_to(Path(root).expanduser().resolve())
    except ValueError:
        return None
    return inside.as_posix()


def own_client(kernel: Any) -> Any:
    """A client of the server's *kernel* (its kernel manager) with a session of its own: a
    client made with the manager's session would share its identity on the kernel's shell
    socket with every other such client, and the kernel's replies to one could go to another.
    The tests of the extension talk to the server's kernels through it too."""
    session = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme,
                      packer=kernel.session.packer, unpacker=kernel.session.unpacker,
                      username="nbbudget")
    return kernel.client(session=session)


async def _ask_kernel(kernel: Any, job_id: str) -> dict[str, str] | None:
    """Ask *kernel* to cancel its job *job_id* (`nbbudget.calls.background.cancel_here`, as a
    user expression of a silent request: nothing shows in the notebook, nothing goes in its
    history); the `Cancel` it answers as a dict, ``{"error": ...}`` when the expression failed,
    or None when it did not answer within `KERNEL_ANSWER_S` (a cell holds it)."""
    client = own_client(kernel)
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    try:
        msg_id = client.execute("", silent=True, store_history=False, allow_stdin=False,
                                user_expressions={"cancel": _CANCEL_EXPRESSION.format(
                                    job_id=job_id)})
        until = time.monotonic() + KERNEL_ANSWER_S
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                reply = await client.get_shell_msg(timeout=left)
            except queue.Empty:
                return None
            if reply["parent_header"].get("msg_id") == msg_id:
                break
    finally:
        client.stop_channels()
    value = reply["content"].get("user_expressions", {}).get("cancel", {})
    if value.get("status") != "ok":
        return {"error": f"{value.get('ename')}: {value.get('evalue')}" if value
                else "the kernel evaluated nothing (is nbbudget installed in it?)"}
    answer: dict[str, str] = ast.literal_eval(value["data"]["text/plain"])
    return answer

