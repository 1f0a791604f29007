"""kombu's SQS channel, with bodies too large for SQS sent through S3 and read back.

Sending: every message kombu publishes (``delay()``, ``apply_async``, retries, chains,
the worker's own publishing) goes out through the channel's ``_put`` and the queue's SQS
client; a botocore hook on that client's SendMessage
(:meth:`~celery_sqs_heartbeat.payload_store.PayloadStore.offload`) moves a large body to
S3 and sends the pointer instead. Smaller messages are not touched.

Receiving: a pointer is replaced by its object's body before kombu decodes the message,
and after the lease was born, so the lease covers the S3 read.

- On the event loop (prefork, threads, solo), the objects of a batch are read on a
  thread of its own, and the batch is handed to kombu on the loop once they are, so the
  loop never waits for S3. Meanwhile the loop goes on receiving, and the messages being
  read count against the prefetch window (:class:`ReadingQoS`).
- On the blocking path (gevent, eventlet), the read is made where kombu turns the batch
  into messages, after the leases were taken.

A message whose object cannot be read is released with a backoff that grows with its
receive count, so a redrive policy ends the retries of an object gone for good.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from queue import Empty
from typing import TYPE_CHECKING, Any, cast

from botocore.client import BaseClient
from kombu.asynchronous import Hub
from kombu.transport import SQS
from kombu.utils.objects import cached_property

from .compat import LoopWaker
from .payload_store import PayloadStore, PayloadUnavailable
from .payloads import S3Pointer, pointer_in, unavailable_release_delay
from .receive_loop import ReceivingChannel

if TYPE_CHECKING:
    from .lease_table import LeaseTable
    from .leases import Lease
    from .manager import VisibilityExtensionManager

__all__ = ["PayloadChannel", "ReadingQoS"]

#: What a read gave, by the message's place in its batch.
Reads = dict[int, "str | PayloadUnavailable"]


class ReadingQoS(SQS.QoS):
    """kombu's SQS QoS, counting the messages whose bodies are being read as taken."""

    channel: PayloadChannel

    def can_consume(self) -> bool:
        estimate = self.can_consume_max_estimate()
        return estimate is None or estimate > 0

    def can_consume_max_estimate(self) -> int | None:
        estimate: int | None = super().can_consume_max_estimate()
        if estimate is None:
            return None
        return max(estimate - self.channel.messages_reading, 0)


