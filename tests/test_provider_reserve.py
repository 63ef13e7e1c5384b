"""S3-10 for ``run.provider``: with ``cost_usd`` limited and ``prices=`` given, each attempt
reserves its worst case before the function is called (its input bounded by the arguments'
size, its output at ``max_output_tokens``, the cap clamped so the worst case fits), and the
reply settles the reservation. Real threads, over every ledger."""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import nbbudget as nb

PRICES = {"input": 1.0, "output": 100.0}  # USD per million tokens: the cap decides
IN_RATE, OUT_RATE = PRICES["input"] / 1e6, PRICES["output"] / 1e6
FRAMING = 1024  # the input tokens the worst case adds to the arguments' size (the docs)
PROMPT = 20  # what each reply reports as its input


def worst(args: tuple[Any, ...], kwargs: dict[str, Any], cap: int) -> float:
    """The worst case the docs state: the arguments as JSON, in bytes, plus 1,024 tokens, at
    the input price; the cap at the output price."""
    size = len(json.dumps([list(args), kwargs]).encode())
    return (size + FRAMING) * IN_RATE + cap * OUT_RATE


def cost_of(out: int) -> float:
    return PROMPT * IN_RATE + out * OUT_RATE


class Model:
    """A model function that counts its calls and uses *uses* output tokens, at most its cap."""

    def __init__(self, uses: int = 30) -> None:
        self.uses = uses
        self.caps: list[int | None] = []
        self.lock = threading.Lock()

    def __call__(self, prompt: str, max_output_tokens: int | None = None) -> dict[str, Any]:
        with self.lock:
            self.caps.append(max_output_tokens)
        out = self.uses if max_output_tokens is None else min(self.uses, max_output_tokens)
        return {"text": "x" * out, "input_tokens": PROMPT, "output_tokens": out}


def test_S3_10_a_reply_settles_its_reservation_to_what_it_used(ledger: Any) -> None:
    model = Model()
    with nb.budget(cost_usd=1.0, ledger=ledger) as run:
        run.provider(model, prices=PRICES)("plan the trip", max_output_tokens=40)
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(30))
        assert run.remaining("cost_usd") == pytest.approx(1.0 - cost_of(30))
    assert model.caps == [40]  # it fitted: not clamped


def test_S3_10_the_cap_is_clamped_so_that_the_worst_case_fits() -> None:
    model = Model(uses=10**6)  # uses its whole cap
    limit = 0.0035
    with nb.budget(cost_usd=limit) as run:
        run.provider(model, prices=PRICES)("plan the trip", max_output_tokens=1000)
    fixed = worst(("plan the trip",), {}, 0)
    assert model.caps == [int((limit - fixed) / OUT_RATE)]
    assert run.consumed["cost_usd"] <= limit
    assert run.outcome.status == "completed"  # the reply used its cap, and it fitted


def test_S3_10_a_call_whose_input_alone_cannot_be_paid_for_is_refused_uncalled() -> None:
    model = Model()
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(cost_usd=0.0005) as run:
        run.provider(model, prices=PRICES)("plan the trip", max_output_tokens=10)
    assert refused.value.kind == "cost_usd"
    assert model.caps == []
    assert run.consumed.get("provider_calls", 0) == 0


