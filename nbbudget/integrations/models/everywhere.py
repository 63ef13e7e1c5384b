"""``nb.instrument()`` with no client: every model call the process makes is a provider call of
the run current when it is made, whichever library makes it and whenever its client was made.

**Where it sits.** The ``send`` of the HTTP clients of httpx2 and of the older httpx
(``Client`` and ``AsyncClient``), replaced on the class, as Logfire replaces the SDKs' methods:
every SDK built on them sends each attempt of a request, its own retries included, through it.
So the OpenAI and Anthropic SDKs at any base URL are covered, and ``google-genai``, with the
clients made before the switch, their copies (``with_options``, ``copy``) and the clients other
libraries make inside (LangChain's ``ChatOpenAI``, LiteLLM's OpenAI handler, an agent
framework's own client), on either library. On aiohttp (3.12 or newer), through which
google-genai's async client sends wherever aiohttp is installed, it is a client middleware
(``aio``) that every ``ClientSession`` made while the switch is on gets, last, its
``__init__`` replaced on the class as OpenTelemetry's aiohttp instrumentation replaces it; a
session made before the switch was turned on is not reached, nor a request given its own
``middlewares=``. boto3's clients send through botocore, whose ``Endpoint.create_request`` and
``URLLib3Session.send`` are replaced on their classes (``boto``): Amazon Bedrock's
``Converse`` and ``ConverseStream``, from every client, made before the switch or after.
Observability tools that wrap the SDKs' methods (Logfire, OpenTelemetry's
instrumentors) sit above it: both see every call, whichever came first, its refusal and its cut
as the SDK's errors; a call made in a run already stopped (a cancel, not a cut) unwinds past
their ``except Exception`` and its span is never ended. A library not imported
yet is switched on as it is imported (`_Finder`), so turning it on imports none of them.

**What is a model call.** A ``POST`` made inside a run (`nbbudget.current`) whose path ends as
an API's endpoint does (``/chat/completions``, ``/responses`` and ``/embeddings``: OpenAI's, and
every server that speaks it; ``/messages``: Anthropic's; ``:generateContent`` and
``:streamGenerateContent``: Gemini's) and whose JSON body names a model (Gemini's path names
it). It goes through the gate of ``clients`` (`send`): the permits, the clamp, the usage, the
price, the stream cut, the time and the degrade of ``nb.instrument(client)``, the same. The
provider, for its price, is resolved from the request's URL through genai-prices
(``https://openrouter.ai/api/v1`` is OpenRouter), else the API's own. Mistral's and Groq's Chat
Completions (the ``mistralai`` and ``groq`` SDKs'), at their URLs or at a URL given their
provider (``nb.instrument(url, provider="mistral")``), are read as their own APIs define them
(``openai_api.chat_of``). The errors are the API's (``openai_api``, ``anthropic_api``,
``gemini_api``): nbbudget's, and the SDK's own where the SDK is installed, which it passes on
unretried (the ``groq`` SDK retries any error raised while a request is sent, a refusal among
them, then raises its own ``APIConnectionError`` from it: the run's block ends with nbbudget's).
A request an instrumented client (``nb.instrument(client)``) has opened, or an adapter has
claimed, passes untouched: it is counted once.

**Ollama's native API** (``/api/chat``, ``/api/generate``: ``ollama_api``), which the ``ollama``
package speaks on httpx, is read the same way; that package passes nbbudget's errors on as they
are, and never retries. So are Bedrock's calls (``bedrock_api``), by the operation botocore
names rather than a path: botocore passes nbbudget's errors on unretried.

**Outside every run** the switched ``send`` reads one context variable and calls the original,
and aiohttp's middleware calls the next handler; the request and its reply are the library's
own, byte for byte.

`install` turns it on (``nb.instrument()``; in IPython, loading the extension does, unless
``NBBudget.instrument = False``); the `Switch` it returns turns it off. A model call the
LangChain, Agents SDK or pydantic-ai adapter counts is claimed by it (``claims``): its requests
pass untouched, and the call is counted once, by the adapter.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ...core.errors import ConfigError
from ...run.budget import current
from ...run.prices import Given, PriceFn, given_price, given_provider, provider_of
from .clients import Gate, Http, Library, api_of, library, send, send_async

__all__ = ["LIBRARIES", "ROUTES", "Switch", "install", "installed"]

#: the HTTP libraries switched: the ``send`` of httpx2's and httpx's clients, the
#: middlewares of aiohttp's sessions (``aio``), and botocore's endpoints and HTTP sessions
#: (``boto``), switched as the module that holds its endpoints is imported
LIBRARIES = ("httpx2", "httpx", "aiohttp", "botocore.endpoint")
#: the endpoints read as model calls: how the path ends, and the API family that reads it
ROUTES: tuple[tuple[str, str], ...] = (
    ("/chat/completions", "openai"), ("/responses", "openai"), ("/embeddings", "openai"),
    ("/messages", "anthropic"),
    (":generateContent", "gemini"), (":streamGenerateContent", "gemini"),
    ("/api/chat", "ollama"), ("/api/generate", "ollama"),
    ("/converse", "bedrock"), ("/converse-stream", "bedrock"))
#: where the base URL of an API family's requests ends, where it is not at its endpoint's path
#: (Bedrock's path names the model: ``/model/{id}/converse``)
_BASE_ENDS = {"bedrock": "/model/"}
#: gates kept, by API family, HTTP library and base URL; cleared past this many
_GATES_KEPT = 256


class Switch:
    """The process-wide switch, on from `install` until `undo` (or the end of a ``with``
    block). One in a process: `install` returns the same one while it is on."""

    def __init__(self) -> None:
        self.on = False
        # (class, the name of the method replaced (``send``, ``__init__``), the original, the
        # one put in its place), for each class switched
        self.patched: list[tuple[type, str, Callable[..., Any], Callable[..., Any]]] = []
        self.gates: dict[tuple[str, str, str], Gate] = {}
        self.finder: _Finder | None = None
        # what `price` set for the calls to a base URL: its price (and whether linear in the
        # usage) and its provider, by base URL
        self.endpoints: dict[str, tuple[PriceFn | None, bool, str | None]] = {}

    def undo(self) -> None:
        """Turn it off: each class's own ``send`` (``ClientSession.__init__`` for aiohttp) is
        put back (where another wrapper was put over it since, the switched one stays beneath
        it and passes every request on; a session made while it was on keeps its middleware,
        which then passes every request on)."""
        with _lock:
            if not self.on:
                return
            self.on = False
            if self.finder is not None:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self.finder)
                self.finder = None
            for cls, name, original, ours in self.patched:
                if cls.__dict__.get(name) is ours:
                    setattr(cls, name, original)
            self.patched.clear()
            self.gates.clear()
            self.endpoints.clear()

    def price(self, base_url: str, prices: Given | None, provider: str | None) -> None:
        """Price the model calls made to *base_url* (and below it) at *prices* (as
        ``nb.instrument(client, prices=...)`` takes it: ``"free"`` for a local server), or at
        *provider*'s prices in genai-prices: ``nb.instrument("http://localhost:11434",
        prices="free")``. Kept until `undo`."""
        where = f"nb.instrument({base_url!r})"
        if prices is None and provider is None:
            raise ConfigError(f"{where}: give prices= (USD per million tokens, a function of "
                              f"the usage, or \"free\") or provider= for the model calls made "
                              f"to that URL")
        given = given_price(prices, where)
        given_provider(provider, where)
        with _lock:
            self.endpoints[base_url.rstrip("/")] = (given, given is not None and not callable(
                prices), provider)
            self.gates.clear()  # made again with it

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "on" if self.on else "off"
        libraries = sorted({cls.__module__.split(".")[0] for cls, _, _, _ in self.patched})
        return f"<nbbudget model calls switch: {state} ({', '.join(libraries) or 'no library'})>"

    # -- what the switched send asks -------------------------------------------------------
    def gate(self, request: Any, http: Library) -> Gate | None:
        """The gate of *request*, a ``POST`` in a run: the one of its API and base URL, made
        the first time; None when its path is no model endpoint's."""
        path = request.url.path
        route = next((route for route in ROUTES if path.endswith(route[0])), None)
        if route is None:
            return None
        end, family = route
        url = str(request.url)
        end = _BASE_ENDS.get(family, end)
        return self.gate_at(family, url[:url.index(end)] if end in url else url, http)

    def gate_at(self, family: str, base: str, http: Library) -> Gate | None:
        """The gate of the API *family*'s calls at the base URL *base* through *http*, made
        the first time (the botocore layer, ``boto``, asks by its operation's name)."""
        key = (family, http.module.__name__, base)
        gate = self.gates.get(key)
        if gate is None:
            given, linear, provider = next(
                (priced for url, priced in self.endpoints.items()
                 if base == url or base.startswith(url + "/")), (None, False, None))
            provider = provider or provider_of(base)
            api = api_of(family, provider, base)  # Mistral's and Groq's Chat Completions
            gate = Gate(api, http, given, None, None, provider or api.provider, linear=linear,
                        max_retries=api.retries, strict=True)
            with _lock:
                if len(self.gates) >= _GATES_KEPT:
                    self.gates.clear()
                gate = self.gates.setdefault(key, gate)
        return gate