class PayloadChannel(ReceivingChannel):
    """Large bodies through S3, on the channel's send and both of its receive paths."""

    # The lease-holding channel built on this one (celery_sqs_heartbeat.transport.Channel).
    lease_table: LeaseTable
    manager: VisibilityExtensionManager
    _release_unclaimed: Callable[[], None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Received messages whose batch waits for its reads: they count against the
        #: prefetch window (:class:`ReadingQoS`) until they are handed to kombu.
        self.messages_reading = 0
        #: Their leases, set aside from the lease table until the batch is handed over.
        self._leases_reading: set[Lease] = set()

    @cached_property
    def payloads(self) -> PayloadStore:
        store: PayloadStore = self.connection.payload_store
        return store

    def sqs(self, queue: str | None = None) -> BaseClient:
        """kombu's client for ``queue``, which sends large bodies through S3."""
        client = super().sqs(queue=queue)
        if self.payloads.options is not None:
            client.meta.events.register(
                "provide-client-params.sqs.SendMessage",
                partial(self.payloads.offload, client),
                unique_id="celery_sqs_heartbeat.large_payloads",
            )
        return client

    def _on_messages_ready(self, queue: str, qname: str, messages: Any) -> Any:
        """The asynchronous receive: a batch with pointers waits for its reads, off the loop.

        Its leases, born already, are set aside meanwhile, so that the channel does not
        take them for messages no consumer claimed.
        """
        received = messages.get("Messages") or []
        pointers = self._pointers(received)
        if not pointers or qname not in self.connection._callbacks:
            return super()._on_messages_ready(queue, qname, messages)
        store = self.payloads
        leases = {lease.receipt_handle: lease for lease in self.lease_table.take_unclaimed()}
        client = self.sqs(queue=self.canonical_queue_name(qname))
        waker = LoopWaker.of(cast(Hub, self.hub))
        self.messages_reading += len(received)
        self._leases_reading.update(leases.values())

        def read() -> None:
            reads = {index: _read(store, client, pointer) for index, pointer in pointers.items()}
            waker.call_soon(self._objects_read, queue, qname, received, pointers, leases, reads)

        threading.Thread(target=read, name="celery-sqs-heartbeat-s3-read", daemon=True).start()
        return len(received)

    def _objects_read(
        self,
        queue: str,
        qname: str,
        received: list[dict[str, Any]],
        pointers: dict[int, S3Pointer],
        leases: dict[str, Lease],
        reads: Reads,
    ) -> None:
        """On the loop: hand the batch to kombu, as if it had just arrived."""
        self.messages_reading -= len(received)
        self._leases_reading.difference_update(leases.values())
        readable: list[dict[str, Any]] = []
        try:
            readable = self._settle_reads(received, pointers, reads, leases.get)
            for message in list(readable):
                lease = leases.get(message.get("ReceiptHandle") or "")
                if lease is None:
                    continue
                if lease.ended:
                    # Released at the channel's close while its body was being read.
                    readable.remove(message)
                else:
                    self.lease_table.admit(lease)
            if not self.closed and qname in self.connection._callbacks:
                super()._on_messages_ready(queue, qname, {"Messages": readable})
        finally:
            self._release_unclaimed()
            if len(readable) < len(received) and not self.closed:
                self.prefetch_room_freed()

    def close(self) -> None:
        """Messages still being read go back to SQS: no consumer is left to take them."""
        leaving, self._leases_reading = self._leases_reading, set()
        if leaving:
            self.manager.release([(lease, 0) for lease in leaving], "shutdown")
        super().close()

    def _settle_reads(
        self,
        received: list[dict[str, Any]],
        pointers: dict[int, S3Pointer],
        reads: Reads,
        lease_of: Callable[[str], Lease | None],
    ) -> list[dict[str, Any]]:
        """The messages with their bodies; those whose object could not be read released."""
        readable: list[dict[str, Any]] = []
        unreadable: list[Lease] = []
        for index, message in enumerate(received):
            lease = lease_of(message.get("ReceiptHandle") or "")
            outcome = reads.get(index)
            if isinstance(outcome, PayloadUnavailable):
                if lease is not None:
                    # Released here, with its backoff: not as a message never delivered.
                    self.lease_table.take_received(lease.receipt_handle)
                    unreadable.append(lease)
                continue
            if outcome is not None:
                message["Body"] = outcome
                if lease is not None:
                    self.payloads.remember(lease, pointers[index])
            readable.append(message)
        self._release_unreadable(unreadable)
        return readable

    def _release_unreadable(self, leases: list[Lease]) -> None:
        if leases:
            self.manager.release(
                [(lease, unavailable_release_delay(lease.receive_count)) for lease in leases],
                "payload unavailable",
            )

    def _messages_to_python(self, messages: list[dict[str, Any]], queue: str) -> Any:
        """The blocking receive: objects are read here, after the leases were taken."""
        pointers = self._pointers(messages)
        if pointers:
            store = self.payloads
            client = self.sqs(queue=self.canonical_queue_name(queue))
            reads = {index: _read(store, client, pointer) for index, pointer in pointers.items()}
            messages = self._settle_reads(messages, pointers, reads, self.lease_table.received)
            if not messages:
                raise Empty()
        return super()._messages_to_python(messages, queue)

    def _pointers(self, messages: list[dict[str, Any]]) -> dict[int, S3Pointer]:
        found = {
            index: pointer_in(message.get("Body") or "") for index, message in enumerate(messages)
        }
        return {index: pointer for index, pointer in found.items() if pointer is not None}


def _read(store: PayloadStore, client: BaseClient, pointer: S3Pointer) -> str | PayloadUnavailable:
    try:
        return store.fetch(client, pointer)
    except PayloadUnavailable as unavailable:
        return unavailable
