"""``nb.instrument(client)``: the model calls of an OpenAI or Anthropic client, bounded by the run
current when each call is made.

**Where it sits.** The SDKs send every attempt of a request, their own retries included, through
their HTTP client's ``send``. `instrument` gives a copy of the client (``with_options``: the same
class, the passed client left as it was) an HTTP client that wraps the original one: sync and
async alike, OpenAI and Anthropic alike, one mechanism. For a request to a model endpoint (see
``openai_api`` and ``anthropic_api``) made inside a run (`nbbudget.current`), before it is sent:

- the request's output cap is clamped to what remains of ``output_tokens`` (S2-9; none left
  refuses it), and once the run has degraded (S3-7) the request names the cheaper model;
- a call's first attempt reserves one ``turns`` and one ``provider_calls`` permit, both or
  neither, and each retry one more ``provider_calls`` permit (S4-6; the SDK numbers its
  attempts in ``x-stainless-retry-count``), as the LangChain and Agents SDK adapters charge
  them; a refusal raises the API module's ``Refused``
  (`nbbudget.BudgetExceeded` and the SDK's own error: the SDK passes its own errors on
  unchanged, where Anthropic's would take any other error for a connection error and retry
  it) and nothing is sent;
- with ``cost_usd`` limited, a model with no price in genai-prices for the client's provider
  and no ``prices=`` is refused with ``Unpriced`` (a `nbbudget.ConfigError`) naming the
  provider, the model, ``prices=`` and ``provider=``;
- the request's timeouts are lowered to the run's remaining time and the guardrail (one hour,
  S3-8), and the socket of its reply is shut at that deadline while the reply is read
  (`_Watch`: a reply that trickles in). A timeout of the run's own raises ``Cut``
  (`nbbudget.BudgetCut`, ``by="timeout"``, or ``"guardrail"``), never the HTTP timeout the SDK
  would retry; the SDK's own shorter timeouts stay its own. An error status the SDK would
  retry after a wait that ends past the deadline cuts the run at once (`Attempt.waits`).

**After.** What a reply used is charged as its API reports it (`spend_reply`): ``tokens`` (input,
cached included, plus output), ``output_tokens`` (reasoning included) and ``cost_usd`` from
``prices=`` (`nbbudget.run.prices`: USD per million tokens, a function of the usage, or
``"free"``), else the cost the reply reports (OpenRouter's ``usage.cost``), else genai-prices'
price of the model at the client's provider: ``provider=``, or the one whose API the client's
base URL matches (``https://openrouter.ai/api/v1``: ``openrouter``), or, when none matches, the
SDK's own (``openai``, ``anthropic``); read once per model. The run counts it for that provider
and the model the request named, beside the attempts it reserved (``run.usage(by="model")``).
Spending that happened is recorded even past a limit; the run is then cut by the first limit
passed (S3-3) and the call raises ``Cut`` with ``salvage``, the reply's text. A stop of the run
itself (a cancel, the panel's Stop button) unwinds through the SDK as any nbbudget stop does.

**Streams.** A stream's bytes pass through a meter that hands the SDK whole events only. Each text
delta is counted as one output token, provisionally, against what remains of ``output_tokens``,
``tokens`` and ``cost_usd`` (at the model's output price); the usage the API reports (OpenAI
Chat at the end, once ``stream_options.include_usage`` is asked, which the client does, keeping
that last chunk from a caller who did not ask for it; Responses in ``response.completed``;
Anthropic's input in ``message_start`` and output in ``message_delta``) is charged as it comes
and supersedes the count. When the count would pass a limit, the stream is cut there (S3-9): the
count is charged as spent (an OpenAI stream's input, reported only at its end, is then unknown
and not charged), the HTTP response is closed, and ``Cut`` raises with ``salvage``, the text
received so far. A stream the caller leaves early is charged its count when it closes, or
when its run's block ends if it is still open then (`nbbudget.core.lowlevel.Core.hold`). Every
event is read as its API defines it, whatever the server's JSON form (`Meter`).

**Usage that cannot be read** (N-7): a reply or stream whose usage is missing or malformed (a
count that is not a whole number >= 0, details that are not an object) is charged what is known
(a stream's count); then, under a ``tokens``, ``output_tokens`` or ``cost_usd`` limit, the run
is cut by the first of them and ``Cut`` raises, naming the provider, the field and the value
(the SDK passes it on: nothing is resent); without one the reply reaches the caller as it came.

What a budget cannot stop: a request already sent is paid for, whatever happens to its answer.
"""

from __future__ import annotations

import contextlib
import email.utils
import importlib
import json
import math
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from ...core import preempt
from ...core.errors import BudgetCut, BudgetExceeded, ConfigError
from ...core.kinds import KIND_INDEX, KINDS, RUN_MS
from ...core.lowlevel import Core, Model, Stop, Unwind
from ...core.outcome import Status
from ...run.budget import Budget, current
from ...run.prices import (
    FRAMING,
    Given,
    PriceFn,
    given_price,
    given_provider,
    price_of,
    provider_of,
    worst_case,
    worst_rates,
)
from ...run.providers import (
    GUARDRAIL_MS,
    Reservation,
    degrade_past,
    reserve_call,
    reserve_priced,
    reserve_request,
    spend_reply,
)
from ..claims import claimed
from .shapes import (
    SSE,
    Shape,
    Unreadable,
    ends,
    may_hold_usage,
    reply_usage,
    request_body,
    request_content,
)

__all__ = ["Attempt", "Gate", "Http", "Library", "Meter", "Read", "Stream", "api_of", "http_of",
           "instrument", "library", "opening", "send", "send_async", "watch"]

_INF = math.inf
#: what bounds a stream's output, for `Meter._left`
_OUTPUT_LEFT = tuple(KIND_INDEX[kind] for kind in ("output_tokens", "tokens", "cost_usd"))
#: the limits a reply's usage is charged to, in the attribution order (S3-3): one of them
#: armed, a reply whose usage cannot be read stops the run (N-7)
_METERED = tuple(sorted((KIND_INDEX[kind] for kind in ("tokens", "output_tokens", "cost_usd")),
                        key=lambda i: KINDS[i].rank))
_MILLION = 1_000_000
_BACKSLASH = ord("\\")  # ``int in bytes`` is one memchr
_COST = KIND_INDEX["cost_usd"]
#: the permit of one attempt at a request that generates no text (an embedding), reserved with
#: its input's worst case
_ONE_CALL = (KIND_INDEX["provider_calls"], 1)
#: the extension a gate marks a request with while it sends the attempt it opened: the HTTP
#: client an instrumented client wraps sends it on untouched, as the process-wide switch does
_OPENED = "nbbudget.opened"
#: the extension a gate marks an SDK's request with once it has admitted it: the same request
#: sent again (the mistralai SDK's retries resend it) is a retry of it (S4-6)
_ADMITTED = "nbbudget.admitted"
#: the headers of a body's length, which a new body replaces
_LENGTH = (b"content-length", b"transfer-encoding")
_C = TypeVar("_C")
#: True while an async gate sends a request it opened, in that context: an HTTP library below
#: it (aiohttp, under LiteLLM's transport for httpx) sends it on untouched, counted once
opening: ContextVar[bool] = ContextVar("nbbudget_opening", default=False)
#: the header of an SDK's first attempt at a request (S4-6: a retry takes one more permit), as
#: httpx2 keeps it: ``Headers._list`` holds (raw key, lower-case key, value) triples, read in
#: place. ``Headers.raw`` copies them into new pairs on every read, which cost a model call 1.1
#: us against 0.27 us (warm; about 5 us in a call, where the copy's allocations miss the cache).
#: A version of httpx2 without it finds nothing here and looks the header up.
_FIRST = (b"x-stainless-retry-count", b"x-stainless-retry-count", b"0")


