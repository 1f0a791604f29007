"""A queue declared with a message TTL, such as a monitor's event queue, keeps its messages
that long on SQS, not four days: a killed monitor's queue holds at most a minute of events."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery
from kombu import Queue

from tests.integration.harness import Bed

#: Makes one queue to declare from a Celery app and its connection, as its consumer would.
MakeQueue = Callable[[Celery, Any], Queue]


def declare(bed: Bed, *makers: MakeQueue) -> list[str]:
    """Declare each queue through a Celery app of this transport; their SQS names."""
    with bed.client_app("monitor") as app, app.connection_for_read() as connection:
        channel = connection.default_channel
        names = []
        for make in makers:
            queue = make(app, connection)(channel)
            queue.queue_declare()
            names.append(channel.canonical_queue_name(queue.name))
        return names


def retention(bed: Bed, url: str) -> str:
    answer = bed.sqs().get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod"])
    return str(answer["Attributes"]["MessageRetentionPeriod"])


def test_an_event_queue_keeps_a_minute_a_mailbox_its_ttl_and_a_plain_queue_sqs_default(
    bed: Bed,
) -> None:
    node = uuid.uuid4().hex
    events, mailbox, plain = declare(
        bed,
        # Celery's event receiver, as `celery events` and Flower make it: a 5-second TTL.
        lambda app, connection: app.events.Receiver(connection, node_id=node).queue,
        # A worker's mailbox: kombu gives it Celery's 300-second ``control_queue_ttl``.
        lambda app, connection: app.control.mailbox(connection).get_queue(f"w{node}@host"),
        lambda app, connection: Queue(f"plain-{node}"),
    )
    sqs = bed.sqs()
    reference = sqs.create_queue(QueueName=f"ref-{node}")["QueueUrl"]
    urls = [reference] + [
        sqs.get_queue_url(QueueName=name)["QueueUrl"] for name in (events, mailbox, plain)
    ]
    try:
        sqs_default, *declared = [retention(bed, url) for url in urls]
    finally:
        for url in urls:
            sqs.delete_queue(QueueUrl=url)

    assert declared == ["60", "300", sqs_default]
    assert sqs_default not in ("60", "300")
