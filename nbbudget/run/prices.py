"""What a model call cost: one price model for every way nbbudget charges a model call.

``prices=`` means the same in ``nb.instrument``, ``run.provider`` and every adapter (LangChain,
the Agents SDK, pydantic-ai), and is read here alone (`given_price`): a mapping of USD **per
million** tokens (``input``, ``output``, optionally ``cache_read`` and ``cache_write``), a
function of the usage figures (`FIGURES`) returning dollars, or ``"free"`` (a local model: it
costs nothing and is never refused as unpriced). Whatever the source, a price is a function of
the usage figures returning dollars (`PriceFn`): the model clients, the providers and the
adapters charge through it.

Without ``prices=``, a cost the provider reports in its reply (OpenRouter's ``usage.cost``) is
charged as reported, and otherwise the model's price comes from genai-prices' bundled data
(never fetched while a run runs) for the provider the client talks to: named with
``provider=``, or resolved from the client's base URL (`provider_of`), as pydantic-ai and
Logfire resolve it.

genai-prices works a price out in about 70 us. A run may charge thousands of calls, so each
model's price is read from genai-prices once per provider and kept as a `Price`: the dollars
per token of each usage figure, which genai-prices itself computed (a price is linear in the
figures). A model priced in tiers (a higher rate past a context length) is not linear: its
`Price` asks genai-prices on every call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..core.errors import ConfigError

__all__ = ["FIGURES", "FRAMING", "FREE", "Given", "Price", "PriceFn", "cost_usd", "given_price",
           "given_provider", "limited_price", "price_of", "provider_of", "worst_case",
           "worst_rates"]

#: The usage figures a price reads, in genai-prices' names. ``input_tokens`` counts every input
#: token, cached ones included; ``cache_read_tokens`` and ``cache_write_tokens`` say how many
#: of them were read from or written to the provider's cache; ``output_tokens`` includes
#: reasoning.
FIGURES = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")

_MILLION = 1_000_000


@dataclass(frozen=True)
class Price:
    """One model's price at one provider, as genai-prices gives it.

    ``per_token`` holds the dollars one more token of each figure adds (`FIGURES`), or is
    None when the model is priced in tiers, and then ``model_price`` answers each call.
    """

    provider: str
    model: str
    per_token: Mapping[str, float] | None
    model_price: Any

    def cost(self, usage: Mapping[str, float]) -> float:
        """The dollars *usage* (a mapping of `FIGURES`; missing ones are 0) cost."""
        per_token = self.per_token
        if per_token is not None:  # the figures in FIGURES' order, as a sum of them would
            get = usage.get
            return (per_token["input_tokens"] * get("input_tokens", 0)
                    + per_token["output_tokens"] * get("output_tokens", 0)
                    + per_token["cache_read_tokens"] * get("cache_read_tokens", 0)
                    + per_token["cache_write_tokens"] * get("cache_write_tokens", 0))
        from genai_prices import Usage

        figures = {key: int(usage.get(key, 0)) for key in FIGURES}
        return float(self.model_price.calc_price(Usage(**figures))["total_price"])


#: a price: what the usage figures (a mapping of `FIGURES`; missing ones are 0; other keys, as a
#: reported ``cost_usd``, are ignored) cost, in dollars. The model clients, the providers and
#: the adapters charge through it; a worst-case reservation calls it with the figures it bounds.
PriceFn = Callable[[Mapping[str, float]], float]

#: ``prices="free"``: a local model, whose calls cost nothing and are never refused as unpriced
FREE = "free"

#: what ``prices=`` takes: USD per million tokens by ``input``, ``output`` and optionally
#: ``cache_read`` and ``cache_write``, a function of the usage figures returning dollars, or
#: ``"free"``
Given = Mapping[str, float] | Callable[[Mapping[str, float]], float] | str

_RATES = ("input", "output", "cache_read", "cache_write")

#: input tokens a provider adds to a request's own (its chat template, a tool-use system
#: prompt: Anthropic's is 346 tokens at most), in a request's worst case (S3-10)
FRAMING = 1024


def worst_case(price: PriceFn, size: int) -> tuple[float, float]:
    """A model request's worst case at *price* (S3-10): the dollars of its input and the dollars
    of each output token. Its input is bounded from above by *size*, the bytes of what it sends
    (a token of text takes at least one byte of it, in any JSON form), and `FRAMING` tokens
    more, each priced as a cache write where that costs more; what that bound does not cover is
    in the docs ("Bounding the agent you already have"). The model clients
    (``nbbudget.integrations.models``) and the LangChain, Agents SDK and pydantic-ai adapters
    work out each request's worst case with it, before they reserve it
    (`nbbudget.run.providers.reserve_priced`)."""
    n = size + FRAMING
    plain_input = price({"input_tokens": n})
    fixed = max(plain_input, price({"input_tokens": n, "cache_write_tokens": n}))
    rate = (price({"input_tokens": n, "output_tokens": _MILLION}) - plain_input) / _MILLION
    return fixed, max(rate, 0.0)


def worst_rates(price: PriceFn) -> tuple[float, float]:
    """A linear price's `worst_case` per token: the dollars of each input token of the bound
    (``(size + FRAMING) * rates[0]``) and of each output token. The model clients work them out
    once per model (4 calls of a price cost a request 5 us)."""
    fixed, rate = worst_case(price, _MILLION - FRAMING)
    return fixed / _MILLION, rate


def given_price(prices: Given | None, where: str, *,
                price: PriceFn | None = None) -> PriceFn | None:
    """The price a user gave as ``prices=`` to *where* (``"nb.instrument()"``, ...), checked, or
    None when none was given: the function itself (its answer as dollars), 0 for ``"free"``, or
    the mapping's USD per million tokens, cached input at ``cache_read``/``cache_write`` where
    given, else at ``input``. *price*: ``price=``, the older name of ``prices=`` given a
    function, which ``run.provider`` and the pydantic-ai adapter still take (not both). A bad
    value raises `ConfigError` naming it and the fix. Every integration reads ``prices=`` with
    it: the model clients, ``run.provider`` and the LangChain, Agents SDK and pydantic-ai
    adapters."""
    if price is not None:
        if prices is not None:
            raise ConfigError(f"{where}: give prices= alone (USD per million tokens, a function "
                              f"of the usage, or 'free'), not price= too")
        prices = price
    if prices is None:
        return None
    if isinstance(prices, str):
        if prices == FREE:
            return _free
    elif callable(prices):
        function = prices
        return lambda usage: float(function(usage))
    elif isinstance(prices, Mapping) and _rates_ok(prices):
        return _per_million(prices)
    raise ConfigError(
        f"{where}: prices={prices!r} is not a price: give USD per million tokens, "
        f"{{'input': 2.5, 'output': 10.0}} (optionally 'cache_read' and 'cache_write'; finite "
        f"numbers >= 0), a function of the usage figures returning dollars, or 'free' for a "
        f"local model")


def given_provider(provider: object, where: str) -> str | None:
    """The provider a user named as ``provider=`` to *where*, checked: a genai-prices provider
    id (``"openrouter"``), or None for the default. The model clients and the LangChain,
    Agents SDK and pydantic-ai adapters read ``provider=`` with it."""
    if provider is None or (isinstance(provider, str) and provider):
        return provider
    raise ConfigError(f"{where}: provider={provider!r}: give the provider's name in "
                      f"genai-prices, a non-empty str such as 'openrouter'")


def limited_price(cost_left: float, given: PriceFn | None, provider: str | None,
                  model: str | None, where: str) -> PriceFn | None:
    """The price a model call's worst case is reserved at (S3-10), for an adapter that knows the
    call's *provider* and *model* only as it starts: None while the dollars are not limited
    (*cost_left* is infinite); else ``prices=`` (*given*), else genai-prices' price of the
    model, and a model with neither is refused with a `ConfigError` naming it and the fix
    (*where*: the adapter, ``"Budgeted"``). The LangChain handler and the Agents SDK hooks read
    it before each model call."""
    if cost_left == math.inf:
        return None
    if given is not None:
        return given
    found = None if model is None else price_of(str(provider), str(model))
    if found is None:
        raise ConfigError(
            f"cost_usd is limited and genai-prices has no price for model {model!r} at "
            f"provider {provider!r}: name the provider genai-prices knows it at, "
            f"{where}(provider='openrouter'), or give its price, {where}(prices={{'input': "
            f"..., 'output': ...}}) in USD per million tokens, a function of the usage, or "
            f"'free'")
    return found.cost


def _rates_ok(prices: Mapping[Any, Any]) -> bool:
    return ("input" in prices and "output" in prices and set(prices) <= set(_RATES)
            and all(not isinstance(value, bool) and isinstance(value, (int, float))
                    and 0 <= value < math.inf for value in prices.values()))


def _free(usage: Mapping[str, float]) -> float:
    return 0.0


def _per_million(prices: Mapping[str, float]) -> PriceFn:
    rate_in, rate_out = prices["input"] / _MILLION, prices["output"] / _MILLION
    rate_read = prices.get("cache_read", prices["input"]) / _MILLION
    rate_write = prices.get("cache_write", prices["input"]) / _MILLION

    def cost(usage: Mapping[str, float]) -> float:
        get = usage.get
        read, written = get("cache_read_tokens", 0), get("cache_write_tokens", 0)
        return (rate_in * (get("input_tokens", 0) - read - written) + rate_read * read
                + rate_write * written + rate_out * get("output_tokens", 0))

    return cost


def provider_of(base_url: str) -> str | None:
    """The genai-prices provider whose API a client at *base_url* talks to
    (``https://openrouter.ai/api/v1``: ``"openrouter"``), matched against the API URL patterns
    of genai-prices' data as pydantic-ai and Logfire match them; None when none matches or
    genai-prices is not installed. ``nb.instrument`` resolves a client's provider with it."""
    try:
        from genai_prices import data_snapshot
    except ImportError:
        return None
    try:
        return str(data_snapshot.get_snapshot().find_provider(None, None, base_url).id)
    except LookupError:
        return None


_prices: dict[tuple[str, str], Price | None] = {}
_prices_lock = threading.Lock()


def price_of(provider: str, model: str) -> Price | None:
    """The price of *model* at *provider* (``"openai"``, ``"anthropic"``, ...), or None when
    genai-prices does not know it or is not installed (it needs Python 3.11 or newer); read
    once per model and kept."""
    key = (provider, model)
    try:
        return _prices[key]
    except KeyError:
        pass
    with _prices_lock:
        if key not in _prices:
            _prices[key] = _read(provider, model)
        return _prices[key]


def cost_usd(provider: str, model: str, usage: Mapping[str, float]) -> float | None:
    """What *usage* (a mapping of `FIGURES`) of *model* at *provider* cost in dollars, or None
    when genai-prices has no price for that model."""
    price = price_of(provider, model)
    return None if price is None else price.cost(usage)


def _read(provider: str, model: str) -> Price | None:
    try:
        from genai_prices import Usage, data_snapshot
        from genai_prices.types import TieredPrices
    except ImportError:  # Python 3.10, or an install without it: prices= gives the price
        return None

    try:
        _, info = data_snapshot.get_snapshot().find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    model_price = info.get_prices(datetime.now(tz=timezone.utc))
    if any(isinstance(value, TieredPrices) for value in vars(model_price).values()):
        return Price(provider, model, None, model_price)

    def dollars(**figures: int) -> float:
        return float(model_price.calc_price(Usage(**figures))["total_price"])

    # genai-prices' own answer for a million of each figure alone (a cached token is also an
    # input token, so the cache rates are measured beside as many input tokens)
    per_input = dollars(input_tokens=_MILLION) / _MILLION
    per_token = {
        "input_tokens": per_input,
        "output_tokens": dollars(output_tokens=_MILLION) / _MILLION,
        "cache_read_tokens": dollars(input_tokens=_MILLION, cache_read_tokens=_MILLION)
        / _MILLION - per_input,
        "cache_write_tokens": dollars(input_tokens=_MILLION, cache_write_tokens=_MILLION)
        / _MILLION - per_input,
    }
    return Price(provider, model, per_token, model_price)