@dataclass(frozen=True)
class _Api:
    provider: str
    shapes: tuple[Shape, ...]
    refused: type[BudgetExceeded]
    cut: type[BudgetCut]
    unpriced: type[ConfigError]
    #: the longest ``Retry-After`` the SDK waits for; past it the SDK does not retry
    max_retry_after: float
    #: the SDK's own retries when nothing says otherwise, which a process-wide gate assumes (it
    #: does not see the client's ``max_retries``; an instrumented client's gate does)
    retries: int = 2
    #: the extra of nbbudget that installs the SDK and genai-prices, when not named as the
    #: provider
    extra: str = ""


def instrument(client: _C, *, prices: Given | None = None,
               degrade: tuple[str, float] | None = None, name: str | None = None,
               provider: str | None = None) -> _C:
    """A copy of *client* (``openai.OpenAI``/``AsyncOpenAI``, ``anthropic.Anthropic``/
    ``AsyncAnthropic``) whose model calls are provider calls of the run current when each is
    made; outside every run it counts nothing. See the module's documentation.

    ``prices``: ``{"input": usd, "output": usd}`` per million tokens (optionally
    ``cache_read`` and ``cache_write``), a function of the usage figures (``input_tokens``,
    ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``) returning dollars, or
    ``"free"`` (a local model); otherwise the cost the reply reports, else genai-prices' price of
    the model at *provider* (a genai-prices provider id, ``"openrouter"``; default: resolved
    from the client's base URL, else the SDK's own). ``degrade=("model", 0.8)``:
    past that fraction of the cost limit (or, with none, of the most used armed limit) requests
    name the cheaper model. ``name``: the calls' name in the trace (default: the model).
    """
    given_provider(provider, "nb.instrument()")
    # the provider of the API at the client's base URL (as genai-prices names it), which
    # picks the shape of its Chat Completions (Mistral's, Groq's); else the SDK's own
    found = provider or provider_of(str(getattr(client, "base_url", "")))
    api = _api_of(client, found)
    given = given_price(prices, "nb.instrument()")
    _check(degrade, name)
    http = client._client  # type: ignore[attr-defined]  # the SDK's HTTP client (no accessor)
    if isinstance(http, (_Budgeted, _AsyncBudgeted)):
        raise ConfigError(f"this {type(client).__name__} client is instrumented already: "
                          f"instrument the original client once")
    library = http_of(http)
    if library is None:
        raise ConfigError(f"nb.instrument() wraps a client built on httpx2 or httpx, and this "
                          f"{type(client).__name__} uses {type(http).__module__}."
                          f"{type(http).__name__}: give it one of those (http_client=)")
    gate = Gate(api, library, given, degrade, name, found or api.provider,
                 linear=given is not None and not callable(prices),
                 max_retries=client.max_retries)  # type: ignore[attr-defined]
    wrapper = (library.budgeted_async(http, gate) if isinstance(http, library.module.AsyncClient)
               else library.budgeted(http, gate))
    copy: _C = client.with_options(http_client=wrapper)  # type: ignore[attr-defined]
    return copy


def api_of(family: str, provider: str | None = None, base_url: str = "") -> _Api:
    """The API *family* (``"openai"``, ``"anthropic"``, ``"gemini"``, ``"ollama"``,
    ``"bedrock"``) as the gates
    read it: its shapes and its errors (the SDK's own as well as nbbudget's where the SDK is
    installed). Used here and by the process-wide switch (``everywhere``), which routes a
    request by its path. The OpenAI family's Chat Completions are read as Mistral's or Groq's
    (``openai_api.chat_of``) when *provider* names that provider, or else when *base_url* is
    at its URL (``openai_api.provider_at``: where genai-prices is not installed to resolve
    it); the API's provider is then that one."""
    if family == "ollama":
        from . import ollama_api as ol

        # the ollama package never retries: an error status is the caller's at once
        return _Api(ol.PROVIDER, (ol.CHAT, ol.GENERATE), ol.Refused, ol.Cut, ol.Unpriced, _INF,
                    retries=0, extra="ollama")
    if family == "openai":
        from . import openai_api as o

        chat = o.chat_of(provider or o.provider_at(base_url) or o.PROVIDER)
        if chat is o.MISTRAL_CHAT:
            # Mistral serves no Responses (its Embeddings are OpenAI's shape); the mistralai
            # SDK retries only when given a retry configuration
            return _Api(o.MISTRAL, (chat, o.EMBEDDINGS), o.Refused, o.Cut, o.Unpriced, _INF,
                        retries=0, extra=o.MISTRAL)
        if chat is o.GROQ_CHAT:
            return _Api(o.GROQ, (chat, o.RESPONSES), o.Refused, o.Cut, o.Unpriced,
                        o.MAX_RETRY_AFTER, extra=o.GROQ)
        return _Api(o.PROVIDER, (o.CHAT, o.RESPONSES, o.EMBEDDINGS), o.Refused, o.Cut,
                    o.Unpriced, o.MAX_RETRY_AFTER)
    if family == "bedrock":
        from . import bedrock_api as b

        # botocore's own retries (its legacy mode's four) wait their own backoff
        return _Api(b.PROVIDER, (b.CONVERSE, b.CONVERSE_STREAM), b.Refused, b.Cut, b.Unpriced,
                    _INF, retries=4, extra=b.EXTRA)
    if family == "gemini":
        from . import gemini_api as g

        # the SDK retries only when given retry options, and reads no Retry-After
        return _Api(g.PROVIDER, (g.GENERATE, g.STREAM), g.Refused, g.Cut, g.Unpriced, _INF,
                    retries=0, extra=g.EXTRA)
    from . import anthropic_api as a

    return _Api(a.PROVIDER, (a.MESSAGES,), a.Refused, a.Cut, a.Unpriced, _INF)


def _api_of(client: object, provider: str | None) -> _Api:
    package = type(client).__module__.split(".")[0]
    if package == "openai" and hasattr(client, "chat"):
        return api_of("openai", provider, str(getattr(client, "base_url", "")))
    if package == "anthropic" and hasattr(client, "messages"):
        return api_of("anthropic")
    raise ConfigError(f"nb.instrument() takes an openai.OpenAI, openai.AsyncOpenAI, "
                      f"anthropic.Anthropic or anthropic.AsyncAnthropic client, not "
                      f"{type(client).__module__}.{type(client).__name__}")


