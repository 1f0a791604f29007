"""kombu's cache of SQS queue URLs, kept from pointing at a queue that was deleted.

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
alike). This transport now keeps a reply queue between calls (:mod:`.reply_queue_channel`),
but still deletes it once idle, and any queue may be deleted by someone else.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError
from kombu.transport import SQS

from ..aws.sqs_facts import QUEUE_MISSING_CODES, canonical_code

__all__ = ["ForgetsDeletedQueueUrls"]


class ForgetsDeletedQueueUrls(SQS.Channel):
    """A channel that forgets the URL of a deleted queue, and declares it anew."""

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super()._delete(queue, *args, **kwargs)
        self._queue_cache.pop(self.canonical_queue_name(queue), None)

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        """Declare ``queue``; if its cached URL is of a deleted queue, create it again."""
        try:
            return super().queue_declare(queue, passive=passive, **kwargs)
        except ClientError as error:
            code = canonical_code(error.response.get("Error", {}).get("Code"))
            if passive or not queue or code not in QUEUE_MISSING_CODES:
                raise
        self._queue_cache.pop(self.canonical_queue_name(queue), None)
        return super().queue_declare(queue, passive=passive, **kwargs)
