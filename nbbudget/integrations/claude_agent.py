"""Budgets around the Claude Agent SDK (the ``claude-agent`` extra).

Install with ``pip install 'nbbudget[claude-agent]'``. The SDK runs Claude Code, a program of
its own, in a subprocess: its model calls are made there, where no HTTP client of this process
sees them. `Budgeted` bounds it from outside, with what the SDK gives::

    import nbbudget as nb
    from claude_agent_sdk import ClaudeAgentOptions
    from nbbudget.claude_agent import Budgeted

    with nb.budget(cost_usd=0.50, turns=10, tool_calls=5) as run:
        async for message in Budgeted().query("Plan the trip", ClaudeAgentOptions()):
            print(message)

``Budgeted()`` with no run takes `nbbudget.current()` when the query starts. What it does:

- **Before it starts**, the run's limits become the agent's own: ``max_budget_usd`` is
  lowered to the dollars the run has left, ``max_turns`` to the turns and provider calls it has
  left (the options given are left as they were; a copy is passed). A run with no model call
  left refuses the query before Claude Code starts.
- **Tool uses.** A ``PreToolUse`` hook takes one ``tool_calls`` permit before each tool runs
  (S4-3), and checks the run: a refusal, or a run stopped or out of time, denies the tool and
  stops the agent (the hook's ``continue: false``); the query then raises that refusal or stop.
- **Model calls.** Each assistant message of a new model response (its ``message_id``) is one
  ``provider_calls`` and one ``turns``, charged as it comes: Claude Code made the call already,
  so it is recorded even past a limit, and the run is then cut (S3-3). The usage and cost are
  charged from the ``ResultMessage``, per model (its ``model_usage``): the cost Claude Code
  reports (``costUSD``), or ``prices=`` of the usage when given; the cached input is input.
  ``run.usage(by="model")`` shows them under provider ``anthropic``.
- **Its own limits reached.** A query Claude Code ended at the ``max_turns`` or
  ``max_budget_usd`` the run set ends as the run's refusal of the next model call, with
  nbbudget's error, never as an answer; at a smaller limit of the caller's own, its
  ``ResultMessage`` is handed on as it came.
- **Stops.** The run is checked at each message, and watched while Claude Code works between
  them: ``run.cancel()``, the panel's Stop button or the run's time ends the query at once
  (Claude Code's process is ended, as the SDK ends it when a query is left), and the run's
  ``with`` block raises the stop.

With `ClaudeSDKClient`, give ``Budgeted().options(options)`` to the client and read its replies
through ``Budgeted.messages(client.receive_response(), client=client)``, which charges them and,
when the run stops, interrupts the client.

**What it cannot bound.** Permits are not taken before each model call (the subprocess makes
them): ``max_turns`` and ``max_budget_usd`` bound them, as Claude Code keeps them, between its
turns, so the last turn may pass the dollars left by what it cost (charged, then the run is
cut). No output cap is clamped (S2-9) and no worst case reserved (S3-10). Tokens are charged
when Claude Code reports them, in its ``ResultMessage`` at the query's end: a run bounded by
``tokens`` or ``output_tokens`` alone is not stopped in between (bound it by ``cost_usd`` or
``turns`` too, which Claude Code keeps). The cost is Claude Code's own figure, which prices
every model at Anthropic's rates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from typing import Any

from ..core.errors import BudgetExceeded, ConfigError
from ..core.kinds import KIND_INDEX
from ..core.scope import Unwind
from ..run.budget import Budget, current
from ..run.prices import Given, given_price
from ..run.providers import Usage, require_request, spend_usage

#: the release of the Claude Agent SDK the adapter was tested with (0.2.190, whose hooks may
#: stop the agent, and whose ``ResultMessage`` reports each model's usage and cost)
CLAUDE_AGENT_NEEDED = "0.2.190"

try:
    from claude_agent_sdk import (
        AssistantMessage,
        ClaudeAgentOptions,
        ClaudeSDKClient,
        HookContext,
        HookInput,
        HookJSONOutput,
        HookMatcher,
        ResultMessage,
    )
except ImportError as exc:
    raise ImportError(
        f"nbbudget.claude_agent needs the Claude Agent SDK {CLAUDE_AGENT_NEEDED} or newer: "
        f"pip install 'nbbudget[claude-agent]'"
    ) from exc

__all__ = ["CLAUDE_AGENT_NEEDED", "Budgeted"]

#: the provider the calls are counted under: Claude Code calls Anthropic's models
PROVIDER = "anthropic"
#: how often the run is looked at while Claude Code works between two messages
POLL_S = 0.1
#: how long Claude Code is given to answer an interrupt, and then to report what it used, once
#: the run stopped
INTERRUPT_S, GRACE_S = 1.0, 5.0
_CALL = ((KIND_INDEX["provider_calls"], 1), (KIND_INDEX["turns"], 1))
_COST = KIND_INDEX["cost_usd"]
#: the ends of a query at one of Claude Code's own limits, by the run's kind that set it
_LIMITED = {"error_max_turns": "turns", "error_max_budget_usd": "cost_usd"}


class Budgeted:
    """Put an nbbudget run around Claude Agent SDK queries (see the module's documentation).

    ``run``: the `nbbudget.Budget` to charge; None takes `nbbudget.current()` when a query
    starts. ``prices``: ``{"input": usd, "output": usd}`` per million tokens, a function of the
    usage mapping returning dollars, or ``"free"``; None charges the cost Claude Code reports.
    """

    def __init__(self, run: Budget | None = None, *, prices: Given | None = None) -> None:
        if run is not None and not isinstance(run, Budget):
            raise ConfigError(f"Budgeted(run={run!r}): give an nbbudget run (nb.budget(...)) "
                              f"or None for the current one")
        self.run = run
        self._given = given_price(prices, "nbbudget.claude_agent.Budgeted()")
        # the limits of the run this adapter set on the last options it made, in the place of
        # the caller's own (or of none): kind -> value
        self._set: dict[str, float] = {}
        # a refusal or stop met in a hook, raised by the query once Claude Code has stopped
        self._stopped: BaseException | None = None
        self._bound: Budget | None = None

    def _run(self) -> Budget:
        run = self.run if self.run is not None else current()
        if run is None:
            raise ConfigError("Budgeted() found no active run: start the query inside "
                              "`with nb.budget(...)` or a %%budget cell, or pass the run: "
                              "Budgeted(run)")
        return run

    def options(self, options: ClaudeAgentOptions | None = None) -> ClaudeAgentOptions:
        """A copy of *options* (default: ``ClaudeAgentOptions()``) bounded by the run: its
        ``max_budget_usd`` and ``max_turns`` lowered to what the run has left, and the hook
        that counts tool uses added to its ``PreToolUse`` hooks. A run that cannot permit one
        more model call refuses here (`nbbudget.BudgetExceeded`)."""
        run = self._run()
        run.check()
        self._bound, self._stopped = run, None
        require_request(run.lowlevel, "agent:claude")
        options = options if options is not None else ClaudeAgentOptions()
        changes: dict[str, Any] = {}
        self._set = {}
        dollars = run.remaining("cost_usd")
        if dollars != float("inf") and (options.max_budget_usd is None
                                        or dollars < options.max_budget_usd):
            changes["max_budget_usd"] = self._set["cost_usd"] = dollars
        turns = min(run.remaining("turns"), run.remaining("provider_calls"))
        if turns != float("inf") and (options.max_turns is None or turns < options.max_turns):
            changes["max_turns"] = int(turns)
            self._set["turns"] = turns
        hooks = {event: list(matchers) for event, matchers in (options.hooks or {}).items()}
        hooks["PreToolUse"] = [HookMatcher(hooks=[self._pre_tool_use]),
                               *hooks.get("PreToolUse", [])]
        changes["hooks"] = hooks
        return dataclasses.replace(options, **changes)

    async def _pre_tool_use(self, hook_input: HookInput, tool_use_id: str | None,
                            context: HookContext) -> HookJSONOutput:
        """Before a tool runs: the run checked and one ``tool_calls`` taken; else the tool is
        denied and the agent stopped, and the refusal kept for the query to raise."""
        run = self._bound
        if run is None:
            return {}
        name = hook_input.get("tool_name")
        try:
            run.check()
            run.charge("tool_calls", target=f"tool:{name}")
        except (BudgetExceeded, Unwind) as err:
            if self._stopped is None:
                self._stopped = err
            said = str(err)
            return {"continue_": False, "stopReason": said,
                    "hookSpecificOutput": {"hookEventName": "PreToolUse",
                                           "permissionDecision": "deny",
                                           "permissionDecisionReason": said}}
        return {}

    async def query(self, prompt: Any, options: ClaudeAgentOptions | None = None
                    ) -> AsyncIterator[Any]:
        """Ask Claude Code *prompt* with *options* bounded by the run (`options`), through a
        ``ClaudeSDKClient`` (which can be interrupted when the run stops), its messages charged
        and handed on (`messages`) up to the ``ResultMessage``."""
        bounded = self.options(options)
        async with ClaudeSDKClient(options=bounded) as client:
            await client.query(prompt)
            async for message in self.messages(client.receive_response(), client=client):
                yield message

    async def messages(self, stream: Any, *, client: Any = None) -> AsyncIterator[Any]:
        """The messages of *stream* (``ClaudeSDKClient.receive_response()``, or a query's),
        each charged before it is handed on; the run checked at each and watched between them.
        Left before its ``ResultMessage`` (the run stopped, the caller left), *client* (when
        given) is interrupted and its messages read up to that result, for `GRACE_S` at most,
        to charge what it used (`_wind_down`); the run's stop then raises."""
        run = self._bound if self._bound is not None else self._run()
        seen: set[str] = set()
        iterator = stream.__aiter__()
        watcher = _Watcher(run)
        finished = False
        try:
            while True:
                try:
                    message = await watcher.next(iterator.__anext__())
                except StopAsyncIteration:
                    finished = True
                    break
                except _Stopped:
                    run.check()  # the run's stop
                    raise asyncio.CancelledError from None  # (it always raises above)
                finished = isinstance(message, ResultMessage)
                self._charge(run, message, seen)
                yield message
                if self._stopped is None:
                    run.check()
        finally:
            watcher.close()
            if not finished and client is not None:
                await self._wind_down(client, iterator, run, seen)
            closing = getattr(iterator, "aclose", None)
            if closing is not None:
                await closing()

    async def _wind_down(self, client: Any, iterator: Any, run: Budget,
                         seen: set[str]) -> None:
        """Interrupt *client* and charge what its messages report up to its result, for
        `GRACE_S` at most: a query left before its end (raises nothing of its own)."""
        async def rest() -> None:
            async for message in iterator:
                if isinstance(message, AssistantMessage):
                    self._charge_call(run, message, seen)
                elif isinstance(message, ResultMessage):
                    self._charge_result(run, message)
                    return

        # its own timeouts, a client already gone (its tasks cancelled with the event loop's,
        # which answer the interrupt: then it is not waited for longer than INTERRUPT_S)
        with contextlib.suppress(Exception):
            await _within(client.interrupt(), INTERRUPT_S)
            await _within(rest(), GRACE_S)

    def _charge(self, run: Budget, message: Any, seen: set[str]) -> None:
        """Charge what *message* reports: a new model response's call, or a result's usage
        and cost; then raise a refusal met in a hook, or the run's refusal of the next call
        when Claude Code stopped at a limit the run set."""
        core = run.lowlevel
        if isinstance(message, AssistantMessage):
            self._charge_call(run, message, seen)
            return
        if not isinstance(message, ResultMessage):
            return
        self._charge_result(run, message)
        stopped, self._stopped = self._stopped, None
        if stopped is not None:
            raise stopped
        run.check()
        kind = _LIMITED.get(message.subtype)
        if kind is not None and kind in self._set:  # the run's limit, not the caller's
            require_request(core, "agent:claude")
            if kind == "cost_usd":
                core.require(_COST, 1e-9, "agent:claude")

    def _charge_call(self, run: Budget, message: Any, seen: set[str]) -> None:
        """An assistant message of a model response not seen yet (its ``message_id``): one
        ``provider_calls`` and one ``turns``, made already, so recorded even past a limit."""
        key = message.message_id
        if key is not None and key in seen:
            return
        if key is not None:
            seen.add(key)
        model = message.model
        run.lowlevel.spend(_CALL, f"provider:{model}", (PROVIDER, model), (1, 0, 0, None))

    def _charge_result(self, run: Budget, result: Any) -> None:
        """Charge a result's usage and cost, model by model (S3-3: recorded even past a
        limit)."""
        rows = [(model, _usage(used, _MODEL_USAGE, used.get("costUSD")))
                for model, used in (result.model_usage or {}).items()]
        if not rows and result.usage:  # no breakdown: the whole, at the cost reported
            rows.append(("claude", _usage(result.usage, _USAGE, result.total_cost_usd)))
        for model, usage in rows:
            spend_usage(run, usage, self._given, model, model=(PROVIDER, model))


#: the keys of a usage's figures (input, output, cache reads, cache writes) in a result's
#: ``model_usage`` (Claude Code's camelCase) and in its ``usage`` (Anthropic's Messages API)
_MODEL_USAGE = ("inputTokens", "outputTokens", "cacheReadInputTokens",
                "cacheCreationInputTokens")
_USAGE = ("input_tokens", "output_tokens", "cache_read_input_tokens",
          "cache_creation_input_tokens")


def _usage(used: Any, keys: tuple[str, str, str, str], cost: Any) -> Usage:
    """The figures of a usage mapping whose keys are *keys*, as `spend_usage` charges them:
    the input counts the cached input too (Anthropic's ``input_tokens`` does not); *cost*, the
    dollars reported, when there is one."""
    inp, out, read, written = (int(used.get(key) or 0) for key in keys)
    usage = Usage(input_tokens=inp + read + written, output_tokens=out,
                  cache_read_tokens=read, cache_write_tokens=written)
    if cost is not None:
        usage["cost_usd"] = float(cost)
    return usage


class _Stopped(Exception):
    """The run stopped while a message was awaited."""


class _Watcher:
    """Awaits a stream's next message in the task that reads it (the SDK's streams must be
    read from one task), while a helper task looks at the run every `POLL_S`: once the run has
    stopped it cancels the reading task, and `next` raises `_Stopped` in its place."""

    def __init__(self, run: Budget) -> None:
        self.run = run
        self.fired = False  # the reader was cancelled by this watcher
        self.task: asyncio.Task[Any] | None = None
        self.reader: asyncio.Task[Any] | None = None

    async def next(self, awaitable: Any) -> Any:
        reader = asyncio.current_task()
        if self.task is None and reader is not None:
            self.reader = reader
            self.task = asyncio.get_running_loop().create_task(
                self._watch(), name="nbbudget-claude-agent-watch")
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not self.fired:
                raise  # cancelled by someone else
            uncancel = getattr(reader, "uncancel", None)
            if uncancel is not None:  # Python 3.11+: the reader goes on
                uncancel()
            raise _Stopped from None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if _run_stopped(self.run):
                if self.reader is not None:
                    self.fired = True
                    self.reader.cancel()
                return

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None


async def _within(awaitable: Any, seconds: float) -> Any:
    """*awaitable*, given *seconds*, in the task that awaits it (asyncio's TimeoutError
    past them)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover  (Python 3.10)


def _run_stopped(run: Budget) -> bool:
    """Whether the run is stopped: cancelled, cut, or out of time (its check raises, and at
    its deadline stops it)."""
    try:
        run.check()
    except BaseException:  # noqa: BLE001  (the run's Unwind, or a public error)
        return True
    return False
