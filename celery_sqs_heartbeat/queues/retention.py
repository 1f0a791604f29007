"""How long SQS keeps a queue's messages: as long as its declaration's message TTL asks.

AMQP brokers drop a message older than the queue's ``x-message-ttl``; SQS has no
per-queue TTL, only a retention period, at least a minute. Celery declares a monitor's
event queue with a 5-second TTL and kombu its mailboxes with 300 seconds, so that a
monitor killed before it could delete its queue leaves no backlog behind. Without a
retention, such a queue kept every event of every worker for SQS's default four days.
Pure, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..aws.sqs_facts import SQS_MAX_RETENTION_SECONDS, SQS_MIN_RETENTION_SECONDS

__all__ = ["MESSAGE_TTL_ARGUMENT", "retention_seconds"]

#: The queue argument, in milliseconds, that kombu makes of a queue's ``message_ttl``.
MESSAGE_TTL_ARGUMENT = "x-message-ttl"


def retention_seconds(arguments: Mapping[str, Any] | None) -> int | None:
    """The ``MessageRetentionPeriod`` for a queue declared with ``arguments``; None: SQS's own.

    The TTL is rounded up to whole seconds, so that no message goes sooner than asked,
    then brought into the range SQS accepts: a shorter TTL keeps messages a minute.
    """
    ttl_ms = (arguments or {}).get(MESSAGE_TTL_ARGUMENT)
    if ttl_ms is None:
        return None
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, (int, float)):
        raise ValueError(f"{MESSAGE_TTL_ARGUMENT} must be a number of milliseconds, not {ttl_ms!r}")
    seconds = math.ceil(ttl_ms / 1000)
    return min(max(seconds, SQS_MIN_RETENTION_SECONDS), SQS_MAX_RETENTION_SECONDS)
