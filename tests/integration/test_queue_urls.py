"""A queue deleted and declared again on one connection is made anew, not looked up at
its old URL (a remote-control reply queue is, on every call from one thread)."""

from __future__ import annotations

from kombu import Connection, Exchange, Queue

from .harness import Bed

#: A reply queue as kombu's Mailbox names it: with dots, which SQS names turn into "-".
REPLY_QUEUE = "4f1c2e.reply.celery.pidbox"


def test_a_deleted_queue_is_declared_again_on_the_same_connection(bed: Bed) -> None:
    options = {"region": "us-east-1", "is_secure": False}
    with Connection(
        bed.server.broker_url,
        transport="celery_sqs_heartbeat:Transport",
        transport_options=options,
    ) as connection:
        reply = Queue(REPLY_QUEUE, Exchange("reply.celery.pidbox", "direct"), "4f1c2e")
        queue = reply(connection.default_channel)
        for _ in range(2):
            queue.declare()
            queue.delete()
    urls = bed.sqs().list_queues(QueueNamePrefix="4f1c2e").get("QueueUrls", [])
    assert urls == []
