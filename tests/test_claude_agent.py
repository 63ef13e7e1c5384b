"""The Claude Agent SDK under an nbbudget run (``nbbudget.claude_agent``): the real SDK runs the
real Claude Code it bundles, whose model calls go to the loopback server of ``tests/wire``
speaking Anthropic's Messages API (streams and tool uses): the run's limits become Claude Code's
own, its tool uses take permits through its hooks (S4-3), what it reports is charged (S3-3), and
a run that stops ends it (S2-3)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sdk = pytest.importorskip("claude_agent_sdk")
from wire import Received, Reply, Server  # noqa: E402
from wire import anthropic_shapes as a  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.claude_agent import Budgeted  # noqa: E402

MODEL = "claude-sonnet-4-5"
pytestmark = pytest.mark.realclock  # Claude Code is a process of its own, on the real clock


class Model:
    """The stand-in's answers: a tool use for each command of ``commands`` in turn (Bash), then
    the text."""

    def __init__(self, commands: list[str], delay: float = 0.0) -> None:
        self.commands = list(commands)
        self.delay = delay
        self.ids = itertools.count(1)

    def __call__(self, received: Received) -> Reply:
        body = received.body or {}
        if not body.get("stream"):  # a side request of Claude Code's (a title, a check)
            return a.message("ok", a.usage(5, 1), model=MODEL)
        n = next(self.ids)
        if self.commands:
            reply = a.tool_use_stream("Bash", {"command": self.commands.pop(0),
                                               "description": "run it"},
                                      a.usage(20, 7), model=MODEL, id=f"msg_{n}",
                                      tool_id=f"toolu_{n}")
        else:
            reply = a.message_stream(["Par", "is."], a.usage(30, 5), model=MODEL, id=f"msg_{n}")
        reply.delay = self.delay
        return reply


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {"CLAUDE_CONFIG_DIR": str(tmp_path / "config"), "ANTHROPIC_API_KEY": "not-needed",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_TELEMETRY": "1"}


def options(server: Server, env: dict[str, str], cwd: Path, **kwargs: Any) -> Any:
    return sdk.ClaudeAgentOptions(model=MODEL, allowed_tools=["Bash"], cwd=str(cwd),
                                  env={**env, "ANTHROPIC_BASE_URL": server.url}, **kwargs)


async def ask(budgeted: Budgeted, opts: Any) -> list[Any]:
    return [m async for m in budgeted.query("The capital of France?", opts)]


def model_calls(server: Server) -> list[Received]:
    return [r for r in server.received if (r.body or {}).get("stream")]


# -- the options -----------------------------------------------------------------------------------
def test_the_runs_limits_become_claude_codes_own_on_a_copy_of_the_options() -> None:
    async def mine(*args: Any) -> dict[str, Any]:
        return {}

    given = sdk.ClaudeAgentOptions(max_turns=50, hooks={"PreToolUse": [
        sdk.HookMatcher(matcher="Bash", hooks=[mine])]})
    with nb.budget(cost_usd=0.25, turns=9, provider_calls=4) as run:
        run.charge("cost_usd", 0.05)
        bounded = Budgeted().options(given)
        assert bounded.max_budget_usd == pytest.approx(0.20)
        assert bounded.max_turns == 4  # the fewer of turns and provider calls left
        matchers = bounded.hooks["PreToolUse"]
        assert len(matchers) == 2 and matchers[1].hooks == [mine]  # the caller's kept
    assert given.max_turns == 50 and given.max_budget_usd is None  # left as it was
    assert len(given.hooks["PreToolUse"]) == 1
    with nb.budget(turns=9):
        kept = Budgeted().options(sdk.ClaudeAgentOptions(max_turns=3, max_budget_usd=1.0))
        assert (kept.max_turns, kept.max_budget_usd) == (3, 1.0)  # the caller's smaller


def test_a_run_with_no_model_call_left_refuses_the_query_before_claude_code_starts(
        tmp_path: Path, env: dict[str, str]) -> None:
    with Server(answer=Model([])) as server:
        with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=1) as run:
            run.charge("provider_calls")
            asyncio.run(ask(Budgeted(run), options(server, env, tmp_path)))
        assert refused.value.kind == "provider_calls"
        assert server.received == []


# -- what it counts (the real Claude Code) --------------------------------------------------------
def test_model_calls_tool_uses_tokens_and_cost_are_charged_as_claude_code_reports_them(
        tmp_path: Path, env: dict[str, str]) -> None:
    with Server(answer=Model(["echo hi"])) as server, nb.budget(
            cost_usd=1.0, turns=10, tool_calls=5) as run:
        messages = asyncio.run(ask(Budgeted(), options(server, env, tmp_path)))
    result = messages[-1]
    assert isinstance(result, sdk.ResultMessage) and result.subtype == "success"
    assert result.result == "Paris."
    assert len(model_calls(server)) == 2
    assert run.consumed["provider_calls"] == 2 and run.consumed["turns"] == 2
    assert run.consumed["tool_calls"] == 1
    assert run.consumed["tokens"] == sum(
        u["inputTokens"] + u["outputTokens"] + u["cacheReadInputTokens"]
        + u["cacheCreationInputTokens"] for u in result.model_usage.values())
    assert run.consumed["cost_usd"] == pytest.approx(result.total_cost_usd)
    assert run.consumed["output_tokens"] == 12  # 7 + 5, as the stand-in reported
    by_model = run.usage(by="model")
    assert by_model.loc[("anthropic", MODEL), "calls"] == 2
    assert by_model.loc[("anthropic", MODEL), "cost_usd"] == pytest.approx(result.total_cost_usd)


def test_a_refused_tool_use_is_denied_and_stops_claude_code_with_the_refusal_S4_3(
        tmp_path: Path, env: dict[str, str]) -> None:
    second = tmp_path / "second"
    with Server(answer=Model(["echo first", f"touch {second}", "echo third"])) as server, \
            pytest.raises(nb.BudgetExceeded) as refused, nb.budget(tool_calls=1) as run:
        asyncio.run(ask(Budgeted(), options(server, env, tmp_path)))
    assert refused.value.kind == "tool_calls"
    assert not second.exists()  # the refused tool never ran
    assert run.consumed["tool_calls"] == 1
    assert len(model_calls(server)) == 2  # Claude Code stopped: no call after the refusal
    assert run.outcome is not None and run.outcome.by == "tool_calls"
    assert run.consumed["tokens"] == 2 * 27 and run.consumed["cost_usd"] > 0  # what it used


def test_claude_code_stopped_at_the_runs_turns_ends_as_the_runs_refusal_and_at_its_own_as_it_came(
        tmp_path: Path, env: dict[str, str]) -> None:
    with Server(answer=Model(["echo a", "echo b", "echo c"])) as server:
        with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(turns=2) as run:
            asyncio.run(ask(Budgeted(), options(server, env, tmp_path)))
        assert refused.value.kind == "turns"
        assert run.consumed["turns"] == 2 and len(model_calls(server)) == 2

    with Server(answer=Model(["echo a", "echo b", "echo c"])) as server:
        with nb.budget(turns=10) as run:  # the caller's own max_turns, the smaller
            messages = asyncio.run(ask(Budgeted(), options(server, env, tmp_path,
                                                           max_turns=2)))
        assert messages[-1].subtype == "error_max_turns"
        assert run.consumed["turns"] == 2


# -- stops -----------------------------------------------------------------------------------------
def test_a_run_cancelled_while_claude_code_waits_for_its_model_ends_the_query_S2_3(
        tmp_path: Path, env: dict[str, str]) -> None:
    # as in a %%budget cell that awaits: the run is entered in the coroutine (N-6)
    async def cell(run: nb.Budget, server: Server) -> None:
        async with run:
            await ask(Budgeted(), options(server, env, tmp_path))

    with Server(answer=Model([], delay=30)) as server:
        run = nb.budget(provider_calls=5)
        timer = threading.Timer(1.0, run.cancel)
        started = time.monotonic()
        timer.start()
        with pytest.raises(nb.Cancelled):
            asyncio.run(cell(run, server))
        timer.join()
        assert time.monotonic() - started < 5  # Claude Code interrupted, not waited for
        assert len(model_calls(server)) == 1


@pytest.mark.parametrize("preempt", [True, False], ids=["preempted", "watched"])
def test_a_run_out_of_time_ends_the_query_S3_8(tmp_path: Path, env: dict[str, str],
                                               preempt: bool) -> None:
    # preempted: the run's stop lands in the thread's event loop; watched: only the adapter's
    # watch of the run sees it, and interrupts Claude Code
    with Server(answer=Model([], delay=30)) as server:
        started = time.monotonic()
        with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="2s", preempt=preempt) as run:
            asyncio.run(ask(Budgeted(), options(server, env, tmp_path)))
        assert time.monotonic() - started < (12 if preempt else 5)
        assert cut.value.by == "timeout"
        assert run.outcome is not None and run.outcome.by == "timeout"
