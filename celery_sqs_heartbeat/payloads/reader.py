"""A channel's large bodies: sent through S3 when too large for SQS, and read back.

Sending: every message kombu publishes (``delay()``, ``apply_async``, retries, chains,
the worker's own publishing) goes out through the channel's ``_put`` and the queue's SQS
client; a botocore hook on that client's SendMessage
(:meth:`~celery_sqs_heartbeat.payloads.store.PayloadStore.offload`) moves a large body to
S3 and sends the pointer instead (:mod:`celery_sqs_heartbeat.payloads.sending`, which
also deletes the object if SQS does not take the message). Smaller messages are not
touched.

Receiving (step 3 of :mod:`celery_sqs_heartbeat.receiving.steps`): a pointer is replaced
by its object's body after the lease was born, so the lease covers the S3 read, and
before anything reads the task's headers (parking reads its ETA) or kombu decodes it.

- On the event loop (prefork, threads, solo), the objects of a batch are read on a
  thread of its own, and the batch goes on on the loop once they are, so the loop never
  waits for S3. Meanwhile the loop goes on receiving, and the messages being read count
  against the prefetch window (:class:`ReadingQoS`).
- On the blocking path (gevent, eventlet), the read is made inline, as the answer arrives.

A message whose object cannot be read is released with a backoff that grows with its
receive count, so a redrive policy ends the retries of an object gone for good. So is a
pointer the options refuse (a bucket they do not name, a body over the size limit):
its object is neither read nor deleted, and the message goes to the dead-letter queue
rather than to Celery, which would delete it as unknown; it is named in the log once,
at its first receive.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from botocore.client import BaseClient
from celery.utils.log import get_logger
from kombu.asynchronous import Hub
from kombu.transport import SQS

from ..compat import LoopWaker
from ..receiving.steps import Received
from .pointers import S3Pointer, pointer_in, size_in, unavailable_release_delay
from .sending import offload_on_send
from .store import PayloadRefused, PayloadStore, PayloadUnavailable

if TYPE_CHECKING:
    from ..leasing.lease_table import LeaseTable
    from ..leasing.leases import Lease
    from ..leasing.manager import VisibilityExtensionManager

__all__ = ["PayloadReader", "ReadingPort", "ReadingQoS"]

logger = get_logger(__name__)

#: What a read gave, by the message's place in its batch.
Reads = dict[int, "str | PayloadUnavailable"]


class ReadingQoS(SQS.QoS):
    """kombu's SQS QoS, counting the messages whose bodies are being read as taken."""

    def can_consume(self) -> bool:
        estimate = self.can_consume_max_estimate()
        return estimate is None or estimate > 0

    def can_consume_max_estimate(self) -> int | None:
        estimate: int | None = super().can_consume_max_estimate()
        if estimate is None:
            return None
        reading: int = self.channel.payload_reader.messages_reading
        return max(estimate - reading, 0)


class ReadingPort(Protocol):
    """What the payload reader reads of, and asks of, its kombu channel."""

    @property
    def hub(self) -> Any: ...

    @property
    def closed(self) -> bool: ...

    @property
    def _queue_cache(self) -> dict[str, str]: ...

    def canonical_queue_name(self, queue_name: str) -> str: ...

    def sqs(self, queue: str | None = None) -> BaseClient: ...