def _check(degrade: tuple[str, float] | None, name: str | None) -> None:
    if degrade is not None:
        ok = isinstance(degrade, tuple) and len(degrade) == 2
        model, fraction = degrade if ok else ("", 0)
        if not (ok and isinstance(model, str) and model and not isinstance(fraction, bool)
                and isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ConfigError(f"degrade={degrade!r}: give (cheaper_model_name, fraction in "
                              f"(0, 1]), e.g. ('gpt-4o-mini', 0.8)")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"name={name!r}: give the calls' name in the trace, a non-empty str")


#: what a gate keeps of each model: the calls' name and target, the price, the worst case's
#: rates, and the model as the run's tally names it
_Model = tuple[str, str, PriceFn | None, tuple[float, float] | None, Model]


class Gate:
    """What every request of one instrumented client goes through (and, under the
    process-wide switch, ``everywhere``, every request to one API at one base URL).

    Kept lean: its work is added to every model call (the goal: at most 5% of a call's CPU
    time, ``benchmarks/bench_instrument.py``). What depends only on the model (the calls' name
    and target, the price) is worked out once per model and kept."""

    def __init__(self, api: _Api, library: Library, given: PriceFn | None,
                 degrade: tuple[str, float] | None, name: str | None, provider: str, *,
                 linear: bool, max_retries: float, strict: bool = False) -> None:
        self.api, self.degrade, self.name, self.provider = api, degrade, name, provider
        # the HTTP library the requests go through: an `Http` wherever `open`, `send` and
        # the wrapper clients take the gate (never the aiohttp layer's, which only admits)
        self.library: Http = library  # type: ignore[assignment]
        # a request is a model call only if its body names a model (a process-wide gate, which
        # sees every POST to a path that ends as the API's do)
        self.strict = strict
        self.max_retries = max_retries  # the instrumented client's, for `Attempt.waits`
        self.given = given  # prices=, which wins over a reported cost; else genai-prices'
        self.linear = linear  # prices= is a mapping or "free", not a function of the user's
        # by model: (label, target, price or None, the worst case's rates or None, the tally's
        # (provider, model)); filled as models are met
        self.models: dict[str, _Model] = {}

    def open(self, request: Any) -> tuple[Any, Attempt] | None:
        """Before an attempt is sent: the request to send and its attempt, or None when it is
        not a model call made in a run (it is then sent untouched)."""
        run = current()
        if run is None or request.method != "POST" or _OPENED in request.extensions or (
                claimed(request, run.lowlevel)):  # an adapter counts it
            return None
        try:
            content = request.content
        except self.library.not_read:
            return None
        admitted = self.admit(run, request.url.path, content, request.headers,
                              retry=True if _ADMITTED in request.extensions else None)
        if admitted is None:
            return None
        request.extensions[_ADMITTED] = True
        attempt, body = admitted
        if body is not None or attempt.stream:
            request = _prepared(request, body, attempt.stream, self.library)
        # the HTTP client an instrumented client wraps (patched by the process-wide switch)
        # sends it as it is
        request.extensions[_OPENED] = True
        timeout = request.extensions.get("timeout")
        bound = attempt.bound
        if not timeout or None in (values := timeout.values()) or max(values) > bound:
            _lower(request, timeout, bound)
        return request, attempt

    def admit(self, run: Budget, path: str, content: bytes, headers: Any,
              retry: bool | None = None, signed: bool | None = None
              ) -> tuple[Attempt, dict[str, Any] | None] | None:
        """A ``POST`` to *path* with the JSON body *content* and *headers* (a mapping with
        ``get``), about to be sent in *run*: its attempt (the permits taken, the worst case
        reserved) and the body to send in its place when it changed (the cap clamped, the
        model degraded, usage asked of a stream), else None; None when it is not a model
        call (it is then sent untouched). A refusal raises the API's ``Refused``, and nothing
        is sent. *retry*: whether it retries an attempt, where the caller knows (botocore's
        attempt count); else read from the SDKs' ``x-stainless-retry-count`` header. *signed*:
        whether the body was signed before it came here, so that it cannot change (default: the
        shape's ``signed``, for a request signed by its sender; botocore's layer admits
        Bedrock's before botocore signs them): its cap is then never clamped, and a worst case
        that does not fit is refused whole. Every
        HTTP library's requests come here: `open` (httpx2, httpx), and the aiohttp and
        botocore layers of the process-wide switch (``aio``, ``boto``)."""
        for shape in self.api.shapes:
            if path.endswith(shape.path):
                break
        else:
            return None
        try:
            body = request_body(content)
        except ValueError:  # not JSON
            return None
        if type(body) is not dict:
            return None
        named = shape.model_of
        model = body.get("model") if named is None else named(path, body)
        if self.strict and type(model) is not str:
            return None  # no model named: not a model call
        changed = False
        if signed is None:
            signed = shape.signed
        degrade = self.degrade
        if degrade is not None and run.lowlevel.degraded is not None and named is None and (
                model != degrade[0]) and not signed:
            body["model"] = model = degrade[0]
            changed = True
        if type(model) is not str:
            model = str(model)
        known = self.models.get(model)
        if known is None:
            known = self._model(model)
        label, target, price, rates, tallied = known
        if price is None:
            self._priceless(run, model)
        if not shape.generates:
            return self._embedding(run, shape, model, known, len(content)), None
        holder = body if not shape.cap_in else body.get(shape.cap_in)
        if type(holder) is not dict:
            holder = {}  # none asked: set in the body only if a cap must be sent
        for key in shape.cap_keys:  # the first the body has, else the last
            if key in holder:
                break
        asked = holder.get(key)
        uncapped = shape.uncapped
        if uncapped is not None and asked is not None and uncapped(asked):
            asked = None  # it bounds nothing (Ollama's num_predict -1): clamped as if not given
        # a first attempt's header found in C (httpx2's), else looked up
        if retry is None:
            retry = _FIRST not in getattr(headers, "_list", ()) and headers.get(
                "x-stainless-retry-count", "0") != "0"
        core = run.lowlevel
        reservation, fixed = None, 0.0
        try:
            if price is not None and core.limited(_COST):
                if rates is not None:  # a linear price: its rates, worked out once
                    fixed, rate = (len(content) + FRAMING) * rates[0], rates[1]
                else:
                    fixed, rate = worst_case(price, len(content))
                choices = holder.get(shape.choices)  # Chat's n: each writes up to the cap
                if type(choices) is int and choices > 1:
                    rate *= choices
                capped, reserved = reserve_priced(core, asked, target, fixed, rate, retry=retry,
                                                  clamp=not signed, model=tallied)
                reservation = Reservation(core, reserved, label, target, tallied)
            else:
                capped = reserve_request(core, asked, target, retry=retry, model=tallied)
        except BudgetExceeded as err:
            raise self.api.refused(*err.args) from None
        except Unwind as signal:  # the run was cut meanwhile, by another thread's reply
            raise _public(self.api, signal, "") from None
        if capped != asked and not signed:
            if shape.cap_in and body.get(shape.cap_in) is not holder:
                body[shape.cap_in] = holder
            holder[key], changed = capped, True
        streamed = shape.streamed
        stream = body.get("stream") is True if streamed is None else streamed(path, body)
        hide = stream and not signed and shape.ask_usage(body)  # a signed body stays as it is
        return Attempt(self, run, core, shape, model, label, target, price, stream, hide,
                        _bound_s(core), reservation, fixed, tallied), (
            body if changed or hide else None)

    def _embedding(self, run: Budget, shape: Shape, model: str, known: _Model,
                   size: int) -> Attempt:
        """The attempt of a request that generates no text (an embedding): one
        ``provider_calls`` permit (S4-6) and, with ``cost_usd`` limited, its input's worst case
        (S3-10); no turn, no output cap."""
        label, target, price, rates, tallied = known
        core = run.lowlevel
        reservation, fixed = None, 0.0
        try:
            if price is not None and core.limited(_COST):
                fixed = ((size + FRAMING) * rates[0] if rates is not None
                         else worst_case(price, size)[0])
                core.reserve(((_COST, fixed), _ONE_CALL), target, tallied)
                reservation = Reservation(core, fixed, label, target, tallied)
            else:
                reserve_call(core, target, tallied)
        except BudgetExceeded as err:
            raise self.api.refused(*err.args) from None
        except Unwind as signal:  # the run was cut meanwhile
            raise _public(self.api, signal, "") from None
        return Attempt(self, run, core, shape, model, label, target, price, False, False,
                       _bound_s(core), reservation, fixed, tallied)

    def _model(self, model: str) -> _Model:
        """The calls' name, target, price for *model* and, where the price is linear in the
        usage (``prices=`` as a mapping, genai-prices' price of a model not priced in tiers),
        the rates of a request's worst case (S3-10), and its row in the run's tally, kept for
        its next calls: 4 calls of the price a request cost 5 us."""
        label = self.name or model
        price, linear = self.given, self.linear
        if price is None:
            found = price_of(self.provider, model)
            price = None if found is None else found.cost
            linear = found is not None and found.per_token is not None
        rates = worst_rates(price) if price is not None and linear else None
        known = self.models[model] = (label, "provider:" + label, price, rates,
                                      (self.provider, model))
        return known

    def _priceless(self, run: Budget, model: str) -> None:
        """A model with no price: refused while ``cost_usd`` is limited."""
        if run.remaining("cost_usd") != _INF and self.strict:  # a gate of the switch
            raise self.api.unpriced(
                f"cost_usd is limited and there is no price for model {model!r} at provider "
                f"{self.provider!r} (genai-prices does not know it, or is not installed: it "
                f"comes with nbbudget[{self.api.extra or self.api.provider}] on Python 3.11 or "
                f"newer): price the calls to its server, nb.instrument('<base URL>', "
                f"prices={{'input': usd, 'output': usd}}) per million tokens (or \"free\" for "
                f"a local model), or name the provider genai-prices knows it at, "
                f"nb.instrument('<base URL>', provider='openrouter')")
        if run.remaining("cost_usd") != _INF:
            raise self.api.unpriced(
                f"cost_usd is limited and there is no price for model {model!r} at provider "
                f"{self.provider!r} (genai-prices does not know it, or is not installed: it "
                f"comes with nbbudget[{self.api.extra or self.api.provider}] on Python 3.11 or "
                f"newer): name the provider genai-prices knows it at, nb.instrument(client, "
                f"provider='openrouter'), or give prices={{'input': usd, 'output': usd}} per "
                f"million "
                f"tokens, or a function of the usage")


