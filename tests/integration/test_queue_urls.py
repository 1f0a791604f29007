"""A queue deleted and declared again is made anew, not looked up at its old URL.

A remote-control reply queue is named the same for every call from one thread, declared
on the connection that publishes the request, and deleted (by kombu after each call, by
this transport once idle) on the one that collected the replies: kombu's connection pool
may hand out either next time. The strict server refuses a name deleted less than a
minute before, as SQS does; the tests skip that minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kombu import Connection, Exchange, Queue

from tests.integration.harness import Bed

#: A reply queue as kombu's Mailbox names it: with dots, which SQS names turn into "-".
REPLY = Queue("4f1c2e.reply.celery.pidbox", Exchange("reply.celery.pidbox", "direct"), "4f1c2e")


@contextmanager
def connection(bed: Bed) -> Iterator[Connection]:
    with Connection(
        bed.server.broker_url,
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1", "is_secure": False},
    ) as opened:
        yield opened


def remaining(bed: Bed) -> list[str]:
    return list(bed.sqs().list_queues(QueueNamePrefix="4f1c2e").get("QueueUrls", []))


def test_a_deleted_queue_is_declared_again_on_the_same_connection(bed: Bed) -> None:
    with connection(bed) as one:
        queue = REPLY(one.default_channel)
        for _ in range(2):
            queue.declare()
            queue.delete()
            # As a minute later: SQS refuses the name of a queue deleted just before.
            bed.server.forget_deleted_queues()
    assert remaining(bed) == []


def test_a_queue_another_connection_deleted_is_declared_again(bed: Bed) -> None:
    with connection(bed) as publisher, connection(bed) as collector:
        REPLY(publisher.default_channel).declare()
        queue = REPLY(collector.default_channel)
        queue.declare()
        queue.delete()
        bed.server.forget_deleted_queues()
        assert remaining(bed) == []
        # The publisher's connection still has the deleted queue's URL cached.
        REPLY(publisher.default_channel).declare()
    assert len(remaining(bed)) == 1
