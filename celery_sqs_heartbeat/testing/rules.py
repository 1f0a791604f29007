"""SQS's lease rules, patched onto moto's SQS backend in the server process.

moto's SQS is more forgiving than AWS exactly where a visibility-heartbeat transport
can go wrong, so a transport tested against plain moto could pass while being broken
against AWS. With these rules:

* ChangeMessageVisibility only accepts the *latest* receipt handle of a message; a
  handle from an earlier receive, or of a deleted message, fails with
  ``InvalidParameterValue`` (moto moves the current lease with any old handle, and
  answers ``ReceiptHandleIsInvalid`` for deleted messages).
* changing the visibility of a message whose lease already expired fails with
  ``AWS.SimpleQueueService.MessageNotInflight`` (moto silently hides it again);
* the new deadline may not be more than ``max_hold_seconds`` (43200, i.e. 12 h, like
  SQS) after the receive that produced the handle (moto counts from the send);
* ChangeMessageVisibilityBatch reports every per-entry error in ``Failed`` (moto fails
  the whole request for most of them);
* ChangeMessageVisibilityBatch and DeleteMessageBatch reject empty batches, batches of
  more than 10 entries and batches with a missing, malformed or repeated Id as a whole,
  as SQS does (moto accepts all but the empty ones);
* SendMessageBatch fails the entries a test asked for (``fail_entries``) in ``Failed``,
  and sends the rest;
* VisibilityTimeout 0 makes the message visible at once and wakes waiting long polls;
* DeleteMessage, and each entry of DeleteMessageBatch, only deletes with the *latest*
  receipt handle. A handle from an earlier receive answers success but leaves the
  message in the queue, as SQS may ("the request succeeds, but the message might not be
  deleted"); the event log records it as ``"stale"``. moto deletes with any handle the
  message ever had. A handle of a deleted message still succeeds (SQS deletes are
  idempotent), and one the server never issued still fails with
  ``ReceiptHandleIsInvalid``.
* CreateQueue refuses, for a minute, the name of a queue deleted just before
  (``QueueDeletedRecently``), as SQS does (:mod:`.deleted_queues`); moto creates it.

Receive, change and delete of the same queue are serialised by the queue's own
lock, because moto's in-memory backend is not thread safe and the threaded server
would otherwise let two concurrent receives hand out the same message.

moto is imported where it is used: the client side of the package, which only imports
the constants here, must not need it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .deleted_queues import install_deleted_queue_rule
from .recorder import Receipt

if TYPE_CHECKING:
    from collections.abc import Callable

    from moto.sqs.models import Message, Queue, SQSBackend

    from .fault_plan import FaultPlan
    from .recorder import Recorder

DEFAULT_MAX_HOLD_SECONDS = 43200.0
"""SQS keeps a received message invisible for at most 12 hours after the receive."""

MAX_VISIBILITY_TIMEOUT = 43200
MAX_BATCH_ENTRIES = 10
LONG_POLL_INTERVAL = 0.1
"""How often a waiting long poll looks for messages whose lease expired."""
NOT_AVAILABLE_REASON = "Message does not exist or is not available for visibility timeout change."
MESSAGE_NOT_INFLIGHT = "AWS.SimpleQueueService.MessageNotInflight"
_SERVER_ENTRY_CODES = frozenset({"InternalError", "ServiceUnavailable"})
"""Per-entry codes that are SQS's fault, not the sender's."""
_BATCH_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")

#: Set while this thread runs a send: moto's queue attributes then hold only the one a
#: send reads (:func:`_attributes_a_send_reads`).
_sending = threading.local()

Entries = list[dict[str, Any]]


def install_strict_rules(recorder: Recorder, faults: FaultPlan, max_hold_seconds: float) -> None:
    """Patch moto's ``SQSBackend`` so that it enforces SQS's lease rules.

    Only the server process calls this: the patches change moto for the whole process.
    """
    from moto.sqs.models import Queue, SQSBackend

    rules = _StrictRules(
        recorder,
        faults,
        max_hold_seconds,
        SQSBackend.receive_message,
        SQSBackend.delete_message,
        (SQSBackend.send_message, SQSBackend.send_message_batch),
    )
    patches: dict[str, Callable[..., Any]] = {
        "is_message_valid_based_on_retention_period": _is_within_retention,
        "receive_message": rules.receive_message,
        "change_message_visibility": rules.change_message_visibility,
        "change_message_visibility_batch": rules.change_message_visibility_batch,
        "delete_message": rules.delete_message,
        "delete_message_batch": rules.delete_message_batch,
        "send_message": rules.send_message,
        "send_message_batch": rules.send_message_batch,
    }
    for name, rule in patches.items():
        setattr(SQSBackend, name, _as_backend_method(rule))
    setattr(Queue, "attributes", _attributes_a_send_reads(vars(Queue)["attributes"]))  # noqa: B010
    install_deleted_queue_rule()


def _as_backend_method(rule: Callable[..., Any]) -> Callable[..., Any]:
    """A bound method set on a class is not bound again, so moto would not pass the backend."""

    def method(backend: SQSBackend, *args: Any, **kwargs: Any) -> Any:
        return rule(backend, *args, **kwargs)

    return method


class _StrictRules:
    """The patched backend methods, with the state they share: the server's records."""

    def __init__(
        self,
        recorder: Recorder,
        faults: FaultPlan,
        max_hold_seconds: float,
        original_receive: Callable[..., list[Message]],
        original_delete: Callable[..., None],
        original_sends: tuple[Callable[..., Message], Callable[..., Any]],
    ) -> None:
        self._recorder = recorder
        self._faults = faults
        self._max_hold_seconds = max_hold_seconds
        self._original_receive = original_receive
        self._original_delete = original_delete
        self._original_send, self._original_send_batch = original_sends

    def send_message(self, backend: SQSBackend, *args: Any, **kwargs: Any) -> Message:
        """moto's send, which reads one queue attribute instead of building them all."""
        with _sending_now():
            message = self._original_send(backend, *args, **kwargs)
        return message

    def send_message_batch(
        self, backend: SQSBackend, queue_name: str, entries: dict[str, dict[str, Any]]
    ) -> tuple[list[Message], Entries]:
        """moto's batch send, less the entries a test asked to fail, which are in ``Failed``."""
        kept: dict[str, dict[str, Any]] = {}
        faulted: Entries = []
        for key, entry in entries.items():
            code = self._faults.take_entry_fault("SendMessageBatch")
            if code is None:
                kept[key] = entry
            else:
                faulted.append(_entry_fault(entry["Id"], code))
        if not kept:
            return [], faulted
        with _sending_now():
            sent, failed = self._original_send_batch(backend, queue_name, kept)
        return sent, [*failed, *faulted]

    def receive_message(
        self,
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
                _drop_messages_past_retention(queue_)
                messages = self._original_receive(
                    backend, queue_name, count, 0, visibility_timeout, message_attribute_names
                )
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0:
                    break
                queue_._messages_lock.wait(min(remaining, LONG_POLL_INTERVAL))
            now = time.time()
            for message in messages:
                handle = message.receipt_handle or ""
                self._recorder.remember_receipt(handle, Receipt(queue_name, message.id, now))
                self._recorder.log_event("receive", queue_name, handle, visibility_timeout, "ok")
        return messages

    def change_message_visibility(
        self, backend: SQSBackend, queue_name: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        """Change a lease only if ``receipt_handle`` is the current lease of an in-flight message.

        moto finds the message by any handle it ever had, re-hides messages whose lease
        expired, counts the 12-hour limit from the send, and lets long polls sleep on
        through a release; SQS does none of that.
        """
        from moto.sqs.exceptions import SQSException

        queue_ = backend.get_queue(queue_name)
        with queue_._messages_lock:
            try:
                self._change_lease(queue_, receipt_handle, int(visibility_timeout))
            except SQSException as err:
                self._recorder.log_event(
                    "change_visibility", queue_name, receipt_handle, visibility_timeout, err.code
                )
                raise
            self._recorder.log_event(
                "change_visibility", queue_name, receipt_handle, visibility_timeout, "ok"
            )

    def _change_lease(self, queue_: Queue, handle: str, visibility_timeout: int) -> None:
        from moto.sqs.exceptions import InvalidParameterValue, ReceiptHandleIsInvalid, SQSException

        if not 0 <= visibility_timeout <= MAX_VISIBILITY_TIMEOUT:
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                f"Reason: Must be between 0 and {MAX_VISIBILITY_TIMEOUT}."
            )
        receipt = self._recorder.receipt(handle)
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
        if time.time() + visibility_timeout > receipt.received_at + self._max_hold_seconds:
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                "Reason: Total VisibilityTimeout for the message is beyond the limit "
                f"[{self._max_hold_seconds:g} seconds]"
            )
        if visibility_timeout:
            message.change_visibility(visibility_timeout)
            return
        # moto's `visible` needs now > visible_at, which a coarse clock may not give yet.
        message.visible_at = 0.0
        queue_.pending_messages.discard(message)
        queue_._messages_lock.notify_all()

    def change_message_visibility_batch(
        self, backend: SQSBackend, queue_name: str, entries: Entries
    ) -> tuple[list[str], Entries]:
        """Apply each entry on its own and report each error in ``Failed``, like SQS.

        moto turns only ReceiptHandleIsInvalid into a per-entry failure, so e.g. the
        12-hour limit on one entry failed the whole request.
        """
        _check_batch("ChangeMessageVisibilityBatch", entries)
        successful: list[str] = []
        failed: Entries = []
        for entry in entries:
            failure = self._change_entry(backend, queue_name, entry)
            if failure is None:
                successful.append(entry["Id"])
            else:
                failed.append(failure)
        return successful, failed

    def _change_entry(
        self, backend: SQSBackend, queue_name: str, entry: dict[str, Any]
    ) -> dict[str, Any] | None:
        from moto.sqs.exceptions import SQSException

        try:
            visibility_timeout = int(entry["VisibilityTimeout"])
        except (KeyError, TypeError, ValueError):
            return _failed_entry(
                entry["Id"],
                "InvalidParameterValue",
                f"Value {entry.get('VisibilityTimeout')} for parameter "
                "VisibilityTimeout is invalid.",
            )
        code = self._faults.take_entry_fault("ChangeMessageVisibilityBatch")
        if code is not None:
            return _entry_fault(entry["Id"], code)
        try:
            backend.change_message_visibility(
                queue_name, entry.get("ReceiptHandle", ""), visibility_timeout
            )
        except SQSException as err:
            return _failed_entry(entry["Id"], err.code, err.message)
        return None

    def delete_message(self, backend: SQSBackend, queue_name: str, receipt_handle: str) -> None:
        """Delete only with the latest receipt handle; a stale one succeeds and deletes nothing.

        SQS wants "the most recently received receipt handle" and otherwise answers
        success but may keep the message, which then runs again; moto deletes with any
        handle the message ever had. Handles of deleted messages and handles never issued
        behave as in moto (success, and ``ReceiptHandleIsInvalid``), as in SQS.
        """
        from moto.sqs.exceptions import SQSException

        queue_ = backend.get_queue(queue_name)
        with queue_._messages_lock:
            if _is_stale(queue_, receipt_handle):
                self._recorder.log_event("delete", queue_name, receipt_handle, None, "stale")
                return
            try:
                self._original_delete(backend, queue_name, receipt_handle)
            except SQSException as err:
                self._recorder.log_event("delete", queue_name, receipt_handle, None, err.code)
                raise
            self._recorder.log_event("delete", queue_name, receipt_handle, None, "ok")

    def delete_message_batch(
        self, backend: SQSBackend, queue_name: str, entries: Entries
    ) -> tuple[list[str], Entries]:
        """Apply :meth:`delete_message` to each entry and report each error in ``Failed``.

        A stale entry is in ``Successful``, as in SQS. moto's own batch also calls
        ``delete_message`` per entry, but only turns ReceiptHandleIsInvalid into a failed
        entry; doing it here keeps the rule from depending on that detail of moto.
        """
        backend.get_queue(queue_name)  # an unknown queue fails the whole request
        _check_batch("DeleteMessageBatch", entries)
        successful: list[str] = []
        failed: Entries = []
        for entry in entries:
            failure = self._delete_entry(backend, queue_name, entry)
            if failure is None:
                successful.append(entry["Id"])
            else:
                failed.append(failure)
        return successful, failed

    def _delete_entry(
        self, backend: SQSBackend, queue_name: str, entry: dict[str, Any]
    ) -> dict[str, Any] | None:
        from moto.sqs.exceptions import ReceiptHandleIsInvalid, SQSException

        handle = entry.get("ReceiptHandle", "")
        code = self._faults.take_entry_fault("DeleteMessageBatch")
        if code is not None:
            return _entry_fault(entry["Id"], code)
        try:
            backend.delete_message(queue_name, handle)
        except ReceiptHandleIsInvalid:
            return _failed_entry(
                entry["Id"],
                "ReceiptHandleIsInvalid",
                f'The input receipt handle "{handle}" is not a valid receipt handle.',
            )
        except SQSException as err:
            return _failed_entry(entry["Id"], err.code, err.message)
        return None