class PayloadReader:
    """Large bodies through S3: the send hook, and step 3 of a receive on both paths.

    ``room_freed`` is called on the loop when a batch read off it no longer counts
    against the prefetch window (the receiver's ``prefetch_room_freed``).
    """

    def __init__(
        self,
        channel: ReadingPort,
        store: PayloadStore,
        manager: VisibilityExtensionManager,
        lease_table: LeaseTable,
        room_freed: Callable[[], None],
    ) -> None:
        self._channel = channel
        self.store = store
        self._manager = manager
        self._lease_table = lease_table
        self._room_freed = room_freed
        #: Received messages whose batch waits off the loop (a confirmation, S3 reads): they
        #: count against the prefetch window (:class:`ReadingQoS`) until they are handed on.
        self.messages_reading = 0
        #: Their leases: released if the channel closes before the batch is back.
        self._leases_reading: set[Lease] = set()

    def offload_large_bodies(self, client: BaseClient) -> None:
        """Make ``client``'s SendMessage send a large body through S3, if the options say so."""
        if self.store.options is not None:
            offload_on_send(client, self.store)

    def read_bodies_now(self, batch: list[Received], queue_name: str) -> list[Received]:
        """Step 3 on the blocking path: the batch with its bodies read, inline."""
        pointers = _pointers(batch)
        if not pointers:
            return batch
        store = self.store
        client = self._channel.sqs(queue=self._channel.canonical_queue_name(queue_name))
        url = self._url_of(queue_name)
        reads = {i: _read(store, client, p, batch[i], url) for i, p in pointers.items()}
        return self._settle_reads(batch, pointers, reads, url)

    def _url_of(self, queue_name: str) -> str | None:
        """The queue's URL as kombu cached it at the receive: it names the account."""
        return self._channel._queue_cache.get(self._channel.canonical_queue_name(queue_name))

    def off_the_loop(
        self,
        batch: list[Received],
        queue_name: str,
        first_steps: Callable[[list[Received]], list[Received]],
        then: Callable[[list[Received]], Any],
    ) -> bool:
        """The steps that wait for SQS or S3, on a thread; then ``then(batch)`` on the loop.

        ``first_steps`` renews the leases of an answer read late and takes out messages
        held or acked here (steps 1 and 2), then the bodies are read from S3 (step 3).
        False if neither call is needed: the caller runs ``first_steps`` itself.
        Meanwhile the loop goes on receiving, and the batch counts against the prefetch
        window.
        """
        if not _pointers(batch) and not any(received.unconfirmed for received in batch):
            return False
        store = self.store
        client = self._channel.sqs(queue=self._channel.canonical_queue_name(queue_name))
        url = self._url_of(queue_name)
        waker = LoopWaker.of(cast(Hub, self._channel.hub))
        leases = {received.lease for received in batch if received.lease is not None}
        self.messages_reading += len(batch)
        self._leases_reading.update(leases)

        def work() -> None:
            try:
                kept = first_steps(batch)
                pointers = _pointers(kept)
                reads = {i: _read(store, client, p, kept[i], url) for i, p in pointers.items()}
            except Exception:
                # SQS's and S3's errors are answers by now; this is a bug. The batch must
                # still come back, or it would hold its room in the prefetch window for good.
                logger.exception("Receiving %d message(s) of %s failed", len(batch), queue_name)
                waker.call_soon(self._back_unreceived, batch)
                return
            waker.call_soon(self._back_on_the_loop, batch, kept, (pointers, reads, url), then)

        threading.Thread(target=work, name="celery-sqs-heartbeat-receive", daemon=True).start()
        return True

    def _back_on_the_loop(
        self,
        batch: list[Received],
        kept: list[Received],
        read: tuple[dict[int, S3Pointer], Reads, str | None],
        then: Callable[[list[Received]], Any],
    ) -> None:
        """On the loop: the batch goes on, less what the channel's close released.

        The batch no longer counts against the prefetch window: what of it was not
        delivered (unconfirmed, unreadable, parked) leaves room, which may wake a
        waiting receive.
        """
        self.messages_reading -= len(batch)
        self._leases_reading.difference_update(
            received.lease for received in batch if received.lease is not None
        )
        readable = self._settle_reads(kept, *read)
        try:
            then([r for r in readable if r.lease is None or not r.lease.ended])
        finally:
            if not self._channel.closed:
                self._room_freed()

    def _back_unreceived(self, batch: list[Received]) -> None:
        """On the loop: a batch whose steps failed goes back to SQS, except what is held.

        A message held here already (its lease adopted by the batch's) keeps running.
        """
        self.messages_reading -= len(batch)
        leases = [r.lease for r in batch if r.lease is not None]
        self._leases_reading.difference_update(leases)
        unheld = [lease for lease in leases if not self._lease_table.holds(lease)]
        self._manager.release([(lease, 0) for lease in unheld], "receive failed")
        if not self._channel.closed:
            self._room_freed()

    def close(self) -> None:
        """Messages still being read go back to SQS: no consumer is left to take them."""
        leaving, self._leases_reading = self._leases_reading, set()
        if leaving:
            self._manager.release([(lease, 0) for lease in leaving], "shutdown")

    def _settle_reads(
        self,
        batch: list[Received],
        pointers: dict[int, S3Pointer],
        reads: Reads,
        url: str | None,
    ) -> list[Received]:
        """The messages with their bodies; those whose object could not be read released.

        Released with a backoff that grows with the receive count, so that a redrive
        policy ends the retries of an object gone for good, or of a pointer refused. One
        without a lease comes back when its visibility timeout ends.
        """
        readable: list[Received] = []
        unreadable: list[Lease] = []
        for index, received in enumerate(batch):
            outcome = reads.get(index)
            if isinstance(outcome, PayloadUnavailable):
                if isinstance(outcome, PayloadRefused):
                    _log_refused(received, outcome)
                if received.lease is not None:
                    unreadable.append(received.lease)
                continue
            if outcome is not None:
                received.message["Body"] = outcome
                if received.lease is not None:
                    self.store.remember(received.lease, pointers[index], url)
            readable.append(received)
        if unreadable:
            self._manager.release(
                [(lease, unavailable_release_delay(lease.receive_count)) for lease in unreadable],
                "payload unavailable",
            )
        return readable


def _pointers(batch: list[Received]) -> dict[int, S3Pointer]:
    found = {
        index: pointer_in(received.message.get("Body") or "")
        for index, received in enumerate(batch)
    }
    return {index: pointer for index, pointer in found.items() if pointer is not None}


def _read(
    store: PayloadStore,
    client: BaseClient,
    pointer: S3Pointer,
    received: Received,
    url: str | None,
) -> str | PayloadUnavailable:
    size = size_in(received.message.get("MessageAttributes"))
    try:
        return store.fetch(client, pointer, size, url)
    except PayloadUnavailable as unavailable:
        return unavailable


def _log_refused(received: Received, refused: PayloadRefused) -> None:
    """A WARNING at the message's first receive; its later receives at DEBUG.

    Stateless, so once across the workers: each receive is released for the redrive
    policy, and a flood of such messages must not flood the log as well.
    """
    first = received.lease is None or received.lease.receive_count <= 1
    logger.log(
        logging.WARNING if first else logging.DEBUG,
        "Refused the S3 pointer of message %s to %s: %s. The object is neither read nor "
        "deleted; the message is released with a backoff, for the queue's dead-letter "
        "queue (redrive policy).",
        received.message.get("MessageId"),
        refused.pointer,
        refused.code,
    )
