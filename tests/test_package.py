"""The package as users import it: a pure core, a pinned public surface, one error tree, typed.

``import nbbudget`` pulls in none of IPython, ipywidgets, pandas, traitlets, numpy or Dask (the
core is standard library only; the Jupyter layer, the frames and the Dask ledger load when asked
for). ``__all__`` is pinned, every public error is under `nb.BudgetError` or `nb.ConfigError`,
and ``py.typed`` ships with the package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pyproject

import nbbudget as nb

REPO = Path(__file__).resolve().parent.parent

HEAVY = ("IPython", "ipywidgets", "pandas", "traitlets", "numpy", "dask", "distributed",
         "genai_prices", "httpx", "httpx2", "openai", "anthropic", "langchain_core", "langgraph",
         "agents", "pydantic_ai")

PUBLIC = [
    "Budget",
    "BudgetCut",
    "BudgetError",
    "BudgetExceeded",
    "Cancelled",
    "CheckpointRefused",
    "ClusterUnanswered",
    "ConfigError",
    "Event",
    "Grant",
    "Job",
    "JobState",
    "Limits",
    "Manifest",
    "Outcome",
    "Replay",
    "Response",
    "RunsPerDayExceeded",
    "Snapshot",
    "Status",
    "StoreBusy",
    "StoreDamaged",
    "StoreReadOnly",
    "Suggestion",
    "ToolContext",
    "Trace",
    "WideningError",
    "budget",
    "call",
    "charge",
    "check",
    "checkpoint",
    "current",
    "instrument",
    "jobs",
    "last_response",
    "parse_duration",
    "resume_state",
    "step",
    "store",
    "suggest_limits",
]


@pytest.mark.parametrize("module", ["nbbudget", "nbbudget.testing"])
def test_importing_the_core_loads_no_jupyter_or_data_library(module: str) -> None:
    code = textwrap.dedent(f"""
        import json, sys
        import {module}
        heavy = {HEAVY!r}
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout) == []


def test_all_is_pinned() -> None:
    assert nb.__all__ == PUBLIC
    assert sorted(PUBLIC) == PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_every_name_in_all_is_an_attribute(name: str) -> None:
    assert hasattr(nb, name)
    if name != "last_response":  # None until a %%budget cell has run
        assert getattr(nb, name) is not None


def test_version_matches_the_installed_distribution() -> None:
    assert nb.__version__ == importlib.metadata.version("nbbudget")


# -- the error tree --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "base"),
    [
        (nb.ConfigError, ValueError),
        (nb.WideningError, nb.ConfigError),
        (nb.BudgetExceeded, nb.BudgetError),
        (nb.BudgetCut, nb.BudgetError),
        (nb.Cancelled, nb.BudgetError),
        (nb.BudgetError, Exception),
    ],
)
def test_each_error_sits_where_the_contract_puts_it(error: type, base: type) -> None:
    assert issubclass(error, base)


def test_budget_errors_and_config_errors_are_separate_branches() -> None:
    assert not issubclass(nb.BudgetError, ValueError)
    assert not issubclass(nb.ConfigError, nb.BudgetError)


def test_every_public_error_is_under_budget_error_or_config_error() -> None:
    errors = [obj for obj in map(nb.__dict__.get, nb.__all__)
              if isinstance(obj, type) and issubclass(obj, BaseException)]
    assert sorted(e.__name__ for e in errors) == [
        "BudgetCut", "BudgetError", "BudgetExceeded", "Cancelled", "CheckpointRefused",
        "ClusterUnanswered", "ConfigError", "RunsPerDayExceeded", "StoreBusy", "StoreDamaged",
        "StoreReadOnly", "WideningError",
    ]
    assert all(issubclass(e, (nb.BudgetError, nb.ConfigError)) for e in errors)


# -- typing ----------------------------------------------------------------------------------------
def test_py_typed_ships_with_the_package() -> None:
    assert importlib.resources.files("nbbudget").joinpath("py.typed").is_file()


def test_the_wheel_takes_the_whole_package_folder_with_py_typed() -> None:
    config = pyproject()
    assert config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["nbbudget"]
    assert (REPO / "nbbudget" / "py.typed").is_file()


# -- how errors show -------------------------------------------------------------------------------
ERRORS = ["BudgetCut", "BudgetError", "BudgetExceeded", "Cancelled", "CheckpointRefused",
          "ClusterUnanswered",
          "ConfigError", "RunsPerDayExceeded", "WideningError"]


@pytest.mark.parametrize("name", ERRORS)
def test_each_public_error_is_named_by_its_public_path(name: str) -> None:
    error = getattr(nb, name)
    assert f"{error.__module__}.{error.__qualname__}" == f"nbbudget.{name}"
    assert repr(error) == f"<class 'nbbudget.{name}'>"


def test_an_uncaught_error_shows_as_nbbudget_dot_its_name_in_the_traceback() -> None:
    code = "import nbbudget as nb\nnb.Limits(steps=0)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "nbbudget.ConfigError: steps=0 must be greater than 0; use None for no limit")


@pytest.mark.parametrize(
    "error",
    [
        nb.ConfigError("steps=0 must be greater than 0; use None for no limit"),
        nb.WideningError("steps", 10, 20),
        nb.BudgetExceeded("steps", 2, 2, 1, "tool:search", "StepBudgetExceeded", "grant"),
        nb.BudgetCut("watchdog", "tool fetch was silent for 5000 ms"),
        nb.Cancelled("run was stopped: enough", reason="enough"),
        nb.RunsPerDayExceeded("report started 3 times today"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_each_error_survives_pickling_with_its_message_and_data(error: Exception) -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.args) == (str(error), error.args)
    assert vars(copy) == vars(error)
