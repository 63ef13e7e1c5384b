"""Budgets around the OpenAI Agents SDK (the ``openai-agents`` extra).

Install with ``pip install 'nbbudget[openai-agents]'``. `Budgeted` is the SDK's `RunHooks`:
give it to a run and the run's model turns, tool calls and handoffs go through an nbbudget run,
with no change to the agents, their tools or their prompts::

    import nbbudget as nb
    from agents import Runner
    from nbbudget.openai_agents import Budgeted

    with nb.budget(turns=8, tool_calls=5, cost_usd=0.10) as run:
        result = Runner.run_sync(agent, "Plan the trip", hooks=Budgeted())

(In a notebook, ``await Runner.run(...)``: a cell already runs an event loop.) ``Budgeted()``
with no run charges `nbbudget.current()` as the agent run reaches each hook, so inside
``with nb.budget(...)`` or a ``%%budget`` cell it bounds the agent by those limits; give
``Budgeted(run)`` to name the run. What it counts:

- **Model turns.** Before each model call (``on_llm_start``) one ``turns`` and one
  ``provider_calls`` permit are reserved together, all or nothing; a refused call is never sent.
  An exhausted ``output_tokens`` grant refuses the call too (S2-9).
- **Tokens and cost.** When the model answers (``on_llm_end``) its usage is charged as the SDK
  reports it: ``tokens`` is input (cached input included) plus output (reasoning included),
  ``output_tokens`` the output, and ``cost_usd`` the model's price in genai-prices' bundled
  data (`nbbudget.run.prices`; genai-prices needs Python 3.11 or newer) at the model's
  provider (``openai``, the prefix of a ``litellm/<provider>/<model>`` name, or ``provider=``),
  or ``prices=``, as everywhere in nbbudget: ``{"input": USD, "output": USD}`` per million
  tokens, a function of the usage mapping (``input_tokens``, ``output_tokens``,
  ``cache_read_tokens``, ``cache_write_tokens``) returning dollars, or ``"free"`` (a local
  model). With ``cost_usd`` armed, a model with no known price is refused before its first
  call with a `nbbudget.ConfigError` naming the provider, the model, ``prices=`` and
  ``provider=``. Usage is spent after the fact: past a limit it is recorded and the run fails
  ``budget-cut`` by the first limit passed (S3-3).
- **Cost reserved before a call** (S3-10). With ``cost_usd`` limited, ``on_llm_start``
  reserves the call's worst case with its permits: its input bounded by its instructions and
  input items (``system_prompt``, ``input_items``), the agent's function tools, handoffs and
  output schema, in bytes of JSON, plus 1,024 tokens, at the input price; its output by the
  agent's ``model_settings.max_tokens``, at the output price, or, with none set, by nothing: all
  the dollars left are reserved. The hooks cannot lower the cap, so a call whose worst case
  does not fit is refused before it is sent. ``on_llm_end`` settles the reservation to what the
  reply cost. No hook hears of a call that fails (the SDK's error ends ``Runner.run``): its
  worst case stays spent, as the provider may have billed it, until the run ends.
- **Tool calls.** Before each local tool runs (``on_tool_start``: function tools, and the
  computer, shell and patch tools) one ``tool_calls`` permit is reserved (S4-3); a refused tool
  never runs.
- **Agent invocations.** A handoff (``on_handoff``) reserves one ``agent_invocations`` before the
  new agent takes over; an agent used as a tool (``agent.as_tool(...)``) reserves one
  ``tool_calls`` and one ``agent_invocations`` together before it starts.
- **Time and stops.** Every hook checks the run (``run.check()``): a run stopped
  (``run.cancel()``, the panel's Stop button) or out of time ends the agent run at its next
  hook.
- **By model.** ``run.usage(by="model")`` counts each model call (the SDK's own retries
  included, as ``provider_calls`` counts them), its tokens and its cost for the agent's model
  and its provider, named as for its price.

**Errors.** A refusal ends ``Runner.run`` with `BudgetRefused`, which is both an
`nbbudget.BudgetExceeded` (``kind``, ``limit``, ``consumed``, ``target``) and the SDK's
``AgentsException``, so the SDK passes it through as it is rather than wrapping it as a tool's
failure (``UserError: Error running tool ...``). A limit passed by what a model already used, a
stop and a timeout unwind the agent run like any other nbbudget stop: the run's ``with`` block
raises `nbbudget.BudgetCut` (``by`` the limit's kind, or ``"timeout"``) or `nbbudget.Cancelled`.
No answer is made up: the agent run ends with the error, never with a final output.

**What hooks cannot bound.** The SDK calls its hooks once per model turn, around the whole call:

- the output cap (S2-9): the SDK resolves the call's model settings before ``on_llm_start``
  and hands the hook no way to change them. A hook could lower ``max_tokens`` only by writing
  into the agent's own ``ModelSettings`` object, which the SDK passes on as it is when no
  ``RunConfig(model_settings=...)`` overrides it: that would change the agent for every run
  that shares it, so ``Budgeted`` does not, and only a call with no output tokens left, or
  whose worst-case cost does not fit, is refused. A ``RunConfig(model_settings=...)`` is not
  visible to the hooks either: its ``max_tokens`` does not bound the reservation, the agent's
  does;
- the turns of one agent: the SDK prepares a turn (its tools listed, its instructions built)
  before ``on_llm_start``, and after an agent's first turn no hook runs before that. The hooks
  refuse a turn the run cannot permit at ``on_agent_start`` (the first agent) and at
  ``on_handoff`` (the agent handed off to), before its preparation; a later turn of the same
  agent is refused at ``on_llm_start``, once prepared. ``Runner.run(agent, input,
  **budgeted.run_options())`` hands the SDK's own ``max_turns`` the run's turns instead, which
  stop before that preparation, as `BudgetRefused`;
- retries: the OpenAI client's own retries (``max_retries``) and the SDK's
  (``ModelSettings.retry``) happen inside one model call, under one ``provider_calls`` permit.
  The SDK reports its own failed attempts in the reply's usage (``requests``): they are charged
  as ``provider_calls`` after the fact, past the limit too (then the run fails ``budget-cut``);
  the client's are not reported at all;
- a stream: ``Runner.run_streamed`` is charged when the model's reply has ended, so it is not
  cut mid-stream (S3-9), and a call that never answers is not abandoned (S3-8).

For those, instrument the model's client instead: ``nb.instrument(AsyncOpenAI(...))`` reserves
a permit per HTTP attempt, clamps the cap, cuts streams and bounds each request by the run's
time; then give ``Budgeted(models=False)``, which leaves the model calls to the client (each
would charge them) and charges the tools and handoffs.

An agent used as a tool runs as a run of its own, with the hooks given to ``as_tool``: pass the
same ``Budgeted`` there (``agent.as_tool(..., hooks=budgeted)``) for its model calls and tools to
be counted too; a refusal inside it ends the whole agent run. A parallel batch of tool calls in
which one is refused is cancelled by the SDK as a whole; the calls already permitted keep their
permits (S4-3), whether or not they started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import BudgetExceeded, ConfigError
from ..core.kinds import KIND_INDEX
from ..core.lowlevel import Core
from ..run.budget import Budget, current
from ..run.prices import (
    Given,
    given_price,
    given_provider,
    limited_price,
    price_of,
    worst_case,
)
from ..run.providers import (
    Reservation,
    Usage,
    require_request,
    reserve_priced,
    reserve_request,
    spend_usage,
)
from .bounds import json_size
from .claims import Claim, claim_in_run

#: The release of the OpenAI Agents SDK the hooks were tested with: 0.24 calls ``on_llm_start``
#: before each model call and passes an ``AgentsException`` raised by a hook through unwrapped.
OPENAI_AGENTS_NEEDED = "0.24"
#: How the User-Agent of every request the SDK's models send begins (its OpenAI Responses,
#: Chat Completions and LiteLLM models): the requests the hooks claim while a call is under way
AGENTS_USER_AGENT = "Agents/Python"

try:
    from agents.exceptions import AgentsException
    from agents.lifecycle import RunHooksBase
    from agents.run_config import DEFAULT_MAX_TURNS
except ImportError as exc:
    raise ImportError(
        f"nbbudget.openai_agents needs the OpenAI Agents SDK {OPENAI_AGENTS_NEEDED} or newer: "
        f"pip install 'nbbudget[openai-agents]'"
    ) from exc

__all__ = ["OPENAI_AGENTS_NEEDED", "BudgetRefused", "Budgeted"]

_PROVIDER_CALLS = KIND_INDEX["provider_calls"]


class BudgetRefused(AgentsException, BudgetExceeded):
    """A model call, tool call or agent invocation the budget refused before it started
    (S4-3, S4-8).

    nbbudget's `BudgetExceeded` and the SDK's ``AgentsException`` at once, so the SDK lets it
    end ``Runner.run`` as it is. ``outcome`` is the run's `nbbudget.Outcome` once the run's
    ``with`` block has ended.
    """

    def __init__(self, kind: str, limit: float, consumed: float, requested: float = 1,
                 target: str | None = None, code: str = "", scope: str = "run") -> None:
        BudgetExceeded.__init__(self, kind, limit, consumed, requested, target, code, scope)
        self.run_data = None  # what AgentsException.__init__ sets; the SDK fills it in


class Budgeted(RunHooksBase[Any, Any]):
    """Put an nbbudget run around an OpenAI Agents SDK run: ``Runner.run(agent, input,
    hooks=Budgeted())`` (see the module's documentation).

    ``run``: the `nbbudget.Budget` to charge; `None` takes `nbbudget.current()` at each hook.
    ``prices``: ``{"input": usd, "output": usd}`` per million tokens, a function of the usage
    mapping returning dollars, or ``"free"``; `None` prices each model from genai-prices' data,
    at ``provider`` (genai-prices' name, ``"openrouter"``) when given.
    ``models=False`` charges no model call (no turns, provider calls, tokens or cost), for a
    model whose client ``nb.instrument`` already charges; tools and handoffs still count.
    """

    def __init__(self, run: Budget | None = None, *, prices: Given | None = None,
                 provider: str | None = None, models: bool = True) -> None:
        if run is not None and not isinstance(run, Budget):
            raise ConfigError(f"Budgeted(run={run!r}): give an nbbudget run (nb.budget(...)) "
                              f"or None for the current one")
        where = "nbbudget.openai_agents.Budgeted()"
        self._given = given_price(prices, where)
        given_provider(provider, where)
        self.run = run
        self.prices = prices
        self.provider = provider
        self.models = models
        # the model calls under way that reserved their worst case (S3-10), by the id of their
        # agent run's context (one model call at a time each): (context, reservation, forget)
        self._reserved: dict[int, tuple[Any, Reservation, Callable[[], None]]] = {}
        # the claims on the HTTP requests of the model calls under way, by the same id
        self._claims: dict[int, Claim] = {}

    def _run(self, *, check: bool = True) -> Budget:
        """The run to charge, checked: a stopped or timed-out run unwinds here."""
        run = self.run if self.run is not None else current()
        if run is None:
            raise ConfigError("Budgeted() found no active run: call Runner.run inside "
                              "`with nb.budget(...)` or a %%budget cell, or pass the run: "
                              "Budgeted(run)")
        if check:
            run.check()
        return run

    def run_options(self, max_turns: int | None = DEFAULT_MAX_TURNS) -> dict[str, Any]:
        """``Runner.run``'s ``hooks``, ``max_turns`` and ``error_handlers`` that end the agent
        run when the run's turns are spent before the SDK prepares the turn past them (see the
        module's documentation): ``Runner.run(agent, input, **budgeted.run_options())``.

        ``max_turns``: the SDK's own limit, lowered to the ``turns`` and ``provider_calls`` the
        run has left now (with ``models=True``); when the SDK's count reaches it, the run's
        refusal ends the agent run as `BudgetRefused`, or, when the run still permits a model
        call (this ``max_turns`` was the smaller), the SDK's own ``MaxTurnsExceeded``."""
        if self.models:
            run = self._run()
            left = min(run.remaining("turns"), run.remaining("provider_calls"))
            if max_turns is None or left < max_turns:
                max_turns = int(left)
        return {"hooks": self, "max_turns": max_turns,
                "error_handlers": {"max_turns": self._max_turns_reached}}

    def _max_turns_reached(self, data: Any) -> None:
        """The SDK's ``max_turns`` error handler: the run's refusal of the next model call
        (traced, as `on_llm_start` would raise it), else None for the SDK to raise its own."""
        run = self._run()
        if self.models:
            _require_call(run, data.run_data.last_agent)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        """An agent takes over (the first, or after a handoff), before the SDK prepares its
        first turn (its instructions, its tools, the agent's own start hook): the run's time is
        checked, and a model call the run could not permit now is refused here rather than at
        `on_llm_start`, after that work."""
        run = self._run()
        if self.models:
            _require_call(run, agent)

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: str | None,
                           input_items: list[Any]) -> None:
        """Before each model call: one ``turns`` and one ``provider_calls``, all or nothing,
        and its worst-case cost with ``cost_usd`` limited (S3-10)."""
        run = self._run()
        if not self.models:
            return
        provider, model = _model_of(agent, self.provider)
        target = f"provider:{model}"
        price = limited_price(run.remaining("cost_usd"), self._given, provider, model,
                              "Budgeted")
        core = run.lowlevel
        try:
            if price is None:
                # refused when no output token is left
                reserve_request(core, None, target, model=(provider, model))
                self._claim(context, core)
                return
            fixed, rate = worst_case(price, json_size([system_prompt, input_items])
                                     + json_size(_definitions(agent)))
            settings = getattr(agent, "model_settings", None)
            asked = getattr(settings, "max_tokens", None)
            _, dollars = reserve_priced(core, asked if type(asked) is int and asked > 0 else None,
                                        target, fixed, rate, clamp=False,
                                        model=(provider, model))
        except BudgetExceeded as err:
            raise BudgetRefused(*err.args) from None
        key = id(context)

        def forget() -> None:  # the run's block ends: a call that failed keeps it spent
            self._reserved.pop(key, None)

        self._reserved[key] = (context, Reservation(core, dollars, model, target,
                                                    (provider, model)), forget)
        core.hold(forget)
        self._claim(context, core)

    def _claim(self, context: Any, core: Core) -> None:
        """Claim the model call's HTTP requests, which these hooks count: the SDK's models
        send them with their own User-Agent, from a task the hooks' context never reaches
        (`claims.claim_in_run`); the claim ends with the call, or with the run's block."""
        made = claim_in_run(core, AGENTS_USER_AGENT)
        old = self._claims.pop(id(context), None)
        if old is not None:  # the call before it failed: no end hook came
            old.end()
        self._claims[id(context)] = made

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        """The model answered: charge its tokens and cost (past a limit the run fails
        ``budget-cut``, S3-3); what was used is charged before the run is checked."""
        run = self._run(check=False)
        if not self.models:
            run.check()
            return
        claimed = self._claims.pop(id(context), None)
        if claimed is not None:
            claimed.end()
        provider, model = _model_of(agent, self.provider)
        used = response.usage
        usage = {
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
            "cache_read_tokens": used.input_tokens_details.cached_tokens or 0,
            "cache_write_tokens": getattr(used.input_tokens_details, "cache_write_tokens",
                                          0) or 0,
        }
        cost: float | None = None
        if self._given is not None:
            cost = self._given(usage)
        else:
            price = price_of(provider, model)
            cost = None if price is None else price.cost(usage)
        held = self._reserved.pop(id(context), None)
        try:
            if held is not None and held[0] is context:  # settles its reservation (S3-10)
                held[1].core.release(held[2])
                held[1].spend(usage["input_tokens"], usage["output_tokens"], cost, final=True)
            else:
                charged = Usage(input_tokens=usage["input_tokens"],
                                output_tokens=usage["output_tokens"])
                if cost is not None:
                    charged["cost_usd"] = cost
                spend_usage(run, charged, None, model, model=(provider, model))
        finally:  # recorded even when the tokens cut the run (the first stop is the one kept)
            if used.requests > 1:  # the SDK's own retries (ModelSettings.retry): no hook ran
                retried = used.requests - 1
                run.lowlevel.spend(((_PROVIDER_CALLS, retried),), f"provider:{model}",
                                   (provider, model), (retried, 0, 0, None))
        run.check()

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """Before a local tool runs: one ``tool_calls`` (and one ``agent_invocations`` for an
        agent used as a tool); a refused tool never runs."""
        run = self._run()
        try:
            if getattr(tool, "_is_agent_tool", False):  # set by Agent.as_tool()
                run.charge_many({"tool_calls": 1, "agent_invocations": 1},
                                target=f"agent:{tool.name}")
            else:
                run.charge("tool_calls", target=f"tool:{tool.name}")
        except BudgetExceeded as err:
            raise BudgetRefused(*err.args) from None

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        """A tool returned: the run's time is checked."""
        self._run()

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        """A handoff: one ``agent_invocations`` before the new agent takes over, refused (and
        so is the handoff) when the run could not permit the new agent a model call: the SDK
        runs the new agent's own start hook beside `on_agent_start`, so a refusal there would
        come too late to keep it from running."""
        run = self._run()
        if self.models:
            _require_call(run, to_agent)
        try:
            run.charge("agent_invocations", target=f"agent:{to_agent.name}")
        except BudgetExceeded as err:
            raise BudgetRefused(*err.args) from None


def _require_call(run: Budget, agent: Any) -> None:
    """Refuse a model call of *agent* that *run* could not permit now (`BudgetRefused`,
    traced), reserving nothing: `Budgeted` reserves at `on_llm_start`."""
    try:
        require_request(run.lowlevel, f"provider:{_model_of(agent, None)[1]}")
    except BudgetExceeded as err:
        raise BudgetRefused(*err.args) from None


def _definitions(agent: Any) -> list[Any]:
    """What *agent*'s model calls send beside their instructions and input, for their input's
    bound (S3-10): its function tools' names, descriptions and schemas, its handoffs' (as the
    SDK makes them tools) and its output type's schema. The tools of its MCP servers, listed as
    each turn is prepared, are not seen by the hooks."""
    from agents.handoffs import Handoff

    sent: list[Any] = []
    for tool in getattr(agent, "tools", None) or ():
        sent.append([getattr(tool, "name", None), getattr(tool, "description", None),
                     getattr(tool, "params_json_schema", None)])
    for handoff in getattr(agent, "handoffs", None) or ():
        if isinstance(handoff, Handoff):
            sent.append([handoff.tool_name, handoff.tool_description,
                         handoff.input_json_schema])
        else:  # an agent: the SDK describes it as its default handoff tool
            sent.append([Handoff.default_tool_name(handoff),
                         Handoff.default_tool_description(handoff)])
    output = getattr(agent, "output_type", None)
    if output is not None and output is not str:
        from agents.agent_output import AgentOutputSchema

        try:
            sent.append(AgentOutputSchema(output).json_schema())
        except Exception:  # noqa: BLE001 - a type the SDK itself refuses: its own error, later
            sent.append(repr(output))
    return sent


def _model_of(agent: Any, provider: str | None) -> tuple[str, str]:
    """The provider and model name an agent asks (a RunConfig(model=...) override is not
    visible to hooks): its ``model`` string, or the ``model`` of its Model object, or the SDK's
    default; *provider* when given, else a ``provider/`` prefix (``litellm/anthropic/...``)
    names the provider, else it is ``openai``."""
    model = agent.model
    if model is not None and not isinstance(model, str):
        model = getattr(model, "model", None)
    if not model:
        from agents.models import get_default_model

        model = get_default_model()
    name = str(model)
    if name.startswith("litellm/"):
        name = name.removeprefix("litellm/")
    if provider is not None:
        return provider, name
    prefix, slash, rest = name.partition("/")
    return (prefix, rest) if slash else ("openai", name)
