"""The thin layer that sends published messages: one SendMessageBatch call and its answer.

Every answer of SQS and every fault of botocore or the network becomes a
:class:`~celery_sqs_heartbeat.publish_book.SendOutcome` per entry, never an exception:
a sending thread that died on one bad answer would leave its scope waiting for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError

from .publish_book import SendOutcome
from .sqs import publish_client
from .sqs_facts import SEND_REFUSED_CODES, THROTTLING_CODES, canonical_code, error_code

__all__ = ["send_message_batch"]

Results = dict[int, tuple[SendOutcome, str]]


def send_message_batch(
    client: BaseClient, queue_url: str, entries: Sequence[dict[str, Any]]
) -> Results:
    """Send ``entries`` (SendMessageBatch entries less their ``Id``) in one call.

    ``client`` is the queue's client as kombu chose it; the call goes through its
    :func:`~celery_sqs_heartbeat.sqs.publish_client`. Entry ``i`` has ``Id`` ``"i"``,
    and the answer is by that index.
    """
    request = [{"Id": str(index), **entry} for index, entry in enumerate(entries)]
    try:
        response = publish_client(client).send_message_batch(QueueUrl=queue_url, Entries=request)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error_code(error.get("Code"))
        outcome = _outcome(code, sender_fault=True)
        return dict.fromkeys(range(len(entries)), (outcome, f"{code}: {error.get('Message', '')}"))
    except (BotoCoreError, OSError) as exc:
        return dict.fromkeys(range(len(entries)), (SendOutcome.RETRY, repr(exc)))
    return _entry_results(response)


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
