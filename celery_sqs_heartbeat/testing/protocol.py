"""SQS's two wire protocols, and S3's, as far as the strict server must read and answer them.

botocore speaks JSON (``X-Amz-Target``) since 1.31 and the query protocol (a form with
``Action``) before; a fault must be answered in the protocol the client used, or the
client would see a parse error instead of the error a test meant. S3 calls (REST, told
apart by the service in their signature) are named ``s3:<Operation>`` so that no rule
meant for SQS's actions catches them by accident (see :mod:`.s3_protocol`).
"""

from __future__ import annotations

import io
import json
import re
import urllib.parse
import uuid
import xml.etree.ElementTree as ElementTree
from typing import TYPE_CHECKING, Any, NamedTuple

from .s3_protocol import identify_s3_call, s3_error

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

_QUERY_ENTRY_ID_KEY = re.compile(r"[^.]+\.(\d+)\.Id")
_QUERY_ENTRY_DELAY_KEY = re.compile(r"[^.]+\.(\d+)\.DelaySeconds")
#: The calls that send messages, whose ``DelaySeconds`` the call log keeps.
_SENDS = ("SendMessage", "SendMessageBatch")


class SQSCall(NamedTuple):
    action: str
    entries: int
    json_protocol: bool
    #: MaxNumberOfMessages of a ReceiveMessage (SQS's default, 1, when not given).
    asked: int | None = None
    #: An S3 call: its faults are answered in S3's XML.
    s3: bool = False
    #: A send's ``DelaySeconds``, one per message in entry order (0 where none was given).
    delays: tuple[int, ...] | None = None
    #: The queue's name, from the call's ``QueueUrl`` ("" for a call that names none).
    queue: str = ""
    #: A ReceiveMessage's ``WaitTimeSeconds`` (None: not given, the queue's own applies).
    wait: int | None = None


class ErrorReply(NamedTuple):
    status: str
    json_type: str
    query_code: str
    fault_type: str
    message: str
    query_compatible: bool
    """Whether a JSON answer carries ``x-amzn-query-error``, as SQS's answers do.

    botocore then reports the query protocol's code, so that e.g. ``AccessDenied`` means
    the same in both protocols. The throttle and server_error answers never had it, and
    keep their JSON codes for the tests that expect them.
    """


FAULT_REPLIES: dict[str, ErrorReply] = {
    "throttle": ErrorReply(
        "400 Bad Request",
        "com.amazonaws.sqs#ThrottlingException",
        "Throttling",
        "Sender",
        "Rate exceeded",
        query_compatible=False,
    ),
    "server_error": ErrorReply(
        "500 Internal Server Error",
        "com.amazonaws.sqs#InternalError",
        "InternalError",
        "Receiver",
        "We encountered an internal error. Please try again.",
        query_compatible=False,
    ),
    "access_denied": ErrorReply(
        "403 Forbidden",
        "com.amazon.coral.service#AccessDeniedException",
        "AccessDenied",
        "Sender",
        "Access to the resource is denied.",
        query_compatible=True,
    ),
    "invalid_credentials": ErrorReply(
        "403 Forbidden",
        "com.amazon.coral.service#UnrecognizedClientException",
        "InvalidClientTokenId",
        "Sender",
        "The security token included in the request is invalid.",
        query_compatible=True,
    ),
}
_GARBAGE_BODY = b"\xff\xfe\x00 not an SQS answer <"
_IAM_REFUSAL_JSON_TYPES = {
    "AccessDenied": "com.amazon.coral.service#AccessDeniedException",
    "InvalidClientTokenId": "com.amazon.coral.service#UnrecognizedClientException",
    "SignatureDoesNotMatch": "com.amazon.coral.service#InvalidSignatureException",
}