def _check_batch(action: str, entries: Entries) -> None:
    """Refuse a batch as a whole where SQS does, before any entry is applied."""
    from moto.sqs.exceptions import (
        BatchEntryIdsNotDistinct,
        InvalidBatchEntryId,
        SQSException,
        TooManyEntriesInBatchRequest,
    )

    if not entries:
        raise SQSException(
            "AWS.SimpleQueueService.EmptyBatchRequest",
            f"There should be at least one {action}RequestEntry in the request.",
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


def _is_stale(queue_: Queue, handle: str) -> bool:
    """Whether ``handle`` is an earlier receive's handle of a message still queued."""
    if handle in queue_.deleted_messages:
        return False  # the message is gone, whichever of its handles this was
    return any(
        m.receipt_handle != handle and m.had_receipt_handle(handle) for m in queue_._messages
    )


def _forget_lapsed_receives(queue_: Queue) -> None:
    """Free the FIFO groups of messages whose lease ran out, before moto's receive looks.

    moto frees them one by one as its loop meets them, and counts a group busy while a
    later lapsed message of it is still on its list: of A1, A2 and A3 lapsed together it
    hands out A3 first. SQS hands out A1.
    """
    lapsed = {message for message in queue_.pending_messages if message.visible}
    queue_.pending_messages.difference_update(lapsed)


def _drop_messages_past_retention(queue_: Queue) -> None:
    """Delete the messages older than the queue's retention, before moto's receive looks.

    SQS deletes them and hands out the younger ones. moto's receive stops at the first one
    it meets and keeps it, so from then on the queue handed out nothing, though it counted
    its messages (a killed monitor's event queue looked empty to ``celery sqs-reap`` a
    minute on: found by the chaos soak).
    """
    cutoff = _retention_cutoff(queue_)
    expired = [m for m in queue_._messages if (m.sent_timestamp or 0) / 1000 <= cutoff]
    for message in expired:
        queue_._messages.remove(message)
        queue_.pending_messages.discard(message)


def _is_within_retention(backend: SQSBackend, queue_name: str, message: Message) -> bool:
    """moto's retention check, reading the one attribute it needs.

    moto builds every attribute of the queue for each message it hands out, and the
    message counts among them scan the whole queue: a receive of ten from a backlog
    of 300 took 130 ms of the server's CPU, where SQS answers in a few ms, so every
    throughput figure measured the test bed. The rule is unchanged.
    """
    return (message.sent_timestamp or 0) / 1000 > _retention_cutoff(backend.get_queue(queue_name))


def _retention_cutoff(queue_: Queue) -> float:
    """The send time (epoch seconds) at or before which a message is past the queue's retention."""
    # moto sets an attribute per queue attribute, which its types do not declare.
    return time.time() - int(vars(queue_)["message_retention_period"])


@contextmanager
def _sending_now() -> Iterator[None]:
    before = getattr(_sending, "active", False)
    _sending.active = True
    try:
        yield
    finally:
        _sending.active = before


def _attributes_a_send_reads(every_attribute: property) -> property:
    """moto's ``Queue.attributes``, but only what a send reads while one runs.

    moto's send builds every attribute of the queue to read ``ContentBasedDeduplication``
    (FIFO sends read it three times), and the message counts among them scan the whole
    queue: a send to a queue of 10,000 messages took about 35 ms of the server's CPU,
    where SQS answers in a few ms, so every publishing figure measured the test bed, and
    grew with the backlog. The rule is unchanged: the one attribute as moto writes it.
    """

    def attributes(queue: Queue) -> dict[str, Any]:
        if not getattr(_sending, "active", False):
            built: dict[str, Any] = every_attribute.__get__(queue)
            return built
        if not queue.fifo_queue:
            return {}
        deduplicates = bool(vars(queue).get("content_based_deduplication"))
        return {"ContentBasedDeduplication": str(deduplicates).lower()}

    return property(attributes)


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
