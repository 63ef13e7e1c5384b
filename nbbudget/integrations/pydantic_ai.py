"""Budgets around pydantic-ai agents (the ``pydantic-ai`` extra).

Install with ``pip install 'nbbudget[pydantic-ai]'``. `Budgeted` is a pydantic-ai capability:
give it to an agent run and the run's model requests and tool calls go through an nbbudget
run, with no change to the agent, its tools or its prompts::

    import nbbudget as nb
    from nbbudget.pydantic_ai import Budgeted

    with nb.budget(tool_calls=3, provider_calls=10, tokens=20_000) as run:
        result = agent.run_sync("Plan the trip", capabilities=[Budgeted(run)])

(In a notebook, ``await agent.run(...)``: a cell already runs an event loop.) What it does:

- **Model requests.** Each attempt at a model request reserves a ``provider_calls`` permit before
  it is sent, retries included (S4-6), and is never refunded. Each request step counts one
  ``turns``. The request's ``max_tokens`` setting is clamped to what remains of the
  ``output_tokens`` grant (S2-9); an exhausted grant refuses the request.
- **What a response used** is charged after the fact: ``tokens`` (input and output),
  ``output_tokens``, and ``cost_usd``: at ``prices=`` when given, as everywhere in nbbudget
  (`nbbudget.run.prices`: USD per million tokens, a function of the usage, or ``"free"``;
  ``price=`` is the older name of a function), else the response's own cost (``usage.cost``,
  which a gateway reports), else genai-prices' price of the model at its provider
  (``provider=``, else the one whose API the response's ``provider_url`` matches, else its
  ``provider_name``). Spending past a limit is
  recorded and the run fails ``budget-cut`` by the first limit passed, in the order tokens >
  cost (S3-3). Under a cost limit, a response that used tokens and whose cost nothing can tell
  stops the run with a `nbbudget.ConfigError` that names ``prices=``: the limit could not be
  kept.
- **Cost reserved before a request** (S3-10). With ``cost_usd`` limited and the model's price
  known (``prices=``, else genai-prices' at the model's provider), each attempt reserves its
  worst case as it takes its permit: its input bounded by its messages, instructions and tool
  definitions in bytes of JSON, plus 1,024 tokens, at the input price; its output by its
  ``max_tokens``, at the output price, the cap lowered so that the worst case fits what is left
  (none asked: all the dollars left are reserved). One that cannot pay for one output token is
  refused before it is sent. The response settles the reservation (a stream draws on it as it
  is charged); an attempt that fails gives it back when the provider billed nothing (an error
  status, a connection never made), and keeps it spent otherwise.
- **Streams** (``agent.run_stream``, ``agent.iter``) are charged as the stream reports its
  usage, after each event; the event that passes ``output_tokens``, ``tokens`` or ``cost_usd``
  never reaches the reader: the stream is cancelled (its connection closed) and
  `UsageLimitCut` raises, its ``salvage`` the text received so far, which also stays in the
  agent's messages (S3-9).
- **Tool calls.** The function tool calls of one model response reserve their ``tool_calls``
  permits together, before any of them starts (S4-3): a batch that would pass the limit is
  refused whole and none of its calls runs. A call that fails, ``ModelRetry`` included, keeps
  its permit: a dispatch is not refunded (S4-3, S4-10), so its retry needs a permit of its own,
  as does a call of the batch that never ran (arguments the tool rejected, an unknown tool).
  The output tool is the agent's answer, not a tool call. The run's time and cancellation are
  checked before every dispatch.
- **By model.** ``run.usage(by="model")`` counts each attempt, its tokens and its cost for the
  model asked for and its provider (``provider=``, else the one whose API the model's base URL
  matches, else its ``system``).
- **Errors.** A refusal ends the agent run with pydantic-ai's own error, `UsageLimitExceeded`,
  as its `UsageLimits` would: here the subclass `UsageLimitRefused`, which is also an
  `nbbudget.BudgetExceeded` (``kind``, ``limit``, ``consumed``, ``target``) and carries the run's
  ``outcome`` once the run has ended. A limit passed after the fact is `UsageLimitCut`, also an
  `nbbudget.BudgetCut`. Both appear in the run's trace (``dispatch_refused_budget_exceeded``,
  ``outcome``). A stop of the run itself (``run.cancel()``, the panel's Stop button, its time
  running out) unwinds the agent run like any other nbbudget stop.

Where this differs from `UsageLimits`, and why, is in "Bounding the agent you already have".

``Budgeted()`` with no run uses `nbbudget.current()` when the agent run starts, so inside a
``%%budget`` cell ``capabilities=[Budgeted()]`` bounds the agent by the cell's limits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, aclosing, asynccontextmanager, suppress
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..core.errors import BudgetCut, BudgetExceeded, ConfigError
from ..core.lowlevel import Model, Unwind
from ..run.budget import Budget, current
from ..run.prices import (
    FIGURES,
    Given,
    PriceFn,
    cost_usd,
    given_price,
    given_provider,
    price_of,
    provider_of,
    worst_case,
)
from ..run.providers import (
    UNKNOWN_PROVIDER,
    Reservation,
    Usage,
    clamp,
    reserve_call,
    reserve_priced,
    spend_usage,
    unbilled,
)
from .bounds import json_size
from .claims import held

#: The first pydantic-ai release with a hook before every attempt at a model request
#: (``prepare_model_request``), where a ``provider_calls`` permit is taken and ``max_tokens``
#: clamped; it needs Python 3.11 or newer.
PYDANTIC_AI_NEEDED = "2.64"

try:
    from pydantic_ai import CallToolsNode
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import TextPart
    from pydantic_ai.models.wrapper import WrapperModel
except ImportError as exc:
    raise ImportError(
        f"nbbudget.pydantic_ai needs pydantic-ai {PYDANTIC_AI_NEEDED} or newer (on Python 3.11 "
        f"or newer): pip install 'nbbudget[pydantic-ai]'"
    ) from exc

if not hasattr(AbstractCapability, "prepare_model_request"):
    from importlib.metadata import version as _version

    raise ImportError(
        f"nbbudget.pydantic_ai needs pydantic-ai {PYDANTIC_AI_NEEDED} or newer, and "
        f"pydantic-ai-slim {_version('pydantic-ai-slim')} is installed: it has no hook before "
        f"each model request, so the budget could not bound provider_calls or max_tokens. "
        f"Upgrade it (pip install 'pydantic-ai-slim>={PYDANTIC_AI_NEEDED}', Python 3.11 or "
        f"newer)"
    )

__all__ = ["Budgeted", "UsageLimitCut", "UsageLimitRefused"]


class UsageLimitRefused(UsageLimitExceeded, BudgetExceeded):
    """A model request or tool call the budget refused before it was sent (S4-3, S4-6).

    pydantic-ai's `UsageLimitExceeded` and nbbudget's `BudgetExceeded` at once: ``except``
    either. ``outcome`` is the run's `nbbudget.Outcome` once the run's ``with`` block has ended.
    """

    def __init__(self, kind: str, limit: float, consumed: float, requested: float = 1,
                 target: str | None = None, code: str = "", scope: str = "run") -> None:
        BudgetExceeded.__init__(self, kind, limit, consumed, requested, target, code, scope)
        self.message = f"{BudgetExceeded.__str__(self)}. {UsageLimitExceeded._HINT}"


class UsageLimitCut(UsageLimitExceeded, BudgetCut):
    """A limit passed by what a model response had already used: the run failed ``budget-cut``.

    pydantic-ai's `UsageLimitExceeded` and nbbudget's `BudgetCut` (``by`` is the limit's kind).
    ``salvage`` is the text a streamed response had delivered when it was cut (S3-9), else None.
    """

    _stop: Any = None
    salvage: str | None = None

    def __init__(self, by: str, message: str) -> None:
        BudgetCut.__init__(self, by, message)
        self.message = message

    def __reduce__(self) -> Any:
        return (type(self), (self.by, self.message), {"salvage": self.salvage})


def _refused(err: BudgetExceeded) -> UsageLimitRefused:
    """The refusal, in pydantic-ai's shape (a spent window never gets here: it suspends)."""
    return UsageLimitRefused(*err.args)


@dataclass
class _Billed:
    """What one attempt's response has been charged so far: a stream is charged as it reports
    its usage, and the response at its end is charged only what the stream had not yet been."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: its worst-case cost, reserved before it was sent, with cost_usd limited (S3-10)
    reserved: Reservation | None = None
    #: its row in the run's tally (`run.usage(by="model")`): the model asked for, its provider
    model: Model | None = None


@dataclass
class Budgeted(AbstractCapability[Any]):
    """Put an nbbudget run around a pydantic-ai agent run (see the module's documentation).

    ``run``: the `nbbudget.Budget` to charge; `None` takes `nbbudget.current()` when the agent
    run starts. ``prices``: ``{"input": usd, "output": usd}`` per million tokens, a function of
    the usage mapping returning dollars, or ``"free"`` (``price``: the older name of a
    function); it wins over a response's own cost and genai-prices'. ``provider``: the
    provider whose price genai-prices gives, in its name (default: the response's).
    ``steer=True`` tells the model about approach notices (S3-5): when the run passes a notice
    threshold, the next request carries a line such as ``Budget notice: start converging
    (tool_calls at 80% of its limit).``; the loop itself can read ``run.notice_level``.
    """

    run: Budget | None = None
    _: KW_ONLY
    prices: Given | None = None
    price: Callable[[Mapping[str, float]], float] | None = None
    provider: str | None = None
    steer: bool = False
    id: str | None = "nbbudget"
    _told: int = dataclasses.field(default=0, init=False, repr=False)
    _billed: _Billed = dataclasses.field(default_factory=_Billed, init=False, repr=False)
    _reserved: set[str] = dataclasses.field(default_factory=set, init=False, repr=False)
    _price: PriceFn | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.run is not None and not isinstance(self.run, Budget):
            raise ConfigError(f"Budgeted(run={self.run!r}): give an nbbudget run "
                              f"(nb.budget(...)) or None for the current one")
        where = "nbbudget.pydantic_ai.Budgeted()"
        self._price = given_price(self.prices, where, price=self.price)
        given_provider(self.provider, where)

    async def for_run(self, ctx: Any) -> Budgeted:
        """A copy for one agent run, bound to its nbbudget run."""
        run = self.run if self.run is not None else current()
        if run is None:
            raise ConfigError("Budgeted() found no active run: call the agent inside "
                              "`with nb.budget(...)` or a %%budget cell, or pass the run: "
                              "Budgeted(run)")
        return dataclasses.replace(self, run=run)

    def _run(self) -> Budget:
        run = self.run
        if run is None:  # for_run() binds it before any hook runs
            raise ConfigError("Budgeted() is not bound to a run")
        return run

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        """One request step of the agent loop: one ``turns``."""
        run = self._run()
        try:
            run.check()
            run.charge("turns", target="agent:turn")
        except BudgetExceeded as err:
            raise _refused(err) from None
        if self.steer and run.notice_level > self._told:
            self._told = run.notice_level
            ctx.enqueue(_notice_text(run))
        return request_context

    async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
        """Every attempt: a ``provider_calls`` permit before dispatch, ``max_tokens`` clamped;
        with ``cost_usd`` limited and the model's price known, its worst case reserved too, the
        cap clamped so that it fits (S3-10)."""
        run = self._run()
        label = _model_name(request_context.model)
        target = f"provider:{label}"
        key = (self._model_provider(request_context.model) or UNKNOWN_PROVIDER, label)
        settings = dict(request_context.model_settings or {})
        asked = settings.get("max_tokens")
        price = self._request_price(run, request_context.model)
        reserved = None
        try:
            if price is None:
                reserve_call(run.lowlevel, target, key)
                clamped = clamp(run, asked, target)
            else:  # its messages, instructions and tool definitions bound its input
                fixed, rate = worst_case(price, json_size(
                    [request_context.messages, request_context.model_request_parameters]))
                # one provider_calls permit (its turn was taken by its request step)
                clamped, dollars = reserve_priced(run.lowlevel, asked, target, fixed, rate,
                                                  retry=True, model=key)
                reserved = Reservation(run.lowlevel, dollars, label, target, key)
        except BudgetExceeded as err:
            raise _refused(err) from None
        # this attempt's response is charged from nothing
        self._billed = _Billed(reserved=reserved, model=key)
        if clamped != asked:
            settings["max_tokens"] = clamped
            request_context = dataclasses.replace(request_context, model_settings=settings)
        return request_context

    def _request_price(self, run: Budget, model: Any) -> PriceFn | None:
        """The price a request's worst case is reserved at: ``prices=``, else genai-prices'
        price of the model at its provider (``provider=``, else the one whose API the model's
        base URL matches, else its ``system``); None when ``cost_usd`` is not limited or no
        price is known (a response's own cost, a gateway's, is then charged after the fact)."""
        if run.remaining("cost_usd") == math.inf:
            return None
        if self._price is not None:
            return self._price
        name = getattr(model, "model_name", None)
        provider = self._model_provider(model)
        found = price_of(provider, str(name)) if name and provider else None
        return None if found is None else found.cost

    def _model_provider(self, model: Any) -> str:
        """The provider of a request's *model*: ``provider=``, else the one whose API the
        model's base URL matches in genai-prices, else its ``system`` (empty: none)."""
        url = getattr(model, "base_url", None)
        return str(self.provider or (provider_of(url) if url else None) or getattr(
            model, "system", None) or "")

    async def on_model_request_error(self, ctx: Any, *, request_context: Any,
                                     error: Exception) -> Any:
        """An attempt failed: its reservation goes back when the provider billed nothing (an
        error status, a connection never made: `unbilled`), else stays spent (S3-10)."""
        reserved = self._billed.reserved
        if reserved is not None and unbilled(error):
            reserved.release()
        raise error

    def get_wrapper_model(self, model: Any) -> Any:
        """The model of every attempt, wrapped so that a streamed response is charged as it
        reports its usage and cut the moment a limit is passed (S3-9)."""
        return _MeteredModel(model, self)

    async def after_model_request(self, ctx: Any, *, request_context: Any,
                                  response: Any) -> Any:
        """Charge what the response used that was not charged yet (a stream is charged as it
        goes); past a limit the run fails ``budget-cut`` (S3-3)."""
        self._charge(response.usage, response.model_name, self._provider(response), final=True)
        return response

    def _charge(self, usage: Any, model: str | None, provider: str | None, *,
                final: bool) -> None:
        """Bring what this attempt is charged up to *usage*, a pydantic-ai `RequestUsage` (the
        response's so far, or at its end when *final*).

        The cost is ``prices=``'s, else the response's own (``usage.cost``), else
        genai-prices' price of the model at *provider*. A
        response that used tokens and has no cost, under a cost limit, is a configuration error
        once it has ended: the limit could not be kept (seed 003: a cost limit needs a price).
        """
        run = self._run()
        inp, out = usage.input_tokens, usage.output_tokens
        billed = self._billed
        if (not final and usage.cost is None and inp == billed.input_tokens
                and out == billed.output_tokens):
            return  # an event that reported no usage: nothing new to charge
        cost = self._cost(usage, inp, out, model, provider)
        if cost is None and final and (inp or out) and run.limits.cost_usd is not None:
            raise ConfigError(
                f"model {model or '(unnamed)'} of provider {provider or '(none)'} returned a "
                f"response with no cost and genai-prices has no price for it, so the run's "
                f"cost_usd limit of {run.limits.cost_usd} cannot be kept: name the provider "
                f"genai-prices knows it at, Budgeted(run, provider='openrouter'), or give its "
                f"prices, Budgeted(run, prices={{'input': ..., 'output': ...}}) in USD per "
                f"million tokens, a function of the usage, or 'free'")
        spent = Usage(input_tokens=max(0, inp - billed.input_tokens),
                      output_tokens=max(0, out - billed.output_tokens))
        billed.input_tokens, billed.output_tokens = max(inp, billed.input_tokens), max(
            out, billed.output_tokens)
        if cost is not None and cost > billed.cost_usd:
            spent["cost_usd"] = cost - billed.cost_usd
            billed.cost_usd = cost
        try:
            if billed.reserved is not None:  # drawn from, or settled by, the final charge
                billed.reserved.spend(spent["input_tokens"], spent["output_tokens"],
                                      spent.get("cost_usd"), final=final)
            else:
                spend_usage(run, spent, None, model or "model", model=billed.model)
        except Unwind as signal:
            cut = signal.stop  # the run, or the run it draws on, failed budget-cut
            err = UsageLimitCut(cut.by or "budget", cut.message)
            err.reports = cut  # so the run's `with` block raises this error, not a new one
            raise err from None

    def _cost(self, usage: Any, inp: int, out: int, model: str | None,
              provider: str | None) -> float | None:
        if self._price is not None:
            return self._price({key: getattr(usage, key, 0) for key in FIGURES})
        if usage.cost is not None:
            return float(usage.cost)
        if not (inp or out):
            return None
        if model and provider:
            figures = {key: getattr(usage, key, 0) for key in FIGURES}
            return cost_usd(provider, model, figures)
        return None

    def _provider(self, response: Any) -> str | None:
        """The provider a response's price is looked up at: ``provider=``, else the one whose
        API its ``provider_url`` matches in genai-prices, else its ``provider_name``."""
        if self.provider is not None:
            return self.provider
        url = getattr(response, "provider_url", None)
        return (provider_of(url) if url else None) or response.provider_name

    async def before_node_run(self, ctx: Any, *, node: Any) -> Any:
        """A model response's tool calls reserve their ``tool_calls`` permits together, before
        any of them runs (S4-3): a batch that would pass the limit is refused whole."""
        if not isinstance(node, CallToolsNode):
            return node
        tools = ctx.tool_manager
        calls = [call for call in node.model_response.tool_calls
                 if (tools is None or (tool := tools.get_tool_def(call.tool_name)) is None
                     or tool.kind == "function")]
        if not calls:
            return node
        run = self._run()
        names = ",".join(dict.fromkeys(call.tool_name for call in calls))
        try:
            run.check()
            run.charge("tool_calls", len(calls), target=f"tool:{names}")
        except BudgetExceeded as err:
            raise _refused(err) from None
        self._reserved = {call.tool_call_id for call in calls}  # the last batch has ended
        return node

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                handler: Any) -> Any:
        """Every tool call runs on a permit taken before it starts: its batch's, or its own
        (a call outside a batch); a refused call never runs. A call that fails, ``ModelRetry``
        included, keeps its permit (S4-3)."""
        run = self._run()
        try:
            run.check()
            if call.tool_call_id in self._reserved:
                self._reserved.discard(call.tool_call_id)
            else:
                run.charge("tool_calls", target=f"tool:{call.tool_name}")
        except BudgetExceeded as err:
            raise _refused(err) from None
        return await handler(args)


class _MeteredModel(WrapperModel):
    """The model of one attempt, whose streamed responses are charged as they arrive. The
    attempt's HTTP request is claimed (`claims.held`): the capability counts it, so the model
    calls process-wide switch leaves it alone."""

    def __init__(self, wrapped: Any, budgeted: Budgeted) -> None:
        super().__init__(wrapped)
        self._budgeted = budgeted

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        with held():
            return await self.wrapped.request(*args, **kwargs)

    @asynccontextmanager
    async def request_stream(self, messages: Any, model_settings: Any,
                             model_request_parameters: Any,
                             run_context: Any = None) -> AsyncIterator[Any]:
        async with AsyncExitStack() as stack:
            with held():  # the request is sent as the stream opens; reading it sends nothing
                stream = await stack.enter_async_context(self.wrapped.request_stream(
                    messages, model_settings, model_request_parameters, run_context))
            _meter(stream, self._budgeted)
            yield stream


def _meter(stream: Any, budgeted: Budgeted) -> None:
    """Charge *stream* (a pydantic-ai `StreamedResponse` not yet read) after each of its events,
    as its usage grows; when a limit is passed the stream is cancelled (its connection closed)
    before that event reaches the reader, and `UsageLimitCut` raises with ``salvage``, the text
    received so far (S3-9). ``_get_event_iterator`` is where each pydantic-ai model produces a
    stream's events; this one stream's is replaced by one that reads it and charges."""
    events = stream._get_event_iterator

    async def metered() -> AsyncIterator[Any]:
        async with aclosing(events()) as source:
            async for event in source:
                try:
                    budgeted._charge(stream.usage, stream.model_name,
                                     budgeted._provider(stream), final=False)
                except UsageLimitCut as err:
                    with suppress(NotImplementedError):  # a model that cannot cancel: its
                        await stream.cancel()  # source is closed below, all there is
                    err.salvage = "".join(part.content for part in stream.get().parts
                                          if isinstance(part, TextPart))
                    raise
                yield event

    stream._get_event_iterator = metered


def _notice_text(run: Budget) -> str:
    """The line for the model: the advice of the run's notice level, and which limit is how
    near from the latest notice of its trace (a run resumed from a checkpoint may have none)."""
    advice = "start converging" if run.notice_level == 1 else "deliver now"
    event = run.trace.latest("approach_notice")
    if event is not None:
        return (f"Budget notice: {advice} ({event.payload['budget_kind']} at "
                f"{event.payload['ratio']:.0%} of its limit).")
    return f"Budget notice: {advice}."


def _model_name(model: Any) -> str:
    name = getattr(model, "model_name", None)
    return str(name) if name else type(model).__name__