_lock = threading.RLock()
_switch = Switch()


def installed() -> Switch | None:
    """The switch, while it is on; else None."""
    return _switch if _switch.on else None


def install() -> Switch:
    """Turn the switch on (once: while it is on, this changes nothing) and return it. The
    libraries imported already are switched now; the others as they are imported."""
    with _lock:
        if _switch.on:
            return _switch
        _switch.on = True
        for name in LIBRARIES:
            module = sys.modules.get(name)
            if module is not None:
                _patch(name)
        finder = _switch.finder = _Finder(tuple(n for n in LIBRARIES if n not in sys.modules))
        if finder.names:
            sys.meta_path.insert(0, finder)
    return _switch


def _patch(name: str) -> None:
    """Switch the ``send`` of library *name*'s ``Client`` and ``AsyncClient``, or for aiohttp
    the ``__init__`` of its ``ClientSession``, or botocore's (lock held)."""
    if name == "aiohttp":
        _patch_aiohttp()
        return
    if name == "botocore.endpoint":
        _patch_botocore()
        return
    http = library(name)
    if http is None:
        return
    module = http.module
    _switch_method(module.Client, "send", lambda original: _switched(original, http))
    _switch_method(module.AsyncClient, "send", lambda original: _switched_async(original, http))


def _switch_method(cls: type, name: str,
                   make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Put ``make(original)`` in the place of *cls*'s method *name*, once while the switch is
    on; `Switch.undo` puts the original back (lock held)."""
    if any(patched is cls for patched, _, _, _ in _switch.patched):
        return
    original = getattr(cls, name)
    ours = make(original)
    setattr(cls, name, ours)
    _switch.patched.append((cls, name, original, ours))


def _patch_aiohttp() -> None:
    """Give every ``aiohttp.ClientSession`` made from now on the switch's middleware (``aio``),
    last, as OpenTelemetry's aiohttp instrumentation adds its trace configs (lock held). An
    aiohttp before 3.12, which has no client middlewares, is left as it is."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None or not hasattr(aiohttp, "ClientMiddlewareType"):
        return  # not installed, or before 3.12
    from . import aio

    _switch_method(aiohttp.ClientSession, "__init__",
             lambda original: _with_middleware(original, aio.middleware(_gate_of)))


def _patch_botocore() -> None:
    """Switch botocore's ``Endpoint.create_request`` and ``URLLib3Session.send`` (``boto``;
    lock held)."""
    endpoint = sys.modules.get("botocore.endpoint")
    if endpoint is None:
        return
    from . import boto

    _switch_method(endpoint.Endpoint, "create_request",
             lambda original: boto.switched_create_request(original, _gate_at))
    _switch_method(endpoint.URLLib3Session, "send", boto.switched_send)


def _gate_at(family: str, base: str, http: Library) -> Gate | None:
    """The gate of *family*'s calls at *base* while the switch is on, else None (botocore's
    layer asks)."""
    return _switch.gate_at(family, base, http) if _switch.on else None


def _gate_of(request: Any, http: Library) -> Gate | None:
    """The gate of *request* while the switch is on, else None (aiohttp's middleware asks)."""
    return _switch.gate(request, http) if _switch.on else None


def _with_middleware(original: Callable[..., None], middleware: Any) -> Callable[..., None]:
    """*original* (``ClientSession.__init__``), giving the session *middleware* after its
    own."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, middlewares: Sequence[Any] | None = (),
                 **kwargs: Any) -> None:
        if _switch.on and middleware not in (middlewares or ()):
            middlewares = (*(middlewares or ()), middleware)
        original(self, *args, middlewares=middlewares, **kwargs)

    return __init__


def _switched(original: Callable[..., Any], http: Http) -> Callable[..., Any]:
    """*original* (a ``Client.send``), with each model request made in a run through its gate."""

    @functools.wraps(original)
    def send_(self: Any, request: Any, **kwargs: Any) -> Any:
        # outside every run (and for a request an instrumented client opened): the original
        if current() is None or not _switch.on:
            return original(self, request, **kwargs)
        gate = _switch.gate(request, http) if request.method == "POST" else None
        if gate is None:
            return original(self, request, **kwargs)
        return send(gate, functools.partial(original, self), request, kwargs)

    return send_


def _switched_async(original: Callable[..., Any], http: Http) -> Callable[..., Any]:
    """*original* (an ``AsyncClient.send``), as `_switched`."""

    @functools.wraps(original)
    async def send_(self: Any, request: Any, **kwargs: Any) -> Any:
        if current() is None or not _switch.on:
            return await original(self, request, **kwargs)
        gate = _switch.gate(request, http) if request.method == "POST" else None
        if gate is None:
            return await original(self, request, **kwargs)
        return await send_async(gate, functools.partial(original, self), request, kwargs)

    return send_


class _Finder(importlib.abc.MetaPathFinder):
    """Switches an HTTP library on as it is imported, after its module has run: the finder
    asks the others on ``sys.meta_path`` for the module's spec and has its loader switch the
    library once it has loaded it (as wrapt's post-import hooks do)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """A library's own loader, which switches it once it has run its module."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        made: ModuleType | None = self.loader.create_module(spec)
        return made

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        with _lock:
            if _switch.on:
                _patch(self.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # the rest of the loader's API (resources, ...)
