"""Budgets around LangChain chat models and LangGraph graphs (the ``langchain`` extra).

Install with ``pip install 'nbbudget[langchain]'``. `Budgeted` is a LangChain callback handler:
pass it in the config of a call and the call's model calls, tool calls and graph node runs go
through an nbbudget run, with no change to the graph, its nodes, its tools or its model::

    import nbbudget as nb
    from nbbudget.langchain import Budgeted

    with nb.budget(tool_calls=3, provider_calls=10, steps=20, cost_usd=0.50) as run:
        state = graph.invoke({"messages": [("user", "Plan the trip")]},
                             config={"callbacks": [Budgeted()]})

(``ainvoke``, ``stream`` and ``astream`` take the same config.) LangChain hands the handler on to
everything the call runs: the graph's nodes, the chat models and tools they call, and subgraphs.
What it counts:

- **Model calls.** Each call of a chat model (or of a text-completion LLM) reserves one
  ``provider_calls`` and one ``turns`` before the model is called, both or neither (S4-3); a
  refused call never reaches the model. Each attempt counts, a LangChain retry
  (``with_retry``) or a fallback included (S4-6). With ``output_tokens`` spent, the next call is
  refused (S2-9). In a langchain ``create_agent`` graph, a call the run could not permit is
  refused at the start of the node that prepares it, before its middleware run (a
  ``before_model`` node, or the ``model`` node's ``wrap_model_call`` and ``@dynamic_prompt``).
- **Usage.** What a reply used is charged from its ``usage_metadata`` when it arrives: ``tokens``
  is input plus output (cached input included), ``output_tokens`` is output (reasoning
  included). Spending that already happened is recorded even past a limit, and then the run is
  cut by the first limit passed, in the order tokens > output > cost (S3-3): the graph ends, the
  run fails ``budget-cut``. A streamed reply (``stream``/``astream``, a graph's
  ``stream_mode="messages"``) is charged as its chunks report usage, and cut at the chunk that
  passes a limit (S3-9); ``stream_events(version="v3")`` reports usage only as the message
  ends, and is charged then.
- **Cost.** ``cost_usd`` is the reply's usage at the model's price in genai-prices (its data
  ships in the package: nothing is fetched), the model and its provider read from the reply's
  ``response_metadata`` (``model_name``, ``model_provider``), else from what the model tells
  LangChain about itself (``ls_model_name``, ``ls_provider``); ``provider=`` names the provider
  instead (``"openrouter"`` for a ``ChatOpenAI`` pointed at OpenRouter, which LangChain calls
  ``openai``). ``prices=`` sets the price instead, as everywhere in nbbudget
  (`nbbudget.run.prices`): ``{"input": usd, "output": usd}`` per million tokens, a function of
  the usage mapping (``input_tokens``, ``output_tokens``, ``cache_read_tokens``,
  ``cache_write_tokens``) returning dollars, or ``"free"`` (a local model). With ``cost_usd``
  limited, a model with no known price is refused before it is called, with a
  `nbbudget.ConfigError` that names the provider, the model, ``prices=`` and ``provider=``.
- **Cost reserved before a call** (S3-10). With ``cost_usd`` limited, each model call reserves
  its worst case as it starts, with its permits: its input bounded by what it sends (the
  messages or prompts and the ``invocation_params``, where the tools bound to the model are,
  in bytes of JSON) plus 1,024 tokens, at the input price; its output by the cap the model
  reports (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``, or its
  ``ls_max_tokens``), times ``n``, at the output price. A handler cannot lower the cap, so a
  call whose worst case does not fit what is left is refused before the model is called; a
  call with no cap known reserves all the dollars left. The reply settles the reservation to
  its cost; a failed call gives it back when the provider billed nothing (an error status, a
  connection never made), and keeps it spent otherwise, as it does a reply that reports no
  usage.
- **Tool calls.** Each tool call reserves a ``tool_calls`` permit before the tool runs; a
  refused tool never runs. The tool calls a model asks for at once (LangGraph's ``ToolNode``
  runs them side by side) each take their permit as they start: with fewer permits left than
  calls, exactly as many run as there are permits, and the others are refused.
- **Graph nodes.** Each run of a LangGraph node is one ``steps``, charged before the node runs
  (parallel branches, ``Send`` fan-outs and subgraph nodes included; a node that calls another
  runnable is still one step). Branches side by side take their permits as they start; under
  ``ainvoke`` LangGraph cancels the other tasks of a step as soon as one fails, so a branch
  that took its permit may be cancelled before it runs (its permit stays spent, S4-3).
- **Time and stops.** Every event (a start, a streamed chunk, an end) checks the run's time and
  whether it was stopped (``run.cancel()``, the panel's Stop button).
- **By model.** ``run.usage(by="model")`` counts each call, its tokens and its cost for the
  provider and the model the call started with (``provider=``, else ``ls_provider``, else
  ``unknown``; ``ls_model_name``, else the model's class).

A refusal ends the graph with `nbbudget.BudgetExceeded` (``kind``, ``limit``, ``consumed``,
``target``: ``provider:<model>``, ``tool:<name>`` or ``node:<name>``), as LangGraph raises any
error of a node: nothing is made up in its place. A ``ToolNode(handle_tool_errors=True)``
catches every error of a tool and hands it to the model as a message; a refused tool call is
not the tool's error, so the next event of that graph raises the refusal again and the graph
ends with it; so does a node that catches the refusal itself, and a node LangGraph retries
(``RetryPolicy``) is refused again at its start, without running. A stop of the run (its time
spent, ``run.cancel()``, a limit passed by what a reply used) unwinds the graph past any
``except Exception`` in it, and the run's ``with`` block (or the ``%%budget`` cell) raises it
as `nbbudget.BudgetCut` or `nbbudget.Cancelled`. (LangChain logs a warning for each error a
handler raises; the handler's own errors, which reach the caller whole, are kept out of that
log.)

What a callback cannot do:

- lower a request's output cap: LangChain gives a handler a copy of the request's parameters,
  so ``max_tokens`` is not clamped to what remains of ``output_tokens`` (S2-9 holds by refusing
  the next call once the grant is spent, and by cutting the run when a reply passes it), nor to
  what the cost left can pay for (S3-10 holds by refusing the call). Set ``max_tokens`` on the
  model to bound one reply (S3-6), and to let calls share a cost limit.
- see the retries inside a provider's SDK: LangChain reports one model call however many HTTP
  attempts the SDK made under it.
- stop a model call or a tool already running: the run's time is checked at each event, so a
  call in flight ends before the graph stops (S4-10). Bound a slow tool with ``run.tool`` and a
  slow request with the model's own timeout.

``Budgeted()`` with no run charges `nbbudget.current()` at each event: the run of the ``with``
block or ``%%budget`` cell the graph runs in. Outside every run the handler counts nothing.
One handler may serve several graphs, threads and event loops at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from ..core.errors import BudgetExceeded, ConfigError
from ..core.lowlevel import Model
from ..run.budget import Budget, current
from ..run.prices import (
    FIGURES,
    Given,
    PriceFn,
    given_price,
    given_provider,
    limited_price,
    price_of,
    worst_case,
)
from ..run.providers import (
    UNKNOWN_PROVIDER,
    Reservation,
    Usage,
    require_request,
    reserve_priced,
    reserve_request,
    spend_usage,
    unbilled,
)
from .bounds import json_size
from .claims import Claim, claim

#: The oldest langchain-core the handler was tested with (the ``langchain`` extra's bound).
LANGCHAIN_CORE_NEEDED = "1.8.3"

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.outputs import LLMResult
except ImportError as exc:
    raise ImportError(
        f"nbbudget.langchain needs langchain-core {LANGCHAIN_CORE_NEEDED} or newer (on Python "
        f"3.11 or newer): pip install 'nbbudget[langchain]'"
    ) from exc

__all__ = ["LANGCHAIN_CORE_NEEDED", "Budgeted"]


class _OwnErrorsUnlogged(logging.Filter):
    """Keeps out of LangChain's callback log (``Error in Budgeted.on_tool_start callback:
    BudgetExceeded(...)``) the errors this handler raises on purpose: each reaches the caller
    as it is, so a person sees it once, as the error that ended the graph."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) == 3 and args[0] == "Budgeted"
                    and str(args[2]).startswith(("BudgetExceeded(", "ConfigError(")))


