"""S3 objects of held messages, deleted once SQS confirms their messages' deletes.

One :class:`ObjectCleanup` per process (:mod:`celery_sqs_heartbeat.process`), like the
leases: an ack may come through any channel, and a lease that ends otherwise (released,
lost) takes its entry with it. The calls are made on a thread of their own, in turn:
this is told of a delete in the SQS delete's call slot, and a slow S3 must not hold the
slots SQS's deletes need.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError
from celery.utils.log import get_logger

from ..aws.clients import DerivedClients
from ..leasing.leases import Lease
from .pointers import FailureStreak, S3Pointer

__all__ = ["S3_DELETE_BATCH", "ObjectCleanup", "Owned", "by_bucket", "error_name", "owned_by"]

logger = get_logger(__name__)

#: DeleteObjects takes at most 1,000 keys a call.
S3_DELETE_BATCH = 1000

#: An object and its bucket's expected owner (None: not named).
Owned = tuple[S3Pointer, "str | None"]

_Waiting = queue.SimpleQueue[tuple[Callable[[], BaseClient], list[Owned]]]


class ObjectCleanup:
    """The objects to delete, by lease, and the one thread that deletes them."""

    def __init__(self, clients: DerivedClients) -> None:
        self._clients = clients
        self._objects: weakref.WeakKeyDictionary[Lease, Owned] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: Notified under ``_lock`` whenever the deleting thread finished a batch.
        self._batch_done = threading.Condition(self._lock)
        #: Objects handed to the deleting thread and not yet tried.
        self._pending = 0
        self._failures = FailureStreak()
        self._waiting: _Waiting = queue.SimpleQueue()
        self._deleter: threading.Thread | None = None

    def remember(self, lease: Lease, owned: Owned) -> None:
        """The object to delete once SQS confirms the delete of ``lease``'s message."""
        with self._lock:
            self._objects[lease] = owned

    def moved(self, replaced: Lease, lease: Lease) -> None:
        """``lease``, a new receive of ``replaced``'s message, deletes it: the object goes with it.

        The new receive's body is not read again (the message is known here), so
        nothing else would remember the object for it.
        """
        with self._lock:
            owned = self._objects.pop(replaced, None)
            if owned is not None:
                self._objects[lease] = owned

    def deleted(self, client_source: Callable[[], BaseClient], leases: Iterable[Lease]) -> None:
        """SQS confirmed these deletes: their messages' objects go, in DeleteObjects calls.

        Never before: a message released, dead-lettered or lost keeps its object. Returns
        at once. A failure is logged once per streak and left: a bucket lifecycle rule
        removes what was not deleted (README), as it does what a process ending
        meanwhile leaves.
        """
        with self._lock:
            owned = [o for lease in leases if (o := self._objects.pop(lease, None))]
            if not owned:
                return
            self._waiting.put((client_source, owned))
            self._pending += len(owned)
            if self._deleter is None:
                self._deleter = threading.Thread(
                    target=self._delete_in_turn,
                    name="celery-sqs-heartbeat-s3-deletes",
                    daemon=True,
                )
                self._deleter.start()

    def _delete_in_turn(self) -> None:
        """The deleting thread: one batch after another, for as long as the process lives.

        An error nobody foresaw (S3's and the network's are handled per call) is logged
        and the thread goes on: the objects stay for the lifecycle rule.
        """
        while True:
            client_source, owned = self._waiting.get()
            try:
                s3 = self._clients.s3(client_source())
                for (bucket, owner), keys in by_bucket(owned).items():
                    for start in range(0, len(keys), S3_DELETE_BATCH):
                        self._delete(s3, bucket, owner, keys[start : start + S3_DELETE_BATCH])
            except Exception:
                logger.exception("Deleting %d S3 object(s) of deleted messages failed", len(owned))
            with self._batch_done:
                self._pending -= len(owned)
                self._batch_done.notify_all()

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the objects already handed to the deleting
        thread; returns how many were not tried by then.

        The process calls it as it leaves: the thread is a daemon, and a worker stopping
        right after its last ack (a warm shutdown's last task) ended before the objects of
        the messages it had deleted were (found by the chaos soak).
        """
        with self._batch_done:
            self._batch_done.wait_for(lambda: not self._pending, timeout)
            return self._pending

    def _delete(self, s3: BaseClient, bucket: str, owner: str | None, keys: Sequence[str]) -> None:
        try:
            answer = s3.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
                **owned_by(owner),
            )
            errors = answer.get("Errors") or []
            code = errors[0].get("Code", "?") if errors else ""
        except (ClientError, BotoCoreError, OSError) as exc:
            code = error_name(exc)
        with self._lock:
            first = self._failures.failed() if code else False
            ended = 0 if code else self._failures.succeeded()
        if first:
            logger.warning(
                "Cannot delete the objects of deleted large messages in bucket %s (%s); they "
                "stay until the bucket's lifecycle rule removes them. Further failures are "
                "not logged until a delete succeeds.",
                bucket,
                code,
            )
        elif ended:
            logger.warning(
                "Objects of deleted large messages are deleted again (%d calls failed)", ended
            )


def owned_by(owner: str | None) -> dict[str, str]:
    """The ``ExpectedBucketOwner`` parameter of an S3 call, when the owner is known."""
    return {"ExpectedBucketOwner": owner} if owner else {}


def error_name(exc: BaseException) -> str:
    """S3's error code, or the exception's name."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or exc)
    return type(exc).__name__


def by_bucket(owned: Iterable[Owned]) -> Mapping[tuple[str, str | None], list[str]]:
    """The keys by bucket and owner: one DeleteObjects call deletes keys of one bucket."""
    keys: defaultdict[tuple[str, str | None], list[str]] = defaultdict(list)
    for pointer, owner in owned:
        keys[pointer.bucket, owner].append(pointer.key)
    return keys
