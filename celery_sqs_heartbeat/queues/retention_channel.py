"""A channel that creates a queue with the retention its declaration's message TTL asks.

kombu's SQS channel dropped a queue's ``message_ttl`` before it reached the declaration
(its ``prepare_queue_arguments`` is the base one, which ignores them), and it sets
attributes only when it creates a queue. So the TTL is noted at the declaration, by
the queue's SQS name, and read when kombu creates that queue
(:func:`~celery_sqs_heartbeat.queues.retention.retention_seconds` says how long).
A queue that exists already keeps its retention; predefined queues are never created.
kombu's ``sqs-creation-attributes`` option, applied after, still decides over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.transport import SQS
from kombu.transport.base import to_rabbitmq_queue_arguments

from .retention import retention_seconds

__all__ = ["RetainsMessagesForTheirTtl"]


class RetainsMessagesForTheirTtl(SQS.Channel):
    """A channel whose new queues keep messages for their declared TTL, not four days."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The retention, in seconds, of each queue declared with a TTL, by its SQS name.
        self._retention_by_name: dict[str, int] = {}
        super().__init__(*args, **kwargs)

    def prepare_queue_arguments(
        self, arguments: Mapping[str, Any], **kwargs: Any
    ) -> Mapping[str, Any]:
        """A queue's ``message_ttl`` and ``expires`` as AMQP's ``x-`` arguments, in ms."""
        prepared: Mapping[str, Any] = to_rabbitmq_queue_arguments(arguments, **kwargs)
        return prepared

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        if queue and not passive:
            name = self.canonical_queue_name(queue)
            retention = retention_seconds(kwargs.get("arguments"))
            if retention is None:
                self._retention_by_name.pop(name, None)
            else:
                self._retention_by_name[name] = retention
        return super().queue_declare(queue, passive=passive, **kwargs)

    def _create_queue(self, queue_name: str, attributes: dict[str, str]) -> Any:
        retention = self._retention_by_name.get(queue_name)
        if retention is not None:
            attributes = {**attributes, "MessageRetentionPeriod": str(retention)}
        return super()._create_queue(queue_name, attributes)
