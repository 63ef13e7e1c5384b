"""Model prices from genai-prices' bundled data, read once per model
(nbbudget.run.prices)."""

from __future__ import annotations

import random
import sys
import threading
import zlib

import pytest

import nbbudget as nb
from nbbudget.run import prices

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
    given = prices.given_price
    assert given({"input": 2.0, "output": 8.0}, "here")(usage) == pytest.approx(2.0 + 0.8)
    assert given({"input": 2.0, "output": 8.0, "cache_read": 0.5}, "here")(usage) == \
        pytest.approx(600_000 * 2e-6 + 400_000 * 0.5e-6 + 0.8)
    assert given(lambda used: used["output_tokens"] / 1e6, "here")(usage) == 0.1


def test_free_costs_nothing_and_no_prices_is_no_price() -> None:
    assert prices.given_price("free", "here")({"input_tokens": 10**9, "output_tokens": 10**9}) \
        == 0
    assert prices.given_price(None, "here") is None


@pytest.mark.parametrize("bad", [
    {"input": 1.0}, {"inptu": 1.0, "output": 2.0}, {"input": -1, "output": 2.0},
    {"input": float("inf"), "output": 1.0}, {"input": True, "output": 1.0},
    {"input": "2.5", "output": 10}, "cheap", "Free", 2.5, [2.5, 10.0]])
def test_a_bad_price_is_refused_naming_the_value_and_the_fix(bad) -> None:
    with pytest.raises(nb.ConfigError) as info:
        prices.given_price(bad, "nb.instrument()")
    assert str(info.value) == (
        f"nb.instrument(): prices={bad!r} is not a price: give USD per million tokens, "
        f"{{'input': 2.5, 'output': 10.0}} (optionally 'cache_read' and 'cache_write'; finite "
        f"numbers >= 0), a function of the usage figures returning dollars, or 'free' for a "
        f"local model")


@needs_genai_prices
@pytest.mark.parametrize(("url", "provider"), [
    ("https://openrouter.ai/api/v1", "openrouter"),
    ("https://api.groq.com/openai/v1", "groq"),
    ("https://generativelanguage.googleapis.com/v1beta/openai/", "google"),
    ("https://api.openai.com/v1/", "openai"),
    ("https://api.anthropic.com", "anthropic"),
    ("https://api.deepseek.com/v1", "deepseek"),
])
def test_a_providers_api_url_names_it_as_genai_prices_does(url: str, provider: str) -> None:
    assert prices.provider_of(url) == provider


@needs_genai_prices
def test_a_url_no_provider_serves_names_none() -> None:
    assert prices.provider_of("http://127.0.0.1:8000/v1") is None
    assert prices.provider_of("https://llm.internal.example.com/v1") is None


def test_without_genai_prices_no_url_names_a_provider(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    assert prices.provider_of("https://openrouter.ai/api/v1") is None


@needs_genai_prices
@pytest.mark.parametrize(("provider", "model"), [
    ("openrouter", "openai/gpt-4o-mini"), ("groq", "llama-3.3-70b-versatile"),
    ("google", "gemini-2.0-flash")])
def test_models_of_the_providers_behind_openai_compatible_apis_have_prices(provider, model):
    usage = {"input_tokens": 1000, "output_tokens": 500}
    expected = genai_prices.calc_price(genai_prices.Usage(**usage), model,
                                       provider_id=provider).total_price
    assert prices.cost_usd(provider, model, usage) == pytest.approx(float(expected))
    assert prices.price_of("openai", model) is None  # looked up at openai, it has none
