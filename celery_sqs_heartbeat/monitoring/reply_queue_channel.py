"""A remote-control reply queue is kept between calls, and a reply to one that is gone is dropped.

kombu deletes a client's reply queue after every call
(``after_reply_message_received``), and the next call from the same thread often
declares the same name again, which SQS refuses for a minute after the delete
(``QueueDeletedRecently``): :mod:`.reply_queues` says when the name comes back, and
holds the book of the queues kept. This channel writes that book: a reply queue is noted
as used when it is declared and when its call ends, and those idle for minutes are
deleted at the end of a later call; the rest go as the process leaves, a prefork pool
child included (:mod:`.exit_cleanup`). Kept, a late reply of an earlier call waits in
the queue until the next call, whose consumer sets it aside by its ticket (kombu's
``Mailbox._collect``) rather than taking it for an answer.

The worker's side: a reply to a reply queue that is gone is dropped (:meth:`_put`).
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

from botocore.exceptions import ClientError
from celery.utils.log import get_logger
from kombu.transport import SQS

from ..aws.sqs_facts import QUEUE_DELETED_RECENTLY, QUEUE_MISSING_CODES, canonical_code
from ..process import this_process
from ..queues.exit_cleanup import delete_reply_queues
from .pidbox_names import is_reply_queue

__all__ = ["KeepsReplyQueues"]

logger = get_logger(__name__)


class KeepsReplyQueues(SQS.Channel):
    """A channel that keeps its process's reply queues between calls."""

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        declared = super().queue_declare(queue, passive=passive, **kwargs)
        if is_reply_queue(declared.queue):
            # In use from now on: no other thread's call deletes it as idle meanwhile.
            self._keep_reply_queue(declared.queue)
        return declared

    def after_reply_message_received(self, queue: str) -> None:
        """Keep a reply queue for the next call from this thread; delete those long idle."""
        if not self._keep_reply_queue(queue):
            super().after_reply_message_received(queue)
            return
        delete_reply_queues(
            this_process().leftovers.reply_queues.take_idle(os.getpid(), time.monotonic())
        )

    def _keep_reply_queue(self, queue: str) -> bool:
        """Note that this process uses the reply queue ``queue`` now; False if not kept."""
        name = self.canonical_queue_name(queue)
        url = self._queue_cache.get(name)
        if url is None or self.predefined_queues or not is_reply_queue(queue):
            return False
        delete = partial(_delete_reply_queue, self.sqs(), self._queue_cache, name, url)
        this_process().leftovers.reply_queues.used(url, delete, os.getpid(), time.monotonic())
        return True

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """A reply to a reply queue that is gone is dropped: the one who asked left.

        A reply queue is gone once the process that asked has exited (or left it idle).
        kombu's ``_put`` then sent the late reply to the URL it had cached, or created
        the queue again, which SQS refuses within the minute after the delete
        (``QueueDeletedRecently``). Either error reached the worker's remote control,
        which logged it and restarted its consumer, losing the requests that came
        meanwhile. A broker drops a message routed to no queue; so does this channel.
        (kombu's Mailbox would drop it on ``InconsistencyError``, but kombu's retrying
        publish turns that into an ``OperationalError`` first.)
        """
        try:
            super()._put(queue, message, **kwargs)
        except ClientError as error:
            if not (is_reply_queue(queue) and _is_queue_gone(error)):
                raise
            self._queue_cache.pop(self.canonical_queue_name(queue), None)
            logger.info("A reply to %s is dropped: its queue is gone (%s)", queue, error)


def _delete_reply_queue(sqs: Any, queue_cache: dict[str, str], name: str, url: str) -> None:
    """Delete the queue, and forget its URL so that a call under its name creates it anew."""
    sqs.delete_queue(QueueUrl=url)
    if queue_cache.get(name) == url:
        del queue_cache[name]


def _is_queue_gone(error: ClientError) -> bool:
    """Whether SQS answered that the queue no longer exists, or was deleted just now."""
    code = canonical_code(error.response.get("Error", {}).get("Code"))
    return code in QUEUE_MISSING_CODES or code == QUEUE_DELETED_RECENTLY
