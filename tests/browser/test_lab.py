"""The quickstart in JupyterLab, in a real browser: the ``%%budget`` panel renders with its bars
and, once finished, no button; a detached cell's late output appears under that cell; Stop on
the panel of a cell that is running stops it at once, even a loop that never calls nbbudget,
and Stop on the panel of a running background job stops it; a panel names each of its axes
whole. Then what-if.ipynb, in a server of its own: a slider of the what-if
explorer moved with the keyboard changes the verdict under it to the kernel's.

Run with ``bash scripts/browser.sh``: JupyterLab on 127.0.0.1 (a free port, no token, a
temporary root, workspace and settings), its kernels started as ``bash scripts/lab.sh`` starts
them (nbbudget loaded at kernel start), driven through ``window.jupyterapp`` by Playwright with
the system's Chromium. Screenshots are saved to ``tests/browser/artifacts/`` (``lab.png``,
``what-if.png``; or the folder in ``NBBUDGET_BROWSER_ARTIFACTS``).

Where Playwright, JupyterLab or ``/usr/bin/chromium`` is missing the tests are skipped, unless
``NBBUDGET_BROWSER_REQUIRED=1``: then that is a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
KERNELS = REPO / "scripts" / "jupyter"  # the kernel of scripts/lab.sh: nbbudget loaded at start
CHROMIUM = os.environ.get("NBBUDGET_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("NBBUDGET_BROWSER_ARTIFACTS")
                 or Path(__file__).parent / "artifacts")
REQUIRED = os.environ.get("NBBUDGET_BROWSER_REQUIRED") == "1"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--disable-quic",
]
CELL_SECONDS = 30  # the longest one cell of the quickstart may take here

#: cells the test appends to its copy of the quickstart, which has no long-running job to stop
TAG = "browser-test"
STOP_CELL = """\
%%budget --detach --budget 1s --steps 1000
import time
for tick in range(600):          # about a minute, unless stopped
    nb.current().step()
    time.sleep(0.1)
"""
FOREGROUND_CELL = """\
%%budget --steps 300 --time 60s
import time
for tick in range(300):          # thirty seconds, unless stopped
    nb.current().step()
    time.sleep(0.1)
"""
STOP_RUNS = 3  # the foreground cell is stopped this many times, each 2 s into it
#: a loop that never calls nbbudget, with no limit: only Stop ends it (N-5)
LOOP_CELL = """\
%%budget
while True:                      # never checks: until stopped
    pass
"""
#: one Stop of LOOP_CELL must end it within a second; the margin is a busy 2-core machine's
LOOP_STOP_S = 1.0
LOOP_MARGIN_S = 1.0
#: a panel whose axes have long names
AXES_CELL = """\
%%budget --provider-calls 10 --agent-invocations 5 --tool-calls 3 --steps 10
nb.current().step()
"""
JOBS_CELL = """\
import json
print("jobs:", json.dumps({job.id: job.state.value for job in nb.jobs}))
"""


# -- what the page is asked -----------------------------------------------------------------
NOTEBOOK_READY = """(path) => {
    const panel = window.jupyterapp?.shell?.currentWidget;
    const kernel = panel?.sessionContext?.session?.kernel;
    return panel?.context?.path === path && !!kernel && kernel.status === 'idle'
        && kernel.connectionStatus === 'connected' && panel.content.widgets.length > 0;
}"""
# Not awaited: the command's promise resolves only when the cell has run.
RUN_CELL = """(index) => {
    const notebook = window.jupyterapp.shell.currentWidget.content;
    notebook.activeCellIndex = index;
    notebook.deselectAll();
    window.jupyterapp.commands.execute('notebook:run-cell');
}"""
CELL_DONE = """(index) => {
    const model = window.jupyterapp.shell.currentWidget.content.widgets[index].model;
    return model.executionCount !== null && model.executionState !== 'running';
}"""
STDOUT = """(index) => window.jupyterapp.shell.currentWidget.content.widgets[index].model
    .outputs.toJSON().filter(o => o.output_type === 'stream' && o.name === 'stdout')
    .map(o => Array.isArray(o.text) ? o.text.join('') : o.text).join('')"""
SCROLL_TO = """(index) => {
    window.jupyterapp.shell.currentWidget.content.widgets[index].node.scrollIntoView(
        {block: 'start'});
}"""
KERNEL_NAME = "() => window.jupyterapp.shell.currentWidget.sessionContext.kernelDisplayName"
CELLS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell => ({
    type: cell.model.type, source: cell.model.sharedModel.getSource(),
    tags: cell.model.getMetadata('tags') || [],
}))"""


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (NBBUDGET_BROWSER_REQUIRED=1: the browser test must run)",
                    pytrace=False)
    pytest.skip(reason)


