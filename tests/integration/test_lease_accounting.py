"""Every lease a receive starts is ended by the ack of its message: none is left renewing.

A lease the channel can no longer reach (its message acked and deleted, the Lease object
still in the manager's book) is renewed a lease later on a deleted message: SQS answers
``InvalidParameterValue`` and the worker logs "Lost the SQS lease" for a task that ran
and was acked long ago (benchmarks/README.md, "An anomaly seen once", at ``da1fd44``).

These tests drive the real transport in this process: a kombu connection on a kombu
event loop (the worker's asynchronous receive path), over HTTP to the strict server.
Messages are acked only once every message has been delivered, as with
``task_acks_late`` and a prefetch window, so that a second receive of a message is
always processed while the first one is still held. Each scenario feeds the channel one
way a message can reach it twice before its ack:

- ``same answer twice``: one ReceiveMessage answer handed to ``_on_messages_ready`` twice;
- ``redelivery``: SQS hands out a message the channel still holds, with a new receipt.

Then the manager must hold no lease of the queue, and a renewal pass run as if a whole
lease had gone by must send no visibility change for any deleted message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from kombu import Connection, Consumer, Exchange, Queue
from kombu.asynchronous import Hub, set_event_loop

from celery_sqs_heartbeat.leasing.manager import VisibilityExtensionManager
from celery_sqs_heartbeat.process import this_process
from celery_sqs_heartbeat.testing import StrictSQSServer

MESSAGES = 12
LEASE = 30
THRESHOLD = 10
#: How long a scenario may take to deliver, ack and have every delete confirmed.
DEADLINE = 20.0


@dataclass
class Run:
    """One scenario's queue, connection, event loop and what the consumer was handed."""

    server: StrictSQSServer
    queue_name: str
    queue_url: str
    hub: Hub
    connection: Connection
    channel: Any
    delivered: list[Any] = field(default_factory=list)

    def events(self, action: str) -> list[dict[str, Any]]:
        return [
            dict(event)
            for event in self.server.events()
            if event["queue"] == self.queue_name and event["action"] == action
        ]

    def numbers(self) -> set[int]:
        """The messages the consumer was handed, each counted once."""
        return {message.payload["number"] for message in self.delivered}

    def deleted(self) -> set[str]:
        return {e["message_id"] for e in self.events("delete") if e["result"] == "ok"}

    def turn_until(self, done: Callable[[], bool], seconds: float = DEADLINE) -> bool:
        """Run the event loop until ``done()``; False if ``seconds`` ran out first."""
        loop = self.hub.create_loop()
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() >= deadline:
                return False
            next(loop)
        return True


@pytest.fixture
def run(sqs_server: StrictSQSServer) -> Iterator[Run]:
    queue_name = f"lease-accounting-{uuid.uuid4().hex[:12]}"
    sqs = boto3.client("sqs", **sqs_server.boto3_kwargs)
    queue_url = sqs.create_queue(
        QueueName=queue_name, Attributes={"VisibilityTimeout": str(LEASE)}
    )["QueueUrl"]
    hub = Hub()
    set_event_loop(hub)  # kombu's SQS channel and its HTTP client take it when made
    connection = Connection(
        f"sqs://{sqs_server.ACCESS_KEY}:{sqs_server.ACCESS_KEY}@127.0.0.1:{sqs_server.port}",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={
            "region": "us-east-1",
            "is_secure": False,
            "wait_time_seconds": 1,
            "polling_interval": 0,
            "visibility_timeout": LEASE,
            "visibility_extension_threshold": THRESHOLD,
        },
    )
    channel = connection.channel()
    try:
        yield Run(sqs_server, queue_name, queue_url, hub, connection, channel)
    finally:
        channel.close()
        connection.release()
        hub.close()
        set_event_loop(None)
        sqs.delete_queue(QueueUrl=queue_url)


def held_leases(manager: VisibilityExtensionManager, queue_name: str) -> list[str]:
    """The leases of ``queue_name`` the manager is renewing, described."""
    if hasattr(manager, "leases"):
        return [f"{s.task_name}[{s.task_id}]" for s in manager.leases() if s.queue == queue_name]
    # Before the manager could list its leases (da1fd44): read its book.
    return [
        lease.describe()
        for leases in manager._book._by_queue.values()
        for lease in leases.values()
        if lease.queue.name == queue_name
    ]


