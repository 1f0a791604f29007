"""The thin layer that talks to SQS: one batch call (visibility change or delete) and its answer.

Every answer of SQS and every fault of botocore or the network becomes an
:class:`EntryResult` per entry: a call's thread that died on one bad answer would leave
its leases marked as being renewed. The manager still guards against what nobody
foresaw (a bug, an answer botocore cannot parse) and counts it as a failed call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError

from ..leasing.leases import EntryResult, Lease
from .sqs_facts import (
    LOST_LEASE_CODES,
    QUEUE_MISSING_CODES,
    canonical_code,
    error_code,
    is_beyond_hold_limit,
)

__all__ = ["FreshCopy", "SQSQueue"]

#: A fresh copy of a received message: its lease, body, message attributes and delay.
FreshCopy = tuple[Lease, str, dict[str, dict[str, Any]], int]

#: How much of a receipt handle a log line may show.
HANDLE_PREFIX = 8


def _keep_objects(leases: Sequence[Lease]) -> None:
    """No large payloads: a confirmed delete leaves nothing behind."""


class SQSQueue:
    """Where visibility changes and deletes for one queue go, with the client allowed to make them.

    ``client_source`` is asked on every call, not once: for a predefined queue with an
    STS role, kombu replaces the client when its session token is about to expire. It
    gives the client to call with (the process's renewal client,
    :class:`~celery_sqs_heartbeat.aws.clients.DerivedClients`). ``deleted`` is told of
    the leases whose messages a confirmed delete surely removed: their S3 objects go then.
    """

    def __init__(
        self,
        name: str,
        url: str,
        client_source: Callable[[], BaseClient],
        deleted: Callable[[Sequence[Lease]], None] = _keep_objects,
    ) -> None:
        self.name = name
        self.url = url
        self._client_source = client_source
        self._deleted = deleted

    def __repr__(self) -> str:
        return f"<SQSQueue {self.name}>"

    def change_visibility(
        self, entries: Sequence[tuple[Lease, int]]
    ) -> dict[Lease, tuple[EntryResult, str]]:
        """Set each lease's visibility, ten at most, in one call."""
        request = [
            {"Id": str(index), "ReceiptHandle": lease.receipt_handle, "VisibilityTimeout": seconds}
            for index, (lease, seconds) in enumerate(entries)
        ]
        return self._batch_call(
            "change_message_visibility_batch", [lease for lease, _ in entries], request
        )

    def delete(self, leases: Sequence[Lease]) -> dict[Lease, tuple[EntryResult, str]]:
        """Delete the leases' messages, ten at most, in one call; then their S3 objects.

        An object read from S3 goes only once SQS confirmed its message's delete.
        """
        request = [
            {"Id": str(index), "ReceiptHandle": lease.receipt_handle}
            for index, lease in enumerate(leases)
        ]
        results = self._batch_call("delete_message_batch", leases, request)
        surely_deleted = _surely_deleted(results)
        if surely_deleted:
            self._deleted(surely_deleted)
        return results

    def send_copies(self, copies: Sequence[FreshCopy]) -> dict[Lease, tuple[EntryResult, str]]:
        """Send each ``(lease, body, attributes, delay)`` as a new message, ten at most.

        A fresh copy of a received message, which SQS counts from its first receive.
        """
        request = [
            {"Id": str(index), "MessageBody": body, "DelaySeconds": delay}
            | ({"MessageAttributes": attributes} if attributes else {})
            for index, (_, body, attributes, delay) in enumerate(copies)
        ]
        leases = [lease for lease, _, _, _ in copies]
        return self._batch_call("send_message_batch", leases, request)

    def has_redrive_policy(self) -> bool:
        """Whether the queue moves messages to a dead-letter queue after so many receives.

        Raises what botocore raises: the caller decides what an unreadable policy means.
        """
        answer = self._client_source().get_queue_attributes(
            QueueUrl=self.url, AttributeNames=["RedrivePolicy"]
        )
        return "RedrivePolicy" in answer.get("Attributes", {})

    def _batch_call(
        self, operation: str, leases: Sequence[Lease], request: list[dict[str, Any]]
    ) -> dict[Lease, tuple[EntryResult, str]]:
        try:
            response = getattr(self._client_source(), operation)(QueueUrl=self.url, Entries=request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error_code(error.get("Code"))
            # None of the queue's leases can be renewed again once the queue is gone.
            kind = _kind(code, error.get("Message"), lost=QUEUE_MISSING_CODES)
            return dict.fromkeys(leases, (kind, without_receipt_handles(f"{code}: {exc}", leases)))
        except (BotoCoreError, OSError) as exc:
            return dict.fromkeys(leases, (EntryResult.TRANSIENT, repr(exc)))
        return _entry_results(leases, response)


def _surely_deleted(results: dict[Lease, tuple[EntryResult, str]]) -> list[Lease]:
    """The leases whose messages the confirmed deletes surely deleted.

    Not those whose lease ran out first: SQS answers a delete by an expired receipt handle
    with success and deletes nothing, and the message, received again, needs its object.
    Nor those copied: the fresh copy carries the same pointer. A bucket's lifecycle rule
    removes what is left.
    """
    return [
        lease
        for lease, (outcome, _) in results.items()
        if outcome is EntryResult.OK and not lease.lost and not lease.copied
    ]


def _entry_results(
    leases: Sequence[Lease], response: dict[str, Any]
) -> dict[Lease, tuple[EntryResult, str]]:
    results: dict[Lease, tuple[EntryResult, str]] = {}
    for ok in response.get("Successful", []):
        results[leases[int(ok["Id"])]] = (EntryResult.OK, "")
    for failed in response.get("Failed", []):
        code = error_code(failed.get("Code"))
        message = failed.get("Message", "")
        kind = _kind(code, message, lost=LOST_LEASE_CODES)
        lease = leases[int(failed["Id"])]
        detail = without_receipt_handles(f"{code}: {message}", [lease])
        results[lease] = (kind, detail)
    return results


def without_receipt_handles(text: str, leases: Sequence[Lease]) -> str:
    """``text`` with each lease's receipt handle cut to a short prefix.

    SQS quotes the handle in some errors ("Value AQEB... for parameter ReceiptHandle is
    invalid"), and these texts are logged. A handle lets whoever reads the log delete or
    hide the message until its lease ends, so logs show only enough to tell handles apart.
    """
    for lease in leases:
        handle = lease.receipt_handle
        if len(handle) > HANDLE_PREFIX:
            text = text.replace(handle, handle[:HANDLE_PREFIX] + "…")
    return text


def _kind(code: str, message: str | None, lost: frozenset[str]) -> EntryResult:
    """What an error means: a visibility past the 12 hours, a code of ``lost``, or a retry.

    The 12-hour refusal is read first: SQS gives it a code of the lost family
    (``InvalidParameterValue``), but the receipt handle still holds the message.
    """
    if is_beyond_hold_limit(code, message):
        return EntryResult.BEYOND_LIMIT
    return EntryResult.LOST if canonical_code(code) in lost else EntryResult.TRANSIENT