def buffer_body(environ: WSGIEnvironment) -> bytes:
    """Read the request body and put it back, so that moto can still read it."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return b""
    if length <= 0:
        return b""
    body: bytes = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def identify_call(environ: WSGIEnvironment) -> SQSCall | None:
    """Find the action of a JSON-protocol (X-Amz-Target) or query-protocol (Action) call."""
    s3_action = identify_s3_call(environ)
    if s3_action is not None:
        return SQSCall(s3_action, 0, False, s3=True)
    body = buffer_body(environ)
    target: str = environ.get("HTTP_X_AMZ_TARGET", "")
    if target.startswith("AmazonSQS."):
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        entries = payload.get("Entries")
        action = target.split(".", 1)[1]
        return SQSCall(
            action,
            len(entries) if isinstance(entries, list) else 0,
            True,
            _asked(action, payload.get("MaxNumberOfMessages")),
            delays=_json_delays(action, payload),
            queue=_queue_name(payload.get("QueueUrl")),
            wait=_waited(action, payload.get("WaitTimeSeconds")),
        )
    form = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        form.update(urllib.parse.parse_qs(body.decode("utf-8", "replace")))
    action = form.get("Action", [""])[0]
    if not action:
        return None
    entry_numbers = {m.group(1) for key in form if (m := _QUERY_ENTRY_ID_KEY.fullmatch(key))}
    asked = form.get("MaxNumberOfMessages", [None])[0]
    delays = _query_delays(action, form, entry_numbers)
    return SQSCall(
        action,
        len(entry_numbers),
        False,
        _asked(action, asked),
        delays=delays,
        queue=_queue_name(form.get("QueueUrl", [None])[0]),
        wait=_waited(action, form.get("WaitTimeSeconds", [None])[0]),
    )


def _json_delays(action: str, payload: dict[str, Any]) -> tuple[int, ...] | None:
    if action not in _SENDS:
        return None
    entries = payload.get("Entries") if action == "SendMessageBatch" else [payload]
    if not isinstance(entries, list):
        return ()
    return tuple(_whole(entry.get("DelaySeconds")) for entry in entries if isinstance(entry, dict))


def _query_delays(
    action: str, form: dict[str, list[str]], entry_numbers: set[str]
) -> tuple[int, ...] | None:
    if action == "SendMessage":
        return (_whole(form.get("DelaySeconds", [None])[0]),)
    if action != "SendMessageBatch":
        return None
    given = {
        m.group(1): values[0]
        for key, values in form.items()
        if (m := _QUERY_ENTRY_DELAY_KEY.fullmatch(key))
    }
    return tuple(_whole(given.get(number)) for number in sorted(entry_numbers, key=int))


def _whole(given: Any) -> int:
    try:
        return int(given) if given is not None else 0
    except (TypeError, ValueError):
        return 0


def _asked(action: str, given: Any) -> int | None:
    if action != "ReceiveMessage":
        return None
    try:
        return int(given) if given is not None else 1
    except (TypeError, ValueError):
        return None


def _waited(action: str, given: Any) -> int | None:
    if action != "ReceiveMessage" or given is None:
        return None
    try:
        return int(given)
    except (TypeError, ValueError):
        return None


def _queue_name(url: Any) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1] if isinstance(url, str) else ""


def returned_messages(body: bytes) -> int:
    """How many messages a ReceiveMessage answer (JSON or XML) carries."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body.count(b"<Message>")
    messages = payload.get("Messages") if isinstance(payload, dict) else None
    return len(messages) if isinstance(messages, list) else 0


def iam_refusal_reply(body: bytes) -> ErrorReply | None:
    """The JSON-protocol form of moto's XML answer to a call IAM refused, if it is one.

    moto answers a refusal in XML whatever the protocol, which botocore reads over JSON
    as error code "403": kombu's check for ``AccessDenied`` would miss it, and logs would
    not name the error. SQS answers it in JSON, with the query code.
    """
    try:
        error = ElementTree.fromstring(body).find(".//Error")
    except ElementTree.ParseError:
        return None
    if error is None:
        return None
    code = error.findtext("Code", "")
    if code not in _IAM_REFUSAL_JSON_TYPES:
        return None
    return ErrorReply(
        "403 Forbidden",
        _IAM_REFUSAL_JSON_TYPES[code],
        code,
        "Sender",
        error.findtext("Message", ""),
        query_compatible=True,
    )


def json_reply(start_response: StartResponse, status: str, payload: object) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def error_reply(start_response: StartResponse, call: SQSCall, reply: ErrorReply) -> list[bytes]:
    """An SQS error response in the protocol the client used."""
    request_id = str(uuid.uuid4())
    headers = [("x-amzn-RequestId", request_id)]
    if call.s3:
        status, body = s3_error(reply.status, reply.query_code, reply.message, request_id)
        return _raw_reply(start_response, status, "application/xml", body, headers)
    if call.json_protocol:
        content_type = "application/x-amz-json-1.0"
        body = json.dumps({"__type": reply.json_type, "message": reply.message}).encode()
        if reply.query_compatible:
            headers.append(("x-amzn-query-error", f"{reply.query_code};{reply.fault_type}"))
    else:
        content_type = "text/xml"
        body = (
            '<?xml version="1.0"?><ErrorResponse '
            'xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><Error>'
            f"<Type>{reply.fault_type}</Type><Code>{reply.query_code}</Code>"
            f"<Message>{reply.message}</Message></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>"
        ).encode()
    return _raw_reply(start_response, reply.status, content_type, body, headers)


def garbage_reply(start_response: StartResponse, call: SQSCall) -> list[bytes]:
    """A success status and content type for the protocol, with a body no parser accepts."""
    content_type = "application/x-amz-json-1.0" if call.json_protocol else "text/xml"
    headers = [("x-amzn-RequestId", str(uuid.uuid4()))]
    return _raw_reply(start_response, "200 OK", content_type, _GARBAGE_BODY, headers)


def _raw_reply(
    start_response: StartResponse,
    status: str,
    content_type: str,
    body: bytes,
    headers: list[tuple[str, str]],
) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers],
    )
    return [body]
