"""Provider calls: the function that asks a model, bounded by the run (S2-9, S3-3, S3-6, S3-8,
S4-6).

Every attempt reserves a ``provider_calls`` permit before dispatch, retries included, and a
failed attempt is not refunded. What a reply used is read from it through a small protocol (an
object or mapping with ``input_tokens``, ``output_tokens`` and optionally ``cache_read_tokens``,
``cache_write_tokens`` and ``cost_usd``, found as the reply's ``usage`` or the reply itself) and
charged after the fact, at ``prices=`` (`nbbudget.run.prices`) when given, else at the cost the
reply reports: spending that already happened is recorded, and when it passes a limit the run
fails ``budget-cut`` by that limit (tokens > cost > ...), never with a made-up reply. A
per-request ``max_output_tokens`` is clamped to what remains of the output-token grant. A
guardrail (one hour by default, 0 to turn it off) stops waiting for a call that never returns,
whether or not the call cooperates.

What each model was called and used is tallied beside (``run.usage(by="model")``): every
reservation and charge here takes the model it is for (a `nbbudget.core.lowlevel.Model`, the
provider and the model's name), which the model clients and the adapters give. A call counts
as it reserves its ``provider_calls`` permit, once per attempt, so that where every provider
call is a model call the tally's calls add up to ``provider_calls``; its tokens and cost count
as they are charged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..core.duration import parse_duration
from ..core.errors import BudgetCut, BudgetExceeded, ConfigError
from ..core.kinds import KIND_INDEX, KINDS
from ..core.scope import Unwind
from .prices import Given, PriceFn, given_price, worst_case

if TYPE_CHECKING:
    from ..core.lowlevel import Core, Model, Run

__all__ = ["GUARDRAIL_MS", "UNKNOWN_PROVIDER", "Reservation", "Usage", "clamp", "degrade_past",
           "make_provider", "require_request", "reserve_call", "reserve_priced",
           "reserve_request", "spend_reply", "spend_usage", "unbilled", "usage_of"]

#: a call that does not answer is cut after 1 h (S3-8): the default of a provider's guardrail,
#: and the guardrail of each request of an instrumented model client
#: (``nbbudget.integrations.models``)
GUARDRAIL_MS = 3_600_000
#: the provider of a model call that names none, in the run's tally (``run.usage(by="model")``):
#: a provider's calls (`make_provider`: its function's provider is not known), and those of the
#: LangChain and pydantic-ai adapters to a model that does not say its provider
UNKNOWN_PROVIDER = "unknown"


_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
               "cost_usd")
_INF = float("inf")
_TOKENS, _OUTPUT_TOKENS, _COST = (KIND_INDEX[k] for k in ("tokens", "output_tokens", "cost_usd"))


class Usage(dict[str, float]):
    """What one reply used: ``input_tokens`` (cached ones included), ``output_tokens``,
    ``cache_read_tokens``, ``cache_write_tokens``, and ``cost_usd`` when it reports its cost.
    `usage_of` makes it and `spend_usage` charges it, here and in the adapters (which make
    their own from a model response's usage)."""


def usage_of(reply: Any) -> Usage:
    """Read a reply's usage: ``reply.usage`` (object or mapping) or the reply itself. A
    provider reads each reply with it."""
    source = reply.get("usage", reply) if type(reply) is dict else getattr(reply, "usage", None)
    if source is None and isinstance(reply, Mapping):
        source = reply.get("usage", reply)
    if source is None:
        source = reply
    out = Usage()
    if type(source) is dict or isinstance(source, Mapping):
        for key in _USAGE_KEYS:
            value = source.get(key)
            if value is not None:
                out[key] = value
    else:
        for key in _USAGE_KEYS:
            value = getattr(source, key, None)
            if value is not None:
                out[key] = value
    return out


def make_provider(run: Run, fn: Callable[..., Any], name: str | None,
                  prices: Given | None, price: PriceFn | None, retries: int,
                  guardrail: int | str | None,
                  degrade: tuple[Callable[..., Any], float] | None = None) -> Callable[..., Any]:
    """*fn* as a provider of *run*: what `Budget.provider` (``nbbudget.run.budget``) returns,
    kept here with what a model call needs (the clamp, the guardrail, retries, charging the
    reply's usage, degrading). The options are those of `Budget.provider`, checked here."""
    priced = _check_options(run, fn, prices, price, retries, degrade)
    limit_ms = GUARDRAIL_MS if guardrail is None else parse_duration(guardrail,
                                                                     field="guardrail")
    label = name or getattr(fn, "__name__", None) or "provider"
    takes_cap = "max_output_tokens" in inspect.signature(fn).parameters
    target = f"provider:{label}"
    # its rows in the run's tally, named as its trace names them: the provider the function
    # talks to is not known; the model is the provider's name, the cheaper function's once
    # degraded (S3-7)
    models = {False: (UNKNOWN_PROVIDER, label),
              True: (UNKNOWN_PROVIDER, _name_of(degrade[0]) if degrade is not None else label)}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        core = run.lowlevel
        # S3-10: with cost_usd limited and a price, each attempt reserves its worst case
        worst = worst_case(priced, _size(args, kwargs)) if (
            priced is not None and core.limited(_COST)) else None
        if takes_cap and worst is None:
            kwargs["max_output_tokens"] = clamp(run, kwargs.get("max_output_tokens"), target)
        asked = kwargs.get("max_output_tokens")
        degraded = degrade is not None and bool(core.degraded)
        model = degrade[0] if degrade is not None and degraded else fn
        called = models[degraded]
        for attempt in range(retries + 1):
            reservation = None
            if worst is None:
                reserve_call(core, target, called)  # S4-6: every attempt
            else:  # its permit, and its worst case with the cap clamped to fit
                cap, dollars = reserve_priced(core, asked, target, *worst, retry=True,
                                              clamp=takes_cap, model=called)
                if takes_cap:
                    kwargs["max_output_tokens"] = cap
                reservation = Reservation(core, dollars, label, target, called)
            try:
                reply = _guarded(run, label, limit_ms, model, args, kwargs)
            except (BudgetCut, BudgetExceeded):
                raise  # (a guardrail's cut keeps the reservation: the call may be billed)
            except Exception as exc:
                if reservation is not None and unbilled(exc):
                    reservation.release()
                if attempt == retries:
                    raise
                continue
            if isinstance(reply, Iterator):  # a streamed reply
                return _stream(run, reply, priced, label, degrade, reservation, called)
            spend_usage(run, usage_of(reply), priced, label, reservation, model=called)
            _maybe_degrade(run, degrade, label)
            return reply
        raise AssertionError("unreachable")

    return call


def _check_options(run: Run, fn: Callable[..., Any], prices: Given | None,
                   price: PriceFn | None, retries: int,
                   degrade: tuple[Callable[..., Any], float] | None) -> PriceFn | None:
    """The options of `make_provider` checked; the price of its replies (``prices=``, or the
    older ``price=``, a function), or None."""
    if not callable(fn):
        raise ConfigError(f"provider() decorates a function, not {fn!r}")
    if degrade is not None:
        cheaper, fraction = degrade
        if not callable(cheaper) or isinstance(fraction, bool) or not (
                isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ConfigError(f"degrade={degrade!r}: give (cheaper_function, fraction of the "
                              f"cost limit in (0, 1])")
        if run.limits.cost_usd is None:
            raise ConfigError("degrade= needs a cost limit (cost_usd=): the fraction is of it")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"retries={retries!r} must be a whole number >= 0")
    return given_price(prices, "run.provider()", price=price)


def _stream(run: Run, chunks: Iterator[Any], price: PriceFn | None, label: str,
            degrade: tuple[Callable[..., Any], float] | None,
            reservation: Reservation | None, model: Model) -> Iterator[Any]:
    """A streamed reply: each chunk's usage is charged as it arrives (drawn from the dollars
    *reservation* holds, S3-10), and the stream is closed the moment a limit is passed (S3-9);
    a stream that fails after content is a cut by ``stream-error`` (S2-4). What it reserved
    and did not draw goes back when it ends or its caller closes it."""
    started = ended = False
    try:
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                ended = True
                _maybe_degrade(run, degrade, label)
                return
            except Exception as exc:
                if not started:
                    raise
                raise BudgetCut("stream-error", f"the stream of provider {label} failed after "
                                                f"content: {type(exc).__name__}: {exc}") from exc
            started = True
            used = usage_of(chunk)
            if used:  # raises once a limit is passed
                spend_usage(run, used, price, label, reservation, final=False, model=model)
            try:
                yield chunk
            except GeneratorExit:  # its caller closed it: what it reported is all it used
                ended = True
                raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # S3-9: the provider stops streaming
        if ended and reservation is not None:
            reservation.release()


def _maybe_degrade(run: Run, degrade: tuple[Callable[..., Any], float] | None,
                   label: str) -> None:
    """S3-7: past a fraction of the cost limit, later calls use the cheaper model (once)."""
    if degrade is not None:
        degrade_past(run, degrade[1], label, _name_of(degrade[0]))


def _name_of(cheaper: Callable[..., Any]) -> str:
    """The name of the cheaper function a provider degrades to (S3-7), as its trace and its
    row in the run's tally name it."""
    return str(getattr(cheaper, "__name__", None) or repr(cheaper))


def degrade_past(run: Run, fraction: float, source: str, to: str) -> None:
    """S3-7: once *run* has used *fraction* of its cost limit, or, with no cost limit armed, of
    its most used armed limit, it degrades from *source* to the cheaper *to*, once, one way
    (traced, and recorded in its outcome). A provider degrades with it after each reply; so
    does an instrumented model client (``nbbudget.integrations.models``)."""
    if run.lowlevel.degraded is not None:
        return
    limits, consumed = run.limits, run.consumed
    cost = limits.cost_usd
    if cost is not None:
        used = consumed.get("cost_usd", 0) / cost
    else:
        armed = [(getattr(limits, kind), consumed.get(kind, 0)) for kind in KIND_INDEX
                 if getattr(limits, kind, None) is not None]
        used = max((spent / limit for limit, spent in armed), default=0.0)
    if used >= fraction:
        run.lowlevel.degrade({"from": source, "to": to, "reason": "budget"})


def clamp(run: Run, asked: Any, target: str) -> int | None:
    """S2-9, S3-6: a reply may not ask for more output than the grant has left; with none
    left the request is refused before dispatch, as any refusal (S4-8). A provider clamps
    ``max_output_tokens`` with it; so does the pydantic-ai adapter, before each model request
    (the model clients and the other adapters clamp through `reserve_request`)."""
    left = run.remaining("output_tokens")
    if left < 1:  # refused and traced (a stopped run raises its stop)
        run.lowlevel.require(_OUTPUT_TOKENS, 1, target)
    if left == float("inf"):
        return asked if asked is None else int(asked)
    return int(left) if asked is None else int(min(asked, left))


#: what the first attempt of a model call reserves (its turn and its permit, in the attribution
#: order), and what each retry reserves (S4-6)
_FIRST_ATTEMPT = tuple(sorted(((KIND_INDEX["turns"], 1), (KIND_INDEX["provider_calls"], 1)),
                              key=lambda item: KINDS[item[0]].rank))
_RETRY = ((KIND_INDEX["provider_calls"], 1),)


def reserve_request(core: Core, asked: Any, target: str, *, retry: bool = False,
                    model: Model | None = None) -> int | None:
    """What a model request takes before it is sent, under one lock: refused when no output
    token is left (S2-9, nothing reserved), else its ``turns`` and ``provider_calls`` permits,
    both or neither (a retry: one more ``provider_calls`` permit, S4-6); the output cap to send,
    *asked* clamped to what ``output_tokens`` has left (None: no cap asked and none needed).
    *core* is the run's (``run.lowlevel``); *model*, the model called, whose calls it counts.
    An instrumented model client (``nbbudget.integrations.models``) calls it before each
    attempt; the LangChain and the Agents SDK adapters before each model call."""
    left = core.reserve_within(_RETRY if retry else _FIRST_ATTEMPT, _OUTPUT_TOKENS, target,
                               model)
    if left == float("inf"):
        return asked if asked is None else int(asked)
    return int(left) if asked is None else int(min(asked, left))


def reserve_priced(core: Core, asked: Any, target: str, fixed: float, rate: float, *,
                   retry: bool = False, clamp: bool = True,
                   model: Model | None = None) -> tuple[int | None, float]:
    """`reserve_request` for a request whose cost is reserved too, with ``cost_usd`` limited
    (S3-10): its worst case, *fixed* dollars for its input (bounded from above,
    `nbbudget.run.prices.worst_case`) and *rate* dollars per output token of its cap, the cap
    clamped so that the worst case fits what is left. The cap to send (None: none asked and none
    needed, and then all the dollars left are reserved, as nothing bounds the reply) and the
    dollars reserved, which `spend_reply` (or a `Reservation`) settles with the reply's cost.
    *retry*: one ``provider_calls`` permit only (a retry; or an attempt whose turn was counted
    apart, as pydantic-ai's). Not *clamp*: the caller cannot change the cap it sends, so a worst
    case that does not fit is refused whole, and no cap (None) is no bound on the output, even
    under an ``output_tokens`` limit. *model*: the model called, whose calls it counts. An
    instrumented model client (``nbbudget.integrations.models``) calls it before each attempt;
    the LangChain, Agents SDK and pydantic-ai adapters before each model call they can see
    before it is sent."""
    cap, reserved = core.reserve_costed(_RETRY if retry else _FIRST_ATTEMPT, _OUTPUT_TOKENS, _COST,
                                        fixed, rate, _INF if asked is None else asked, target,
                                        clamp, model)
    if not clamp:
        return (None if asked is None else int(asked)), reserved
    return (None if cap == _INF else int(cap)), reserved


#: a call that reserved nothing, for `reserve_call`
_CALL = ((KIND_INDEX["provider_calls"], 1),)


def reserve_call(core: Core, target: str, model: Model) -> None:
    """One ``provider_calls`` permit for an attempt at a call of *model*, counted as its call
    (S4-6; refused as any charge is). A provider calls it before each attempt whose cost it does
    not reserve; so does the pydantic-ai adapter."""
    core.reserve(_CALL, target, model)


class Reservation:
    """The dollars one model request reserved before it was sent (`reserve_priced`, S3-10) and
    has not drawn yet, and the charges that settle them, for *model* (its row of the tally):
    the model clients (``nbbudget.integrations.models``) keep one for each attempt, the
    LangChain, Agents SDK and pydantic-ai adapters for each model call under way."""

    __slots__ = ("core", "dollars", "label", "model", "target")

    def __init__(self, core: Core, dollars: float, label: str, target: str,
                 model: Model | None = None) -> None:
        self.core, self.dollars, self.label, self.target = core, dollars, label, target
        self.model = model

    def spend(self, inp: float, out: float, cost: float | None, *, final: bool) -> None:
        """Charge what the reply used (`spend_reply`: recorded even past a limit, S3-3). A
        charge on the way (a streamed reply's) draws its cost from the dollars reserved while
        they last; the *final* one settles them: what the reply did not use goes back."""
        reserved = self.dollars
        if reserved and not final:
            reserved = min(cost or 0.0, reserved)
            self.dollars -= reserved
        else:
            self.dollars = 0.0
        spend_reply(self.core, inp, out, cost, self.label, self.target, reserved, self.model)

    def release(self, keep: float = 0.0) -> None:
        """Give back the dollars not drawn but *keep* of them: the call used nothing more
        (`unbilled`), or nothing more than *keep* says (a model client's stream that ended
        before it reported its input keeps its input's bound). A limit the run passed
        meanwhile is raised at its next check, not here."""
        reserved, self.dollars = self.dollars, 0.0
        if reserved > keep:
            with contextlib.suppress(Unwind):
                spend_reply(self.core, 0, 0, None, self.label, self.target, reserved - keep)


def unbilled(error: BaseException) -> bool:
    """Whether the *error* a model call failed with shows that the provider billed nothing: it
    answered with an error status (an HTTP status of 400 or more on the error or on one it was
    raised from: the SDKs' ``APIStatusError``, pydantic-ai's ``ModelHTTPError``, httpx's
    ``HTTPStatusError``), or the connection was never made (refused, or a connect timeout). Any
    other error (a timeout or a connection dropped after the request was sent, a model's own
    exception) may come after the provider billed the request. The adapters give a failed
    call's reservation back when it is unbilled (S3-10)."""
    seen: set[int] = set()
    err: BaseException | None = error
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        status = getattr(err, "status_code", None)
        if status is None:
            status = getattr(getattr(err, "response", None), "status_code", None)
        if (type(status) is int and status >= 400) or isinstance(err, ConnectionRefusedError) \
                or type(err).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        err = err.__cause__ or err.__context__
    return False


def require_request(core: Core, target: str) -> None:
    """Refuse a model request the run cannot permit now, as `reserve_request` would refuse it
    (no output token left, S2-9, then no ``turns`` or ``provider_calls`` permit), reserving
    nothing. For an adapter that acts before a model call is prepared (its prompt built, its
    tools listed) and reserves at the call itself: the Agents SDK hooks at an agent's start,
    the LangChain handler at the start of an agent's model node."""
    core.require(_OUTPUT_TOKENS, 1, target)
    for i, n in _FIRST_ATTEMPT:
        core.require(i, n, target)


def _guarded(run: Run, label: str, limit_ms: int, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """S3-8: wait for the call at most the guardrail (0: as long as it takes)."""
    if limit_ms == 0:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}
    done = threading.Event()

    def attempt() -> None:
        try:
            box["reply"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc
        finally:
            done.set()

    clock = run.lowlevel.clock
    deadline = clock.now_ms() + limit_ms  # from the dispatch, before the call can run
    thread = threading.Thread(target=attempt, name=f"nbbudget-provider-{label}", daemon=True)
    thread.start()
    if not clock.wait(done, deadline):
        run.lowlevel.record("cut", {"by": "guardrail", "provider": label,
                                    "code": "guardrail_timeout"})
        raise BudgetCut("guardrail", f"provider {label} did not answer within its guardrail of "
                                     f"{limit_ms} ms (guardrail_timeout); the run stopped "
                                     f"waiting for it")
    if "error" in box:
        raise box["error"]
    return box["reply"]


def spend_usage(run: Run, usage: Usage, price: PriceFn | None, label: str,
                reservation: Reservation | None = None, *, final: bool = True,
                model: Model | None = None) -> None:
    """Charge what a reply used: it was spent, so it is recorded even past a limit, and then
    the run fails by the first limit it passed (S3-3). Its cost is *price* (``prices=``) of
    the usage when given, else the ``cost_usd`` it reports. A provider charges each reply with
    it, settling what its attempt reserved (*reservation*, S3-10, whose model it counts for;
    a stream's chunk draws on it, not *final*); so do the adapters, with the cost they worked
    out in ``cost_usd``. *model*: the model that answered, without a reservation."""
    inp = _amount("input_tokens", usage.get("input_tokens", 0), label)
    out = _amount("output_tokens", usage.get("output_tokens", 0), label)
    if price is not None:
        for key in ("cache_read_tokens", "cache_write_tokens"):
            if key in usage:
                _amount(key, usage[key], label)
        cost: float | None = price(usage)
    else:
        cost = usage.get("cost_usd")
    if reservation is not None:
        reservation.spend(inp, out, cost, final=final)
    else:
        spend_reply(run.lowlevel, inp, out, cost, label, f"provider:{label}", model=model)


def _size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """What bounds the input of a provider's request from above (S3-10): the bytes of its
    arguments as JSON (what is not JSON as its ``str``), ``max_output_tokens`` left out. What
    the function adds to the prompt itself is not covered (the docs say so)."""
    given = {k: v for k, v in kwargs.items() if k != "max_output_tokens"}
    try:
        text = json.dumps([args, given], default=str, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # keys that are not strings, a cycle
        text = repr((args, given))
    return len(text.encode("utf-8", "surrogatepass"))


def spend_reply(core: Core, inp: float, out: float, cost: float | None, label: str,
                target: str, reserved: float = 0.0, model: Model | None = None) -> None:
    """Charge what a model reply used, *inp* input and *out* output tokens and *cost* dollars
    (None or 0: no cost), to *target* on the run whose *core* it is (``run.lowlevel``), each
    figure checked as `spend_usage` checks it (whole numbers of tokens pass at once). *reserved*:
    dollars reserved for the reply before it was sent (`reserve_priced`), settled here in the
    same charge: what the reply did not use of them is given back, what it used beyond them is
    spent (S3-10). *model*: the model that answered, whose row of the tally the tokens and the
    cost (not the reservation) are added to. The model clients (``nbbudget.integrations.models``)
    call it with what they read from each reply and its price; `spend_usage` once it has worked
    out the cost of a usage mapping."""
    if not (type(inp) is int and type(out) is int and inp >= 0 and out >= 0):
        inp = _amount("input_tokens", inp, label)
        out = _amount("output_tokens", out, label)
    items: list[tuple[int, float]] = []  # in the attribution order: tokens > output > cost
    if inp or out:
        items.append((_TOKENS, inp + out))
    if out:
        items.append((_OUTPUT_TOKENS, out))
    if cost and not (type(cost) is float and 0 < cost < _INF):
        cost = _amount("cost_usd", cost, label)
    if cost or reserved:
        settled = (cost or 0) - reserved  # < 0: what the reservation gives back
        if settled:
            items.append((_COST, settled))
    if items:
        core.spend(items, target, model, (0, inp, out, cost))


def _amount(key: str, value: Any, label: str) -> float:
    """A usage figure as reported: a finite number >= 0 (tokens whole)."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value < float("inf")) or (key != "cost_usd" and not float(value).is_integer()):
        raise ConfigError(f"provider {label} reported {key}={value!r}: usage must be a finite "
                          f"number >= 0 (tokens in whole numbers)")
    return value
