"""SQS's receive count, told to Celery as the ``redelivered`` flag AMQP brokers set.

Celery reads ``delivery_info["redelivered"]``: a task sees it in ``request.delivery_info``
(to tell a first delivery from a requeued one), and ``worker_deduplicate_successful_tasks``
asks the result backend whether a task already succeeded only when its message is
redelivered. RabbitMQ sets the flag, and kombu's Redis transport sets it when it
restores a message; kombu's SQS transport never does, although SQS counts every receive.
So on SQS a task that rejects its first delivery with ``requeue=True`` saw every
redelivery as a first one, and rejected it again, for ever.

``ApproximateReceiveCount`` above 1 means SQS delivered the message before: it was
released (reject, requeue, shutdown), or its lease ran out. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..aws.sqs_facts import RECEIVE_COUNT_ATTRIBUTE

__all__ = ["mark_redelivered", "receive_count"]


def receive_count(attributes: Mapping[str, Any]) -> int:
    """The message's ``ApproximateReceiveCount``; 1 when SQS did not say (not asked for)."""
    try:
        return int(attributes.get(RECEIVE_COUNT_ATTRIBUTE, 1))
    except (TypeError, ValueError):
        return 1


def mark_redelivered(payload: Any, sqs_message: Mapping[str, Any]) -> Any:
    """Set ``redelivered`` in the delivery info of ``payload``, the message kombu decoded.

    Only a redelivery is marked: a first delivery keeps what the body carries, as on
    other brokers. A payload without kombu's envelope is left as it is.
    """
    properties = payload.get("properties") if isinstance(payload, dict) else None
    delivery_info = properties.get("delivery_info") if isinstance(properties, dict) else None
    if isinstance(delivery_info, dict) and receive_count(sqs_message.get("Attributes") or {}) > 1:
        delivery_info["redelivered"] = True
    return payload
