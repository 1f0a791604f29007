"""A channel's queue URLs and new queues: no URL of a deleted queue kept, a TTL's retention asked.

kombu caches each queue's URL, per connection, under its SQS name
(``canonical_queue_name``: "." becomes "-"). Two ways it kept the URL of a deleted queue,
so that declaring the queue again asked SQS about the old URL and failed with
``QueueDoesNotExist`` instead of creating it:

* kombu's own delete forgets the URL under the name as given, not the SQS name, so a
  name with a dot stayed cached on the connection that deleted it;
* another connection (or process) that deleted the queue cannot touch this one's cache.

Remote control's reply queues were both: named ``<id>.reply.celery.pidbox``, the same
for every call made from one thread, declared on the connection that publishes the
request and deleted by kombu, after the replies, on the one that collected them. So an
application's second ``inspect`` failed whenever the pool handed out a connection that
had declared the queue before (seen in Celery's own suite; kombu's stock transport
alike). This transport now keeps a reply queue between calls
(:mod:`~celery_sqs_heartbeat.monitoring.reply_queue_keeper`), but still deletes it once
idle, and any queue may be deleted by someone else.

kombu's SQS channel also dropped a queue's ``message_ttl`` before it reached the
declaration, and it sets attributes only when it creates a queue. So the TTL is noted
at the declaration, by the queue's SQS name, and read when kombu creates that queue
(:func:`~celery_sqs_heartbeat.queues.retention.retention_seconds` says how long). A queue
that exists already keeps its retention; predefined queues are never created. kombu's
``sqs-creation-attributes`` option, applied after, still decides over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from botocore.exceptions import ClientError

from ..aws.sqs_facts import QUEUE_MISSING_CODES, canonical_code
from .retention import retention_seconds

__all__ = ["QueueKeeper", "QueueKeeperPort"]


class QueueKeeperPort(Protocol):
    """What the queue keeper reads of its kombu channel."""

    @property
    def _queue_cache(self) -> dict[str, str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...


class QueueKeeper:
    """Forgets the URL of a deleted queue and declares it anew; creates queues with their TTL."""

    def __init__(self, channel: QueueKeeperPort) -> None:
        self._channel = channel
        #: The retention, in seconds, of each queue declared with a TTL, by its SQS name.
        self._retention_by_name: dict[str, int] = {}

    def note_retention(self, queue: str | None, passive: bool, arguments: Any) -> None:
        """A declaration's TTL, noted for kombu's creation of the queue (if it creates it)."""
        if queue and not passive:
            name = self._channel.canonical_queue_name(queue)
            retention = retention_seconds(arguments)
            if retention is None:
                self._retention_by_name.pop(name, None)
            else:
                self._retention_by_name[name] = retention

    def creation_attributes(self, queue_name: str, attributes: dict[str, str]) -> dict[str, str]:
        """The attributes kombu creates ``queue_name`` with, its noted retention added."""
        retention = self._retention_by_name.get(queue_name)
        if retention is None:
            return attributes
        return {**attributes, "MessageRetentionPeriod": str(retention)}

    def declare(self, queue: str | None, passive: bool, kombu_declare: Callable[[], Any]) -> Any:
        """``kombu_declare()``; if the cached URL is of a deleted queue, forgotten and once more."""
        try:
            return kombu_declare()
        except ClientError as error:
            code = canonical_code(error.response.get("Error", {}).get("Code"))
            if passive or not queue or code not in QUEUE_MISSING_CODES:
                raise
        self.forget_url(queue)
        return kombu_declare()

    def forget_url(self, queue: str) -> None:
        """Forget ``queue``'s URL under its SQS name (kombu forgets it under the name as given)."""
        self._channel._queue_cache.pop(self._channel.canonical_queue_name(queue), None)
