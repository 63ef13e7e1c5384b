"""S3-10: with ``cost_usd`` armed, each request of an instrumented client reserves its worst case
before it is sent (its input bounded by its body's size, its output at its cap, the cap clamped
so the worst case fits), and its reply settles the reservation. Real SDKs against the loopback
server of ``tests/wire``."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
from wire import Reply, Server  # noqa: E402
from wire import anthropic_shapes as a  # noqa: E402
from wire import openai_shapes as o  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations.models import anthropic_api, openai_api  # noqa: E402

ASK = [{"role": "user", "content": "plan the trip"}]
#: USD per million tokens: output dear, so that a request's cap decides most of its worst case
PRICES = {"input": 1.0, "output": 100.0}
IN_RATE, OUT_RATE = PRICES["input"] / 1e6, PRICES["output"] / 1e6
FRAMING = 1024  # the input tokens the worst case adds to the body's size (see the docs)
PROMPT, ANSWER = 20, 30  # what each reply reports using, its output at most its cap
LIMIT = 0.05  # the cost limit sixteen threads share


def capped_chat(body: Any) -> Any:
    """A completion that uses at most the output cap it was asked for."""
    out = min(ANSWER, body.get("max_completion_tokens") or body.get("max_tokens") or ANSWER)
    return o.chat("x" * out, o.chat_usage(PROMPT, out)).body


def cost_of(out: int) -> float:
    return PROMPT * IN_RATE + out * OUT_RATE


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=Reply(body=capped_chat)) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[Any]:
    bare = openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)
    yield nb.instrument(bare, prices=PRICES)
    bare.close()


def chat(client: Any, **kwargs: Any) -> Any:
    return client.chat.completions.create(model="house-model", messages=ASK, **kwargs)


def worst(body_size: int, cap: int) -> float:
    return (body_size + FRAMING) * IN_RATE + cap * OUT_RATE


def test_S3_10_a_reply_settles_its_reservation_to_what_it_used(server: Server, client: Any,
                                                               ledger: Any) -> None:
    with nb.budget(cost_usd=1.0, ledger=ledger) as run:
        chat(client, max_tokens=40)
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER))
        assert run.remaining("cost_usd") == pytest.approx(1.0 - cost_of(ANSWER))
    assert server.bodies()[0]["max_tokens"] == 40  # it fitted: not clamped


def test_S3_10_the_cap_is_clamped_so_that_the_worst_case_fits(server: Server,
                                                              client: Any) -> None:
    limit = 0.0035  # about 20 output tokens past the input's bound
    with nb.budget(cost_usd=limit) as run:
        chat(client, max_tokens=1000)
        sent = server.received[0]
    cap = sent.body["max_tokens"]
    size = int(sent.headers["content-length"])
    assert 1 <= cap < 1000
    # the largest cap whose worst case fits, give or take the bytes the new cap changed
    assert worst(size - 8, cap) <= limit < worst(size + 8, cap + 2)
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(min(cap, ANSWER)))


def test_S3_10_a_request_that_cannot_pay_for_one_output_token_is_refused_unsent(
        server: Server, client: Any) -> None:
    # less than the input's bound alone
    with nb.budget(cost_usd=0.001) as run, pytest.raises(nb.BudgetExceeded) as caught:
        chat(client, max_tokens=40)
    assert isinstance(caught.value, openai_api.Refused)  # the SDK's own error class too
    assert caught.value.kind == "cost_usd"
    assert server.received == []
    assert run.consumed.get("cost_usd", 0) == 0  # nothing reserved stays behind
    assert run.trace.refusals_by_kind()["cost_usd"] == 1  # traced as any refusal (S4-8)


def test_S3_10_an_error_status_gives_the_reservation_back(server: Server, client: Any) -> None:
    server.queue(Reply.error(400, "bad request", "invalid_request_error"))
    with nb.budget(cost_usd=1.0) as run:
        with pytest.raises(openai.BadRequestError):
            chat(client, max_tokens=40)
        assert run.consumed.get("cost_usd", 0) == pytest.approx(0)
        chat(client, max_tokens=40)
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER))


def test_S3_10_a_request_with_no_cap_reserves_all_that_is_left_until_it_settles(
        server: Server, client: Any) -> None:
    """Nothing bounds such a reply's output, so the cost left is reserved whole: a request made
    meanwhile is refused, and the reply gives back what it did not use."""
    server.queue(Reply(body=capped_chat, delay=0.5))
    errors: list[BaseException] = []
    with nb.budget(cost_usd=1.0) as run:
        first = threading.Thread(target=contextvars.copy_context().run,
                                 args=(lambda: chat(client),), name="reserve-no-cap")
        first.start()
        try:
            while not server.received:  # the first request is in flight
                threading.Event().wait(0.01)
            assert run.remaining("cost_usd") == pytest.approx(0)
            try:
                chat(client, max_tokens=5)
            except nb.BudgetExceeded as err:
                errors.append(err)
        finally:
            first.join()
        assert "max_tokens" not in server.received[0].body  # no cap invented for it
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER))
    assert [type(e) for e in errors] == [openai_api.Refused]
    assert len(server.received) == 1


@pytest.mark.parametrize("round_", range(5))
def test_S3_10_sixteen_threads_sharing_a_cost_limit_never_pass_it(server: Server, client: Any,
                                                                 ledger: Any, round_: int
                                                                 ) -> None:
    """Each thread asks until it is refused: every reply uses no more than its request
    reserved, so the run never passes its limit and nothing is cut; each refusal is nbbudget's
    error, and the server answered exactly the calls that were charged."""
    run = sixteen_until_refused(lambda: chat(client, max_tokens=40), ledger)
    caps = [r.body["max_tokens"] for r in server.received]
    used = sum(cost_of(min(cap, ANSWER)) for cap in caps)
    assert run.consumed["cost_usd"] == pytest.approx(used)
    assert run.consumed["provider_calls"] == len(caps) > 16


def sixteen_until_refused(call: Any, ledger: Any) -> nb.Budget:
    """Sixteen threads in one run under ``cost_usd=LIMIT`` each make *call* until it is refused;
    each must end with the API's refusal by ``cost_usd`` (never a cut: no reply passes the
    limit), and the run never passes it. The run, ended."""
    raised: list[BaseException] = []
    lock = threading.Lock()

    def until_refused() -> None:
        try:
            for _ in range(100):  # the cost limit refuses long before
                call()
        except BaseException as exc:  # the test reads what each thread met
            with lock:
                raised.append(exc)

    with nb.budget(cost_usd=LIMIT, ledger=ledger) as run:
        threads = [threading.Thread(target=contextvars.copy_context().run,  # in the run
                                    args=(until_refused,), name=f"reserve-{i}")
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(raised) == 16
    assert all(isinstance(e, openai_api.Refused) and e.kind == "cost_usd" for e in raised), raised
    assert run.outcome.status == "completed"
    assert run.consumed["cost_usd"] <= LIMIT
    return run


def test_S3_10_anthropic_requests_reserve_and_clamp_too(server: Server) -> None:
    def capped_message(body: Any) -> Any:
        out = min(ANSWER, body["max_tokens"])
        return a.message("y" * out, a.usage(PROMPT, out)).body

    server.default = Reply(body=capped_message)
    bare = anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=0)
    client = nb.instrument(bare, prices=PRICES)
    try:
        with nb.budget(cost_usd=0.0035) as run:
            client.messages.create(model="house-model", max_tokens=1000, messages=ASK)
            with pytest.raises(anthropic_api.Refused):
                client.messages.create(model="house-model", max_tokens=1000, messages=ASK)
    finally:
        bare.close()
    cap = server.received[0].body["max_tokens"]
    assert 1 <= cap < 1000
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(min(cap, ANSWER)))
    assert len(server.received) == 1


def capped_stream() -> Reply:
    """A streamed completion that writes at most the output cap it was asked for, a piece a
    token, and reports that usage at its end."""

    def events(body: Any) -> Any:
        out = min(ANSWER, body.get("max_completion_tokens") or body.get("max_tokens") or ANSWER)
        made = o.chat_stream(["x"] * out, o.chat_usage(PROMPT, out)).events
        assert callable(made)
        return made(body)

    return Reply(events=events)


def test_S3_10_a_stream_draws_on_its_reservation_and_gives_back_the_rest(server: Server,
                                                                       client: Any) -> None:
    server.queue(capped_stream())
    with nb.budget(cost_usd=1.0) as run:
        pieces = list(chat(client, max_tokens=40, stream=True))
        assert run.consumed["cost_usd"] == pytest.approx(cost_of(ANSWER))
    assert sum(1 for p in pieces if p.choices and p.choices[0].delta.content) == ANSWER


def test_S3_10_a_stream_left_before_its_usage_keeps_its_inputs_bound(server: Server,
                                                                    client: Any) -> None:
    """OpenAI reports a stream's input only at its end; a stream closed before it is charged
    the output it counted and its input's bound, which the provider bills all the same."""
    server.queue(capped_stream())
    with nb.budget(cost_usd=1.0) as run:
        stream = chat(client, max_tokens=40, stream=True)
        for n, _ in enumerate(stream):
            if n == 5:
                break
        stream.close()
        size = int(server.received[0].headers["content-length"])
        charged = run.consumed["cost_usd"]
    counted = run.consumed["output_tokens"]
    assert 1 <= counted <= 5
    # the bound is of the body asked, before nbbudget added its stream_options (41 bytes)
    assert worst(size - 50, 0) + counted * OUT_RATE <= charged
    assert charged <= worst(size, 0) + counted * OUT_RATE


