"""What SQS did with the tests' messages: releases in the strict server's event log, and
what reached a dead-letter queue (named ``<queue>-dlq``, as ``Bed.create_queue`` makes it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from tests.integration.harness import Bed

E = TypeVar("E", bound=Mapping[str, Any])


def releases(events: Iterable[E], *, up_to: float = 0) -> list[E]:
    """The visibility changes among ``events`` that hand a message back, whatever SQS said.

    A release is a change to 0 s; with ``up_to``, to at most that many seconds: a release
    at shutdown waits out a long poll still on the wire (``ReceiveGate``), so it may hide
    the message for the rest of that poll (``wait_time_seconds``, 1 s on a bed).
    """
    return [e for e in events if e["action"] == "change_visibility" and e["visibility"] <= up_to]


def dead_lettered(bed: Bed, wait_seconds: int = 5) -> list[dict[str, Any]]:
    """The messages in the bed's dead-letter queue, as one long poll of ``wait_seconds``
    receives them (and hides them): it ends as soon as one is there."""
    sqs = bed.sqs()
    dead_url = sqs.get_queue_url(QueueName=f"{bed.queue}-dlq")["QueueUrl"]
    answer = sqs.receive_message(QueueUrl=dead_url, WaitTimeSeconds=wait_seconds)
    return list(answer.get("Messages", []))


def dead_letter_count(sqs: Any, queue: str) -> int:
    """How many messages SQS counts in ``queue``'s dead-letter queue, read with the client
    ``sqs`` (on a server that enforces IAM, one allowed to), without receiving any."""
    url = sqs.get_queue_url(QueueName=f"{queue}-dlq")["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])