def _bound_s(core: Core) -> float:
    """The seconds an attempt of the run of *core* may take: the run's time left, or the
    guardrail (S3-8) when that is sooner or the run has no time limit."""
    left_ms = core.scope.remaining_ms()
    return (GUARDRAIL_MS if left_ms is None or left_ms >= GUARDRAIL_MS else left_ms) / 1000


def _lower(request: Any, timeout: Mapping[str, float | None] | None, bound: float) -> None:
    """Lower *request*'s timeouts to *bound* seconds."""
    timeout = timeout or dict.fromkeys(("connect", "read", "write", "pool"))
    request.extensions["timeout"] = {key: bound if value is None else min(value, bound)
                                     for key, value in timeout.items()}


def _prepared(request: Any, body: dict[str, Any] | None, stream: bool, library: Http) -> Any:
    """*request* with *body* (when it changed); a stream is asked uncompressed, so that its
    bytes can be read as they come. A new body makes a new request, its headers given once
    as the raw pairs (a ``Headers`` copy, then a request's own, cost twice as much)."""
    if body is None:
        if stream:
            request.headers["accept-encoding"] = "identity"
        return request
    content = request_content(body)
    dropped = (*_LENGTH, b"accept-encoding") if stream else _LENGTH
    headers = [(key, value) for key, value in request.headers.raw
               if key.lower() not in dropped]
    headers.append((b"Content-Length", str(len(content)).encode()))
    if stream:
        headers.append((b"Accept-Encoding", b"identity"))
    http = library.module
    prepared = http.Request(request.method, request.url, headers=headers,
                            stream=http.ByteStream(content), extensions=dict(request.extensions))
    prepared.read()  # its content, as a request made with content= has it
    return prepared


#: the SDKs' backoff before a retry when the reply names no wait: 0.5 s doubled with each retry
#: up to 8 s, less up to a quarter (jitter); a wait known to be at least this long
_BACKOFF_S, _BACKOFF_MAX_S, _JITTER_KEPT = 0.5, 8.0, 0.75


def _retry_after(headers: Any) -> float | None:
    """The wait a reply asks for before a retry, in seconds, read as the SDKs read it:
    ``retry-after-ms``, else ``retry-after`` in seconds or as an HTTP date; None without one."""
    for key, scale in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(key)
        if value is not None:
            try:
                return float(value) / scale
            except ValueError:
                if scale == 1000:
                    continue
                when = email.utils.parsedate_tz(value)
                return None if when is None else float(email.utils.mktime_tz(when) - time.time())
    return None


def _retried(response: Any) -> bool:
    """Whether the SDKs retry a reply of this status (while they have retries left)."""
    asked = response.headers.get("x-should-retry")
    if asked in ("true", "false"):
        return bool(asked == "true")
    status = response.status_code
    return status in (408, 409, 429) or status >= 500


class _Watch:
    """The sockets of the replies being read, each shut at its attempt's deadline (S3-8): a
    reply whose bytes trickle in, each within the read timeout, then fails at once, and its
    reader (`_Budgeted`, `Stream`) raises the run's cut. One named daemon thread
    (``nbbudget-model-deadlines``) looks every `TICK_S` while any reply is watched, and ends
    after `IDLE_S` with none (calls one after another find it running: adding and dropping a
    reply is a dict's insert and pop)."""

    TICK_S = 0.05
    #: how long the thread waits for a reply to watch before it ends (the tests shorten it)
    IDLE_S = 1.0

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.due: dict[int, tuple[float, socket.socket]] = {}
        self.thread: threading.Thread | None = None

    def add(self, key: int, deadline: float, response: Any) -> None:
        """Shut *response*'s socket (an httpx response's) at *deadline* (``time.monotonic()``)
        unless dropped."""
        stream = response.extensions.get("network_stream")
        self.add_socket(key, deadline,
                        stream.get_extra_info("socket") if stream is not None else None)

    def add_socket(self, key: int, deadline: float, sock: socket.socket | None) -> None:
        """Shut *sock* at *deadline* unless dropped (the botocore layer's, ``boto``, gives
        urllib3's)."""
        if sock is None:  # a transport without a socket (in memory): nothing to shut
            return
        with self.lock:
            self.due[key] = (deadline, sock)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="nbbudget-model-deadlines")
                self.thread.start()

    def drop(self, key: int) -> None:
        """The reply of *key* was read, or closed: its socket is no longer watched."""
        if key in self.due:
            with self.lock:
                self.due.pop(key, None)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(self.TICK_S)
            now = time.monotonic()
            with self.lock:
                due = self.due
                if not due:
                    if now - idle_since >= self.IDLE_S:
                        self.thread = None
                        return
                    continue
                idle_since = now
                late = [key for key, (deadline, _) in due.items() if deadline <= now]
                shut = [due.pop(key)[1] for key in late]
            for sock in shut:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


