"""A local SQS server that enforces SQS's real lease rules, for testing the transport.

moto's SQS is more forgiving than AWS exactly where a visibility-heartbeat transport
can go wrong, so a transport tested against plain moto could pass while being broken
against AWS. This module runs moto in server mode behind a small WSGI middleware, in a
subprocess on 127.0.0.1, after patching moto's SQS backend (in that process only) so
that:

* ChangeMessageVisibility only accepts the *latest* receipt handle of a message; a
  handle from an earlier receive, or of a deleted message, fails with
  ``InvalidParameterValue`` (moto moves the current lease with any old handle, and
  answers ``ReceiptHandleIsInvalid`` for deleted messages).
* changing the visibility of a message whose lease already expired fails with
  ``AWS.SimpleQueueService.MessageNotInflight`` (moto silently hides it again);
* the new deadline may not be more than ``--max-hold-seconds`` (43200, i.e. 12 h, like
  SQS) after the receive that produced the handle (moto counts from the send);
* ChangeMessageVisibilityBatch reports every per-entry error in ``Failed`` and rejects
  empty, oversized and ambiguous batches as a whole (moto fails the whole request for
  most per-entry errors, and accepts any batch);
* VisibilityTimeout 0 makes the message visible at once and wakes waiting long polls.

Receive, change and delete of the same queue are serialised by the queue's own
lock, because moto's in-memory backend is not thread safe and the threaded server
would otherwise let two concurrent receives hand out the same message.

Extra HTTP endpoints under ``/_strict/`` (never called by boto3) count the SQS calls,
inject faults and expose a per-message event log; :class:`StrictSQSServer` wraps them.

Run it with ``python -m celery_sqs_heartbeat.testing.strict_sqs --port 0``; it prints
``STRICT_SQS_READY http://127.0.0.1:PORT`` once it serves, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from types import TracebackType

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from moto.sqs.models import Message, Queue, SQSBackend
    from werkzeug.serving import BaseWSGIServer

__all__ = [
    "DEFAULT_MAX_HOLD_SECONDS",
    "FAULT_KINDS",
    "Event",
    "FaultKind",
    "StrictSQSServer",
    "main",
]

DEFAULT_MAX_HOLD_SECONDS = 43200.0
"""SQS keeps a received message invisible for at most 12 hours after the receive."""

HOST = "127.0.0.1"
_MODULE = "celery_sqs_heartbeat.testing.strict_sqs"
READY_PREFIX = "STRICT_SQS_READY "
CONTROL_PREFIX = "/_strict/"
MAX_VISIBILITY_TIMEOUT = 43200
MAX_BATCH_ENTRIES = 10
LONG_POLL_INTERVAL = 0.1
"""How often a waiting long poll looks for messages whose lease expired."""
NOT_AVAILABLE_REASON = "Message does not exist or is not available for visibility timeout change."
MESSAGE_NOT_INFLIGHT = "AWS.SimpleQueueService.MessageNotInflight"
_BATCH_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_QUERY_ENTRY_ID_KEY = re.compile(r"[^.]+\.(\d+)\.Id")

FaultKind = Literal["throttle", "server_error", "drop_connection", "delay"]
FAULT_KINDS: tuple[FaultKind, ...] = ("throttle", "server_error", "drop_connection", "delay")
EventAction = Literal["receive", "change_visibility", "delete"]


class Event(TypedDict):
    """One per-message operation the server saw (``result`` is ``"ok"`` or an error code)."""

    t: float
    action: EventAction
    message_id: str | None
    queue: str
    visibility: int | None
    result: str


# --------------------------------------------------------------------------------------
# Server side: shared state, moto patches, WSGI middleware, launcher.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Receipt:
    """What the server knows about a receipt handle it issued."""

    queue: str
    message_id: str
    received_at: float


@dataclass
class _Fault:
    kind: FaultKind
    remaining: int
    seconds: float


class _Recorder:
    """Thread-safe state shared by the middleware and the patched backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._entries: Counter[str] = Counter()
        self._faults: dict[str, list[_Fault]] = {}
        self._events: list[Event] = []
        self._receipts: dict[str, _Receipt] = {}

    def count_call(self, action: str, entries: int) -> None:
        with self._lock:
            self._calls[action] += 1
            if entries:
                self._entries[action] += entries

    def calls(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"calls": dict(self._calls), "batch_entries": dict(self._entries)}

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._entries.clear()

    def add_fault(self, action: str, fault: _Fault) -> None:
        with self._lock:
            self._faults.setdefault(action, []).append(fault)

    def take_fault(self, action: str) -> _Fault | None:
        """Consume one occurrence of the oldest fault planned for ``action``."""
        with self._lock:
            planned = self._faults.get(action)
            if not planned:
                return None
            fault = planned[0]
            fault.remaining -= 1
            if fault.remaining == 0:
                planned.pop(0)
            return fault

    def pending_faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"action": action, "kind": f.kind, "count": f.remaining, "seconds": f.seconds}
                for action, planned in self._faults.items()
                for f in planned
            ]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def remember_receipt(self, handle: str, receipt: _Receipt) -> None:
        with self._lock:
            self._receipts[handle] = receipt

    def receipt(self, handle: str) -> _Receipt | None:
        with self._lock:
            return self._receipts.get(handle)

    def log_event(
        self,
        action: EventAction,
        queue_name: str,
        handle: str,
        visibility: int | None,
        result: str,
    ) -> None:
        with self._lock:
            receipt = self._receipts.get(handle)
            self._events.append(
                Event(
                    t=time.time(),
                    action=action,
                    message_id=receipt.message_id if receipt else None,
                    queue=queue_name,
                    visibility=visibility,
                    result=result,
                )
            )

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def clear_events(self) -> None:
        with self._lock:
            self._events.clear()