def test_S3_10_a_function_without_a_cap_reserves_all_that_is_left_until_it_settles() -> None:
    """Nothing bounds its reply: a second call meanwhile is refused, one after it is not."""
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow(prompt: str) -> dict[str, Any]:
        inside.set()
        assert release.wait(10)
        return {"input_tokens": PROMPT, "output_tokens": 5}

    with nb.budget(cost_usd=0.01) as run:
        ask = run.provider(slow, prices=PRICES)

        def first() -> None:
            try:
                ask("plan the trip")
            except BaseException as exc:  # read below
                errors.append(exc)

        thread = threading.Thread(target=contextvars.copy_context().run, args=(first,),
                                  name="provider-first")
        thread.start()
        assert inside.wait(10)
        with pytest.raises(nb.BudgetExceeded) as refused:
            ask("and the way back")
        release.set()
        thread.join(10)
        ask("and the way back")  # settled: the first gave back what it did not use
    assert refused.value.kind == "cost_usd"
    assert errors == []
    assert run.consumed["cost_usd"] == pytest.approx(2 * cost_of(5))


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_sixteen_threads_sharing_a_cost_limit_never_pass_it(ledger: Any,
                                                                 round_: int) -> None:
    """Each thread asks until it is refused; each reply uses all of its cap: the run never
    passes its limit, nothing is cut, and every refusal is by cost_usd."""
    model = Model(uses=10**6)
    limit = 0.2  # about 40 calls' worth
    raised: list[BaseException] = []
    lock = threading.Lock()
    with nb.budget(cost_usd=limit, ledger=ledger) as run:
        ask = run.provider(model, prices=PRICES)

        def until_refused() -> None:
            try:
                for _ in range(100):
                    ask("plan the trip", max_output_tokens=40)
            except BaseException as exc:  # the test reads what each thread met
                with lock:
                    raised.append(exc)

        threads = [threading.Thread(target=contextvars.copy_context().run,
                                    args=(until_refused,), name=f"provider-{i}")
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(raised) == 16
    assert all(isinstance(e, nb.BudgetExceeded) and e.kind == "cost_usd" for e in raised), raised
    assert run.outcome.status == "completed"
    assert run.consumed["cost_usd"] <= limit
    assert run.consumed["cost_usd"] == pytest.approx(
        sum(cost_of(cap) for cap in model.caps if cap is not None))
    assert run.consumed["provider_calls"] == len(model.caps) > 16


def test_S3_10_a_stream_draws_on_its_reservation_and_gives_back_the_rest() -> None:
    def stream(prompt: str, max_output_tokens: int | None = None) -> Iterator[dict[str, Any]]:
        for _ in range(3):
            yield {"text": "x", "output_tokens": 5}
        yield {"input_tokens": PROMPT}

    with nb.budget(cost_usd=1.0) as run:
        chunks = list(run.provider(stream, prices=PRICES)("plan", max_output_tokens=100))
        assert len(chunks) == 4
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(15))
        assert run.remaining("cost_usd") == pytest.approx(1.0 - cost_of(15))


def test_S3_10_a_stream_its_caller_closes_gives_back_what_it_did_not_draw() -> None:
    def stream(prompt: str, max_output_tokens: int | None = None) -> Iterator[dict[str, Any]]:
        for _ in range(10):
            yield {"text": "x", "output_tokens": 5}

    with nb.budget(cost_usd=1.0) as run:
        reply = run.provider(stream, prices=PRICES)("plan", max_output_tokens=100)
        next(reply)
        reply.close()
        assert run.consumed["cost_usd"] == pytest.approx(5 * OUT_RATE)


class Status(Exception):
    """An error an SDK raises for an error status: the provider billed nothing."""

    status_code = 503


def test_S3_10_an_error_status_gives_the_reservation_back_and_another_error_keeps_it() -> None:
    def fails(error: BaseException) -> Any:
        def model(prompt: str, max_output_tokens: int | None = None) -> Any:
            raise error
        return model

    with nb.budget(cost_usd=1.0) as run:
        with pytest.raises(Status):
            run.provider(fails(Status()), prices=PRICES)("plan", max_output_tokens=100)
        assert run.consumed.get("cost_usd", 0) == 0
        with pytest.raises(TimeoutError):  # sent, maybe billed: what it reserved stays spent
            run.provider(fails(TimeoutError()), prices=PRICES)("plan", max_output_tokens=100)
        assert run.consumed["cost_usd"] == pytest.approx(
            worst(("plan",), {}, 100), rel=1e-9)


def test_S3_10_without_a_price_or_a_cost_limit_nothing_is_reserved() -> None:
    model = Model()
    with nb.budget(cost_usd=1.0) as run:  # no price: charged what the reply reports
        run.provider(model)("plan", max_output_tokens=40)
        assert "cost_usd" not in run.consumed
    with nb.budget(output_tokens=25) as run:  # no cost limit: the output grant clamps (S2-9)
        run.provider(model, prices=PRICES)("plan", max_output_tokens=40)
    assert model.caps == [40, 25]