#: the sockets of the replies being read, shut at their deadlines: here and in ``boto``
watch = _Watch()


def _public(api: _Api, signal: Unwind, salvage: str) -> BaseException:
    """The error for a stop met before, while or after a request is sent: a cut becomes the
    API's ``Cut`` (which the run's ``with`` block re-raises as it is, and the SDK passes on
    unretried), with *salvage*, in every thread and task it reaches; any other stop (a cancel)
    unwinds as it is."""
    stop = signal.stop
    if not isinstance(stop.error(), BudgetCut):
        return signal
    err = api.cut(stop.by or "budget", stop.message)
    err.salvage = salvage  # type: ignore[attr-defined]
    err.reports = stop
    return err


class Attempt:
    """One attempt of a model request in a run: what it charges and how it is cut. Made by
    `Gate.admit`; read here and by the aiohttp layer of the process-wide switch (``aio``)."""

    __slots__ = ("bound", "core", "deadline", "gate", "hide", "input_bound", "key", "label",
                 "model", "price", "reservation", "run", "shape", "started", "stream", "target")

    def __init__(self, gate: Gate, run: Budget, core: Core, shape: Shape, model: str,
                 label: str, target: str, price: PriceFn | None,
                 stream: bool, hide: bool, bound: float, reservation: Reservation | None,
                 input_bound: float, key: Model) -> None:
        self.gate, self.run, self.core, self.shape = gate, run, core, shape
        self.model, self.label = model, label
        self.target, self.price, self.stream, self.hide = target, price, stream, hide
        self.started = time.monotonic()
        self.bound = bound  # the seconds it may take: the run's time left, or the guardrail
        self.deadline = self.started + bound
        self.reservation = reservation  # the dollars reserved before sending (S3-10), if any
        self.input_bound = input_bound  # the dollars of its input's bound, in the reservation
        self.key = key  # its row in the run's tally: the gate's provider and the model

    def charge(self, figures: Mapping[str, float], cost: float | None,
               final: bool = False) -> None:
        """Charge what was used (S3-3: recorded even past a limit, which raises the run's
        stop), then degrade if the run has used enough (S3-7). The cost is drawn from what the
        attempt reserved first; a *final* charge settles the reservation, giving back what the
        reply did not use (S3-10)."""
        inp, out = figures.get("input_tokens", 0), figures.get("output_tokens", 0)
        reservation = self.reservation
        if reservation is not None:
            reservation.spend(inp, out, cost, final=final)
        else:
            spend_reply(self.core, inp, out, cost, self.label, self.target, model=self.key)
        degrade = self.gate.degrade
        if degrade is not None:
            degrade_past(self.run, degrade[1], self.model, degrade[0])

    def release(self, keep: float = 0.0) -> None:
        """Give back what is left of the reservation but *keep* dollars (`Reservation.release`):
        the attempt used nothing more (an error status, a request never sent, a stream's end
        once its usage is charged), or nothing more than *keep* says (a stream that ends
        before its input is reported keeps its input's bound)."""
        if self.reservation is not None:
            self.reservation.release(keep)

    def release_unreported(self, reported: Mapping[str, float]) -> None:
        """A stream ended early: `release` what is left of the reservation, but for the bound
        of its input when the stream never reported it (OpenAI reports a stream's input only
        at its end: the provider bills it all the same)."""
        self.release(0.0 if "input_tokens" in reported else self.input_bound)

    def cost(self, figures: Mapping[str, float]) -> float | None:
        """What *figures* cost: at ``prices=``, else the cost the reply reports in them
        (``cost_usd``), else at genai-prices' price of the model; None when nothing prices
        them."""
        reported = figures.get("cost_usd")
        if reported is not None and self.gate.given is None:
            return reported
        price = self.price
        return None if price is None else price(figures)

    def cut(self, signal: Unwind, salvage: str) -> BaseException:
        """The error for a stop met while charging or waiting (`_public`)."""
        return _public(self.gate.api, signal, salvage)

    def timed_out(self, salvage: str = "") -> None:
        """After a timeout or at a deadline between events: raise the run's ``timeout`` cut,
        or the guardrail's (S3-8); return when neither is due (an SDK timeout of its own)."""
        try:
            self.run.check()
        except Unwind as signal:
            raise self.cut(signal, salvage) from None
        waited_ms = (time.monotonic() - self.started) * 1000
        if waited_ms >= GUARDRAIL_MS:
            self.run.lowlevel.record("cut", {"by": "guardrail", "provider": self.label,
                                             "code": "guardrail_timeout"})
            err = self.gate.api.cut("guardrail", (
                f"provider {self.label} did not answer within its guardrail of {GUARDRAIL_MS} "
                f"ms (guardrail_timeout); the run stopped waiting for it"))
            err.salvage = salvage  # type: ignore[attr-defined]
            raise err

    def waits(self, request: Any, response: Any) -> None:
        """An error status the SDK retries after a wait (the reply's ``Retry-After``, else its
        backoff, at least as long as computed here): when that wait would end past the run's
        time (or the guardrail), the run is cut now, and the API's ``Cut`` raises, which the
        SDK passes on unretried (S3-8)."""
        if not _retried(response):
            return
        said = request.headers.get("x-stainless-retry-count", "0")
        taken = int(said) if said.isdigit() else 0
        if taken >= self.gate.max_retries:
            return  # the SDK's last attempt: it raises the error, with no wait
        wait = _retry_after(response.headers)
        if wait is not None and wait > self.gate.api.max_retry_after:
            return  # the SDK does not retry it
        if wait is None or wait <= 0:
            wait = min(_BACKOFF_S * 2.0 ** taken, _BACKOFF_MAX_S) * _JITTER_KEPT
        left = self.deadline - time.monotonic()
        if wait <= left:
            return
        response.close()
        if (time.monotonic() - self.started) * 1000 + wait * 1000 >= GUARDRAIL_MS:
            self.timed_out()  # the guardrail's own cut, when it is the bound
        core = self.core
        scope = core.scope
        scope.halt(Stop.of(Status.FAILED, (
            f"{self.gate.api.provider} answered {response.status_code} for {self.label} and "
            f"the SDK would wait {wait:.3g} s before trying again, past the {max(left, 0):.3g} s "
            f"{scope.name} has left: the run stopped (out of time); give it more time"),
            scope, by="timeout", code=KINDS[RUN_MS].code))
        stop = scope.stop
        assert stop is not None
        raise self.cut(stop.signal(), "")

    def answered(self, response: Any) -> None:
        """A whole reply (read): charge its usage. Error statuses used nothing."""
        if not 200 <= response.status_code < 300:  # is_success, without its two calls
            self.release()  # an error status: the API bills nothing
            return
        try:
            figures = reply_usage(self.shape, response.content)
        except Unreadable as err:  # its reservation stays charged: the worst case is known
            self.unmetered(err, self._text(response))
            return
        try:
            self.charge(figures, self.cost(figures), final=True)
        except Unwind as signal:
            raise self.cut(signal, self._text(response)) from None

    def _text(self, response: Any) -> str:
        try:
            return self.shape.reply_text(response.json())
        except (ValueError, AttributeError, TypeError):  # not the API's shape
            return ""

    def unmetered(self, err: Unreadable, salvage: str) -> None:
        """A reply whose usage cannot be read (N-7): under a ``tokens``, ``output_tokens`` or
        ``cost_usd`` limit the run (or grant) the call was made in is cut by the first of them
        and the API's ``Cut`` raises, which the SDK passes on unretried; without one the reply
        goes to the caller as it came, and the trace marks the call ``unmetered``."""
        core = self.core
        limited = [i for i, left in zip(_METERED, core.remaining_of(_METERED), strict=True)
                   if left != _INF]
        if not limited:
            core.record("unmetered", {"provider": self.gate.provider, "model": self.label,
                                      "usage": err.said()})
            return
        kind = KINDS[limited[0]]
        scope = core.scope
        scope.halt(Stop.of(Status.FAILED, (
            f"{self.gate.provider} reply reported {err.said()} for {self.label}, so what "
            f"it used cannot be charged and {kind.name} cannot be kept: the run stopped; use a "
            f"server that reports usage as the API defines it, or bound the run by "
            f"provider_calls or time instead of {kind.name} (see: nbbudget explain N-7)"),
            scope, by=kind.name,
            code=kind.code))
        stop = scope.stop
        assert stop is not None
        raise self.cut(stop.signal(), salvage)