def _install_strict_rules(recorder: _Recorder, max_hold_seconds: float) -> None:
    """Patch moto's ``SQSBackend`` in this process so that it enforces SQS's lease rules.

    Only the server process calls this; the patches change moto globally.
    """
    from moto.sqs.exceptions import (
        BatchEntryIdsNotDistinct,
        InvalidBatchEntryId,
        InvalidParameterValue,
        ReceiptHandleIsInvalid,
        SQSException,
        TooManyEntriesInBatchRequest,
    )
    from moto.sqs.models import SQSBackend

    original_receive = SQSBackend.receive_message
    original_delete = SQSBackend.delete_message

    def receive_message(
        backend: SQSBackend,
        queue_name: str,
        count: int,
        wait_seconds_timeout: int,
        visibility_timeout: int,
        message_attribute_names: list[str] | None = None,
    ) -> list[Message]:
        """moto's receive under the queue lock, remembering when each handle was issued.

        The 12-hour limit counts from the receive, which moto does not record. The long
        poll is done here rather than by moto: moto's own loop spins without sleeping
        while a FIFO group is busy, which under the lock would block that group's
        delete. Waiting on the queue's Condition frees the lock; sends and releases
        wake the poll at once, and lease expiries are seen within a poll interval.
        """
        queue_ = backend.get_queue(queue_name)
        deadline = time.monotonic() + wait_seconds_timeout
        with queue_._messages_lock:
            while True:
                messages: list[Message] = original_receive(
                    backend, queue_name, count, 0, visibility_timeout, message_attribute_names
                )
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0:
                    break
                queue_._messages_lock.wait(min(remaining, LONG_POLL_INTERVAL))
            now = time.time()
            for message in messages:
                handle = message.receipt_handle or ""
                recorder.remember_receipt(handle, _Receipt(queue_name, message.id, now))
                recorder.log_event("receive", queue_name, handle, visibility_timeout, "ok")
        return messages

    def change_lease(queue_: Queue, handle: str, visibility_timeout: int) -> None:
        if not 0 <= visibility_timeout <= MAX_VISIBILITY_TIMEOUT:
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                f"Reason: Must be between 0 and {MAX_VISIBILITY_TIMEOUT}."
            )
        receipt = recorder.receipt(handle)
        if receipt is None:
            raise ReceiptHandleIsInvalid()
        # SQS accepts only the handle of the latest receive; moto accepts any old one.
        message = next((m for m in queue_._messages if m.receipt_handle == handle), None)
        if message is None:
            raise InvalidParameterValue(
                f"Value {handle} for parameter ReceiptHandle is invalid. "
                f"Reason: {NOT_AVAILABLE_REASON}"
            )
        if message.visible:
            raise SQSException(MESSAGE_NOT_INFLIGHT, "The specified message isn't in flight.")
        if time.time() + visibility_timeout > receipt.received_at + max_hold_seconds:
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                "Reason: Total VisibilityTimeout for the message is beyond the limit "
                f"[{max_hold_seconds:g} seconds]"
            )
        if visibility_timeout:
            message.change_visibility(visibility_timeout)
            return
        # moto's `visible` needs now > visible_at, which a coarse clock may not give yet.
        message.visible_at = 0.0
        queue_.pending_messages.discard(message)
        queue_._messages_lock.notify_all()

    def change_message_visibility(
        backend: SQSBackend, queue_name: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        """Change a lease only if ``receipt_handle`` is the current lease of an in-flight message.

        moto finds the message by any handle it ever had, re-hides messages whose lease
        expired, counts the 12-hour limit from the send, and lets long polls sleep on
        through a release; SQS does none of that (see the module docstring).
        """
        queue_ = backend.get_queue(queue_name)
        with queue_._messages_lock:
            try:
                change_lease(queue_, receipt_handle, int(visibility_timeout))
            except SQSException as err:
                recorder.log_event(
                    "change_visibility", queue_name, receipt_handle, visibility_timeout, err.code
                )
                raise
            recorder.log_event(
                "change_visibility", queue_name, receipt_handle, visibility_timeout, "ok"
            )

    def change_message_visibility_batch(
        backend: SQSBackend, queue_name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Apply each entry on its own and report each error in ``Failed``, like SQS.

        moto turns only ReceiptHandleIsInvalid into a per-entry failure, so e.g. the
        12-hour limit on one entry failed the whole request; and it accepted empty,
        oversized and duplicate-Id batches, which SQS rejects as a whole.
        """
        if not entries:
            raise SQSException(
                "AWS.SimpleQueueService.EmptyBatchRequest",
                "There should be at least one ChangeMessageVisibilityBatchRequestEntry "
                "in the request.",
            )
        if len(entries) > MAX_BATCH_ENTRIES:
            raise TooManyEntriesInBatchRequest(len(entries))
        seen: set[str] = set()
        for entry in entries:
            entry_id = entry.get("Id")
            if not isinstance(entry_id, str) or not _BATCH_ENTRY_ID.fullmatch(entry_id):
                raise InvalidBatchEntryId()
            if entry_id in seen:
                raise BatchEntryIdsNotDistinct(entry_id)
            seen.add(entry_id)

        successful: list[str] = []
        failed: list[dict[str, Any]] = []
        for entry in entries:
            try:
                visibility_timeout = int(entry["VisibilityTimeout"])
            except (KeyError, TypeError, ValueError):
                failed.append(
                    _failed_entry(
                        entry["Id"],
                        "InvalidParameterValue",
                        f"Value {entry.get('VisibilityTimeout')} for parameter "
                        "VisibilityTimeout is invalid.",
                    )
                )
                continue
            try:
                backend.change_message_visibility(
                    queue_name, entry.get("ReceiptHandle", ""), visibility_timeout
                )
            except SQSException as err:
                failed.append(_failed_entry(entry["Id"], err.code, err.message))
            else:
                successful.append(entry["Id"])
        return successful, failed

    def delete_message(backend: SQSBackend, queue_name: str, receipt_handle: str) -> None:
        """moto's delete (stale handles are accepted, as before), serialised and logged."""
        queue_ = backend.get_queue(queue_name)
        with queue_._messages_lock:
            try:
                original_delete(backend, queue_name, receipt_handle)
            except SQSException as err:
                recorder.log_event("delete", queue_name, receipt_handle, None, err.code)
                raise
            recorder.log_event("delete", queue_name, receipt_handle, None, "ok")

    patches: dict[str, Callable[..., Any]] = {
        "receive_message": receive_message,
        "change_message_visibility": change_message_visibility,
        "change_message_visibility_batch": change_message_visibility_batch,
        "delete_message": delete_message,
    }
    for name, function in patches.items():
        setattr(SQSBackend, name, function)


def _failed_entry(entry_id: str, code: str, message: str) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": True, "Code": code, "Message": message}


class _SQSCall(NamedTuple):
    action: str
    entries: int
    json_protocol: bool


class _ErrorReply(NamedTuple):
    status: str
    json_code: str
    query_code: str
    fault_type: str
    message: str


_FAULT_REPLIES: dict[str, _ErrorReply] = {
    "throttle": _ErrorReply(
        "400 Bad Request", "ThrottlingException", "Throttling", "Sender", "Rate exceeded"
    ),
    "server_error": _ErrorReply(
        "500 Internal Server Error",
        "InternalError",
        "InternalError",
        "Receiver",
        "We encountered an internal error. Please try again.",
    ),
}


def _buffer_body(environ: WSGIEnvironment) -> bytes:
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


def _identify_call(environ: WSGIEnvironment) -> _SQSCall | None:
    """Find the action of a JSON-protocol (X-Amz-Target) or query-protocol (Action) call."""
    body = _buffer_body(environ)
    target: str = environ.get("HTTP_X_AMZ_TARGET", "")
    if target.startswith("AmazonSQS."):
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
        entries = payload.get("Entries") if isinstance(payload, dict) else None
        return _SQSCall(
            target.split(".", 1)[1], len(entries) if isinstance(entries, list) else 0, True
        )
    form = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        form.update(urllib.parse.parse_qs(body.decode("utf-8", "replace")))
    action = form.get("Action", [""])[0]
    if not action:
        return None
    entry_numbers = {m.group(1) for key in form if (m := _QUERY_ENTRY_ID_KEY.fullmatch(key))}
    return _SQSCall(action, len(entry_numbers), False)


def _json_reply(start_response: StartResponse, status: str, payload: object) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _error_reply(start_response: StartResponse, call: _SQSCall, reply: _ErrorReply) -> list[bytes]:
    """An SQS error response in the protocol the client used."""
    request_id = str(uuid.uuid4())
    if call.json_protocol:
        content_type = "application/x-amz-json-1.0"
        body = json.dumps(
            {"__type": f"com.amazonaws.sqs#{reply.json_code}", "message": reply.message}
        ).encode()
    else:
        content_type = "text/xml"
        body = (
            '<?xml version="1.0"?><ErrorResponse '
            'xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><Error>'
            f"<Type>{reply.fault_type}</Type><Code>{reply.query_code}</Code>"
            f"<Message>{reply.message}</Message></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>"
        ).encode()
    start_response(
        reply.status,
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("x-amzn-RequestId", request_id),
        ],
    )
    return [body]


def _parse_fault(payload: object) -> tuple[str, _Fault]:
    if not isinstance(payload, dict):
        raise ValueError("expected a JSON object")
    action = payload.get("action")
    kind = payload.get("kind")
    count = payload.get("count", 1)
    seconds = payload.get("seconds", 0)
    if not isinstance(action, str) or not action:
        raise ValueError("'action' must be an SQS action name, e.g. ChangeMessageVisibility")
    if kind not in FAULT_KINDS:
        raise ValueError(f"'kind' must be one of {', '.join(FAULT_KINDS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("'count' must be a positive integer")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError("'seconds' must be a non-negative number")
    if kind == "delay" and seconds <= 0:
        raise ValueError("a 'delay' fault needs 'seconds' > 0")
    return action, _Fault(kind, count, float(seconds))


class _StrictApp:
    """WSGI middleware in front of moto: ``/_strict/`` control endpoints, call counts, faults."""

    def __init__(self, moto_app: WSGIApplication, recorder: _Recorder) -> None:
        self._moto_app = moto_app
        self._recorder = recorder
        self._routes: dict[tuple[str, str], Callable[[bytes], object]] = {
            ("GET", "calls"): lambda _: recorder.calls(),
            ("POST", "calls/reset"): lambda _: recorder.reset_calls(),
            ("GET", "events"): lambda _: recorder.events(),
            ("DELETE", "events"): lambda _: recorder.clear_events(),
            ("GET", "faults"): lambda _: recorder.pending_faults(),
            ("POST", "faults"): self._add_fault,
            ("DELETE", "faults"): lambda _: recorder.clear_faults(),
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PREFIX):
            return self._control(environ, start_response, path[len(CONTROL_PREFIX) :])
        call = _identify_call(environ)
        if call is None:
            return self._moto_app(environ, start_response)
        self._recorder.count_call(call.action, call.entries)
        fault = self._recorder.take_fault(call.action)
        if fault is None:
            return self._moto_app(environ, start_response)
        if fault.kind == "delay":
            time.sleep(fault.seconds)
            return self._moto_app(environ, start_response)
        if fault.kind == "drop_connection":
            # Werkzeug treats ConnectionError as "client went away" and sends nothing.
            environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
            raise ConnectionAbortedError(f"injected drop_connection for {call.action}")
        return _error_reply(start_response, call, _FAULT_REPLIES[fault.kind])

    def _control(
        self, environ: WSGIEnvironment, start_response: StartResponse, route: str
    ) -> list[bytes]:
        handler = self._routes.get((environ.get("REQUEST_METHOD", ""), route.rstrip("/")))
        if handler is None:
            return _json_reply(start_response, "404 Not Found", {"error": f"no route {route}"})
        try:
            result = handler(_buffer_body(environ))
        except ValueError as err:
            return _json_reply(start_response, "400 Bad Request", {"error": str(err)})
        return _json_reply(start_response, "200 OK", {} if result is None else result)

    def _add_fault(self, body: bytes) -> None:
        action, fault = _parse_fault(json.loads(body or b"null"))
        self._recorder.add_fault(action, fault)


def _build_server(port: int, max_hold_seconds: float) -> BaseWSGIServer:
    """Patch moto and bind a threaded WSGI server (long polls must not block each other)."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    recorder = _Recorder()
    _install_strict_rules(recorder, max_hold_seconds)
    app = _StrictApp(DomainDispatcherApplication(create_backend_app), recorder)
    return make_server(HOST, port, app, threaded=True, request_handler=MotoRequestHandler)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m celery_sqs_heartbeat.testing.strict_sqs",
        description="moto's SQS with SQS's real visibility-timeout rules enforced.",
    )
    parser.add_argument("--host", default=HOST, help=f"must be {HOST} (the default)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument(
        "--max-hold-seconds",
        type=float,
        default=DEFAULT_MAX_HOLD_SECONDS,
        help="how long after a receive a message may be kept invisible (default: 43200)",
    )
    parser.add_argument(
        "--stop-at-stdin-eof",
        action="store_true",
        help="stop when stdin closes, e.g. because the process that started the server died",
    )
    args = parser.parse_args(argv)
    if args.host != HOST:
        parser.error(f"refusing to bind {args.host!r}: the test bed only listens on {HOST}")
    if args.max_hold_seconds <= 0:
        parser.error("--max-hold-seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    args = _parse_args(argv)
    # One log line per request would flood the log of a long test session.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = _build_server(args.port, args.max_hold_seconds)
    # serve_forever() closes the server on KeyboardInterrupt, so treat SIGTERM alike.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.stop_at_stdin_eof:
        threading.Thread(target=_stop_at_stdin_eof, args=(server,), daemon=True).start()
    print(f"{READY_PREFIX}http://{HOST}:{server.port}", flush=True)
    server.serve_forever()


def _stop_at_stdin_eof(server: BaseWSGIServer) -> None:
    """Stop serving once stdin is closed, so a killed test run leaves no server behind.

    os.read, not sys.stdin: a daemon thread blocked inside the buffered reader holds
    its lock, and the interpreter aborts when it cannot take that lock at exit.
    """
    while os.read(sys.stdin.fileno(), 4096):
        pass
    server.shutdown()


# --------------------------------------------------------------------------------------
# Client side: start the server in a subprocess and talk to its control endpoints.
# --------------------------------------------------------------------------------------


def _pump_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Forward the server's stdout, and keep draining it so the server never blocks."""
    for line in stream:
        lines.put(line)


class StrictSQSServer:
    """A strict SQS server in a subprocess, and the client of its control endpoints.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The server
    accepts any credentials; :attr:`boto3_kwargs` has the ones the tests use.
    """

    REGION = "us-east-1"
    ACCESS_KEY = "testing"

    def __init__(
        self,
        *,
        max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS,
        startup_timeout: float = 30.0,
    ) -> None:
        self.max_hold_seconds = max_hold_seconds
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._port: int | None = None
        # The server only talks to 127.0.0.1, so never go through a configured proxy.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __enter__(self) -> StrictSQSServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> StrictSQSServer:
        """Start the subprocess and wait until it answers; its stderr is inherited.

        The server also stops by itself when this process dies (its stdin closes).
        """
        if self._proc is not None:
            raise RuntimeError("the strict SQS server is already running")
        command = [
            sys.executable,
            "-m",
            _MODULE,
            "--host",
            HOST,
            "--port",
            "0",
            "--max-hold-seconds",
            repr(self.max_hold_seconds),
            "--stop-at-stdin-eof",
        ]
        # Let the child import this very copy of the package, installed or not.
        source_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": python_path},
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self._proc.stdout is not None  # stdout=PIPE
        threading.Thread(target=_pump_lines, args=(self._proc.stdout, lines), daemon=True).start()
        try:
            deadline = time.monotonic() + self.startup_timeout
            self._port = self._wait_ready(lines, deadline)
            self._wait_answers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, lines: queue.Queue[str], deadline: float) -> int:
        assert self._proc is not None
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"strict SQS server exited with {self._proc.returncode} before it "
                        "was ready; see its stderr"
                    ) from None
                continue
            if line.startswith(READY_PREFIX):
                return int(line.strip().rsplit(":", 1)[1])
        raise TimeoutError(f"strict SQS server not ready after {self.startup_timeout} s")

    def _wait_answers(self, deadline: float) -> None:
        while True:
            try:
                self.calls()
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server, killing it if it does not exit within 5 s."""
        proc, self._proc, self._port = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the strict SQS server is not running")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def broker_url(self) -> str:
        """A kombu/Celery broker URL (kombu derives ``http://`` unless ``is_secure`` is set)."""
        return f"sqs://{self.ACCESS_KEY}:{self.ACCESS_KEY}@{HOST}:{self.port}"

    @property
    def boto3_kwargs(self) -> dict[str, str]:
        """Keyword arguments for ``boto3.client("sqs", ...)`` talking to this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.REGION,
            "aws_access_key_id": self.ACCESS_KEY,
            "aws_secret_access_key": self.ACCESS_KEY,
        }

    def calls(self) -> dict[str, int]:
        """How many calls of each SQS action arrived (faulted ones included)."""
        counts: dict[str, int] = self._control("GET", "calls")["calls"]
        return counts

    def batch_entries(self) -> dict[str, int]:
        """How many batch entries arrived, per batch action."""
        entries: dict[str, int] = self._control("GET", "calls")["batch_entries"]
        return entries

    def reset_calls(self) -> None:
        self._control("POST", "calls/reset")

    def inject_fault(
        self, action: str, kind: FaultKind, count: int = 1, seconds: float = 0.0
    ) -> None:
        """Make the next ``count`` calls of ``action`` fail as ``kind``.

        throttle: HTTP 400 ``ThrottlingException`` (query protocol: ``Throttling``);
        server_error: HTTP 500 ``InternalError``; drop_connection: the socket is closed
        without a response; delay: the call is served after ``seconds``. Faults for the
        same action queue up in order. Raises ValueError if the server rejects them.
        """
        self._control(
            "POST", "faults", {"action": action, "kind": kind, "count": count, "seconds": seconds}
        )

    def pending_faults(self) -> list[dict[str, Any]]:
        """Faults not yet consumed, with their remaining counts."""
        pending: list[dict[str, Any]] = self._control("GET", "faults")
        return pending

    def clear_faults(self) -> None:
        self._control("DELETE", "faults")

    def events(self) -> list[Event]:
        """Every receive, visibility change and delete the server saw, oldest first."""
        events: list[Event] = self._control("GET", "events")
        return events

    def clear_events(self) -> None:
        self._control("DELETE", "events")

    def _control(self, method: str, route: str, payload: object = None) -> Any:
        request = urllib.request.Request(
            f"{self.endpoint_url}{CONTROL_PREFIX}{route}",
            data=None if payload is None else json.dumps(payload).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 400:
                raise ValueError(json.loads(err.read())["error"]) from None
            raise


if __name__ == "__main__":
    main()
