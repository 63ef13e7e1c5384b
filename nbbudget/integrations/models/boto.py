"""The process-wide switch (``everywhere``) on botocore, through which boto3's clients send:
Amazon Bedrock's ``Converse`` and ``ConverseStream`` (``bedrock_api``). Two methods are
replaced on their classes, so every client is reached, made before the switch or after it:

- ``Endpoint.create_request``, which botocore calls for each attempt of an API call (its own
  retries included) before the request is signed: a model call made in a run goes through the
  gate of ``clients`` there (`clients.Gate.admit`): its permits are taken, and a refusal
  raises ``bedrock_api.Refused`` with nothing sent (botocore passes it on, unretried); its
  output cap is clamped in the body botocore then signs, and its worst case reserved; its read
  timeout is lowered to the run's time left (botocore's per-call ``read_timeout``);
- ``URLLib3Session.send``, which sends each attempt: a whole reply's usage is charged as it
  comes (an error status gives the reservation back), and a stream's bytes are read through
  the stream meter of ``clients`` (whole messages of the event stream pass on, usage charged
  as it comes, the stream cut, its connection closed, where it passes a limit, S3-9; its
  socket shut at the run's deadline, S3-8). The attempt passes from one to the other in the
  call's request context, the dictionary botocore gives its handlers to share what they know.

A call outside every run, any other service's or operation's, and a call an adapter has
claimed (``claims``) go through both untouched. A call's attempt whose request never reaches
``send`` (a ``before-send`` handler that answers it, as botocore's ``Stubber`` does earlier)
keeps its permits: counted, never undercounted.

Not reached: aiobotocore's clients (their endpoint is their own), and Bedrock's
``InvokeModel``, whose body is each model family's own format.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import botocore
import botocore.exceptions
from botocore.awsrequest import AWSPreparedRequest
from urllib3.exceptions import HTTPError as _Urllib3Error

from ...core import preempt
from ...core.errors import ConfigError
from ...run.budget import current
from ..claims import claimed
from .clients import Attempt, Gate, Library, Meter, Read, Stream
from .shapes import request_content

__all__ = ["BOTOCORE", "FIRST", "OPERATIONS", "Botocore", "switched_create_request",
           "switched_send"]

#: the operations read as model calls, by botocore's service name
OPERATIONS = {"bedrock-runtime": ("Converse", "ConverseStream")}
#: the first botocore whose request carries its call's context to ``send`` (1.43.68)
FIRST = (1, 43, 68)
#: where the call's request context holds the attempt being sent
_KEY = "nbbudget_attempt"


class Botocore(Library):
    """botocore, as the gates of the switch know an HTTP library: what it raises (its own
    errors for a request that failed, urllib3's while a stream is read)."""

    def __init__(self, module: Any) -> None:
        errors = module.exceptions
        super().__init__(module, (ValueError,), (errors.HTTPClientError, _Urllib3Error, OSError),
                         (errors.EndpointConnectionError, errors.ConnectTimeoutError))


BOTOCORE = Botocore(botocore)


#: whether this botocore's prepared request carries its call's context (from `FIRST` on)
_CONTEXT_SENT = "context" in inspect.signature(AWSPreparedRequest).parameters


class _Asked:
    """A request's headers, as `claims.claimed` reads them (``headers.get``), lower-cased."""

    __slots__ = ("headers",)

    def __init__(self, headers: Any) -> None:
        self.headers = {str(k).lower(): v.decode() if isinstance(v, bytes) else v
                        for k, v in headers.items()}


def switched_create_request(original: Callable[..., Any],
                            gate_of: Callable[[str, str, Library], Gate | None]
                            ) -> Callable[..., Any]:
    """*original* (``Endpoint.create_request``), with each attempt of a model call made in a
    run admitted through its gate (*gate_of*: the switch's, by API family, base URL and
    library; None when the switch is off)."""

    @functools.wraps(original)
    def create_request(self: Any, params: Any, operation_model: Any = None) -> Any:
        run = current()
        if run is None or operation_model is None:
            return original(self, params, operation_model)
        operations = OPERATIONS.get(operation_model.service_model.service_name)
        if operations is None or operation_model.name not in operations:
            return original(self, params, operation_model)
        url, path = params.get("url"), params.get("url_path")
        at = url.find("/model/") if type(url) is str else -1
        gate = gate_of("bedrock", url[:at], BOTOCORE) if at >= 0 else None
        context = params.get("context")
        if gate is None or type(context) is not dict or claimed(
                _Asked(params.get("headers") or {}), run.lowlevel):
            return original(self, params, operation_model)
        if not _CONTEXT_SENT:
            raise ConfigError(
                f"botocore {botocore.__version__} does not pass a request's context to the "
                f"code that sends it, so nbbudget cannot meter this Bedrock "
                f"{operation_model.name} call in its run: upgrade it, pip install "
                f"'botocore>={'.'.join(map(str, FIRST))}' (or 'nbbudget[bedrock]')")
        body = params.get("body")
        if not isinstance(body, bytes):
            return original(self, params, operation_model)
        tries = context.get("retries")
        retry = type(tries) is dict and type(tries.get("attempt")) is int and tries["attempt"] > 1
        admitted = gate.admit(run, path or url[at:], body, params.get("headers") or {},
                              retry=retry, signed=False)  # botocore signs it afterwards
        if admitted is None:
            return original(self, params, operation_model)
        attempt, changed = admitted
        if changed is not None:  # signed as it is sent: botocore signs what this returns
            params = {**params, "body": request_content(changed)}
        configured = context.get("client_config")
        read_timeout = context.get("read_timeout") or getattr(configured, "read_timeout", None)
        if not read_timeout or read_timeout > attempt.bound:
            context["read_timeout"] = attempt.bound
        context[_KEY] = attempt
        try:
            return original(self, params, operation_model)
        except BaseException:
            context.pop(_KEY, None)
            attempt.release()  # never sent
            raise

    return create_request


def switched_send(original: Callable[..., Any]) -> Callable[..., Any]:
    """*original* (``URLLib3Session.send``), with an attempt `switched_create_request` admitted
    charged, and its stream metered."""

    @functools.wraps(original)
    def send(self: Any, request: Any) -> Any:
        context = getattr(request, "context", None)
        attempt = context.pop(_KEY, None) if type(context) is dict else None
        if attempt is None:
            return original(self, request)
        return _send(attempt, original, self, request)

    return send


def _send(attempt: Attempt, original: Callable[..., Any], session: Any, request: Any) -> Any:
    """Send *request*, *attempt*'s, with *original*; charge its reply or meter its stream."""
    try:
        response = original(session, request)
    except BOTOCORE.transport_error as err:  # a timeout, or a failed connection
        if isinstance(err, BOTOCORE.never_sent):
            attempt.release()  # never sent: nothing billed
        attempt.timed_out()
        raise
    status = response.status_code
    if status >= 400:
        attempt.release()  # an error status: the API bills nothing
        return response
    if attempt.stream:
        response.raw = _Raw(response.raw, Meter(attempt))
        return response
    attempt.answered(Read(status, response.content))
    return response


class _Raw(Stream):
    """A streamed reply's urllib3 response, read through its meter: ``stream()`` (botocore's
    event stream reads it so) hands on whole messages, charged (or cut: the connection is then
    closed, and ``Cut`` raises) as they come. Its other attributes are urllib3's."""

    def __init__(self, raw: Any, meter: Meter) -> None:
        connection = getattr(raw, "connection", None)
        super().__init__(raw.stream(), meter, None, getattr(connection, "sock", None))
        self.raw = raw

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        return iter(self)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.raw.close()

    def release_conn(self) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)  # status, headers, ...


# N-5: an attempt's send reads the run's deadline and stops itself (as ``clients.send``)
preempt.guard(_send.__code__)