def _check_requirements() -> None:
    for module, package in (("playwright", "playwright"), ("jupyterlab", "jupyterlab"),
                            ("jupyterlab_widgets", "jupyterlab_widgets")):
        if importlib.util.find_spec(module) is None:
            _missing(f"{package} is not installed (pip install -e '.[browser]')")
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    if not QUICKSTART.is_file():
        pytest.fail(f"no quickstart notebook at {QUICKSTART}", pytrace=False)


# -- the server ---------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quickstart_copy(root: Path) -> str:
    """The quickstart without its stored outputs, plus the test's own cells; its name."""
    import nbformat

    nb = nbformat.read(QUICKSTART, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for source in (STOP_CELL, FOREGROUND_CELL, LOOP_CELL, AXES_CELL, JOBS_CELL):
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": [TAG]}))
    nbformat.write(nb, root / QUICKSTART.name)
    return QUICKSTART.name


def _settings(folder: Path) -> None:
    """No news toast over the page, and every cell attached to the DOM."""
    overrides = {
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "notebook-extension/tracker": {"windowingMode": "none"},
    }
    for name, values in overrides.items():
        path = folder / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class Lab:
    """JupyterLab in a process group of its own; its kernels are found by the runtime folder
    their connection files are in, so that every one of them is stopped at the end."""

    def __init__(self, tmp: Path, token: str = "") -> None:
        self.tmp = tmp
        self.token = token  # with one, the server's XSRF checks are on too
        self.root = tmp / "root"
        self.runtime = tmp / "runtime"
        self.log = tmp / "lab.log"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for name in ("root", "runtime", "workspaces", "settings", "config", "ipython", "home"):
            (self.tmp / name).mkdir()
        _settings(self.tmp / "settings")
        env = {k: v for k, v in os.environ.items()
               if k not in ("NBBUDGET_INTERACTIVE", "AGENT_CALL_BUDGET_MS")}
        env.update(
            JUPYTER_PATH=os.pathsep.join(filter(None, [str(KERNELS), env.get("JUPYTER_PATH")])),
            JUPYTER_CONFIG_DIR=str(self.tmp / "config"), JUPYTER_RUNTIME_DIR=str(self.runtime),
            IPYTHONDIR=str(self.tmp / "ipython"), NBBUDGET_HOME=str(self.tmp / "home"),
        )
        command = [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            "--ServerApp.password=", f"--ServerApp.disable_check_xsrf={not self.token}",
            f"--ServerApp.root_dir={self.root}",
            f"--LabApp.workspaces_dir={self.tmp / 'workspaces'}",
            f"--LabApp.user_settings_dir={self.tmp / 'settings'}",
            "--LabApp.expose_app_in_browser=True",
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, env=env, cwd=self.root, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{self.log_tail()}", pytrace=False)
            time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.request("api/status"), timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def request(self, path: str, method: str = "GET", token: bool = True) -> Any:
        """A request to the server's *path*, with its token unless *token* is false."""
        headers = {"Authorization": f"token {self.token}"} if token and self.token else {}
        return urllib.request.Request(f"{self.url}/{path}", method=method, headers=headers)

    def stop(self) -> list[int]:
        """Shut the server down (it shuts its kernels down), then kill what is left of it;
        the kernel processes that had to be killed."""
        if self.process is None:
            return []
        with contextlib.suppress(OSError):
            urllib.request.urlopen(self.request("api/shutdown", method="POST"), timeout=5).close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        left = self.kernels()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    def kernels(self) -> list[int]:
        """The processes still running with a connection file of this server."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if str(self.runtime).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
        return found

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


# -- the page -----------------------------------------------------------------------------------
class Notebook:
    """The open notebook: run cells by index through JupyterLab's commands, read the DOM."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.cells: list[dict[str, Any]] = []
        self.stdout_at_end: dict[int, str] = {}  # what a cell had printed when it had run

    def open(self, url: str, path: str) -> None:
        """Open the notebook and wait until its kernel is ready."""
        self.page.set_default_timeout(20_000)
        self.page.goto(url)
        self.page.wait_for_function(NOTEBOOK_READY, arg=path, timeout=30_000)
        toast = self.page.locator(".Toastify__toast")
        if toast.count():  # a notification over the page, although the settings ask for none
            toast.locator("button").last.click()
        self.cells = self.page.evaluate(CELLS)
        kernel = self.page.evaluate(KERNEL_NAME)
        assert kernel == "Python 3 (nbbudget)", f"the kernel of scripts/jupyter, not {kernel!r}"

    def cell(self, index: int) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def outputs(self, index: int) -> Any:
        return self.cell(index).locator(".jp-OutputArea-output")

    def stdout(self, index: int) -> str:
        found = self.cell(index).locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stdout']")
        return "\n".join(text.rstrip("\n") for text in found.all_inner_texts())

    def status(self, index: int) -> str:
        """The state line of the cell's panel."""
        return str(self.outputs(index).locator(".widget-html").first.inner_text())

    def run(self, index: int) -> float:
        """Run one cell, wait until it has run; the seconds it took."""
        started = time.monotonic()
        self.page.evaluate(RUN_CELL, index)
        self.page.wait_for_function(CELL_DONE, arg=index, timeout=CELL_SECONDS * 1000)
        self.stdout_at_end[index] = self.page.evaluate(STDOUT, index)
        return time.monotonic() - started

    def find(self, predicate: Any, what: str) -> int:
        for index, cell in enumerate(self.cells):
            if cell["type"] == "code" and predicate(cell["source"], cell["tags"]):
                return index
        raise AssertionError(f"the quickstart has no {what}")

    def screenshot(self, name: str, index: int | None = None) -> Path:
        """Save the page, scrolled to cell *index* if given, under ARTIFACTS."""
        if index is not None:
            self.page.evaluate(SCROLL_TO, index)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        path.write_bytes(self.page.screenshot())  # (with path=, Playwright starts threads)
        return path


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Notebook]:
    """The quickstart open in Chromium, every code cell run in order but the test's last one.
    The server, its kernels and the browser are stopped at the end, whatever happened."""
    _check_requirements()
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    lab = Lab(tmp_path_factory.mktemp("lab"))
    playwright = browser = nb = None
    try:
        lab.start()
        name = _quickstart_copy(lab.root)
        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        nb = Notebook(browser.new_page(viewport={"width": 1280, "height": 1200}))
        nb.open(f"{lab.url}/lab/tree/{name}", name)
        ready = time.monotonic() - started
        for index, cell in enumerate(nb.cells):
            if cell["type"] == "code" and not _jobs_cell(cell["source"], cell["tags"]) \
                    and not _foreground_cell(cell["source"], cell["tags"]) \
                    and not _loop_cell(cell["source"], cell["tags"]):
                nb.run(index)
        print(f"\nJupyterLab and its kernel ready in {ready:.1f} s; the quickstart ran in "
              f"{time.monotonic() - started - ready:.1f} s")
        yield nb
        nb.screenshot("lab.png", nb.find(_stop_cell, "long-running --detach cell"))
    except BaseException:
        if nb is not None:
            with contextlib.suppress(Exception):
                print(f"\nscreenshot: {nb.screenshot('lab.png')}")
        print(f"\nJupyterLab's log ({lab.log}):\n{lab.log_tail()}")
        raise
    finally:
        if browser is not None:
            browser.close()
        if playwright is not None:
            playwright.stop()
        forced = lab.stop()
        print(f"\nthe browser test took {time.monotonic() - started:.1f} s in all")
    assert not forced, f"JupyterLab left kernel processes running (killed): {forced}"


def _stop_cell(source: str, tags: list[str]) -> bool:
    return TAG in tags and source.startswith("%%budget --detach")


def _foreground_cell(source: str, tags: list[str]) -> bool:
    return TAG in tags and source.startswith("%%budget --steps")


def _jobs_cell(source: str, tags: list[str]) -> bool:
    return TAG in tags and '"jobs:"' in source


def _loop_cell(source: str, tags: list[str]) -> bool:
    return TAG in tags and source == LOOP_CELL


def _axes_cell(source: str, tags: list[str]) -> bool:
    return TAG in tags and source == AXES_CELL


def _panel_cell(source: str, tags: list[str]) -> bool:
    line = source.splitlines()[0]
    return line.startswith("%%budget") and "--no-widget" not in line and "--detach" not in line \
        and "--resume" not in line


def _late_output_cell(source: str, tags: list[str]) -> bool:
    return source.startswith("%%budget --detach") and "print(" in source and TAG not in tags


def _enabled_buttons(outputs: Any) -> list[str]:
    """The labels of the buttons in a cell's outputs that can still be clicked."""
    return [text.strip() for text in outputs.locator("button:enabled").all_inner_texts()]


def test_a_finished_panel_shows_a_bar_per_limit_and_no_button(notebook: Notebook) -> None:
    index = notebook.find(_panel_cell, "%%budget cell with a panel")
    flags = notebook.cells[index]["source"].splitlines()[0]
    limits = re.findall(r"--(time|steps|tool-calls|agent-invocations|provider-calls|turns|tokens"
                        r"|output-tokens|cost)\b", flags)
    outputs = notebook.outputs(index)
    bars = outputs.locator(".widget-hprogress, .widget-progress")  # ipywidgets 8, 7
    bars.first.wait_for(state="visible")
    assert bars.count() == len(limits)
    _wait(lambda: notebook.status(index).startswith("completed, "), 5,
          "the panel showing 'completed'")
    assert _enabled_buttons(outputs) == []  # nothing left to stop (a running one: below)
    notebook.screenshot("lab-panel.png", index)


def test_a_detached_cells_late_output_appears_under_it(notebook: Notebook) -> None:
    index = notebook.find(_late_output_cell, "--detach cell that prints")
    outputs = notebook.outputs(index)
    assert outputs.filter(has_text="INCOMPLETE (exit 14)").count() == 1
    at_end = notebook.stdout_at_end[index].splitlines()
    _wait(lambda: " completed, " in notebook.status(index), 10,
          "the detached job's panel showing 'completed'")
    assert re.match(r"job \S+ completed, ", notebook.status(index))  # the job, named
    _wait(lambda: "result: " in notebook.status(index), 5, "the job's result on its panel")
    _wait(lambda: _enabled_buttons(outputs) == [], 5, "the ended job's panel dropping Stop")
    _wait(lambda: len(notebook.stdout(index).splitlines()) > len(at_end), 5,
          "late output under the detached cell")
    assert notebook.stdout(index).splitlines()[:len(at_end)] == at_end
    notebook.screenshot("lab-detached.png", index)


def test_stop_on_the_panel_stops_a_running_background_job(notebook: Notebook) -> None:
    index = notebook.find(_stop_cell, "long-running --detach cell")
    outputs = notebook.outputs(index)
    envelope = outputs.filter(has_text="INCOMPLETE (exit 14)")
    assert envelope.count() == 1
    job = re.search(r"nb\.jobs\['([^']+)'\]", envelope.inner_text())
    assert job is not None, envelope.inner_text()
    assert notebook.status(index).startswith(f"running in the background as job {job.group(1)}")
    clicked = time.monotonic()
    outputs.locator("button", has_text="Stop").click()
    _wait(lambda: notebook.status(index).startswith(f"job {job.group(1)} stopped, "), 10,
          "the panel showing 'stopped'")
    print(f"\nstopped {time.monotonic() - clicked:.1f} s after the click")
    assert _enabled_buttons(outputs) == []
    _wait(lambda: envelope.filter(has_text="was then stopped: there is no result to wait for")
          .count() == 1, 5, "the envelope's line saying there is no result to wait for")
    probe = notebook.find(_jobs_cell, "jobs cell")
    notebook.run(probe)
    states = json.loads(notebook.stdout(probe).split("jobs:", 1)[1])
    assert states[job.group(1)] == "cancelled"


def test_stop_on_the_panel_ends_a_running_cell_within_a_second(notebook: Notebook) -> None:
    index = notebook.find(_foreground_cell, "30 s foreground cell")
    outputs = notebook.outputs(index)
    latencies = []
    for _ in range(STOP_RUNS):
        started = time.monotonic()
        notebook.page.evaluate(RUN_CELL, index)
        stop = outputs.locator("button:enabled", has_text="Stop")
        stop.wait_for(state="visible", timeout=10_000)
        _wait(lambda: notebook.status(index).startswith("running, "), 10,
              "the panel showing 'running'")
        time.sleep(max(0.0, started + 2 - time.monotonic()))
        clicked = time.monotonic()
        stop.click()
        notebook.page.wait_for_function(CELL_DONE, arg=index, timeout=CELL_SECONDS * 1000)
        latencies.append(time.monotonic() - clicked)
        assert notebook.status(index).startswith("stopped, "), notebook.status(index)
        assert outputs.filter(has_text="Cancelled").count() >= 1  # how a stopped cell ends
    print(f"\nfrom the click to the cell's end: "
          f"{', '.join(f'{s * 1000:.0f} ms' for s in latencies)}")
    notebook.screenshot("lab-stopped.png", index)
    assert max(latencies) < 1.0, f"a cell ended {max(latencies):.2f} s after its Stop click"


def test_stop_on_the_panel_ends_a_loop_that_never_checks_within_a_second(
        notebook: Notebook) -> None:
    """N-5: ``while True: pass`` under ``%%budget`` with no limit; Stop, 2 s into it, ends the
    cell within a second (plus a margin for a busy machine), the panel and the cell's error
    say it was stopped, and the kernel goes on: the next cell runs."""
    index = notebook.find(_loop_cell, "while True cell")
    outputs = notebook.outputs(index)
    started = time.monotonic()
    notebook.page.evaluate(RUN_CELL, index)
    stop = outputs.locator("button:enabled", has_text="Stop")
    stop.wait_for(state="visible", timeout=10_000)
    _wait(lambda: notebook.status(index).startswith("running, "), 10, "the panel showing 'running'")
    time.sleep(max(0.0, started + 2 - time.monotonic()))
    clicked = time.monotonic()
    stop.click()
    notebook.page.wait_for_function(CELL_DONE, arg=index, timeout=CELL_SECONDS * 1000)
    took = time.monotonic() - clicked
    print(f"\nthe loop ended {took * 1000:.0f} ms after the click")
    notebook.screenshot("lab-loop-stopped.png", index)
    assert took < LOOP_STOP_S + LOOP_MARGIN_S, f"the loop ended {took:.2f} s after its Stop"
    assert notebook.status(index).startswith("stopped, "), notebook.status(index)
    error = outputs.filter(has_text="Cancelled")
    assert error.count() == 1 and "stopped from the panel" in error.inner_text()
    assert _enabled_buttons(outputs) == []
    probe = notebook.find(_jobs_cell, "jobs cell")
    assert notebook.run(probe) < 10  # the kernel answers the next cell
    assert notebook.stdout(probe).startswith("jobs: ")


def test_a_panel_names_each_axis_whole_and_says_only_the_state_and_time(
        notebook: Notebook) -> None:
    index = notebook.find(_axes_cell, "cell with long axis names")
    outputs = notebook.outputs(index)
    _wait(lambda: notebook.status(index).startswith("completed, "), 5,
          "the panel showing 'completed'")
    names = outputs.locator(".widget-hprogress .widget-label").evaluate_all(
        "nodes => nodes.map(n => [n.textContent, n.scrollWidth <= n.clientWidth])")
    assert names == [[name, True] for name in ("steps", "tool_calls", "agent_invocations",
                                               "provider_calls")], names
    status = notebook.status(index)
    assert "nbbudget" not in status and "steps" not in status, status  # nothing repeated
    notebook.screenshot("lab-axes.png", index)


# -- the what-if explorer -----------------------------------------------------------------------
WHAT_IF = REPO / "notebooks" / "what-if.ipynb"
#: the cell the test appends to its copy of what-if.ipynb: what the kernel's explorer says
EXPLORER_STATE = """\
print("explorer:", explorer.sliders["steps"].value, explorer.verdict.status)
print(explorer.verdict.lines[0])
"""


def _what_if_copy(root: Path) -> str:
    """what-if.ipynb without its stored outputs, plus the test's cell; its name."""
    import nbformat

    nb = nbformat.read(WHAT_IF, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(EXPLORER_STATE, metadata={"tags": [TAG]}))
    nbformat.write(nb, root / WHAT_IF.name)
    return WHAT_IF.name


def test_the_what_if_explorer_follows_a_slider_moved_in_the_browser(
        tmp_path_factory: pytest.TempPathFactory, notebook: Notebook) -> None:
    """what-if.ipynb run in JupyterLab; the explorer's step slider moved to its least value
    with the keyboard: the verdict under it changes to a refusal by steps, the one the kernel's
    explorer gives. In a page of the quickstart's browser: one sync Playwright a thread."""
    lab = Lab(tmp_path_factory.mktemp("what-if"))
    page = nb = None
    try:
        lab.start()
        name = _what_if_copy(lab.root)
        page = notebook.page.context.browser.new_page(viewport={"width": 1280, "height": 1200})
        nb = Notebook(page)
        nb.open(f"{lab.url}/lab/tree/{name}", name)
        probe = len(nb.cells) - 1
        for index, cell in enumerate(nb.cells[:probe]):
            if cell["type"] == "code":
                nb.run(index)
        index = nb.find(lambda source, tags: source.startswith("explorer = run.trace.explore()"),
                        "explorer cell")
        outputs = nb.outputs(index)
        verdict = outputs.locator(".widget-html").first
        verdict.wait_for(state="visible")
        before = verdict.inner_text()
        slider = outputs.locator(".widget-slider", has=nb.page.locator("label", has_text="steps"))
        assert slider.count() == 1, f"{slider.count()} step sliders"
        slider.locator(".noUi-handle").first.focus()
        nb.page.keyboard.press("Home")  # to the least limit: one step
        _wait(lambda: "by steps (limit 1)" in verdict.inner_text(), 10,
              "the verdict following the slider")
        nb.run(probe)
        state, first_line = nb.stdout(probe).split("\n")[:2]
        assert state == "explorer: 1 refused"
        assert verdict.inner_text().splitlines()[0] == first_line != before.splitlines()[0]
        print(f"\nthe verdict after the move: {first_line}")
        nb.screenshot("what-if.png", index)
    except BaseException:
        if nb is not None:
            with contextlib.suppress(Exception):
                print(f"\nscreenshot: {nb.screenshot('what-if.png')}")
        print(f"\nJupyterLab's log ({lab.log}):\n{lab.log_tail()}")
        raise
    finally:
        if page is not None:
            page.close()
        forced = lab.stop()
    assert not forced, f"JupyterLab left kernel processes running (killed): {forced}"
