"""Model prices from genai-prices' bundled data, read once per model
(nbbudget.integrations.prices)."""

from __future__ import annotations

import random
import sys
import threading
import zlib

import pytest

from nbbudget.integrations import prices

try:
    import genai_prices
except ImportError:  # Python 3.10: genai-prices needs 3.11
    genai_prices = None

needs_genai_prices = pytest.mark.skipif(genai_prices is None,
                                        reason="genai-prices needs Python 3.11 or newer")

MODELS = [("openai", "gpt-4o-mini"), ("openai", "gpt-4.1"), ("openai", "o3"),
          ("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-3-5-haiku-latest"),
          ("google", "gemini-1.5-pro")]


def usages(seed: int) -> list[dict[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(50):
        inp = rng.randrange(0, 400_000)
        read = rng.randrange(0, inp + 1)
        write = rng.randrange(0, inp - read + 1)
        out.append({"input_tokens": inp, "output_tokens": rng.randrange(0, 50_000),
                    "cache_read_tokens": read, "cache_write_tokens": write})
    return out


@needs_genai_prices
@pytest.mark.parametrize(("provider", "model"), MODELS)
def test_a_cost_is_what_genai_prices_itself_computes(provider: str, model: str) -> None:
    for usage in usages(zlib.crc32(model.encode())):
        expected = genai_prices.calc_price(genai_prices.Usage(**usage), model,
                                           provider_id=provider).total_price
        assert prices.cost_usd(provider, model, usage) == pytest.approx(float(expected),
                                                                       rel=1e-9, abs=1e-12)


@needs_genai_prices
def test_a_model_priced_in_tiers_is_asked_of_genai_prices_each_time() -> None:
    price = prices.price_of("google", "gemini-1.5-pro")
    assert price is not None and price.per_token is None  # a higher rate past 128k tokens
    small = {"input_tokens": 100_000}
    large = {"input_tokens": 200_000}
    assert price.cost(large) > 2 * price.cost(small)


@needs_genai_prices
def test_a_model_genai_prices_does_not_know_has_no_price() -> None:
    assert prices.price_of("openai", "no-such-model-anywhere") is None
    assert prices.cost_usd("openai", "no-such-model-anywhere", {"input_tokens": 5}) is None


@needs_genai_prices
def test_missing_figures_count_as_none_used() -> None:
    assert prices.cost_usd("openai", "gpt-4o-mini", {}) == 0
    only_output = prices.cost_usd("openai", "gpt-4o-mini", {"output_tokens": 1_000_000})
    assert only_output == pytest.approx(float(genai_prices.calc_price(
        genai_prices.Usage(output_tokens=1_000_000), "gpt-4o-mini", provider_id="openai")
        .total_price))


@needs_genai_prices
def test_a_price_is_read_once_per_model_by_threads_racing_for_it(monkeypatch) -> None:
    reads: list[tuple[str, str]] = []
    real = prices._read
    barrier = threading.Barrier(8)

    def counting(provider: str, model: str):
        reads.append((provider, model))
        return real(provider, model)

    monkeypatch.setattr(prices, "_read", counting)
    monkeypatch.setattr(prices, "_prices", {})
    found = []

    def ask() -> None:
        barrier.wait()
        found.append(prices.price_of("openai", "gpt-4.1"))

    threads = [threading.Thread(target=ask, name=f"price-reader-{i}") for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reads == [("openai", "gpt-4.1")]
    assert len({id(price) for price in found}) == 1


def test_without_genai_prices_no_model_has_a_price(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # import genai_prices fails
    monkeypatch.setattr(prices, "_prices", {})
    assert prices.price_of("openai", "gpt-4o-mini") is None
    assert prices.cost_usd("openai", "gpt-4o-mini", {"input_tokens": 5}) is None


def test_prices_given_per_million_tokens_price_cached_input_at_its_own_rate_or_as_input() -> None:
    usage = {"input_tokens": 1_000_000, "cache_read_tokens": 400_000, "output_tokens": 100_000}
    assert prices.given_price({"input": 2.0, "output": 8.0})(usage) == pytest.approx(2.0 + 0.8)
    assert prices.given_price({"input": 2.0, "output": 8.0, "cache_read": 0.5})(usage) == \
        pytest.approx(600_000 * 2e-6 + 400_000 * 0.5e-6 + 0.8)
    assert prices.given_price(lambda used: used["output_tokens"] / 1e6)(usage) == 0.1
