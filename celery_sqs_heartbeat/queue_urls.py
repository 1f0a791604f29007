"""kombu's cache of SQS queue URLs, emptied right when a queue is deleted.

kombu caches each queue's URL under its SQS name (``canonical_queue_name``: "." becomes
"-"), but forgets it on delete under the name as given. For a name with a dot the URL
of the deleted queue stayed, and the next declare of that name on the same connection
asked SQS about the old URL: ``QueueDoesNotExist``. Remote control's reply queues are
such names (``<id>.reply.celery.pidbox``), deleted after each call and named the same
for every call made from one thread, so an application's second ``inspect`` on a pooled
connection failed (seen in Celery's own suite, kombu's stock transport alike).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import SQS

__all__ = ["ForgetsDeletedQueueUrls"]


class ForgetsDeletedQueueUrls(SQS.Channel):
    """A channel whose delete also forgets the URL kombu cached under the SQS name."""

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super()._delete(queue, *args, **kwargs)
        self._queue_cache.pop(self.canonical_queue_name(queue), None)
