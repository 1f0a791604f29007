"""The thin layer that sends published messages: one SendMessageBatch call and its answer.

Every answer of SQS and every fault of botocore or the network becomes a
:class:`~celery_sqs_heartbeat.publishing.book.SendOutcome` per entry, never an exception:
a sending thread that died on one bad answer would leave its scope waiting for ever.
Also the queue's ``MaximumMessageSize``, which bounds what one call may carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)
from celery.utils.log import get_logger

from ..publishing.book import SendOutcome
from .sqs_facts import (
    FATAL_CODES,
    MAX_MESSAGE_SIZE_ATTRIBUTE,
    SEND_REFUSED_CODES,
    SQS_MAX_BATCH_SEND_SIZE,
    SQS_MAX_MESSAGE_SIZE,
    THROTTLING_CODES,
    canonical_code,
    error_code,
)

__all__ = ["MessageLimits", "may_have_arrived", "send_message_batch"]

logger = get_logger(__name__)

Results = dict[int, tuple[SendOutcome, str]]


class MessageLimits:
    """Each queue's ``MaximumMessageSize`` by URL, read once per process.

    Plain dict operations, atomic under the GIL: two threads reading the same queue at
    once cost one extra call, no harm.
    """

    def __init__(self) -> None:
        self._limits: dict[str, int] = {}

    def of(self, client: BaseClient, queue_url: str) -> int:
        """The most bytes one call to the queue may carry: its ``MaximumMessageSize``.

        Read once per queue URL with GetQueueAttributes (which kombu's declare needs too,
        so a producer's policy allows it), through ``client``, the queue's publish
        client. If it cannot be read, SQS's default limit, :data:`SQS_MAX_MESSAGE_SIZE`:
        a queue with a lower one then refuses some calls whole, and
        :func:`send_message_batch` splits them, so the guess costs calls, never a
        message. A refusal for good (access denied) is kept, so that each publish does
        not ask again; a passing fault is asked again next time.
        """
        known = self._limits.get(queue_url)
        if known is not None:
            return known
        try:
            answer = client.get_queue_attributes(
                QueueUrl=queue_url, AttributeNames=[MAX_MESSAGE_SIZE_ATTRIBUTE]
            )
            limit = int(answer["Attributes"][MAX_MESSAGE_SIZE_ATTRIBUTE])
        except ClientError as exc:
            code = error_code(exc.response.get("Error", {}).get("Code"))
            logger.warning(
                "Cannot read %s of %s (%s); sending calls of %d bytes at most",
                MAX_MESSAGE_SIZE_ATTRIBUTE,
                queue_url,
                code,
                SQS_MAX_MESSAGE_SIZE,
            )
            if canonical_code(code) in FATAL_CODES:
                self._limits[queue_url] = SQS_MAX_MESSAGE_SIZE
            return SQS_MAX_MESSAGE_SIZE
        except (BotoCoreError, OSError, KeyError, ValueError):
            return SQS_MAX_MESSAGE_SIZE
        limit = min(limit, SQS_MAX_BATCH_SEND_SIZE)
        self._limits[queue_url] = limit
        return limit


def send_message_batch(
    client: BaseClient, queue_url: str, entries: Sequence[dict[str, Any]]
) -> Results:
    """Send ``entries`` (SendMessageBatch entries less their ``Id``) in one call.

    ``client`` is the queue's publish client
    (:meth:`~celery_sqs_heartbeat.aws.clients.DerivedClients.publish`). Entry ``i`` has
    ``Id`` ``"i"``, and the answer is by that index.

    A call SQS refuses whole for a reason one entry may cause (a message too long for
    the queue, bad contents: SQS names no entry) is split in halves, each sent alone, so
    that only the entry really refused fails. The second half goes only if the first
    left nothing to retry: a FIFO group's later entry never overtakes an earlier one,
    and what is not sent has no answer, which the book retries in its place.
    """
    request = [{"Id": str(index), **entry} for index, entry in enumerate(entries)]
    try:
        response = client.send_message_batch(QueueUrl=queue_url, Entries=request)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error_code(error.get("Code"))
        outcome = _outcome(code, sender_fault=True)
        if outcome is SendOutcome.REFUSED and len(entries) > 1 and not _refuses_any(code):
            return _in_halves(client, queue_url, entries)
        return dict.fromkeys(range(len(entries)), (outcome, f"{code}: {error.get('Message', '')}"))
    except (BotoCoreError, OSError) as exc:
        outcome = SendOutcome.UNANSWERED if may_have_arrived(exc) else SendOutcome.RETRY
        return dict.fromkeys(range(len(entries)), (outcome, repr(exc)))
    return _entry_results(response)


def may_have_arrived(exc: BaseException) -> bool:
    """Whether a call that got ``exc`` instead of an answer may still have been made.

    Only a connection never made (refused, unresolved, timed out while connecting)
    proves the request never left; after a read timeout or a connection closed
    mid-call, SQS may have done what was asked and its answer was lost.
    """
    return not isinstance(exc, (EndpointConnectionError, ConnectTimeoutError))


def _refuses_any(code: str) -> bool:
    """Whether the refusal is the queue's or the caller's (missing, access denied), so
    every entry, alone or not, would be refused the same: no use splitting the call."""
    return canonical_code(code) in FATAL_CODES


def _in_halves(client: BaseClient, queue_url: str, entries: Sequence[dict[str, Any]]) -> Results:
    """``entries`` sent as two calls, in order, answered by index into ``entries``."""
    middle = len(entries) // 2
    results = send_message_batch(client, queue_url, entries[:middle])
    if any(outcome.worth_another_try for outcome, _ in results.values()):
        return results
    later = send_message_batch(client, queue_url, entries[middle:])
    results.update({middle + index: result for index, result in later.items()})
    return results


def _entry_results(response: dict[str, Any]) -> Results:
    """By entry index; an entry in neither list is left out (the book retries it)."""
    results: Results = {}
    for ok in response.get("Successful", []):
        results[int(ok["Id"])] = (SendOutcome.SENT, "")
    for failed in response.get("Failed", []):
        code = error_code(failed.get("Code"))
        outcome = _outcome(code, sender_fault=bool(failed.get("SenderFault")))
        results[int(failed["Id"])] = (outcome, f"{code}: {failed.get('Message', '')}")
    return results


def _outcome(code: str, sender_fault: bool) -> SendOutcome:
    """Refused only for a code that says the same message would be refused again.

    Throttling is the sender's fault by SQS's flag, and still worth a try later; SQS's
    own fault always is.
    """
    canonical = canonical_code(code)
    if not sender_fault or canonical in THROTTLING_CODES:
        return SendOutcome.RETRY
    return SendOutcome.REFUSED if canonical in SEND_REFUSED_CODES else SendOutcome.RETRY