logging.getLogger("langchain_core.callbacks.manager").addFilter(_OwnErrorsUnlogged())

@dataclass(eq=False)
class _Call:
    """One model call between its start and its end: the run it charged and the model."""

    run: Budget
    provider: str | None
    model: str | None
    key: Model  # its row in the run's tally (`run.usage(by="model")`)
    streamed: dict[str, int] = field(default_factory=dict)  # usage charged chunk by chunk
    reserved: Reservation | None = None  # its worst-case cost, with cost_usd limited (S3-10)
    # its HTTP requests, which the model calls process-wide switch then leaves to this handler
    claim: Claim | None = None


class Budgeted(BaseCallbackHandler):
    """A LangChain callback handler that bounds chat models and LangGraph graphs by an nbbudget
    run (see the module's documentation).

    ``run``: the `nbbudget.Budget` to charge; `None` charges `nbbudget.current()` at each event.
    ``prices``: the model's price when genai-prices has none or you want your own: a mapping
    of USD per million tokens (``input``, ``output``, and optionally ``cache_read`` and
    ``cache_write`` for cached input tokens, which otherwise cost as input), a function of
    the usage mapping returning dollars, or ``"free"``. ``provider``: the provider whose price
    genai-prices gives, in its name (default: the one the model tells LangChain).
    """

    raise_error = True  # LangChain logs and swallows a handler's error unless told otherwise
    run_inline = True  # under ainvoke: charge in the graph's own task, before the call, in order

    def __init__(self, run: Budget | None = None, *, prices: Given | None = None,
                 provider: str | None = None) -> None:
        if run is not None and not isinstance(run, Budget):
            raise ConfigError(f"Budgeted(run={run!r}): give an nbbudget run (nb.budget(...)) "
                              f"or None for the current one")
        self._given = given_price(prices, "nbbudget.langchain.Budgeted()")  # else genai-prices'
        given_provider(provider, "nbbudget.langchain.Budgeted()")
        self.run = run
        self.prices = prices
        self.provider = provider
        self._calls: dict[UUID, _Call] = {}  # model calls under way
        self._roots: dict[UUID, UUID] = {}  # every run under way -> the top run it is part of
        self._namespaces: dict[UUID, str] = {}  # chain runs under way -> their LangGraph task
        self._refused: dict[UUID, BudgetExceeded] = {}  # top run -> the refusal that ends it

    def __repr__(self) -> str:
        return f"Budgeted({self.run!r})" if self.run is not None else "Budgeted()"

    # -- starts: check, then reserve before the work runs ------------------------------------
    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[Any]], *,
                            run_id: UUID, parent_run_id: UUID | None = None,
                            tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A chat model is about to be called: one ``provider_calls`` and one ``turns``, and
        its worst-case cost with ``cost_usd`` limited (S3-10)."""
        self._model_start(run_id, parent_run_id, metadata, serialized, messages, kwargs)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID,
                     parent_run_id: UUID | None = None, tags: list[str] | None = None,
                     metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A text-completion model is about to be called: as a chat model."""
        self._model_start(run_id, parent_run_id, metadata, serialized, prompts, kwargs)

    def _model_start(self, run_id: UUID, parent_run_id: UUID | None,
                     metadata: dict[str, Any] | None, serialized: dict[str, Any],
                     sent: Any, kwargs: dict[str, Any]) -> None:
        root = self._enter(run_id, parent_run_id)
        run = self.run if self.run is not None else current()
        if run is None:
            return
        metadata = metadata or {}
        provider = self.provider or metadata.get("ls_provider")
        model = metadata.get("ls_model_name")
        label = f"provider:{model or _class_name(serialized)}"
        key = (str(provider) if provider else UNKNOWN_PROVIDER,
               str(model or _class_name(serialized)))
        reserved = None
        try:
            run.check()
            price = limited_price(run.remaining("cost_usd"), self._given, provider, model,
                                  "Budgeted")
            if price is None:  # S2-9: with output_tokens spent, no more calls
                reserve_request(run.lowlevel, None, label, model=key)
            else:
                reserved = _reserve(run, price, sent, kwargs, metadata, label, key)
        except BudgetExceeded as err:
            self._refuse(run_id, root, err)
            raise
        except BaseException:
            self._roots.pop(run_id, None)  # no end event follows a start that raised
            raise
        # LangChain calls the handler inline, in the context the model then sends from
        self._calls[run_id] = _Call(run, provider, model, key, reserved=reserved,
                                    claim=claim())

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, tags: list[str] | None = None,
                      metadata: dict[str, Any] | None = None,
                      inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A tool is about to run: one ``tool_calls`` permit, or it does not run."""
        root = self._enter(run_id, parent_run_id)
        run = self.run if self.run is not None else current()
        if run is None:
            return
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        try:
            run.check()
            run.charge("tool_calls", target=f"tool:{name}")
        except BudgetExceeded as err:
            self._refuse(run_id, root, err)
            raise
        except BaseException:
            self._roots.pop(run_id, None)
            raise

    def on_chain_start(self, serialized: dict[str, Any], inputs: dict[str, Any], *,
                       run_id: UUID, parent_run_id: UUID | None = None,
                       tags: list[str] | None = None, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        """A runnable starts: a LangGraph node's run is one ``steps``, anything else is
        checked only. A node that prepares a model call of a langchain ``create_agent``
        graph is refused first when the run could not permit the call, before its middleware
        run (`_prepares_model_call`).

        LangGraph gives each node run (a task) its own ``langgraph_checkpoint_ns``, which the
        runnables inside the node inherit: a run whose namespace differs from its parent's is
        the node's own."""
        root = self._enter(run_id, parent_run_id)
        namespace = (metadata or {}).get("langgraph_checkpoint_ns")
        node = None
        if namespace is not None:
            self._namespaces[run_id] = namespace
            if parent_run_id is None or self._namespaces.get(parent_run_id) != namespace:
                node = (metadata or {}).get("langgraph_node")
        run = self.run if self.run is not None else current()
        if run is None:
            return
        try:
            run.check()
            if node is not None:
                if _prepares_model_call(node, metadata):
                    require_request(run.lowlevel, f"node:{node}")
                run.charge("steps", target=f"node:{node}")
        except BudgetExceeded as err:
            self._namespaces.pop(run_id, None)
            self._refuse(run_id, root, err)
            raise
        except BaseException:
            self._namespaces.pop(run_id, None)
            self._roots.pop(run_id, None)
            raise

    # -- while a model streams, and at the ends ------------------------------------------------
    def on_llm_new_token(self, token: Any, *, chunk: Any = None, run_id: UUID,
                         parent_run_id: UUID | None = None, tags: list[str] | None = None,
                         **kwargs: Any) -> None:
        """A streamed chunk: charge the usage it reports; past a limit the stream stops here
        (S3-9)."""
        call = self._calls.get(run_id)
        if call is None:
            return
        call.run.check()
        message = getattr(chunk, "message", None)
        figures = _figures(getattr(message, "usage_metadata", None))
        if figures:
            for key, value in figures.items():
                call.streamed[key] = call.streamed.get(key, 0) + value
            self._spend(call, figures, message)

    def on_stream_event(self, event: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                        tags: list[str] | None = None, **kwargs: Any) -> None:
        """An event of ``stream_events(version="v3")``: check the run. (Such a stream reports
        usage only as the message finishes: `on_llm_end` charges it.)"""
        call = self._calls.get(run_id)
        if call is not None:
            call.run.check()

    def on_llm_end(self, response: LLMResult, *, run_id: UUID,
                   parent_run_id: UUID | None = None, tags: list[str] | None = None,
                   **kwargs: Any) -> None:
        """The reply: charge what it used (less what its chunks already charged)."""
        self._roots.pop(run_id, None)
        call = self._calls.pop(run_id, None)
        if call is None:
            return
        if call.claim is not None:
            call.claim.end()
        message, figures = _reply_usage(response)
        streamed = bool(call.streamed)
        if streamed:
            figures = {key: value - call.streamed.get(key, 0) for key, value in figures.items()
                       if value > call.streamed.get(key, 0)}
        if figures or (streamed and call.reserved is not None):
            self._spend(call, figures, message, final=True)
        # a reply that reported no usage at all keeps its reservation spent: what it cost
        # cannot be told (N-7)
        call.run.check()

    def on_llm_error(self, error: BaseException, *, run_id: UUID,
                     parent_run_id: UUID | None = None, tags: list[str] | None = None,
                     **kwargs: Any) -> None:
        """A failed call keeps its permit (S4-3); what its chunks reported stays charged. Its
        reservation goes back when the provider billed nothing (an error status, a connection
        never made: `unbilled`), else stays spent (S3-10)."""
        call = self._calls.pop(run_id, None)
        self._leave(run_id)
        if call is None:
            return
        if call.claim is not None:
            call.claim.end()
        if call.reserved is not None and unbilled(error):
            call.reserved.release()

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                    **kwargs: Any) -> None:
        """A tool returned: check the run before the graph goes on."""
        self._roots.pop(run_id, None)
        self._check()

    def on_tool_error(self, error: BaseException, *, run_id: UUID,
                      parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """A tool failed: its permit stays spent (S4-3)."""
        self._leave(run_id)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        """A runnable (a node, the graph) returned: check the run."""
        self._namespaces.pop(run_id, None)
        self._leave(run_id)
        self._check()

    def on_chain_error(self, error: BaseException, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """A runnable failed: forget it (the error goes on as it is)."""
        self._namespaces.pop(run_id, None)
        self._leave(run_id)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _enter(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        """Note *run_id* under its top run, and raise the refusal that ended that top run, if
        one did: an error handler in the graph (``ToolNode(handle_tool_errors=True)``) may have
        turned it into a message, and the graph must not go on."""
        root = run_id if parent_run_id is None else self._roots.get(parent_run_id,
                                                                     parent_run_id)
        self._roots[run_id] = root
        refused = self._refused.get(root)
        if refused is not None:
            self._roots.pop(run_id, None)
            raise BudgetExceeded(*refused.args)
        return root

    def _refuse(self, run_id: UUID, root: UUID, err: BudgetExceeded) -> None:
        """*err* ends the top run *root*: every later start under it raises it again (when
        this handler saw *root* start, and so will see it end)."""
        self._roots.pop(run_id, None)
        if root != run_id and root in self._roots:
            self._refused[root] = err

    def _leave(self, run_id: UUID) -> None:
        """*run_id* ended; a top run's refusal is forgotten with it."""
        self._roots.pop(run_id, None)
        self._refused.pop(run_id, None)

    def _check(self) -> None:
        run = self.run if self.run is not None else current()
        if run is not None:
            run.check()

    def _spend(self, call: _Call, figures: Mapping[str, int], message: Any, *,
               final: bool = False) -> None:
        """Charge *figures* of one reply (*message*) of *call*: tokens, output tokens and cost
        (S3-3); the *final* charge settles the call's reservation (S3-10)."""
        metadata = getattr(message, "response_metadata", None) or {}
        model = metadata.get("model_name") or metadata.get("model")
        cost = self._cost(call, figures,
                          self.provider or metadata.get("model_provider") or call.provider,
                          str(model) if model else None)
        if call.reserved is not None:
            call.reserved.spend(figures.get("input_tokens", 0), figures.get("output_tokens", 0),
                                cost, final=final)
            return
        usage = Usage(input_tokens=figures.get("input_tokens", 0),
                      output_tokens=figures.get("output_tokens", 0))
        if cost is not None:
            usage["cost_usd"] = cost
        spend_usage(call.run, usage, None, call.model or model or "model", model=call.key)

    def _cost(self, call: _Call, figures: Mapping[str, int], provider: str | None,
              model: str | None) -> float | None:
        """What *figures* cost: at ``prices=``, else at the price genai-prices gives the
        model that answered (else the model asked for) at its provider, else unknown."""
        if self._given is not None:
            return self._given(figures)
        for name in (model, call.model):
            price = price_of(str(provider), name) if name else None
            if price is not None:
                return price.cost(figures)
        return None


#: where a model class reports a request's output cap in its ``invocation_params`` (OpenAI's,
#: Anthropic's, Google's, Hugging Face's names), else in its LangSmith metadata
_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens")


def _reserve(run: Budget, price: PriceFn, sent: Any, kwargs: dict[str, Any],
             metadata: dict[str, Any], label: str, key: Model) -> Reservation:
    """Reserve a model call's worst case at *price* (S3-10), or refuse it: its input bounded by
    what it sends, *sent* (the messages or prompts) and its ``invocation_params`` (the tools
    bound to the model are there), in bytes of JSON, its output by the cap the model reports,
    times the choices it asks for (``n``). The handler cannot lower that cap: a worst case that
    does not fit is refused whole; with no cap known, all the dollars left are reserved.
    Counted as a call of *key*, which the reservation's charges are for."""
    params = kwargs.get("invocation_params") or {}
    asked = next((params[key] for key in _CAPS if _whole(params.get(key))),
                 metadata.get("ls_max_tokens"))
    fixed, rate = worst_case(price, json_size(sent) + json_size(params))
    choices = params.get("n")
    if type(choices) is int and choices > 1:
        rate *= choices
    _, dollars = reserve_priced(run.lowlevel, asked if _whole(asked) else None, label, fixed,
                                rate, clamp=False, model=key)
    return Reservation(run.lowlevel, dollars, label.removeprefix("provider:"), label, key)


def _whole(value: Any) -> bool:
    return type(value) is int and value > 0


def _prepares_model_call(node: str, metadata: dict[str, Any] | None) -> bool:
    """Whether *node* runs the middleware before a model call of a langchain ``create_agent``
    graph (which marks its runs ``ls_integration``): its ``model`` node, where the
    ``wrap_model_call`` middleware (``@dynamic_prompt`` among them) run before the model is
    called, or a middleware's ``<name>.before_model`` node, which run before it."""
    return (metadata or {}).get("ls_integration") == "langchain_create_agent" and (
        node == "model" or node.endswith(".before_model"))


def _figures(usage: Any) -> dict[str, int]:
    """A message's ``usage_metadata`` as the figures a price reads (`FIGURES`); LangChain
    counts cached input in ``input_tokens`` and reasoning in ``output_tokens``."""
    if not usage:
        return {}
    details = usage.get("input_token_details") or {}
    figures = {"input_tokens": usage.get("input_tokens") or 0,
               "output_tokens": usage.get("output_tokens") or 0,
               "cache_read_tokens": details.get("cache_read") or 0,
               "cache_write_tokens": details.get("cache_creation") or 0}
    return {key: figures[key] for key in FIGURES if figures[key]}


def _reply_usage(response: LLMResult) -> tuple[Any, dict[str, int]]:
    """The first message of a reply that reports usage, and that usage (a reply of several
    choices reports the call's usage on each); else the ``token_usage`` of ``llm_output``, as
    older integrations report it."""
    first = None
    for generations in response.generations:
        for generation in generations:
            message = getattr(generation, "message", None)
            first = first if first is not None else message
            figures = _figures(getattr(message, "usage_metadata", None))
            if figures:
                return message, figures
    usage = (response.llm_output or {}).get("token_usage") or {}
    return first, _figures({
        "input_tokens": usage.get("input_tokens", usage.get("prompt_tokens")),
        "output_tokens": usage.get("output_tokens", usage.get("completion_tokens"))})


def _class_name(serialized: dict[str, Any] | None) -> str:
    """The model's class, as LangChain serializes it (its last id part)."""
    ident = (serialized or {}).get("id") or ["model"]
    return str(ident[-1])
