"""SQS's refusal to create a queue under a name deleted less than a minute ago.

SQS answers ``CreateQueue`` with ``AWS.SimpleQueueService.QueueDeletedRecently`` for
:data:`~celery_sqs_heartbeat.aws.sqs_facts.SQS_QUEUE_NAME_REUSE_SECONDS` after a queue of the
same name (in the same account and region) was deleted. moto creates it at once, so a
transport that deletes a queue whose name comes back (kombu deleted a remote-control
reply queue after every call, and the next call from the same thread declares the same
name) passed here and failed on SQS. :class:`RecentlyDeletedNames` is the bookkeeping,
with the clock passed in; :func:`install_deleted_queue_rule` patches it onto moto in the
server process.

Creating a queue that exists is unaffected (SQS answers with its URL), and so is a
name deleted more than the minute ago.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from ..aws.sqs_facts import QUEUE_DELETED_RECENTLY as CODE
from ..aws.sqs_facts import SQS_QUEUE_NAME_REUSE_SECONDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from moto.sqs.models import Queue, SQSBackend

__all__ = [
    "QUEUE_DELETED_RECENTLY",
    "RecentlyDeletedNames",
    "deleted_names",
    "install_deleted_queue_rule",
]

QUEUE_DELETED_RECENTLY = f"AWS.SimpleQueueService.{CODE}"
QUEUE_DELETED_RECENTLY_MESSAGE = (
    f"You must wait {SQS_QUEUE_NAME_REUSE_SECONDS} seconds after deleting a queue before "
    "you can create another with the same name."
)


class RecentlyDeletedNames:
    """The queue names deleted within the last minute, and when; thread safe.

    Names are whatever identifies a queue to SQS; the server passes the account, the
    region and the queue's name together.
    """

    def __init__(self, reuse_seconds: float = SQS_QUEUE_NAME_REUSE_SECONDS) -> None:
        self._reuse_seconds = reuse_seconds
        self._deleted_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def deleted(self, name: str, now: float) -> None:
        """``name``'s queue was deleted at ``now``."""
        with self._lock:
            self._deleted_at[name] = now

    def refuses(self, name: str, now: float) -> bool:
        """Whether SQS would refuse to create a queue named ``name`` at ``now``.

        Names whose minute is over are forgotten here, so the book holds only the
        names deleted in the last minute.
        """
        with self._lock:
            self._forget_older_than(now - self._reuse_seconds)
            return name in self._deleted_at

    def forget(self) -> None:
        """As if the minute of every deleted name had passed: tests skip the wait."""
        with self._lock:
            self._deleted_at.clear()

    def _forget_older_than(self, moment: float) -> None:
        for name in [n for n, at in self._deleted_at.items() if at <= moment]:
            del self._deleted_at[name]


#: The server's book: the patch below writes it, the control endpoint empties it.
deleted_names = RecentlyDeletedNames()


def install_deleted_queue_rule(
    book: RecentlyDeletedNames = deleted_names, clock: Callable[[], float] = time.monotonic
) -> None:
    """Patch moto's ``SQSBackend`` so that ``CreateQueue`` refuses a name deleted just now.

    Only the server process calls this: the patch changes moto for the whole process.
    """
    from moto.sqs.exceptions import SQSException
    from moto.sqs.models import SQSBackend

    original_create: Callable[..., Queue] = SQSBackend.create_queue
    original_delete: Callable[..., None] = SQSBackend.delete_queue

    def create_queue(backend: SQSBackend, name: str, *args: Any, **kwargs: Any) -> Queue:
        if name not in backend.queues and book.refuses(_identity(backend, name), clock()):
            raise SQSException(QUEUE_DELETED_RECENTLY, QUEUE_DELETED_RECENTLY_MESSAGE)
        return original_create(backend, name, *args, **kwargs)

    def delete_queue(backend: SQSBackend, queue_name: str) -> None:
        original_delete(backend, queue_name)
        book.deleted(_identity(backend, queue_name), clock())

    setattr(SQSBackend, "create_queue", create_queue)  # noqa: B010
    setattr(SQSBackend, "delete_queue", delete_queue)  # noqa: B010


def _identity(backend: SQSBackend, name: str) -> str:
    """A queue name is reserved per account and region, as SQS's queue URLs are."""
    return f"{backend.account_id}/{backend.region_name}/{name}"