class Meter:
    """A stream's meter: whole events pass on, text deltas are counted, usage charged (S3-9).
    The stream classes here and the aiohttp layer of the process-wide switch (``aio``) read
    their streams through it.

    Every event is read as its API defines it, parsed, whatever its JSON form; the bytes only
    tell which events need no parse, and only where they prove it. An event is parsed for usage
    when `may_hold_usage` cannot prove it holds none; when the caller did not ask for usage, the
    field asked for in its stead (compact: ``,"usage":null``) is removed from every event first,
    so that a text event needs no parse. Text deltas are counted (parsed) only when they could
    reach the limit: one delta takes at least ``Shape.delta_bytes`` bytes in any JSON form, so
    until the bytes received since the last count exceed the tokens left times that, no limit
    can have been crossed, and the count waits (``count_at``). Far from a limit it waits for the
    stream's end; near one, it runs at every chunk, so the stream is cut at the same event
    either way. Kept cheap per chunk (a chunk costs the SDK tens of microseconds, and
    nbbudget's work on it runs with its caches cold): a chunk that ends on an event's end, as a
    server sends them, passes on as it is."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        shape = attempt.shape
        self.delta_bytes, self.final, self.done = shape.delta_bytes, shape.final, shape.done
        self.framing = shape.framing or SSE
        self.text = self.framing.text
        self.deadline = attempt.deadline
        self.strip = shape.asked_field if attempt.hide else b""
        # the whole events passed on so far, as they came (a list: a bytearray grown by each
        # chunk copied all it held at each growth, about 8 bytes for each byte added), and
        # their length
        self.received: list[bytes] = []
        self.size = 0
        self.pending = b""  # the start of an event not complete yet
        self.deltas = 0  # text deltas counted
        self.counted = 0  # how many of ``received`` are counted in ``deltas``
        self.counted_size = 0  # and their length
        self.charged: dict[str, float] = {}
        self.charged_out: float = 0  # the output tokens in ``charged``
        self.charged_cost = 0.0
        self.reported: dict[str, float] = {}
        self.settled = False  # the final usage came (or could not be read)
        self.ended = False  # finished, cut, or closed
        price = attempt.price
        self.per_output = price({"output_tokens": _MILLION}) / _MILLION if price else 0.0
        self.left = self._left()
        self.count_at = 0.0  # the ``size`` past which the deltas are counted
        self._rearm()
        attempt.core.hold(self.settle)  # charged by its run's end if never ended or closed

    def _left(self) -> float:
        """How many more output tokens the run's limits allow now (the dollars this stream
        reserved and has not drawn yet are its own, S3-10)."""
        output_tokens, tokens, cost = self.attempt.core.remaining_of(_OUTPUT_LEFT)
        left = min(output_tokens, tokens)
        if self.per_output > 0:
            reservation = self.attempt.reservation
            if reservation is not None:
                cost += reservation.dollars
            left = min(left, cost / self.per_output)
        return left

    def _rearm(self) -> None:
        """Set when the next count is due: once more bytes are received uncounted than could
        hold the deltas of the tokens left."""
        self.count_at = (self.counted_size
                         + (self.left - (self.deltas - self.charged_out)) * self.delta_bytes)

    def feed(self, chunk: bytes) -> bytes:
        """The whole events *chunk* completes, to pass on (charged, or cut, first)."""
        if self.pending:
            chunk, self.pending = self.pending + chunk, b""
        # a chunk that ends as an event does, as a server sends them, passes whole; these ends
        # end an event of every framing of text (a server-sent event's, a line's), tested here
        # in C; a binary framing's chunk is always cut at its messages' ends
        if not (self.text and (chunk.endswith(b"\n\n") or chunk.endswith(b"\r\n\r\n"))):
            cut = self.framing.whole(chunk)  # its whole events; the rest waits
            chunk, self.pending = chunk[:cut], chunk[cut:]
            if not chunk:
                return b""
        if time.monotonic() > self.deadline:
            self.attempt.timed_out(self.salvage())
        strip = self.strip
        if strip:
            chunk = chunk.replace(strip, b"")
        self.received.append(chunk)
        self.size += len(chunk)
        # the usual chunk, one event with no "usage" in it, tested inline, and Chat's [DONE]
        # only where found: a generator over ``final`` and two calls a chunk cost 1.5 us.
        # ``bytes.find`` where ``in`` would read the same: ``in`` costs 100 to 300 ns more on
        # a chunk of 250 bytes (3.10 to 3.13); an escaped "usage" (\u0075sage) is looked for
        # only where a backslash is, found with ``memchr`` in 30 ns (bench_instrument.py:
        # a chunk cost 0.5 us less)
        if chunk.find(b"usage") >= 0 or (_BACKSLASH in chunk and chunk.find(b"\\u") >= 0):
            out = self._usage(chunk) if may_hold_usage(chunk) else chunk
        else:
            out = chunk
        if out is chunk:
            for name in self.final:
                if chunk.find(name) >= 0:
                    out = self._usage(chunk)
                    break
        if self.size > self.count_at:
            self._count()
        done = self.done
        if (done and chunk.find(done) >= 0 and not self.settled
                and ends(self.attempt.shape, chunk)):
            self._unreadable(Unreadable("usage"))  # the SDK reads no further
        return out

    def _count(self) -> None:
        """Count the text deltas of the events received since the last count (an empty text,
        as a role chunk's, is none); cut the stream if they pass the limit."""
        received, counted = self.received, self.counted
        if counted < len(received):
            self.counted, self.counted_size = len(received), self.size
            text, events = self.attempt.shape.stream_text, self.framing.events
            self.deltas += sum(1 for _, _, event in events(b"".join(received[counted:]))
                               if type(event) is dict and text(event))
            if self.deltas - self.charged_out > self.left:
                self._cross()
        self._rearm()

    def _usage(self, data: bytes) -> bytes:
        """Charge the usage the events of *data* report; the events to pass on."""
        shape, hide, kept = self.attempt.shape, self.attempt.hide, []
        reported = self.reported
        for start, end, event in self.framing.events(data):
            if type(event) is dict and not self.settled:
                try:
                    figures = shape.stream_usage(event)
                except Unreadable as err:
                    self._unreadable(err)
                    figures = None
                if figures is not None:
                    for key, value in figures.items():
                        reported[key] = max(value, reported.get(key, 0))
                    self.settled = shape.settles(event)
                    if hide and shape.hidden(event):
                        continue
            kept.append(data[start:end])
        self._charge_to(reported)
        return b"".join(kept)

    def _unreadable(self, err: Unreadable) -> None:
        """An event whose usage cannot be read: what was counted is charged, then the run is
        cut under a token or cost limit (N-7); else the stream is unmetered from here on."""
        self.settled = True
        self._count()
        self._charge_count()
        try:
            self.attempt.unmetered(err, self.salvage())
        except BaseException:
            self.ended = True
            raise

    def _cross(self) -> None:
        """The count would pass a limit: unless others' spending changed that, charge it and
        cut the stream (S3-9)."""
        self.left = self._left()
        if self.deltas - self.charged_out <= self.left:
            return
        self._charge_count()

    def _charge_count(self) -> None:
        """Charge what the stream reported, its output at least the text deltas counted."""
        reported = self.reported
        self._charge_to({**reported, "output_tokens": max(
            self.deltas, reported.get("output_tokens", 0))})

    def _charge_to(self, figures: Mapping[str, float]) -> None:
        """Charge what *figures* add to what this stream has charged."""
        charged = self.charged
        diff = {key: value - charged.get(key, 0) for key, value in figures.items()
                if value > charged.get(key, 0)}
        if not diff:
            return
        charged.update(figures)
        self.charged_out = charged.get("output_tokens", 0)
        cost = None
        total = self.attempt.cost(charged)
        if total is not None:
            cost, self.charged_cost = max(0.0, total - self.charged_cost), total
        try:
            self.attempt.charge(diff, cost)
        except Unwind as signal:
            self.ended = True
            self.attempt.release_unreported(self.reported)  # cut: it receives no more
            raise self.attempt.cut(signal, self.salvage()) from None
        self.left = self._left()
        self._rearm()

    def finish(self) -> bytes:
        """The stream ended: its last bytes, charged. One that never reported its final usage
        is charged its count, then is unreadable usage (N-7)."""
        try:
            # a last event without its end
            rest = self.feed(self.framing.flush) if self.pending else b""
            if not self.settled:
                self._unreadable(Unreadable("usage"))
        finally:
            self.ended = True
            self.attempt.core.release(self.settle)
        self.attempt.release()  # its usage is charged: the rest of the reservation goes back
        return rest

    def close(self) -> None:
        """The stream is closed before its end (left by the caller, or failed): what it counted
        is charged; a limit it passes stops the run, whose next check raises, not this close."""
        self.attempt.core.release(self.settle)
        if self.ended:
            return
        self.ended = True
        self.settle()

    def settle(self) -> None:
        """Charge the text deltas received so far, and the usage reported: the stream is
        closed, or its run's block ends while the stream is still open (`Core.hold`: a caller
        that left a stream with ``break`` and keeps it in a variable). Raises nothing."""
        if not self.settled:
            with contextlib.suppress(BudgetCut):
                self._count()
                self._charge_count()
        self.attempt.release_unreported(self.reported)

    def salvage(self) -> str:
        """The text of the events received so far."""
        text = self.attempt.shape.stream_text
        return "".join(text(event) for _, _, event in self.framing.events(b"".join(self.received))
                       if isinstance(event, dict))


class Read:
    """A whole reply, read: what `Attempt.answered` reads of it, for the layers whose replies
    are not httpx's (``aio``, ``boto``)."""

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code, self.content = status_code, content

    def json(self) -> Any:
        return json.loads(self.content)


class Stream:
    """A streamed reply's bytes (*inner*, an iterable of them), through its meter: the part
    every HTTP library's stream class shares (`Http` makes one for each, a subclass of its
    ``SyncByteStream``, which its responses require; the botocore layer, ``boto``, one over
    urllib3's). *sock*: the reply's socket, shut at the deadline, where *response* (an httpx
    response) does not give it."""

    def __init__(self, inner: Any, meter: Meter, response: Any,
                 sock: socket.socket | None = None) -> None:
        self.inner, self.meter = inner, meter
        self.closed = False
        if response is not None:
            watch.add(id(self), meter.deadline, response)  # shut at the deadline (S3-8)
        else:
            watch.add_socket(id(self), meter.deadline, sock)

    def __iter__(self) -> Iterator[bytes]:
        meter = self.meter
        try:
            for chunk in self.inner:
                out = meter.feed(chunk)
                if out:
                    yield out
            watch.drop(id(self))
            rest = meter.finish()
        except meter.attempt.gate.library.transport_error:  # a timeout, or the socket shut at
            watch.drop(id(self))                             # the deadline
            meter.attempt.timed_out(meter.salvage())
            raise
        except (BudgetCut, Unwind, GeneratorExit):
            # cut (S3-9, N-7), or left by a reader that failed: released here, as the older
            # httpx does not close a response whose reader raised (nor do all SDKs)
            self.close()
            raise
        if rest:
            yield rest

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        watch.drop(id(self))
        try:
            self.meter.close()
        finally:
            self.inner.close()


class _AsyncStream:
    """A streamed reply's bytes, through its meter (async; as `Stream`)."""

    def __init__(self, inner: Any, meter: Meter, response: Any) -> None:
        self.inner, self.meter = inner, meter
        self.closed = False
        watch.add(id(self), meter.deadline, response)  # shut at the deadline (S3-8)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        meter = self.meter
        try:
            async for chunk in self.inner:
                out = meter.feed(chunk)
                if out:
                    yield out
            watch.drop(id(self))
            rest = meter.finish()
        except meter.attempt.gate.library.transport_error:  # a timeout, or the socket shut at
            watch.drop(id(self))                             # the deadline
            meter.attempt.timed_out(meter.salvage())
            raise
        except (BudgetCut, Unwind):  # cut (S3-9, N-7): released here, as `Stream`
            await self.aclose()
            raise
        if rest:
            yield rest

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        watch.drop(id(self))
        try:
            self.meter.close()
        finally:
            await self.inner.aclose()


def _metered(attempt: Attempt, request: Any, response: Any, stream: type) -> bool:
    """A response's head has come: an error status gives the reservation back (and may cut the
    run, `Attempt.waits`); a streamed success gets its meter (*stream*, the library's stream
    class of the sync or async kind), and is then handed on as it is (True)."""
    if response.status_code >= 400:
        attempt.release()  # an error status: the API bills nothing
        attempt.waits(request, response)
    if attempt.stream and response.is_success:
        response.stream = stream(response.stream, Meter(attempt), response)
        return True
    return False


def send(gate: Gate, sender: Callable[..., Any], request: Any, kwargs: dict[str, Any]) -> Any:
    """Send *request* with *sender* (an HTTP client's own ``send``), through *gate*: a model
    call made in a run is charged, bounded and metered; any other request is sent untouched.
    An instrumented client's HTTP client sends each request with it, and so does the
    process-wide switch (``everywhere``) in the ``send`` of every HTTP client."""
    opened = gate.open(request)
    if opened is None:
        return sender(request, **kwargs)
    request, attempt = opened
    library = gate.library
    kwargs["stream"] = True  # the body is read here, its socket watched (S3-8)
    try:
        response = sender(request, **kwargs)
        if _metered(attempt, request, response, library.stream):
            return response
        key = id(attempt)
        watch.add(key, attempt.deadline, response)
        try:
            response.read()
        finally:
            watch.drop(key)
    except library.transport_error as err:  # a timeout, or the socket shut at the deadline
        if isinstance(err, library.never_sent):
            attempt.release()  # never sent: nothing billed
        attempt.timed_out()
        raise
    finally:
        request.extensions.pop(_OPENED, None)  # sent: the SDK sending it again is a new attempt
    attempt.answered(response)
    return response


async def send_async(gate: Gate, sender: Callable[..., Any], request: Any,
                     kwargs: dict[str, Any]) -> Any:
    """`send`, for an async HTTP client."""
    opened = gate.open(request)
    if opened is None:
        return await sender(request, **kwargs)
    request, attempt = opened
    library = gate.library
    kwargs["stream"] = True  # the body is read here, its socket watched (S3-8)
    # a transport that sends it through aiohttp (LiteLLM's) sends it as it is: counted here
    inside = opening.set(True)
    try:
        response = await sender(request, **kwargs)
        if _metered(attempt, request, response, library.async_stream):
            return response
        key = id(attempt)
        watch.add(key, attempt.deadline, response)
        try:
            await response.aread()
        finally:
            watch.drop(key)
    except library.transport_error as err:  # a timeout, or the socket shut at the deadline
        if isinstance(err, library.never_sent):
            attempt.release()  # never sent: nothing billed
        attempt.timed_out()
        raise
    finally:
        opening.reset(inside)
        request.extensions.pop(_OPENED, None)  # sent: the SDK sending it again is a new attempt
    attempt.answered(response)
    return response


class _Budgeted:
    """The HTTP client of an instrumented sync client: the original one, each model request
    through the gate. Its own transport is never used (every request goes to the original).
    `Http` makes one class of it for each HTTP library, a subclass of its ``Client`` (the SDKs
    take nothing else)."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        http = gate.library.module
        super().__init__(timeout=inner.timeout,  # type: ignore[call-arg]
                         transport=http.BaseTransport(), trust_env=False)
        self.inner, self.gate = inner, gate
        # the original client builds every request (its base URL, headers, auth), called
        # straight from the SDK: no frame of this wrapper's in between
        self.build_request = inner.build_request

    def send(self, request: Any, **kwargs: Any) -> Any:
        return send(self.gate, self.inner.send, request, kwargs)

    @property
    def is_closed(self) -> bool:
        return bool(self.inner.is_closed)

    def close(self) -> None:
        self.inner.close()


class _AsyncBudgeted:
    """The HTTP client of an instrumented async client (as `_Budgeted`)."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        http = gate.library.module
        super().__init__(timeout=inner.timeout,  # type: ignore[call-arg]
                         transport=http.AsyncBaseTransport(), trust_env=False)
        self.inner, self.gate = inner, gate
        self.build_request = inner.build_request  # as _Budgeted

    async def send(self, request: Any, **kwargs: Any) -> Any:
        return await send_async(self.gate, self.inner.send, request, kwargs)

    @property
    def is_closed(self) -> bool:
        return bool(self.inner.is_closed)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Library:
    """An HTTP library model requests go through, as a gate knows it: its module and what it
    raises. `Http` (httpx2, httpx) and the aiohttp and botocore layers of the process-wide
    switch (``aio``, ``boto``) are its kinds."""

    def __init__(self, module: Any, not_read: tuple[type[BaseException], ...],
                 transport_error: type[BaseException] | tuple[type[BaseException], ...],
                 never_sent: tuple[type[BaseException], ...]) -> None:
        self.module = module
        self.not_read = not_read  # a body not read, not JSON
        self.transport_error = transport_error  # a timeout, a connection lost or shut
        self.never_sent = never_sent  # nothing billed


class Http(Library):
    """One HTTP library model requests go through: httpx2, or the older httpx, whose classes
    have the same names and behave alike (openai before 3, LiteLLM, Ollama's client). What the
    gate, the meter and the wrapper clients make and catch in it; `http_of` gives the one of a
    client. Used here and by the process-wide switch (``everywhere``)."""

    def __init__(self, module: Any) -> None:
        super().__init__(module, (module.RequestNotRead, ValueError), module.TransportError,
                         (module.ConnectError, module.ConnectTimeout))
        # its responses require their streams to be of its own classes
        self.stream = type("Stream", (Stream, module.SyncByteStream), {})
        self.async_stream = type("AsyncStream", (_AsyncStream, module.AsyncByteStream), {})
        self.budgeted = type("Budgeted", (_Budgeted, module.Client), {})
        self.budgeted_async = type("AsyncBudgeted", (_AsyncBudgeted, module.AsyncClient), {})


_libraries: dict[str, Http] = {}


def library(name: str) -> Http | None:
    """The `Http` of the library *name* (``"httpx2"``, ``"httpx"``), made once; None when it
    is not installed."""
    found = _libraries.get(name)
    if found is None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return None
        found = _libraries.setdefault(name, Http(module))
    return found


def http_of(client: object) -> Http | None:
    """The `Http` of an HTTP *client* (an ``httpx2`` or ``httpx`` one, or of a subclass of
    theirs), else None."""
    for name in ("httpx2", "httpx"):
        if name in sys.modules:  # a client of a library never imported is none of its
            found = library(name)
            if found is not None and isinstance(client, (found.module.Client,
                                                         found.module.AsyncClient)):
                return found
    return None


# N-5: a request and its stream read the run's deadline and stop themselves, cut with the text
# received so far (S3-9): a stop from elsewhere is held back while the thread is inside them
for _own in (send, Stream.__iter__):
    preempt.guard(_own.__code__)
