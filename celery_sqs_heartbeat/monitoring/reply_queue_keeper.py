"""A remote-control reply queue is kept between calls, and a reply to one that is gone is dropped.

kombu deletes a client's reply queue after every call
(``after_reply_message_received``), and the next call from the same thread often
declares the same name again, which SQS refuses for a minute after the delete
(``QueueDeletedRecently``): :mod:`.reply_queues` says when the name comes back, and
holds the book of the queues kept. This part of the channel writes that book: a reply queue is noted
as used when it is declared and when its call ends, and those idle for minutes are
deleted at the end of a later call; the rest go as the process leaves, a prefork pool
child included (:mod:`.exit_cleanup`). Kept, a late reply of an earlier call waits in
the queue until the next call, whose consumer sets it aside by its ticket (kombu's
``Mailbox._collect``) rather than taking it for an answer.

The worker's side: a reply to a reply queue that is gone is dropped
(:meth:`ReplyQueueKeeper.put`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from botocore.client import BaseClient
from botocore.exceptions import ClientError
from celery.utils.log import get_logger

from ..aws.sqs_facts import QUEUE_DELETED_RECENTLY, QUEUE_MISSING_CODES, canonical_code
from ..process import this_process
from ..queues.exit_cleanup import delete_reply_queues
from .pidbox_names import is_reply_queue

__all__ = ["ReplyQueueKeeper", "ReplyQueuePort"]

logger = get_logger(__name__)


class ReplyQueuePort(Protocol):
    """What the reply queue keeper reads of its kombu channel."""

    @property
    def _queue_cache(self) -> dict[str, str]: ...

    @property
    def predefined_queues(self) -> Mapping[str, Any]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def sqs(self, queue: str | None = None) -> BaseClient: ...


class ReplyQueueKeeper:
    """Keeps its channel's process's reply queues between calls."""

    def __init__(self, channel: ReplyQueuePort) -> None:
        self._channel = channel

    def declared(self, queue: str) -> None:
        """A queue was declared: a reply queue is in use from now on, so no other thread's
        call deletes it as idle meanwhile."""
        if is_reply_queue(queue):
            self._keep_reply_queue(queue)

    def after_reply_received(self, queue: str, kombu_delete: Callable[[str], Any]) -> None:
        """Keep a reply queue for the next call from this thread; delete those long idle.

        ``kombu_delete`` is kombu's ``after_reply_message_received``, for a queue not kept.
        """
        if not self._keep_reply_queue(queue):
            kombu_delete(queue)
            return
        delete_reply_queues(
            this_process().leftovers.reply_queues.take_idle(os.getpid(), time.monotonic())
        )

    def _keep_reply_queue(self, queue: str) -> bool:
        """Note that this process uses the reply queue ``queue`` now; False if not kept."""
        channel = self._channel
        name = channel.canonical_queue_name(queue)
        url = channel._queue_cache.get(name)
        if url is None or channel.predefined_queues or not is_reply_queue(queue):
            return False
        delete = partial(_delete_reply_queue, channel.sqs(), channel._queue_cache, name, url)
        this_process().leftovers.reply_queues.used(url, delete, os.getpid(), time.monotonic())
        return True

    def put(self, queue: str, kombu_put: Callable[[], None]) -> None:
        """``kombu_put()``; a reply to a reply queue that is gone is dropped: the asker left.

        A reply queue is gone once the process that asked has exited (or left it idle).
        kombu's ``_put`` then sent the late reply to the URL it had cached, or created
        the queue again, which SQS refuses within the minute after the delete
        (``QueueDeletedRecently``). Either error reached the worker's remote control,
        which logged it and restarted its consumer, losing the requests that came
        meanwhile. A broker drops a message routed to no queue; so does this part.
        (kombu's Mailbox would drop it on ``InconsistencyError``, but kombu's retrying
        publish turns that into an ``OperationalError`` first.)
        """
        try:
            kombu_put()
        except ClientError as error:
            if not (is_reply_queue(queue) and _is_queue_gone(error)):
                raise
            self._channel._queue_cache.pop(self._channel.canonical_queue_name(queue), None)
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