@pytest.mark.parametrize("round_", range(3))
def test_S3_10_sixteen_streams_sharing_a_cost_limit_never_pass_it(server: Server, client: Any,
                                                                 ledger: Any, round_: int
                                                                 ) -> None:
    server.queue(*[capped_stream() for _ in range(200)])

    def stream() -> None:
        for _ in chat(client, max_tokens=40, stream=True):
            pass

    run = sixteen_until_refused(stream, ledger)
    caps = [r.body["max_tokens"] for r in server.received]
    assert run.consumed["cost_usd"] == pytest.approx(sum(cost_of(min(c, ANSWER)) for c in caps))


def test_S3_10_with_no_output_token_left_the_refusal_is_by_output_tokens_S2_9(
        server: Server, client: Any) -> None:
    with nb.budget(cost_usd=1.0, output_tokens=10) as run:
        run.charge("output_tokens", 10)
        with pytest.raises(openai_api.Refused) as caught:
            chat(client, max_tokens=40)
    assert caught.value.kind == "output_tokens"
    assert server.received == []
    assert run.consumed.get("cost_usd", 0) == 0


def test_S3_10_the_output_tokens_left_and_the_dollars_left_both_clamp_the_cap(
        server: Server, client: Any) -> None:
    with nb.budget(cost_usd=1.0, output_tokens=7) as run:
        chat(client, max_tokens=40)
    assert server.received[0].body["max_tokens"] == 7
    assert run.consumed["cost_usd"] == pytest.approx(cost_of(7))


