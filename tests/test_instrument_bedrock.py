"""``nb.instrument()`` with no client bounds Amazon Bedrock's ``Converse`` and ``ConverseStream``
as boto3's ``bedrock-runtime`` client makes them (botocore, whose endpoints and HTTP sessions
the switch reaches): through the real boto3 against the loopback server of ``tests/wire``
speaking Bedrock's wire format, whole replies and AWS event streams (S2-9, S3-8, S3-9, S3-10,
S4-6, N-7)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
import botocore.auth  # noqa: E402
import botocore.awsrequest  # noqa: E402
import botocore.config  # noqa: E402
import botocore.credentials  # noqa: E402
import botocore.exceptions  # noqa: E402
from wire import FORMS, Received, Reply, Server  # noqa: E402
from wire import bedrock_shapes as b  # noqa: E402

import nbbudget as nb  # noqa: E402
from nbbudget.integrations import claims  # noqa: E402
from nbbudget.integrations.models import bedrock_api, boto  # noqa: E402
from nbbudget.run.prices import cost_usd, price_of  # noqa: E402

MODEL = "amazon.nova-lite-v1:0"
ASK = [{"role": "user", "content": [{"text": "plan the trip"}]}]
PIECES = [f"w{i} " for i in range(40)]
KEY, SECRET, REGION = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG", "us-east-1"
#: genai-prices prices Bedrock's models (provider ``aws``) where it is installed (3.11+)
priced = pytest.mark.skipif(price_of("aws", MODEL) is None,
                            reason="genai-prices is not installed (it needs Python 3.11+)")


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(default=b.converse("Paris.", b.usage(12, 3))) as server:
        yield server
        # an error raised inside botocore's retry loop is in a cycle with its frames, which
        # hold the last attempt's response and its connection until the collector runs: the
        # server would wait for that connection to idle out
        gc.collect()


def make(server: Server, **config: Any) -> Any:
    """A bedrock-runtime client at the loopback server (botocore's retries of 429 and 500 as
    configured, none by default)."""
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    return boto3.client("bedrock-runtime", endpoint_url=server.url, region_name=REGION,
                        aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                        config=botocore.config.Config(**config))


@pytest.fixture
def client(server: Server) -> Iterator[Any]:
    client = make(server)
    yield client
    client.close()  # before the server waits for its connections


def converse(client: Any, **kwargs: Any) -> Any:
    return client.converse(modelId=MODEL, messages=ASK, **kwargs)


def streamed(client: Any, **kwargs: Any) -> list[dict[str, Any]]:
    return list(client.converse_stream(modelId=MODEL, messages=ASK, **kwargs)["stream"])


def used(run: nb.Budget) -> dict[str, float]:
    return {k: v for k, v in run.consumed.items() if k != "run_ms"}


def signed_as_sent(received: Received) -> bool:
    """Whether the request's signature is the one of the bytes the server received: SigV4
    computed again over them, at the time the request names."""
    authorization = received.headers["authorization"]
    names = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    headers = {k: v for k, v in received.headers.items() if k in names}
    request = botocore.awsrequest.AWSRequest(
        method="POST", url=f"http://{received.headers['host']}{received.path}",
        data=received.raw, headers=headers)
    stamp = received.headers["x-amz-date"]
    request.context["timestamp"] = stamp
    auth = botocore.auth.SigV4Auth(botocore.credentials.Credentials(KEY, SECRET),
                                   "bedrock", REGION)
    signature = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)),
                               request)
    return authorization.endswith(f"Signature={signature}")


# -- permits ---------------------------------------------------------------------------------------
def test_the_third_call_under_two_provider_calls_is_refused_with_nothing_sent_S4_6(
        server: Server, switch: Any, client: Any) -> None:
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(provider_calls=2) as run:
        converse(client)
        streamed(client)
        converse(client)
    assert len(server.received) == 2
    assert run.consumed["provider_calls"] == 2
    assert refused.value.kind == "provider_calls"
    assert isinstance(refused.value, bedrock_api.Refused)  # nbbudget's, unwrapped by botocore
    assert run.trace.latest("dispatch_refused_budget_exceeded") is not None


def test_a_client_made_before_the_switch_is_reached_and_undo_gives_botocore_its_own(
        server: Server, client: Any) -> None:
    endpoint = sys.modules["botocore.endpoint"]
    own = (endpoint.Endpoint.create_request, endpoint.URLLib3Session.send)
    switch = nb.instrument()
    try:
        assert "botocore" in repr(switch)
        with pytest.raises(nb.BudgetExceeded), nb.budget(provider_calls=1):
            converse(client)
            converse(client)
    finally:
        switch.undo()
    assert (endpoint.Endpoint.create_request, endpoint.URLLib3Session.send) == own
    with nb.budget(provider_calls=1) as run:  # off: nothing counted
        converse(client)
        converse(client)
    assert run.consumed.get("provider_calls", 0) == 0
    assert len(server.received) == 3


def test_a_retry_of_botocores_own_takes_one_more_permit_S4_6(server: Server,
                                                             switch: Any) -> None:
    throttled = Reply(body={"message": "slow down"}, status=429,
                      headers={"x-amzn-ErrorType": "ThrottlingException"})
    server.queue(throttled, b.converse("Paris.", b.usage(12, 3)))
    client = make(server, retries={"max_attempts": 3, "mode": "standard"})
    try:
        with nb.budget(provider_calls=5) as run:
            reply = converse(client)
        assert reply["ResponseMetadata"]["RetryAttempts"] == 1
        assert run.consumed["provider_calls"] == 2
        assert run.consumed["tokens"] == 15  # the 429 used nothing

        server.queue(throttled, b.converse("Paris.", b.usage(12, 3)))
        with pytest.raises(nb.BudgetExceeded), nb.budget(provider_calls=1) as run:
            converse(client)  # the retry is refused unsent
        assert run.consumed["provider_calls"] == 1
        assert len(server.received) == 3
    finally:
        client.close()


# -- usage, price, clamp ---------------------------------------------------------------------------
@priced
@pytest.mark.parametrize("form", FORMS)
def test_usage_and_cost_are_charged_as_the_reply_reports_them_in_every_json_form_S2_9(
        server: Server, switch: Any, client: Any, form: str) -> None:
    server.queue(b.converse("Paris.", b.usage(12, 3, read=100, written=20), form=form),
                 b.stream(["Pa", "ris."], b.usage(7, 2), form=form))
    with nb.budget(cost_usd=1.0) as run:
        reply = converse(client)
        events = streamed(client)
    assert reply["output"]["message"]["content"] == [{"text": "Paris."}]
    assert [e["contentBlockDelta"]["delta"]["text"] for e in events
            if "contentBlockDelta" in e] == ["Pa", "ris."]
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 2  # handed on whole
    assert run.consumed["tokens"] == 12 + 100 + 20 + 3 + 7 + 2  # the cached input is input
    assert run.consumed["output_tokens"] == 5
    price = (cost_usd("aws", MODEL, {"input_tokens": 132, "output_tokens": 3,
                                     "cache_read_tokens": 100, "cache_write_tokens": 20})
             + cost_usd("aws", MODEL, {"input_tokens": 7, "output_tokens": 2}))
    assert run.consumed["cost_usd"] == pytest.approx(price)
    assert run.usage(by="model").loc[("aws", MODEL), "calls"] == 2


def test_the_output_cap_is_clamped_in_the_body_botocore_signs_S3_10(
        server: Server, switch: Any, client: Any) -> None:
    with nb.budget(output_tokens=50) as run:
        converse(client, inferenceConfig={"maxTokens": 4096, "temperature": 0.2})
        converse(client)  # none asked: the cap is set
    first, second = server.received
    assert first.body["inferenceConfig"] == {"maxTokens": 50, "temperature": 0.2}
    assert second.body["inferenceConfig"] == {"maxTokens": 47}
    assert signed_as_sent(first) and signed_as_sent(second)
    assert run.consumed["output_tokens"] == 6


def test_outside_every_run_the_requests_and_replies_are_boto3s_own_byte_for_byte(
        server: Server, client: Any) -> None:
    varies = ("x-amz-date", "authorization", "amz-sdk-invocation-id")

    def sent() -> list[Any]:
        server.received.clear()
        server.queue(b.converse("Paris.", b.usage(12, 3)), b.stream(["Pa", "ris."],
                                                                    b.usage(12, 2)))
        reply = converse(client, inferenceConfig={"maxTokens": 7})
        events = streamed(client)
        for r in (reply,):
            r["ResponseMetadata"].pop("HTTPHeaders")  # its date
            r["ResponseMetadata"].pop("RequestId", None)
        return [(r.path, r.raw, {k: v for k, v in r.headers.items() if k not in varies})
                for r in server.received] + [reply, events]

    bare = sent()
    with nb.instrument():
        switched = sent()
    assert switched == bare


def test_another_operation_of_the_service_is_no_model_call(server: Server, switch: Any,
                                                          client: Any) -> None:
    server.queue(Reply(body={"action": "NONE", "outputs": [], "assessments": [],
                             "usage": {"topicPolicyUnits": 1}}))
    with nb.budget(provider_calls=1) as run:
        client.apply_guardrail(guardrailIdentifier="g1", guardrailVersion="1", source="INPUT",
                               content=[{"text": {"text": "hello"}}])
    assert run.consumed.get("provider_calls", 0) == 0
    assert server.received[0].path == "/guardrail/g1/version/1/apply"


def test_a_call_an_adapter_claims_is_counted_by_it_alone(server: Server, switch: Any,
                                                       client: Any) -> None:
    with nb.budget(provider_calls=1) as run:
        with claims.held():
            converse(client)
            converse(client)
        converse(client)
    assert run.consumed["provider_calls"] == 1


# -- streams ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_a_stream_is_cut_where_its_text_passes_the_output_limit_S3_9(
        server: Server, switch: Any, client: Any, form: str) -> None:
    server.queue(b.stream(PIECES, b.usage(12, 40), form=form, event_delay=0.005))
    got: list[str] = []
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=10) as run:
        for event in client.converse_stream(modelId=MODEL, messages=ASK,
                                            inferenceConfig={"maxTokens": 100})["stream"]:
            if "contentBlockDelta" in event:
                got.append(event["contentBlockDelta"]["delta"]["text"])
    assert isinstance(cut.value, bedrock_api.Cut)
    assert cut.value.salvage == "".join(PIECES[:11])  # the crossing one
    assert "".join(got) == "".join(PIECES[:10])
    assert server.received[0].body["inferenceConfig"]["maxTokens"] == 10
    assert run.consumed["output_tokens"] == 11  # the delta that crossed is charged (S3-3)
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    server.wait_finished()
    (answer,) = server.received
    assert answer.disconnected and answer.events_sent < answer.events_total


def test_a_stream_read_a_byte_at_a_time_hands_on_whole_messages_only(
        server: Server, switch: Any, client: Any) -> None:
    # each message's bytes come one by one: botocore's parser gets only whole messages
    def reply() -> Reply:
        slow = b.stream(["Pa", "ris."], b.usage(12, 2))
        slow.trickle = 0.0002
        return slow

    server.queue(reply(), reply())
    bare = streamed(client)
    with nb.budget(tokens=1000) as run:
        events = streamed(client)
    assert events == bare and len(events) == 6
    assert run.consumed["output_tokens"] == 2


def test_a_stream_that_ends_without_its_usage_is_unreadable_usage_under_a_token_limit_N_7(
        server: Server, switch: Any, client: Any) -> None:
    server.queue(b.stream(["Pa", "ris."], None))
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(tokens=1000) as run:
        streamed(client)
    assert "metadata" not in str(cut.value) and "no usage" in str(cut.value)
    assert run.consumed["output_tokens"] == 2  # what it counted
    server.queue(b.stream(["Pa", "ris."], None))
    with nb.budget(provider_calls=5) as run:  # nothing metered is limited: said in the trace
        streamed(client)
    assert run.trace.latest("unmetered") is not None


def test_a_metadata_event_without_usage_is_unreadable_usage_N_7(server: Server, switch: Any,
                                                                 client: Any) -> None:
    reply = b.stream(["Paris."], None)
    assert isinstance(reply.events, list)
    reply.events.append(("metadata", {"metrics": {"latencyMs": 3}}))
    server.queue(reply)
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(output_tokens=1000):
        streamed(client)
    assert "no metadata.usage" in str(cut.value)


@priced
def test_a_whole_reply_without_usage_stops_a_run_limited_by_cost_N_7(
        server: Server, switch: Any, client: Any) -> None:
    server.queue(b.converse("Paris.", None))
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(cost_usd=1.0) as run:
        converse(client)
    assert cut.value.salvage == "Paris."
    assert run.outcome is not None and run.outcome.by == "cost_usd"


def test_an_unpriced_model_is_refused_under_a_cost_limit_with_nothing_sent(
        server: Server, switch: Any, client: Any) -> None:
    with pytest.raises(bedrock_api.Unpriced) as unpriced, nb.budget(cost_usd=1.0):
        client.converse(modelId="my-imported-model", messages=ASK)
    assert "nb.instrument('<base URL>', prices=" in str(unpriced.value)
    assert not server.received


# -- time (real clock, generous margins) -----------------------------------------------------------
@pytest.mark.realclock
def test_a_reply_that_never_comes_is_cut_at_the_runs_time_S3_8(server: Server, switch: Any,
                                                               client: Any) -> None:
    server.queue(Reply(body={"output": {}}, delay=20))
    started = time.monotonic()
    with pytest.raises(nb.BudgetCut) as cut, nb.budget(time="1s") as run:
        converse(client)
    assert time.monotonic() - started < 8
    assert isinstance(cut.value, bedrock_api.Cut)
    assert run.outcome is not None and run.outcome.by == "timeout"


@pytest.mark.realclock
def test_a_stream_that_trickles_past_the_runs_time_is_cut_S3_8(server: Server, switch: Any,
                                                               client: Any) -> None:
    server.queue(b.stream(PIECES, b.usage(12, 40), event_delay=0.3))
    started = time.monotonic()
    with pytest.raises(nb.BudgetCut), nb.budget(time="1.5s") as run:
        streamed(client)
    assert time.monotonic() - started < 8
    assert run.outcome is not None and run.outcome.by == "timeout"
    assert 0 < run.consumed["output_tokens"] < 40


# -- botocore's versions, and its import ----------------------------------------------------------
def test_a_botocore_too_old_to_meter_a_call_refuses_it_and_names_the_upgrade(
        server: Server, switch: Any, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boto, "_CONTEXT_SENT", False)
    with pytest.raises(nb.ConfigError) as refused, nb.budget(provider_calls=5):
        converse(client)
    assert "pip install 'botocore>=1.43.68'" in str(refused.value)
    assert not server.received
    converse(client)  # outside every run: untouched


def test_botocore_imported_after_the_switch_is_switched_as_it_is_imported() -> None:
    code = ("import sys, nbbudget as nb\n"
            "assert 'botocore' not in sys.modules\n"
            "switch = nb.instrument()\n"
            "import boto3\n"
            "from botocore.endpoint import Endpoint, URLLib3Session\n"
            "assert Endpoint.create_request.__wrapped__ and URLLib3Session.send.__wrapped__\n"
            "switch.undo()\n"
            "assert not hasattr(Endpoint.create_request, '__wrapped__')\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_event_stream_framing_reads_what_botocores_parser_reads() -> None:
    from botocore.eventstream import EventStreamBuffer
    from wire import event_message

    from nbbudget.integrations.models.shapes import EVENT_STREAM

    data = b"".join(b.stream(["Pa", "ris."], b.usage(12, 2), form=form).written(None)[i]
                    for i, form in enumerate(FORMS))
    data += event_message("throttlingException", b'{"message":"slow"}', "exception")
    parser = EventStreamBuffer()
    parser.add_data(data)
    theirs = list(parser)
    ours = EVENT_STREAM.events(data)
    assert len(ours) == len(theirs) == 6
    for (_, _, event), message in zip(ours, theirs, strict=True):
        kind = message.headers.get(":event-type")
        assert event == (None if kind is None else {kind: json.loads(message.payload)})
    ends = [0] + [end for _, end, _ in ours]
    for cut in range(len(data)):  # a part of a message waits for its rest
        assert EVENT_STREAM.whole(data[:cut]) == max(end for end in ends if end <= cut)


# -- LiteLLM's Bedrock models: signed by LiteLLM, sent on httpx -----------------------------------
def litellm_converse(server: Server, **kwargs: Any) -> Any:
    litellm = pytest.importorskip("litellm")
    return litellm.completion(
        model=f"bedrock/converse/{MODEL}", api_base=server.url, aws_access_key_id=KEY,
        aws_secret_access_key=SECRET, aws_region_name=REGION,
        messages=[{"role": "user", "content": "plan the trip"}], **kwargs)


def test_litellms_bedrock_calls_are_counted_and_their_signed_bodies_never_changed(
        server: Server, switch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(
            provider_calls=2, output_tokens=10) as run:
        reply = litellm_converse(server, max_tokens=4096)
        assert reply.choices[0].message.content == "Paris."
        server.queue(b.stream(["Pa", "ris."], b.usage(12, 2)))
        pieces = [c.choices[0].delta.content for c in litellm_converse(server, stream=True)
                  if c.choices]
        assert "".join(p for p in pieces if p) == "Paris."
        litellm_converse(server)
    assert refused.value.kind == "provider_calls"
    assert len(server.received) == 2  # the third refused unsent
    assert run.consumed["tokens"] == 15 + 14 and run.consumed["output_tokens"] == 5
    first = server.received[0]
    assert first.body["inferenceConfig"]["maxTokens"] == 4096  # signed: never clamped
    assert all(signed_as_sent(r) for r in server.received)


def test_litellms_bedrock_stream_is_cut_at_the_crossing_S3_9(
        server: Server, switch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    server.queue(b.stream(PIECES, b.usage(12, 40), event_delay=0.005))
    with pytest.raises(nb.BudgetCut), nb.budget(output_tokens=5) as run:
        for _ in litellm_converse(server, stream=True):
            pass
    assert run.consumed["output_tokens"] == 6
    assert run.outcome is not None and run.outcome.by == "output_tokens"
    assert signed_as_sent(server.received[0])


@priced
def test_litellms_bedrock_call_whose_worst_case_does_not_fit_is_refused_whole_S3_10(
        server: Server, switch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # 4,096 output tokens at the model's price pass a thousandth of a cent: the cap cannot be
    # lowered in a signed body, so the call is refused before it is sent
    with pytest.raises(nb.BudgetExceeded) as refused, nb.budget(cost_usd=0.00001):
        litellm_converse(server, max_tokens=4096)
    assert refused.value.kind == "cost_usd"
    assert server.received == []
