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
* VisibilityTimeout 0 makes the message visible at once and wakes waiting long polls;
* DeleteMessage, and each entry of DeleteMessageBatch, only deletes with the *latest*
  receipt handle. A handle from an earlier receive answers success but leaves the
  message in the queue, as SQS may ("the request succeeds, but the message might not be
  deleted"); the event log records it as ``"stale"``. moto deletes with any handle the
  message ever had. A handle of a deleted message still succeeds (SQS deletes are
  idempotent), and one the server never issued still fails with
  ``ReceiptHandleIsInvalid``.

Receive, change and delete of the same queue are serialised by the queue's own
lock, because moto's in-memory backend is not thread safe and the threaded server
would otherwise let two concurrent receives hand out the same message.

Extra HTTP endpoints under ``/_strict/`` (never called by boto3) count the SQS calls,
inject faults and expose a per-message event log; :class:`StrictSQSServer` wraps them.
Faults come in four shapes, so that scenarios can simulate both blips and outages:

* ``inject_fault``: the next N calls of one action fail (or are delayed);
* ``outage``: every call of some or all actions fails for N seconds of the server's
  monotonic clock (``end_outages`` ends them early);
* ``fail_fraction``: each call of some or all actions fails with probability p, from an
  optionally seeded generator so that a run can be repeated;
* ``add_latency``: every call of some or all actions is answered that much later. The
  wait happens in the request's own thread, so concurrent calls are not serialised;
* ``fail_entries``: the next entries of DeleteMessageBatch or ChangeMessageVisibilityBatch
  calls fail one by one with an error code, the rest of each call going through.

The kinds of failure are listed at :data:`FAULT_KINDS`. ``clear_faults`` removes them
all and ``pending_faults`` lists them. A faulted call is counted by ``calls`` but never
reaches moto, so it leaves nothing in the event log.

``enforce_iam`` turns on moto's IAM enforcement, so that an IAM policy can be tested
before it meets AWS. Two of moto's authorisation rules differ from AWS's in ways that
matter to an SQS consumer, and are fixed here: a batch call (e.g.
ChangeMessageVisibilityBatch) is authorised as its single action, since IAM has no
actions of its own for batches, and CreateQueue and GetQueueUrl are authorised on the ARN
of the queue they name (moto checks them against "*"). Every call the enforcement refuses
is kept, for ``refused_calls``.

Run it with ``python -m celery_sqs_heartbeat.testing.strict_sqs --port 0``; it prints
``STRICT_SQS_READY http://127.0.0.1:PORT`` once it serves, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import queue
import random
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
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from types import TracebackType

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from moto.sqs.models import Message, Queue, SQSBackend
    from werkzeug.serving import BaseWSGIServer

__all__ = [
    "DEFAULT_MAX_HOLD_SECONDS",
    "FAULT_KINDS",
    "Call",
    "Event",
    "FaultKind",
    "Refusal",
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
#: The batch actions whose entries :meth:`StrictSQSServer.fail_entries` can fail.
_BATCH_ACTIONS_WITH_ENTRY_FAULTS = ("DeleteMessageBatch", "ChangeMessageVisibilityBatch")
#: Per-entry codes that are SQS's fault, not the sender's.
_SERVER_ENTRY_CODES = frozenset({"InternalError", "ServiceUnavailable"})
_BATCH_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_QUERY_ENTRY_ID_KEY = re.compile(r"[^.]+\.(\d+)\.Id")

FaultKind = Literal[
    "throttle",
    "server_error",
    "drop_connection",
    "delay",
    "access_denied",
    "invalid_credentials",
    "garbage",
    "timeout",
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "throttle",
    "server_error",
    "drop_connection",
    "delay",
    "access_denied",
    "invalid_credentials",
    "garbage",
    "timeout",
)
"""How a faulted call is answered; ``seconds`` is the fault's own duration (the
``seconds`` of ``inject_fault``, the ``fault_seconds`` of an outage or a fraction).

throttle: HTTP 400 ``ThrottlingException`` (query protocol: ``Throttling``).
server_error: HTTP 500 ``InternalError``.
drop_connection: the socket is closed without an answer.
delay: the call is served normally, ``seconds`` late.
access_denied: HTTP 403 ``AccessDenied``, as SQS answers an IAM denial.
invalid_credentials: HTTP 403 ``InvalidClientTokenId``, as for an unknown access key.
garbage: HTTP 200 with a body that is neither JSON nor XML, nor even UTF-8, because
botocore reads JSON text it cannot parse as an empty answer. botocore then raises
``UnicodeDecodeError`` (JSON protocol) or ``ResponseParserError`` (query protocol); over
JSON it never reads the body of an answer without fields (e.g. DeleteMessage), so there
the fault looks like success, as it would on the wire.
timeout: the call is held ``seconds`` and then dropped without an answer, which a
client whose read timeout is shorter sees as a read timeout.

None of them reaches moto, except delay.
"""
EventAction = Literal["receive", "change_visibility", "delete"]

_IAM_ACTIONS = {
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    "DeleteMessageBatch": "DeleteMessage",
    "SendMessageBatch": "SendMessage",
}
"""The IAM action that authorises each SQS batch call: IAM has none of its own for them."""
_ACTIONS_ON_A_NAMED_QUEUE = frozenset({"CreateQueue", "GetQueueUrl"})


class Event(TypedDict):
    """One per-message operation the server saw.

    ``result`` is ``"ok"``, an error code, or ``"stale"`` for a delete with a receipt
    handle from an earlier receive, which SQS answers with success without deleting.
    """

    t: float
    action: EventAction
    message_id: str | None
    queue: str
    visibility: int | None
    result: str


class Call(TypedDict):
    """One SQS call, as the server saw it: when it arrived and when it was answered.

    ``entries`` counts the entries of a batch call; for ReceiveMessage, ``asked`` is its
    MaxNumberOfMessages and ``returned`` how many messages the answer carried. Latency
    and faults are inside the ``arrived``..``answered`` span, as a client sees them.
    """

    action: str
    arrived: float
    answered: float
    entries: int
    asked: int | None
    returned: int | None


class Refusal(TypedDict):
    """A call that IAM enforcement refused before the service saw it.

    ``code`` is ``AccessDenied`` (no policy allows it), ``InvalidClientTokenId`` (an
    unknown access key) or ``SignatureDoesNotMatch`` (a wrong secret key). ``action`` is
    the API call as sent, e.g. ``ChangeMessageVisibilityBatch``; an AccessDenied
    ``message`` names the user and the IAM action that was checked.
    """

    t: float
    service: str
    action: str
    access_key_id: str
    code: str
    message: str


# --------------------------------------------------------------------------------------
# Server side: shared state, moto patches, WSGI middleware, launcher.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Receipt:
    """What the server knows about a receipt handle it issued."""

    queue: str
    message_id: str
    received_at: float


class _Failure(NamedTuple):
    kind: FaultKind
    seconds: float


@dataclass
class _CountedFault:
    failure: _Failure
    remaining: int


@dataclass(frozen=True)
class _Outage:
    actions: frozenset[str] | None
    failure: _Failure
    until: float
    """Monotonic, so that a step of the wall clock neither ends nor stretches an outage."""


@dataclass(frozen=True)
class _FailureFraction:
    actions: frozenset[str] | None
    failure: _Failure
    probability: float
    seed: int | None
    rng: random.Random


@dataclass(frozen=True)
class _Latency:
    actions: frozenset[str] | None
    seconds: float


def _applies(actions: frozenset[str] | None, action: str) -> bool:
    """``None`` stands for every SQS action, so that an outage needs no list of them."""
    return actions is None or action in actions


def _describe_actions(actions: frozenset[str] | None) -> list[str] | None:
    return None if actions is None else sorted(actions)


class _Recorder:
    """Thread-safe state shared by the middleware and the patched backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._entries: Counter[str] = Counter()
        self._faults: dict[str, list[_CountedFault]] = {}
        #: Per-entry failures of batch actions: ``[code, entries left]`` in order.
        self._entry_faults: dict[str, list[list[Any]]] = {}
        self._outages: list[_Outage] = []
        self._fractions: list[_FailureFraction] = []
        self._latencies: list[_Latency] = []
        self._events: list[Event] = []
        self._receipts: dict[str, _Receipt] = {}
        self._refusals: list[Refusal] = []
        self._call_log: list[Call] = []

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
            self._call_log.clear()

    def log_call(self, call: Call) -> None:
        with self._lock:
            self._call_log.append(call)

    def call_log(self) -> list[Call]:
        with self._lock:
            return list(self._call_log)

    def add_fault(self, action: str, fault: _CountedFault) -> None:
        with self._lock:
            self._faults.setdefault(action, []).append(fault)

    def add_entry_fault(self, action: str, code: str, count: int) -> None:
        with self._lock:
            self._entry_faults.setdefault(action, []).append([code, count])

    def take_entry_fault(self, action: str) -> str | None:
        """The error code the next entry of a batch call of ``action`` fails with, if any."""
        with self._lock:
            planned = self._entry_faults.get(action)
            if not planned:
                return None
            code: str = planned[0][0]
            planned[0][1] -= 1
            if planned[0][1] == 0:
                planned.pop(0)
            return code

    def add_outage(self, outage: _Outage) -> None:
        with self._lock:
            self._outages.append(outage)

    def end_outages(self) -> None:
        with self._lock:
            self._outages.clear()

    def add_fraction(self, fraction: _FailureFraction) -> None:
        with self._lock:
            self._fractions.append(fraction)

    def add_latency(self, latency: _Latency) -> None:
        with self._lock:
            self._latencies.append(latency)

    def latency(self, action: str) -> float:
        """The extra delay of a call of ``action``: the sum of every latency that applies."""
        with self._lock:
            return sum(lat.seconds for lat in self._latencies if _applies(lat.actions, action))

    def take_fault(self, action: str) -> _Failure | None:
        """How a call of ``action`` that arrives now fails, if it does.

        A fault planned for the next calls comes first, so that it hits exactly the calls
        a test meant; then an outage; the fractions draw last, so that their generators
        only advance for calls that nothing else failed.
        """
        with self._lock:
            planned = self._faults.get(action)
            if planned:
                fault = planned[0]
                fault.remaining -= 1
                if fault.remaining == 0:
                    planned.pop(0)
                return fault.failure
            self._drop_ended_outages()
            for outage in self._outages:
                if _applies(outage.actions, action):
                    return outage.failure
            for fraction in self._fractions:
                if _applies(fraction.actions, action) and (
                    fraction.rng.random() < fraction.probability
                ):
                    return fraction.failure
            return None

    def _drop_ended_outages(self) -> None:
        now = time.monotonic()
        self._outages = [outage for outage in self._outages if outage.until > now]

    def pending_faults(self) -> list[dict[str, Any]]:
        with self._lock:
            self._drop_ended_outages()
            now = time.monotonic()
            return [
                *(
                    {
                        "type": "count",
                        "action": action,
                        "kind": f.failure.kind,
                        "count": f.remaining,
                        "seconds": f.failure.seconds,
                    }
                    for action, planned in self._faults.items()
                    for f in planned
                ),
                *(
                    {"type": "entries", "action": action, "code": code, "count": left}
                    for action, planned in self._entry_faults.items()
                    for code, left in planned
                ),
                *(
                    {
                        "type": "outage",
                        "actions": _describe_actions(o.actions),
                        "kind": o.failure.kind,
                        "fault_seconds": o.failure.seconds,
                        "remaining_seconds": o.until - now,
                    }
                    for o in self._outages
                ),
                *(
                    {
                        "type": "fraction",
                        "actions": _describe_actions(f.actions),
                        "kind": f.failure.kind,
                        "fault_seconds": f.failure.seconds,
                        "probability": f.probability,
                        "seed": f.seed,
                    }
                    for f in self._fractions
                ),
                *(
                    {
                        "type": "latency",
                        "actions": _describe_actions(lat.actions),
                        "seconds": lat.seconds,
                    }
                    for lat in self._latencies
                ),
            ]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._entry_faults.clear()
            self._outages.clear()
            self._fractions.clear()
            self._latencies.clear()

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

    def record_refusal(self, refusal: Refusal) -> None:
        with self._lock:
            self._refusals.append(refusal)

    def refusals(self) -> list[Refusal]:
        with self._lock:
            return list(self._refusals)


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
                _forget_lapsed_receives(queue_)
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
            code = recorder.take_entry_fault("ChangeMessageVisibilityBatch")
            if code is not None:
                failed.append(_entry_fault(entry["Id"], code))
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

    def is_stale(queue_: Queue, handle: str) -> bool:
        """Whether ``handle`` is an earlier receive's handle of a message still queued."""
        if handle in queue_.deleted_messages:
            return False  # the message is gone, whichever of its handles this was
        return any(
            m.receipt_handle != handle and m.had_receipt_handle(handle) for m in queue_._messages
        )

    def delete_message(backend: SQSBackend, queue_name: str, receipt_handle: str) -> None:
        """Delete only with the latest receipt handle; a stale one succeeds and deletes nothing.

        SQS wants "the most recently received receipt handle" and otherwise answers
        success but may keep the message, which then runs again; moto deletes with any
        handle the message ever had. Handles of deleted messages and handles never issued
        behave as in moto (success, and ``ReceiptHandleIsInvalid``), as in SQS.
        """
        queue_ = backend.get_queue(queue_name)
        with queue_._messages_lock:
            if is_stale(queue_, receipt_handle):
                recorder.log_event("delete", queue_name, receipt_handle, None, "stale")
                return
            try:
                original_delete(backend, queue_name, receipt_handle)
            except SQSException as err:
                recorder.log_event("delete", queue_name, receipt_handle, None, err.code)
                raise
            recorder.log_event("delete", queue_name, receipt_handle, None, "ok")

    def delete_message_batch(
        backend: SQSBackend, queue_name: str, entries: list[dict[str, Any]]
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """Apply :func:`delete_message` to each entry and report each error in ``Failed``.

        A stale entry is in ``Successful``, as in SQS. moto's own batch also calls
        ``delete_message`` per entry, but only turns ReceiptHandleIsInvalid into a failed
        entry; doing it here keeps the rule from depending on that detail of moto.
        """
        backend.get_queue(queue_name)  # an unknown queue fails the whole request
        successful: list[str] = []
        failed: list[dict[str, Any]] = []
        for entry in entries:
            handle = entry.get("ReceiptHandle", "")
            code = recorder.take_entry_fault("DeleteMessageBatch")
            if code is not None:
                failed.append(_entry_fault(entry["Id"], code))
                continue
            try:
                backend.delete_message(queue_name, handle)
            except ReceiptHandleIsInvalid:
                failed.append(
                    _failed_entry(
                        entry["Id"],
                        "ReceiptHandleIsInvalid",
                        f'The input receipt handle "{handle}" is not a valid receipt handle.',
                    )
                )
            except SQSException as err:
                failed.append(_failed_entry(entry["Id"], err.code, err.message))
            else:
                successful.append(entry["Id"])
        return successful, failed

    def is_message_valid_based_on_retention_period(
        backend: SQSBackend, queue_name: str, message: Message
    ) -> bool:
        """moto's retention check, reading the one attribute it needs.

        moto builds every attribute of the queue for each message it hands out, and the
        message counts among them scan the whole queue: a receive of ten from a backlog
        of 300 took 130 ms of the server's CPU, where SQS answers in a few ms, so every
        throughput figure measured the test bed. The rule is unchanged.
        """
        # moto sets an attribute per queue attribute, which its types do not declare.
        retention = int(vars(backend.get_queue(queue_name))["message_retention_period"])
        return (message.sent_timestamp or 0) / 1000 + retention > time.time()

    patches: dict[str, Callable[..., Any]] = {
        "is_message_valid_based_on_retention_period": is_message_valid_based_on_retention_period,
        "receive_message": receive_message,
        "change_message_visibility": change_message_visibility,
        "change_message_visibility_batch": change_message_visibility_batch,
        "delete_message": delete_message,
        "delete_message_batch": delete_message_batch,
    }
    for name, function in patches.items():
        setattr(SQSBackend, name, function)


def _forget_lapsed_receives(queue_: Queue) -> None:
    """Free the FIFO groups of messages whose lease ran out, before moto's receive looks.

    moto frees them one by one as its loop meets them, and counts a group busy while a
    later lapsed message of it is still on its list: of A1, A2 and A3 lapsed together it
    hands out A3 first. SQS hands out A1.
    """
    lapsed = {message for message in queue_.pending_messages if message.visible}
    queue_.pending_messages.difference_update(lapsed)


def _install_iam_rules(recorder: _Recorder) -> None:
    """Make moto's IAM enforcement authorise SQS calls as AWS does, and keep its refusals.

    Nothing changes until :func:`_enforce_iam`: before it, moto checks no call at all.
    """
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.iam.access_control import IAMRequest
    from moto.sqs.responses import SQSResponse
    from moto.utilities.utils import get_partition
    from werkzeug.exceptions import HTTPException

    def sqs_iam_request(*, action: str, **kwargs: Any) -> Any:
        """moto would ask for ``sqs:ChangeMessageVisibilityBatch``, which no policy grants."""
        return IAMRequest(action=_IAM_ACTIONS.get(action, action), **kwargs)

    def authorize_sqs_action(response: SQSResponse, resource: str = "*") -> None:
        # moto only calls the "class" it is given, so a factory does.
        response._authenticate_and_authorize_action(cast(Any, sqs_iam_request), resource)

    original_resource = SQSResponse._determine_resource

    def determine_resource(response: SQSResponse) -> str:
        """The queue a call acts on; for CreateQueue and GetQueueUrl, the one they name.

        moto resolves those two to "*", so a policy that grants them on the queues' ARNs,
        as AWS expects, would be refused.
        """
        if response._get_action() in _ACTIONS_ON_A_NAMED_QUEUE:
            name = response._get_param("QueueName")
            if isinstance(name, str) and name:
                account = response._get_param("QueueOwnerAWSAccountId") or (
                    response.current_account
                )
                region = response.region
                return f"arn:{get_partition(region)}:sqs:{region}:{account}:{name}"
        resource: str = original_resource(response)
        return resource

    original_authorize = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def authorize_and_record(response: Any, iam_request_cls: type, resource: str = "*") -> None:
        try:
            original_authorize(response, iam_request_cls, resource)
        except HTTPException as refusal:
            recorder.record_refusal(_describe_refusal(response, refusal))
            raise

    patches: list[tuple[type, str, Callable[..., Any]]] = [
        (SQSResponse, "_authenticate_and_authorize_normal_action", authorize_sqs_action),
        (SQSResponse, "_determine_resource", determine_resource),
        (ActionAuthenticatorMixin, "_authenticate_and_authorize_action", authorize_and_record),
    ]
    for owner, name, function in patches:
        setattr(owner, name, function)


def _describe_refusal(response: Any, refusal: Exception) -> Refusal:
    # "AWS4-HMAC-SHA256 Credential=AKIA.../20261123/us-east-1/sqs/aws4_request, ..."
    authorization: str = response.headers.get("Authorization") or ""
    scope = authorization.partition("Credential=")[2].partition(",")[0].split("/")
    return Refusal(
        t=time.time(),
        service=scope[3] if len(scope) > 3 else "",
        action=str(response._get_action()),
        access_key_id=scope[0],
        code=str(getattr(refusal, "error_type", type(refusal).__name__)),
        message=str(getattr(refusal, "message", refusal)),
    )


def _enforce_iam() -> None:
    """moto checks every call once it has served this many unchecked ones; 0 is "now"."""
    from moto import settings

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0


def _failed_entry(entry_id: str, code: str, message: str) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": True, "Code": code, "Message": message}


def _entry_fault(entry_id: str, code: str) -> dict[str, Any]:
    """An injected per-entry failure: SQS's fault unless the code names the sender's."""
    return {
        "Id": entry_id,
        "SenderFault": code not in _SERVER_ENTRY_CODES,
        "Code": code,
        "Message": f"{code} injected by the strict SQS server",
    }


class _SQSCall(NamedTuple):
    action: str
    entries: int
    json_protocol: bool
    #: MaxNumberOfMessages of a ReceiveMessage (SQS's default, 1, when not given).
    asked: int | None = None


class _ErrorReply(NamedTuple):
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


_FAULT_REPLIES: dict[str, _ErrorReply] = {
    "throttle": _ErrorReply(
        "400 Bad Request",
        "com.amazonaws.sqs#ThrottlingException",
        "Throttling",
        "Sender",
        "Rate exceeded",
        query_compatible=False,
    ),
    "server_error": _ErrorReply(
        "500 Internal Server Error",
        "com.amazonaws.sqs#InternalError",
        "InternalError",
        "Receiver",
        "We encountered an internal error. Please try again.",
        query_compatible=False,
    ),
    "access_denied": _ErrorReply(
        "403 Forbidden",
        "com.amazon.coral.service#AccessDeniedException",
        "AccessDenied",
        "Sender",
        "Access to the resource is denied.",
        query_compatible=True,
    ),
    "invalid_credentials": _ErrorReply(
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
        if not isinstance(payload, dict):
            payload = {}
        entries = payload.get("Entries")
        action = target.split(".", 1)[1]
        return _SQSCall(
            action,
            len(entries) if isinstance(entries, list) else 0,
            True,
            _asked(action, payload.get("MaxNumberOfMessages")),
        )
    form = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        form.update(urllib.parse.parse_qs(body.decode("utf-8", "replace")))
    action = form.get("Action", [""])[0]
    if not action:
        return None
    entry_numbers = {m.group(1) for key in form if (m := _QUERY_ENTRY_ID_KEY.fullmatch(key))}
    asked = form.get("MaxNumberOfMessages", [None])[0]
    return _SQSCall(action, len(entry_numbers), False, _asked(action, asked))


def _asked(action: str, given: Any) -> int | None:
    if action != "ReceiveMessage":
        return None
    try:
        return int(given) if given is not None else 1
    except (TypeError, ValueError):
        return None


def _returned_messages(body: bytes) -> int:
    """How many messages a ReceiveMessage answer (JSON or XML) carries."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body.count(b"<Message>")
    messages = payload.get("Messages") if isinstance(payload, dict) else None
    return len(messages) if isinstance(messages, list) else 0


def _json_reply(start_response: StartResponse, status: str, payload: object) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _error_reply(start_response: StartResponse, call: _SQSCall, reply: _ErrorReply) -> list[bytes]:
    """An SQS error response in the protocol the client used."""
    request_id = str(uuid.uuid4())
    headers = [("x-amzn-RequestId", request_id)]
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


def _garbage_reply(start_response: StartResponse, call: _SQSCall) -> list[bytes]:
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


def _json_object(body: bytes) -> dict[str, Any]:
    payload = json.loads(body or b"null")
    if not isinstance(payload, dict):
        raise ValueError("expected a JSON object")
    return payload


def _number(payload: dict[str, Any], key: str, default: float, *, positive: bool) -> float:
    value = payload.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise ValueError(f"'{key}' must be a {'positive' if positive else 'non-negative'} number")
    return float(value)


def _parse_failure(payload: dict[str, Any], seconds_key: str) -> _Failure:
    kind = payload.get("kind")
    if kind not in FAULT_KINDS:
        raise ValueError(f"'kind' must be one of {', '.join(FAULT_KINDS)}")
    seconds = _number(payload, seconds_key, 0, positive=False)
    if kind in ("delay", "timeout") and seconds <= 0:
        raise ValueError(f"a '{kind}' fault needs '{seconds_key}' > 0")
    return _Failure(kind, seconds)


def _parse_actions(payload: dict[str, Any]) -> frozenset[str] | None:
    """An empty list is refused: a rule that matches no call is surely a mistake."""
    actions = payload.get("actions")
    if actions is None:
        return None
    if (
        not isinstance(actions, list)
        or not actions
        or not all(isinstance(action, str) and action for action in actions)
    ):
        raise ValueError("'actions' must be null (every action) or a list of SQS action names")
    return frozenset(actions)


def _parse_fault(body: bytes) -> tuple[str, _CountedFault]:
    payload = _json_object(body)
    action = payload.get("action")
    count = payload.get("count", 1)
    if not isinstance(action, str) or not action:
        raise ValueError("'action' must be an SQS action name, e.g. ChangeMessageVisibility")
    failure = _parse_failure(payload, "seconds")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("'count' must be a positive integer")
    return action, _CountedFault(failure, count)


def _parse_entry_fault(body: bytes) -> tuple[str, str, int]:
    payload = _json_object(body)
    action, code, count = payload.get("action"), payload.get("code"), payload.get("count", 1)
    if action not in _BATCH_ACTIONS_WITH_ENTRY_FAULTS:
        raise ValueError(f"'action' must be one of {', '.join(_BATCH_ACTIONS_WITH_ENTRY_FAULTS)}")
    if not isinstance(code, str) or not code:
        raise ValueError("'code' must be an SQS error code, e.g. InternalError")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("'count' must be a positive integer")
    return action, code, count


def _parse_outage(body: bytes) -> _Outage:
    payload = _json_object(body)
    seconds = _number(payload, "seconds", 0, positive=True)
    return _Outage(
        _parse_actions(payload),
        _parse_failure(payload, "fault_seconds"),
        time.monotonic() + seconds,
    )


def _parse_fraction(body: bytes) -> _FailureFraction:
    payload = _json_object(body)
    probability = payload.get("probability")
    if (
        isinstance(probability, bool)
        or not isinstance(probability, (int, float))
        or not 0 <= probability <= 1
    ):
        raise ValueError("'probability' must be a number from 0 to 1")
    seed = payload.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError("'seed' must be null or an integer")
    return _FailureFraction(
        _parse_actions(payload),
        _parse_failure(payload, "fault_seconds"),
        float(probability),
        seed,
        random.Random(seed),
    )


def _parse_latency(body: bytes) -> _Latency:
    payload = _json_object(body)
    return _Latency(_parse_actions(payload), _number(payload, "seconds", 0, positive=True))


class _StrictApp:
    """WSGI middleware in front of moto: ``/_strict/`` control endpoints, call counts, faults."""

    def __init__(self, moto_app: WSGIApplication, recorder: _Recorder) -> None:
        self._moto_app = moto_app
        self._recorder = recorder
        self._routes: dict[tuple[str, str], Callable[[bytes], object]] = {
            ("GET", "calls"): lambda _: recorder.calls(),
            ("POST", "calls/reset"): lambda _: recorder.reset_calls(),
            ("GET", "calls/log"): lambda _: recorder.call_log(),
            ("GET", "events"): lambda _: recorder.events(),
            ("DELETE", "events"): lambda _: recorder.clear_events(),
            ("GET", "faults"): lambda _: recorder.pending_faults(),
            ("POST", "faults"): lambda body: recorder.add_fault(*_parse_fault(body)),
            ("DELETE", "faults"): lambda _: recorder.clear_faults(),
            ("POST", "entry_faults"): lambda body: recorder.add_entry_fault(
                *_parse_entry_fault(body)
            ),
            ("POST", "outages"): lambda body: recorder.add_outage(_parse_outage(body)),
            ("DELETE", "outages"): lambda _: recorder.end_outages(),
            ("POST", "fractions"): lambda body: recorder.add_fraction(_parse_fraction(body)),
            ("POST", "latency"): lambda body: recorder.add_latency(_parse_latency(body)),
            ("POST", "iam/enforce"): lambda _: _enforce_iam(),
            ("GET", "iam/refusals"): lambda _: recorder.refusals(),
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PREFIX):
            return self._control(environ, start_response, path[len(CONTROL_PREFIX) :])
        call = _identify_call(environ)
        if call is None:
            return self._moto_app(environ, start_response)
        self._recorder.count_call(call.action, call.entries)
        arrived = time.time()
        returned: int | None = None
        try:
            answer = self._answer(environ, start_response, call)
            if call.action == "ReceiveMessage":
                body = b"".join(answer)
                returned = _returned_messages(body)
                answer = [body]
            return answer
        finally:
            self._recorder.log_call(
                Call(
                    action=call.action,
                    arrived=arrived,
                    answered=time.time(),
                    entries=call.entries,
                    asked=call.asked,
                    returned=returned,
                )
            )

    def _answer(
        self, environ: WSGIEnvironment, start_response: StartResponse, call: _SQSCall
    ) -> Iterable[bytes]:
        """The answer to an SQS call: moto's, after any latency, or an injected fault."""
        fault = self._recorder.take_fault(call.action)
        # Each request has its own thread, so these waits hold up no other call.
        latency = self._recorder.latency(call.action)
        if latency:
            time.sleep(latency)
        if fault is None:
            return self._serve(environ, start_response, call)
        if fault.kind == "delay":
            time.sleep(fault.seconds)
            return self._serve(environ, start_response, call)
        if fault.kind == "timeout":
            time.sleep(fault.seconds)
        if fault.kind in ("drop_connection", "timeout"):
            # A client that timed out may have closed the socket already.
            with contextlib.suppress(OSError):
                environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
            # Werkzeug treats ConnectionError as "client went away" and sends nothing.
            raise ConnectionAbortedError(f"injected {fault.kind} for {call.action}")
        if fault.kind == "garbage":
            return _garbage_reply(start_response, call)
        return _error_reply(start_response, call, _FAULT_REPLIES[fault.kind])

    def _serve(
        self, environ: WSGIEnvironment, start_response: StartResponse, call: _SQSCall
    ) -> Iterable[bytes]:
        """moto's answer, with an IAM refusal in the JSON protocol when the client used it.

        moto answers a refusal in XML whatever the protocol, which botocore reads over
        JSON as error code "403": kombu's check for ``AccessDenied`` would miss it, and
        logs would not name the error. SQS answers it in JSON, with the query code.
        """
        if not call.json_protocol:
            return self._moto_app(environ, start_response)
        refused: list[tuple[str, list[tuple[str, str]]]] = []

        def hold_refusal(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            if status.startswith("403 "):
                refused.append((status, headers))
                return lambda _: None
            return start_response(status, headers, exc_info)

        answer = self._moto_app(environ, hold_refusal)
        if not refused:
            return answer
        body = b"".join(answer)
        close = getattr(answer, "close", None)
        if close is not None:
            close()
        try:
            error = ElementTree.fromstring(body).find(".//Error")
        except ElementTree.ParseError:
            error = None
        code = "" if error is None else error.findtext("Code", "")
        if code not in _IAM_REFUSAL_JSON_TYPES or error is None:
            start_response(*refused[0])
            return [body]
        reply = _ErrorReply(
            "403 Forbidden",
            _IAM_REFUSAL_JSON_TYPES[code],
            code,
            "Sender",
            error.findtext("Message", ""),
            query_compatible=True,
        )
        return _error_reply(start_response, call, reply)

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
    _install_iam_rules(recorder)
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


def _action_list(actions: Iterable[str] | None) -> list[str] | None:
    """A lone action name would otherwise be taken for its letters."""
    if actions is None:
        return None
    return [actions] if isinstance(actions, str) else list(actions)


def _pump_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Forward the server's stdout, and keep draining it so the server never blocks."""
    for line in stream:
        lines.put(line)


class StrictSQSServer:
    """A strict SQS server in a subprocess, and the client of its control endpoints.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The server
    accepts any credentials until :meth:`enforce_iam`; :attr:`boto3_kwargs` has the ones
    the tests use.
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
        """Zero the counts and empty the call log."""
        self._control("POST", "calls/reset")

    def call_log(self) -> list[Call]:
        """Every SQS call since the last :meth:`reset_calls`, in the order they ended."""
        log: list[Call] = self._control("GET", "calls/log")
        return log

    def inject_fault(
        self, action: str, kind: FaultKind, count: int = 1, seconds: float = 0.0
    ) -> None:
        """Make the next ``count`` calls of ``action`` fail as ``kind``.

        ``seconds`` is how long a delay or timeout holds each call (see
        :data:`FAULT_KINDS`). Faults for the same action queue up in order, and come
        before any outage or fraction. Raises ValueError if the server rejects them.
        """
        self._control(
            "POST", "faults", {"action": action, "kind": kind, "count": count, "seconds": seconds}
        )

    def outage(
        self,
        seconds: float,
        kind: FaultKind,
        actions: Iterable[str] | None = None,
        *,
        fault_seconds: float = 0.0,
    ) -> None:
        """Fail every call of ``actions`` (None: every SQS action) as ``kind`` for ``seconds``.

        The window starts when the server gets this request and is timed by its monotonic
        clock. ``fault_seconds`` is how long a delay or timeout holds each call.
        """
        self._control(
            "POST",
            "outages",
            {
                "seconds": seconds,
                "kind": kind,
                "actions": _action_list(actions),
                "fault_seconds": fault_seconds,
            },
        )

    def end_outages(self) -> None:
        """End every outage now; other faults stay."""
        self._control("DELETE", "outages")

    def fail_fraction(
        self,
        probability: float,
        kind: FaultKind,
        actions: Iterable[str] | None = None,
        *,
        seed: int | None = None,
        fault_seconds: float = 0.0,
    ) -> None:
        """Fail each call of ``actions`` (None: every SQS action) as ``kind`` with ``probability``.

        It lasts until :meth:`clear_faults`. With a ``seed`` the same sequence of calls
        fails the same way in every run; each fraction draws from its own generator.
        """
        self._control(
            "POST",
            "fractions",
            {
                "probability": probability,
                "kind": kind,
                "actions": _action_list(actions),
                "seed": seed,
                "fault_seconds": fault_seconds,
            },
        )

    def fail_entries(self, action: str, code: str, count: int = 1) -> None:
        """Fail the next ``count`` entries of ``action`` batch calls with ``code``.

        The rest of each call goes through: SQS answers a batch entry by entry, and a
        client must retry just the entries that failed. ``action`` is
        ``DeleteMessageBatch`` or ``ChangeMessageVisibilityBatch``; ``InternalError`` and
        ``ServiceUnavailable`` come as SQS's fault, any other code as the sender's.
        """
        self._control("POST", "entry_faults", {"action": action, "code": code, "count": count})

    def add_latency(self, seconds: float, actions: Iterable[str] | None = None) -> None:
        """Answer every call of ``actions`` (None: every SQS action) ``seconds`` later.

        It lasts until :meth:`clear_faults`; latencies that apply to the same call add
        up. Faulted calls wait too, like any answer crossing a slow network.
        """
        self._control("POST", "latency", {"seconds": seconds, "actions": _action_list(actions)})

    def pending_faults(self) -> list[dict[str, Any]]:
        """Everything configured that can still affect a call, by ``type``.

        ``count``: a fault not yet consumed, with its remaining ``count``; ``outage``:
        with its ``remaining_seconds``; ``fraction`` and ``latency``. ``actions`` is
        None for the rules that apply to every SQS action.
        """
        pending: list[dict[str, Any]] = self._control("GET", "faults")
        return pending

    def clear_faults(self) -> None:
        """Remove every fault, outage, fraction and latency."""
        self._control("DELETE", "faults")

    def events(self) -> list[Event]:
        """Every receive, visibility change and delete the server saw, oldest first."""
        events: list[Event] = self._control("GET", "events")
        return events

    def clear_events(self) -> None:
        self._control("DELETE", "events")

    def enforce_iam(self) -> None:
        """From now on, authenticate and authorise every AWS call, as AWS does.

        Until then the server accepts any credentials, which is what most tests want.
        After it, each call must be signed with an access key of an IAM user of this
        server (account 123456789012), and that user's policies must allow the action on
        the resource: the queue's ARN, or "*" for ListQueues. So create the users, their
        policies and access keys first, with boto3 and :attr:`boto3_kwargs` against this
        server, which also serves IAM: IAM calls are checked too, and the credentials of
        :attr:`boto3_kwargs` belong to no user. There is no way back, so a test that
        enforces IAM needs a server of its own. :meth:`refused_calls` lists what was
        refused.

        moto's evaluation is simpler than AWS's. It reads Effect, Action, NotAction and
        Resource, with ``*`` wildcards only and action names case-sensitive; it treats
        every Condition as met, and knows no queue policy, permission boundary or SCP. A
        policy that passes here may still be refused by AWS for a condition or a boundary,
        and one refused here may pass on AWS if it spells an action in other case or uses
        ``?``.
        """
        self._control("POST", "iam/enforce")

    def refused_calls(self) -> list[Refusal]:
        """Every call refused since :meth:`enforce_iam`, oldest first, IAM calls included."""
        refused: list[Refusal] = self._control("GET", "iam/refusals")
        return refused

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
