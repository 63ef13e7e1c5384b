"""What a model call cost, from genai-prices' bundled price data (never fetched while a run runs).

`cost_usd` is what the model clients (``nb.instrument``) and the agent-framework adapters charge
as ``cost_usd`` when the caller gave no prices of their own. genai-prices is the price data
pydantic-ai uses; its data ships inside the package, and nothing here starts its auto-update,
so no request leaves the machine for a price.

genai-prices works a price out in about 70 us. A run may charge thousands of calls, so each
model's price is read from genai-prices once and kept as a `Price`: the dollars per token of
each usage figure, which genai-prices itself computed (a price is linear in the figures). A
model priced in tiers (a higher rate past a context length) is not linear: its `Price` asks
genai-prices on every call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["FIGURES", "Given", "Price", "cost_usd", "given_price", "price_of"]

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

    def cost(self, usage: Mapping[str, int]) -> float:
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


#: prices a user gives (``prices=``): USD per million tokens by ``input``, ``output`` and
#: optionally ``cache_read`` and ``cache_write``, or a function of the usage figures
Given = Mapping[str, float] | Callable[[Mapping[str, int]], float]


def given_price(prices: Given) -> Callable[[Mapping[str, int]], float]:
    """What usage (a mapping of `FIGURES`) costs at the *prices* a user gave (``prices=``, each
    adapter checks its shape): the function itself, in dollars, or the mapping's USD per
    million tokens, cached input at ``cache_read``/``cache_write`` where given, else at
    ``input``. The model clients, the LangChain handler and the Agents SDK hooks read
    ``prices=`` with it."""
    if callable(prices):
        return lambda usage: float(prices(usage))
    rate_in, rate_out = prices.get("input", 0) / _MILLION, prices.get("output", 0) / _MILLION
    rate_read = prices.get("cache_read", prices.get("input", 0)) / _MILLION
    rate_write = prices.get("cache_write", prices.get("input", 0)) / _MILLION

    def cost(usage: Mapping[str, int]) -> float:
        read, written = usage.get("cache_read_tokens", 0), usage.get("cache_write_tokens", 0)
        return (rate_in * (usage.get("input_tokens", 0) - read - written) + rate_read * read
                + rate_write * written + rate_out * usage.get("output_tokens", 0))

    return cost


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


def cost_usd(provider: str, model: str, usage: Mapping[str, int]) -> float | None:
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
