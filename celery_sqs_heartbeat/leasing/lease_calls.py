"""What the lease manager needs of a queue, and how each of its SQS calls is made.

Apart because three parts make these calls: the manager's public face (a late answer's
confirmation, on the caller's thread), and the check's renewals, deletes and releases
(on threads of their own). Each call is made outside the manager's lock, and whatever
goes wrong in it becomes an answer, so that no lease is stranded as "being renewed".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from .leases import EntryResult, Lease

__all__ = ["Answers", "LeaseQueue", "ask"]

Answers = Mapping[Lease, tuple[EntryResult, str]]


class LeaseQueue(Protocol):
    """What the manager needs of a queue: :class:`celery_sqs_heartbeat.aws.sqs_queue.SQSQueue`."""

    name: str

    def change_visibility(self, entries: Sequence[tuple[Lease, int]]) -> Answers: ...

    def delete(self, leases: Sequence[Lease]) -> Answers: ...


def ask(
    queue: LeaseQueue,
    activity: str,
    leases: Sequence[Lease],
    call: Callable[[], Answers],
    logger: logging.Logger,
) -> Answers:
    """SQS's answer per entry; an exception nobody foresaw counts as a failed call.

    :class:`~celery_sqs_heartbeat.aws.sqs_queue.SQSQueue` turns every error of SQS, botocore and
    the network into answers; anything else is a bug, which must not strand the leases
    as "being renewed" nor end the call's thread without settling it. Logged with the
    manager's ``logger``, where operators look for renewals.
    """
    try:
        return call()
    except Exception as exc:
        logger.exception("%s on queue %s failed", activity, queue.name)
        return dict.fromkeys(leases, (EntryResult.TRANSIENT, repr(exc)))