def test_S3_10_each_of_a_requests_n_choices_may_write_up_to_its_cap(server: Server,
                                                                   client: Any) -> None:
    """Chat's ``n=3`` asks three answers, each up to the cap: the worst case is three times the
    output, and the cap is clamped so that it fits (one answer's would not need it)."""
    def three_answers(body: Any) -> Any:
        out = min(ANSWER, body["max_tokens"])
        return o.chat("x" * out, o.chat_usage(PROMPT, 3 * out)).body

    server.queue(Reply(body=three_answers))
    limit = 0.01
    with nb.budget(cost_usd=limit) as run:
        chat(client, max_tokens=40, n=3)
    sent = server.received[0]
    cap, size = sent.body["max_tokens"], int(sent.headers["content-length"])
    assert worst(size - 8, 40) <= limit < worst(size - 8, 3 * 40)  # one fits, three do not
    assert 1 <= cap < 40 and worst(size - 8, 3 * cap) <= limit
    assert run.consumed["cost_usd"] == pytest.approx(PROMPT * IN_RATE + 3 * min(cap, ANSWER)
                                                     * OUT_RATE)


def test_S3_5_a_reservation_that_reaches_a_notice_level_gives_the_notice(
        server: Server, client: Any, ledger: Any) -> None:
    """Dollars reserved count toward the approach notices as dollars spent do (S3-5): a
    request whose worst case takes the run past 50% of its cost gives the first notice."""
    with nb.budget(cost_usd=0.0125, notices=(0.5, 0.95), ledger=ledger) as run:
        chat(client, max_tokens=40)  # reserves ~0.0052 (42%), settles at ~0.003 (24%)
        assert not [e for e in run.trace.events if e.kind == "approach_notice"]
        chat(client, max_tokens=40)  # the first's 0.003 and this one's ~0.0052: past 50%
        assert run.consumed["cost_usd"] / 0.0125 < 0.5  # settled: below it again
    notices = [e.payload for e in run.trace.events if e.kind == "approach_notice"]
    assert [(n["level"], n["budget_kind"]) for n in notices] == [(1, "cost_usd")]
    assert notices[0]["ratio"] > 0.6  # given at the reservation