def renew_as_if_a_lease_went_by(manager: VisibilityExtensionManager) -> None:
    """One renewal pass with the manager's clock a lease later: every held lease is due."""
    real_clock = manager.clock
    manager.clock = lambda: real_clock() + LEASE - 5
    try:
        manager.check()
    finally:
        manager.clock = real_clock


def same_answer_twice(run: Run) -> None:
    deliver = run.channel._on_messages_ready

    def twice(queue: str, qname: str, messages: Any) -> Any:
        again = {**messages, "Messages": [dict(m) for m in messages.get("Messages") or []]}
        deliver(queue, qname, messages)
        return deliver(queue, qname, again)

    run.channel._on_messages_ready = twice


def no_trigger(run: Run) -> None:
    pass


@pytest.mark.parametrize(
    "trigger",
    [no_trigger, same_answer_twice],
    ids=["plain", "same answer twice"],
)
def test_every_lease_ends_with_the_ack_of_its_message(
    run: Run, trigger: Callable[[Run], None]
) -> None:
    trigger(run)
    consume(run)
    assert run.turn_until(lambda: len(run.numbers()) == MESSAGES), "not every message came"
    # Late acks: every message is in hand before the first is acked.
    ack_and_check(run)


def test_a_redelivery_of_a_held_message_leaves_no_lease_behind(run: Run) -> None:
    """SQS hands out messages the channel still holds (their lease lapsed, say)."""
    sqs = boto3.client("sqs", **run.server.boto3_kwargs)
    lapsed: set[str] = set()

    def lapse(body: Any, message: Any) -> None:
        message_id = message.delivery_info["sqs_message"]["MessageId"]
        if message_id not in lapsed:
            lapsed.add(message_id)
            sqs.change_message_visibility(
                QueueUrl=run.queue_url, ReceiptHandle=message.delivery_tag, VisibilityTimeout=0
            )

    consume(run, also=lapse)

    def every_message_received_twice() -> bool:
        receives = [e["message_id"] for e in run.events("receive")]
        return len(set(receives)) == MESSAGES and all(receives.count(m) >= 2 for m in receives)

    assert run.turn_until(every_message_received_twice), "SQS did not hand them out again"
    ack_and_check(run)


def consume(run: Run, also: Callable[[Any, Any], None] | None = None) -> None:
    queue = Queue(run.queue_name, Exchange(run.queue_name, type="direct"), run.queue_name)
    with run.connection.Producer() as producer:
        for number in range(MESSAGES):
            producer.publish(
                {"number": number},
                exchange=queue.exchange,
                routing_key=run.queue_name,
                declare=[queue],  # kombu routes by bindings it keeps in memory
                serializer="json",
                headers={"id": f"task-{number}", "task": "lease_accounting.noop"},
            )

    def hold(body: Any, message: Any) -> None:
        run.delivered.append(message)
        if also is not None:
            also(body, message)

    consumer = Consumer(run.channel, [queue], callbacks=[hold], accept=["json"])
    # Room for every message twice: a full window would stop the polls that redeliver.
    consumer.qos(prefetch_count=3 * MESSAGES)
    consumer.consume()


def ack_and_check(run: Run) -> None:
    manager = this_process().manager
    for message in run.delivered:
        if not message.acknowledged:
            message.ack()
    assert run.turn_until(lambda: len(run.deleted()) == MESSAGES), "not every message deleted"
    # A delete may be confirmed a moment after SQS has done it.
    run.turn_until(lambda: not held_leases(manager, run.queue_name), seconds=3)
    assert held_leases(manager, run.queue_name) == [], "leases left renewing after every ack"
    changes_before = len(run.events("change_visibility"))

    renew_as_if_a_lease_went_by(manager)

    deleted = run.deleted()
    renewals_of_deleted = [
        e for e in run.events("change_visibility")[changes_before:] if e["message_id"] in deleted
    ]
    assert renewals_of_deleted == []
    numbers = sorted(message.payload["number"] for message in run.delivered)
    assert numbers == list(range(MESSAGES)), "each message is handed to the consumer once"
