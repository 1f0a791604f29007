"""The transport's Channel on its own: kombu's real channel, a fake SQS, a hand-driven manager.

The channel is made as a worker makes it (a kombu ``Connection`` with a predefined queue,
so nothing is asked of SQS at start-up); every call that would reach SQS goes to
:class:`FakeSQS` instead, and the manager is driven by ``check()`` and a fake clock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from queue import Empty
from typing import Any

import pytest
from botocore.exceptions import ClientError
from celery.concurrency.base import BasePool
from celery.signals import task_received
from celery.worker import state as worker_state
from kombu import Connection
from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Entry
from kombu.transport import SQS
from vine import ppartial, promise

from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease
from celery_sqs_heartbeat.leasing.manager import VisibilityExtensionManager
from celery_sqs_heartbeat.monitoring.metrics import LeaseMetrics
from celery_sqs_heartbeat.payloads import reader as payload_reader
from celery_sqs_heartbeat.payloads.pointers import SIZE_ATTRIBUTE, S3Pointer
from celery_sqs_heartbeat.process import ProcessState, this_process
from celery_sqs_heartbeat.receiving.receiver import Receiver
from celery_sqs_heartbeat.settling import celery_requests
from celery_sqs_heartbeat.transport import Channel
from tests.unit.conftest import Consumer, FakeClock, Settle

URL = "http://127.0.0.1:9/123456789012/jobs"
#: SQSQueue's own delete, before a test's fake SQS replaces it.
REAL_DELETE = SQSQueue.delete
TASK = "proj.tasks.report"


class FakeSQS:
    """What the channel's leases ask of SQS, recorded and answered OK."""

    def __init__(self) -> None:
        self.visibility_changes: list[tuple[str, int]] = []
        self.deletes: list[str] = []
        self.copies: list[str] = []
        #: What each fresh copy was sent with, after its receipt handle.
        self.copies_sent: list[tuple[Any, ...]] = []
        self.redrive_policy = False
        #: Visibility changes SQS refuses, by receipt handle.
        self.refusals: dict[str, tuple[EntryResult, str]] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        def change_visibility(_: SQSQueue, entries: Any) -> Any:
            fake.visibility_changes += [
                (lease.receipt_handle, seconds) for lease, seconds in entries
            ]
            ok = (EntryResult.OK, "")
            return {lease: fake.refusals.get(lease.receipt_handle, ok) for lease, _ in entries}

        def delete(_: SQSQueue, leases: Any) -> Any:
            fake.deletes += [lease.receipt_handle for lease in leases]
            return {lease: (EntryResult.OK, "") for lease in leases}

        def send_copies(_: SQSQueue, copies: Any) -> Any:
            fake.copies += [entry[0].receipt_handle for entry in copies]
            fake.copies_sent += [tuple(entry[1:]) for entry in copies]
            return {entry[0]: (EntryResult.OK, "") for entry in copies}

        monkeypatch.setattr(SQSQueue, "change_visibility", change_visibility)
        monkeypatch.setattr(SQSQueue, "delete", delete)
        monkeypatch.setattr(SQSQueue, "send_copies", send_copies)
        monkeypatch.setattr(SQSQueue, "has_redrive_policy", lambda _: fake.redrive_policy)


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> FakeSQS:
    fake = FakeSQS()
    fake.install(monkeypatch)
    return fake


OpenChannel = Callable[..., tuple[Channel, list[Any]]]


@pytest.fixture
def open_channel(
    manager: VisibilityExtensionManager, sqs: FakeSQS, monkeypatch: pytest.MonkeyPatch
) -> Iterator[OpenChannel]:
    """Open a consuming channel (a worker's connection); each call is a new connection."""
    # Closing a channel waits for the manager's thread to send what is pending; this
    # manager has no thread, so a flush is one synchronous check.
    monkeypatch.setattr(manager, "flush", lambda timeout: manager.check() or 0)
    opened: list[Channel] = []

    def open_one(**options: Any) -> tuple[Channel, list[Any]]:
        channel, delivered = consuming_channel(manager, **options)
        opened.append(channel)
        return channel, delivered

    yield open_one
    for channel in opened:
        if not channel.closed:
            channel.close()


def consuming_channel(
    manager: VisibilityExtensionManager, **options: Any
) -> tuple[Channel, list[Any]]:
    """A new connection's channel consuming the predefined queue, and what it delivers."""
    queue = {"url": URL, **options.pop("queue", {})}
    connection = Connection(
        "sqs://key:secret@127.0.0.1:9/",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1", "predefined_queues": {"jobs": queue}, **options},
    )
    connection.transport.manager = manager
    channel = connection.channel()
    delivered: list[Any] = []
    channel.basic_consume("jobs", False, delivered.append, "consumer")
    return channel, delivered


def sqs_message(
    channel: Channel, handle: str, eta_in: float | None = None, receive_count: int = 1
) -> dict[str, Any]:
    """A task message as SQS answers a receive: one message id, ``handle`` its receipt."""
    eta = None
    if eta_in is not None:
        eta = (datetime.now(timezone.utc) + timedelta(seconds=eta_in)).isoformat()
    headers = {"id": "task-1", "task": TASK, "eta": eta, "expires": None}
    # As kombu publishes it: the routing key is what ties it to its predefined queue.
    properties = {"delivery_info": {"exchange": "jobs", "routing_key": "jobs"}}
    body = channel.prepare_message(
        json.dumps([[], {}, {}]), 0, "application/json", "utf-8", headers, properties
    )
    return {
        "MessageId": "message-1",
        "ReceiptHandle": handle,
        "Body": json.dumps(body),
        "Attributes": {"ApproximateReceiveCount": str(receive_count)},
    }


def receive(channel: Channel, *messages: dict[str, Any]) -> None:
    """An answer to the event loop's long poll, as kombu hands it to the channel."""
    channel._on_messages_ready(URL, "jobs", {"Messages": list(messages)})


def wait_for_copy_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "sqs-park-copies":
            thread.join(5)


def test_a_held_countdown_received_again_on_a_dead_letter_queue_is_adopted_not_copied(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    """Issue 24, item 7: parking sent a fresh copy before the check for a held message,
    so the copy and the held task both ran at the ETA."""
    sqs.redrive_policy = True
    channel, delivered = open_channel()
    receive(channel, sqs_message(channel, "first", eta_in=60))
    assert [m.delivery_tag for m in delivered] == ["first"]

    # Its lease lapsed (an outage) and SQS hands it to this worker again.
    receive(channel, sqs_message(channel, "second", eta_in=60, receive_count=2))
    wait_for_copy_threads()

    assert [m.delivery_tag for m in delivered] == ["first"]
    assert sqs.copies == []
    held = channel.lease_table.get("first")
    assert held is not None and held.receipt_handle == "second"
    assert len(manager) == 1


def test_a_far_countdown_is_parked_at_the_receive_and_its_lease_ends(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    channel, delivered = open_channel()
    receive(channel, sqs_message(channel, "far", eta_in=3600))
    # A park waits up to half a lease for company in its call.
    clock.advance(15)
    manager.check()
    assert delivered == []
    assert len(manager) == 0 and len(channel.lease_table) == 0
    [(handle, seconds)] = sqs.visibility_changes
    assert handle == "far" and 3000 < seconds < 3600


def test_renewals_after_a_reconnect_go_through_the_live_connections_client(
    open_channel: OpenChannel,
) -> None:
    """Issue 24, item 8: a task still running after a reconnect was renewed with the
    closed channel's client, whose STS credentials kombu no longer refreshes."""
    first, _ = open_channel()
    receive(first, sqs_message(first, "running"))
    lease = first.lease_table.get("running")
    assert lease is not None
    first.close()

    second, _ = open_channel()
    receive(second, sqs_message(second, "next"))

    live = this_process().clients.renewal(second.sqs(queue="jobs"))
    assert lease.queue._client_source() is live  # type: ignore[attr-defined]


class Request:
    """What the transport reads of a Celery request: ``settled`` is "ack", "reject" or None."""

    def __init__(self, message: Any, settled: str | None) -> None:
        self.id = "task-1"
        self.message = message
        self.acknowledged = settled is not None
        self.on_ack = Settle(settled == "ack")
        self.on_reject = Settle(settled == "reject")
        self._apply_result = None


def closed_with(open_channel: OpenChannel, settled: str | None) -> tuple[Channel, Any]:
    """A channel closed (a reconnect) while its one message's request was ``settled``."""
    channel, delivered = open_channel(ack_batch_interval=0)
    receive(channel, sqs_message(channel, "ended"))
    task_received.send(sender=Consumer(), request=Request(delivered[0], settled))
    channel.close()
    return channel, delivered[0]


def test_a_task_whose_ack_is_still_queued_at_a_reconnect_is_deleted_not_released(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    """Issue 24, found by the crossing suite: Celery queues a finished task's ack on the
    event loop; a reconnect that closed the channel before it ran released the message,
    and it ran again wherever SQS handed it. kombu's Hub may drop that queued ack (when a
    callback before it raises), so the close acks without waiting for it."""
    channel, _ = closed_with(open_channel, "ack")
    manager.check()

    assert sqs.visibility_changes == []
    assert sqs.deletes == ["ended"]
    assert not channel.celery_requests.will_run("ended", None)  # forgotten with its delivery


def test_the_queued_ack_that_runs_after_the_close_sends_nothing_more(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    _, message = closed_with(open_channel, "ack")
    message.ack()
    manager.check()

    assert sqs.deletes == ["ended"]


def test_a_task_whose_reject_is_still_queued_at_a_reconnect_stays_held_for_it(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    """A reject may mean a release or a delete (requeue, release_on_failure, a dead-letter
    queue, the kombu release): what it means is the reject's to say, when it runs."""
    channel, message = closed_with(open_channel, "reject")
    manager.check()
    held = channel.lease_table.get("ended") is not None
    message.reject()
    manager.check()

    assert held
    assert channel.lease_table.get("ended") is None
    assert sqs.visibility_changes == []
    # kombu 5.7 deletes a message rejected without requeue; 5.5 and 5.6 leave it to its lease.
    deletes_rejected = hasattr(SQS.Channel, "_delete_rejected_message")
    assert sqs.deletes == (["ended"] if deletes_rejected else [])


def test_a_prefetched_task_of_a_prefork_pool_is_released_at_a_reconnect(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    """The other side: a request the pool dropped at its flush goes back to SQS at once."""
    closed_with(open_channel, None)
    manager.check()

    assert sqs.visibility_changes == [("ended", 0)]
    assert sqs.deletes == []


class ThreadsPool:
    """A pool whose ``flush()`` is the base pool's, as Celery's threads and gevent pools have."""

    flush = BasePool.flush


class Greenlet:
    """A green timer's greenlet, as the transport reads it: the entry it runs."""

    def __init__(self, request: Any) -> None:
        self.entry = Entry(lambda request: None, (request,))


class GreenTimer:
    """Celery's gevent (and eventlet) timer: a set of greenlets, one for each countdown,
    each kept until its entry returns (while it waits in a full pool's ``spawn`` too)."""

    def __init__(self) -> None:
        self._queue: set[Greenlet] = set()

    def carry(self, request: Any) -> None:
        self._queue.add(Greenlet(request))


class GreenConsumer:
    """A gevent worker's consumer: its pool's ``flush()`` is the base pool's, and its timer
    runs each countdown in a greenlet."""

    def __init__(self) -> None:
        self.pool = ThreadsPool()
        self.timer = GreenTimer()


def closed_with_a_countdown(
    open_channel: OpenChannel,
    consumer: Any,
    celery_version: tuple[int, int],
    due: bool,
    carried: bool = True,
) -> Channel:
    """A channel of a worker on ``celery_version`` closed while its one message's countdown
    was in ``consumer``'s timer: ``due`` (Celery reserved it, and it waits for a free slot)
    or not yet. The close comes before Celery's ``on_close``, as it does."""
    channel, delivered = open_channel(ack_batch_interval=0)
    receive(channel, sqs_message(channel, "countdown"))
    request = Request(delivered[0], settled=None)
    task_received.send(sender=consumer, request=request)
    timer = getattr(consumer, "timer", None)
    if timer is not None and carried:
        timer.carry(request)
    scheduled = set() if due else {request}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(celery_requests, "CELERY_VERSION", (*celery_version, 0, "", ""))
        if celery_version >= (5, 7):
            patch.setattr(worker_state, "scheduled_requests", scheduled, raising=False)
        else:
            patch.delattr(worker_state, "scheduled_requests", raising=False)
        channel.close()
    return channel


#: Whether a green pool's countdown still runs after the close, by Celery version and due or
#: not (:func:`celery_requests._green_timer_runs`); measured by test_reconnect.py.
GREEN_TIMER_RUNS = [
    ((5, 5), True, False),  # on_close clears the timer, killing the waiting greenlet too
    ((5, 5), False, False),
    ((5, 6), True, True),  # on_close leaves the timer's greenlets: each still runs
    ((5, 6), False, True),
    ((5, 7), True, True),  # on_close cancels the countdowns not yet due, and only those
    ((5, 7), False, False),
]


@pytest.mark.parametrize(("celery_version", "due", "runs"), GREEN_TIMER_RUNS)
def test_a_green_pools_countdown_is_held_at_a_reconnect_exactly_when_celery_still_runs_it(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    celery_version: tuple[int, int],
    due: bool,
    runs: bool,
) -> None:
    """The chaos soak, gevent on Celery 5.7: a countdown came due on a full pool, so its
    timer greenlet waited in the pool's ``spawn`` for a free slot, and a dropped connection
    released the message; it ran there and on the worker SQS handed it to. Released when
    Celery drops it, it is received again at once; held when Celery runs it, it runs once."""
    channel = closed_with_a_countdown(open_channel, GreenConsumer(), celery_version, due)
    manager.check()

    assert (channel.lease_table.get("countdown") is not None) is runs
    assert sqs.visibility_changes == ([] if runs else [("countdown", 0)])


@pytest.mark.parametrize("celery_version", [(5, 5), (5, 6), (5, 7)])
def test_a_countdown_of_the_event_loops_timer_is_released_at_a_reconnect(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    celery_version: tuple[int, int],
) -> None:
    """Prefork, threads, solo: the event loop's timer is emptied at a lost connection on
    every version, and what waits for the prefork pool's semaphore is dropped by
    ``on_close``: Celery runs none of it."""
    closed_with_a_countdown(open_channel, Consumer(), celery_version, due=True)
    manager.check()

    assert sqs.visibility_changes == [("countdown", 0)]


def test_a_green_pools_message_no_greenlet_carries_is_released_at_a_reconnect(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    """A greenlet of another countdown does not hold a message Celery will not run."""
    consumer = GreenConsumer()
    consumer.timer.carry(Request(None, settled=None))
    closed_with_a_countdown(open_channel, consumer, (5, 6), due=True, carried=False)
    manager.check()

    assert sqs.visibility_changes == [("countdown", 0)]


class HubConsumer:
    """A threads worker's consumer: an ack is queued on its event loop, as Celery queues it."""

    pool = ThreadsPool()

    def __init__(self) -> None:
        self.queued: list[Any] = []

    def call_soon_ack(self, p: Any, *args: Any) -> Any:
        queued = ppartial(p, *args)
        self.queued.append(queued)
        return queued


def task_ending_while_the_worker_stops(
    open_channel: OpenChannel, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, HubConsumer]:
    """A task ends during a warm shutdown: its ack is queued on a loop that no longer turns."""
    channel, delivered = open_channel(ack_batch_interval=0)
    receive(channel, sqs_message(channel, "ended"))
    consumer = HubConsumer()
    message = delivered[0]
    request = Request(message, settled=None)
    request.on_ack = promise(consumer.call_soon_ack, (message.ack_log_error,))
    task_received.send(sender=consumer, request=request)
    monkeypatch.setattr(worker_state, "should_stop", 0)  # SIGTERM: Celery sets EX_OK
    request.on_ack(logging.getLogger("celery.worker.request"), ())  # Request.acknowledge
    return message, consumer


def test_a_task_ending_during_a_warm_shutdown_is_deleted_before_its_queued_ack_runs(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33: a threads worker sent the delete only at the close, after every task ended;
    a SIGKILL after the grace period, and the task ran again elsewhere."""
    task_ending_while_the_worker_stops(open_channel, monkeypatch)
    manager.check()

    assert sqs.deletes == ["ended"], "no delete while the ack waits on the event loop"


def test_the_queued_ack_that_runs_after_the_shutdown_ack_sends_nothing_more(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    message, consumer = task_ending_while_the_worker_stops(open_channel, monkeypatch)
    manager.check()
    (queued,) = consumer.queued
    queued()  # the event loop turns once more before the channel closes
    manager.check()

    assert sqs.deletes == ["ended"]
    assert message.acknowledged
    # Celery's dispatcher reports handlers of other modules (the example app's
    # task_received, once its tests were collected), which get this test's fake request.
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name != "celery.utils.dispatch.signal"
    ]
    assert logged == []


def test_a_task_ending_while_the_worker_runs_leaves_its_ack_to_the_event_loop(
    open_channel: OpenChannel, sqs: FakeSQS, manager: VisibilityExtensionManager
) -> None:
    channel, delivered = open_channel(ack_batch_interval=0)
    receive(channel, sqs_message(channel, "ended"))
    consumer = HubConsumer()
    request = Request(delivered[0], settled=None)
    request.on_ack = promise(consumer.call_soon_ack, (delivered[0].ack_log_error,))
    task_received.send(sender=consumer, request=request)
    request.on_ack(logging.getLogger("celery.worker.request"), ())
    manager.check()
    held = sqs.deletes == []
    (queued,) = consumer.queued
    queued()
    manager.check()

    assert held
    assert sqs.deletes == ["ended"]


def test_a_solo_workers_task_is_deleted_as_celery_asks_not_behind_the_next_task(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chaos soak, solo: a task's ack, queued on the event loop, waited for the next
    task of the same receive (12 s) to end; its delete then failed in an outage past its
    lease, and the task ran again elsewhere."""
    monkeypatch.setattr(this_process(), "tasks_run_on_the_loop", True)
    channel, delivered = open_channel(ack_batch_interval=0)
    receive(channel, sqs_message(channel, "ended"))
    consumer = HubConsumer()  # solo's consumer queues the ack on its event loop too
    request = Request(delivered[0], settled=None)
    request.on_ack = promise(consumer.call_soon_ack, (delivered[0].ack_log_error,))
    task_received.send(sender=consumer, request=request)
    request.on_ack(logging.getLogger("celery.worker.request"), ())
    manager.check()
    deleted_at_once = sqs.deletes == ["ended"]
    (queued,) = consumer.queued
    queued()  # the loop turns once the next task ended
    manager.check()

    assert deleted_at_once
    assert sqs.deletes == ["ended"]
    assert delivered[0].acknowledged


BACKOFF = {"backoff_policy": {1: 5, 2: 60}, "backoff_tasks": [TASK]}


def test_a_backoff_task_is_released_after_its_backoff_through_the_manager(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 5: kombu set the backoff itself, synchronously and by the first
    receipt handle, before the lease was let go; when that raised (SQS down, a handle
    stale after an adoption), the rejected message stayed held and renewed for 12 hours."""

    def kombu_backoff(*_: Any) -> None:
        raise ConnectionError("SQS is down")

    monkeypatch.setattr(SQS.QoS, "apply_backoff_policy", kombu_backoff)
    channel, delivered = open_channel(queue=BACKOFF)
    receive(channel, sqs_message(channel, "failing"))

    channel.basic_reject(delivered[0].delivery_tag)
    clock.advance(1)  # a release waits up to ack_batch_interval for company
    manager.check()

    assert len(manager) == 0 and len(channel.lease_table) == 0
    assert sqs.visibility_changes == [("failing", 5)]


def test_a_reject_whose_kombu_path_raises_still_ends_the_lease(
    open_channel: OpenChannel, manager: VisibilityExtensionManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    def kombu_reject(*_: Any, **__: Any) -> None:
        raise ConnectionError("SQS is down")

    monkeypatch.setattr(SQS.QoS, "reject", kombu_reject)
    channel, delivered = open_channel()
    receive(channel, sqs_message(channel, "failing"))

    with pytest.raises(ConnectionError):
        channel.basic_reject(delivered[0].delivery_tag)

    assert len(manager) == 0 and len(channel.lease_table) == 0


def test_the_lease_of_a_received_message_is_born_before_its_steps(
    open_channel: OpenChannel, manager: VisibilityExtensionManager
) -> None:
    channel, delivered = open_channel()
    receive(channel, sqs_message(channel, "now"))
    [status] = manager.leases()
    assert (status.task_id, status.task_name, status.renewals) == ("task-1", TASK, 0)
    lease = channel.lease_table.get(delivered[0].delivery_tag)
    assert isinstance(lease, Lease) and lease.received_at == manager.clock()


def receive_blocking(
    channel: Channel,
    clock: FakeClock,
    answered_after: float,
    monkeypatch: pytest.MonkeyPatch,
    *messages: dict[str, Any],
) -> None:
    """A blocking receive (gevent, eventlet) whose answer is read ``answered_after`` later."""

    def receive_message(**_: Any) -> dict[str, Any]:
        clock.advance(answered_after)
        return {"Messages": list(messages)}

    monkeypatch.setattr(channel.sqs(queue="jobs"), "receive_message", receive_message)
    with contextlib.suppress(Empty):  # kombu's word for a receive that delivered nothing
        channel._get_bulk("jobs")


def test_a_lease_is_counted_from_when_its_receive_was_sent(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 2: the lease's clock started when the answer was read, after SQS
    had started it, so the worker reckoned it to last longer than it did."""
    channel, delivered = open_channel()
    sent_at = clock.now
    receive_blocking(channel, clock, 5, monkeypatch, sqs_message(channel, "in-time"))
    lease = channel.lease_table.get(delivered[0].delivery_tag)
    assert lease is not None
    assert (lease.received_at, lease.expires_at) == (sent_at, sent_at + 30)
    assert sqs.visibility_changes == []


def test_an_answer_read_after_its_lease_was_due_is_delivered_once_sqs_confirms_it(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    channel, delivered = open_channel()
    receive_blocking(channel, clock, 25, monkeypatch, sqs_message(channel, "late"))
    assert sqs.visibility_changes == [("late", 30)]
    assert [m.delivery_tag for m in delivered] == ["late"]
    [status] = manager.leases()
    assert status.expires_in == 30


def test_an_answer_read_after_its_lease_was_due_is_not_run_if_sqs_handed_it_out_meanwhile(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 24, item 2: a solo worker's loop, blocked by a long task, read an answer after
    the message's lease ran out; another worker had received and run it meanwhile, and
    then this one ran it too."""
    sqs.refusals["late"] = (EntryResult.LOST, "ReceiptHandleIsInvalid: expired")
    channel, delivered = open_channel()
    receive_blocking(channel, clock, 40, monkeypatch, sqs_message(channel, "late"))
    assert delivered == []
    assert len(manager) == 0 and len(channel.lease_table) == 0
    warnings = [r for r in caplog.records if "Not running 1 message(s)" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


@dataclass
class DeleteOnTheWire:
    """A channel whose one ack's delete is on the wire until ``answer`` is set."""

    channel: Channel
    manager: VisibilityExtensionManager
    answer: threading.Event


def delete_on_the_wire(monkeypatch: pytest.MonkeyPatch) -> DeleteOnTheWire:
    on_the_wire, answer = threading.Event(), threading.Event()

    def slow_delete(_: SQSQueue, leases: Any) -> Any:
        on_the_wire.set()
        answer.wait(30)
        return {lease: (EntryResult.OK, "") for lease in leases}

    monkeypatch.setattr(SQSQueue, "delete", slow_delete)
    manager = VisibilityExtensionManager()  # its own thread, on the real clock
    channel, delivered = consuming_channel(manager, ack_batch_interval=0)
    receive(channel, sqs_message(channel, "done"))
    channel.basic_ack(delivered[0].delivery_tag)
    assert on_the_wire.wait(5)
    return DeleteOnTheWire(channel, manager, answer)


def test_closing_a_channel_sends_what_is_pending_without_waiting_for_sqs(
    sqs: FakeSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24, item 9: closing a channel waited up to 10 s, twice, for the process's
    pending deletes: at a reconnect it held the event loop while SQS was failing."""
    pending = delete_on_the_wire(monkeypatch)

    closing = threading.Thread(target=pending.channel.close)
    closing.start()
    closing.join(5)
    returned_at_once = not closing.is_alive()
    pending.answer.set()

    assert returned_at_once
    assert pending.manager.stop(5) == 0


def test_closing_a_channel_at_a_workers_shutdown_waits_for_sqs(
    sqs: FakeSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold shutdown may end the process without the atexit flush: the releases of the
    messages Celery will not run must have landed by then."""
    state = pytest.importorskip("celery.worker.state")
    monkeypatch.setattr(state, "should_terminate", 1)
    pending = delete_on_the_wire(monkeypatch)

    closing = threading.Thread(target=pending.channel.close)
    closing.start()
    closing.join(1)
    waited = closing.is_alive()
    pending.answer.set()
    closing.join(5)

    assert waited and not closing.is_alive()
    assert pending.manager.stop(5) == 0


def test_a_batch_whose_steps_fail_off_the_loop_goes_back_and_frees_its_room(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in a step off the event loop must not keep the batch's room in the prefetch
    window for good, nor its leases renewed: the messages go back to SQS."""
    channel, delivered = open_channel(large_payload_bucket="tasks")

    def broken_read(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(payload_reader, "_read", broken_read)
    hub = Hub()
    channel.hub = hub
    message = sqs_message(channel, "large")
    message["Body"] = S3Pointer("tasks", "k-1").body()

    receive(channel, message)
    deadline = time.monotonic() + 10
    while channel.payload_reader.messages_reading and time.monotonic() < deadline:
        hub.run_once()
    manager.check()

    assert delivered == [] and channel.payload_reader.messages_reading == 0
    assert len(manager) == 0
    assert sqs.visibility_changes == [("large", 0)]


def join_receive_threads() -> None:
    for thread in threading.enumerate():
        if thread.name == "celery-sqs-heartbeat-receive":
            thread.join(10)


def test_a_late_answers_lease_released_by_a_close_during_its_confirmation_stays_released(
    sqs: FakeSQS, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, item 7: the channel closed while the renewal confirming a late answer was
    on the wire; its release went out before that renewal landed, and the answer then
    tracked the released lease: renewed, held and listed for the life of the process."""
    counters = LeaseMetrics()
    manager = VisibilityExtensionManager(clock=clock, metrics=counters)
    monkeypatch.setattr(manager, "_ensure_thread", lambda: None)
    monkeypatch.setattr(manager, "flush", lambda timeout: manager.check() or 0)
    events: list[tuple[str, str, int]] = []
    on_the_wire, answer = threading.Event(), threading.Event()

    def change_visibility(_: SQSQueue, entries: Any) -> Any:
        entries = list(entries)
        events.extend(("sent", lease.receipt_handle, seconds) for lease, seconds in entries)
        if not on_the_wire.is_set():  # the first call: the confirmation
            on_the_wire.set()
            answer.wait(10)
        events.extend(("returned", lease.receipt_handle, seconds) for lease, seconds in entries)
        return {lease: (EntryResult.OK, "") for lease, _ in entries}

    monkeypatch.setattr(SQSQueue, "change_visibility", change_visibility)
    channel, delivered = consuming_channel(manager)
    hub = Hub()
    channel.hub = hub
    clock.advance(100)
    # Read 25 s after the receive was sent.
    monkeypatch.setattr(Receiver, "answer_sent_at", clock.now - 25)

    receive(channel, sqs_message(channel, "late"))
    assert on_the_wire.wait(10)
    channel.close()
    answer.set()
    join_receive_threads()
    deadline = time.monotonic() + 10
    while channel.payload_reader.messages_reading and time.monotonic() < deadline:
        hub.run_once()
    for _ in range(3):
        manager.check()
        clock.advance(30)

    assert events[:3] == [("sent", "late", 30), ("returned", "late", 30), ("sent", "late", 0)]
    assert events[3:] == [("returned", "late", 0)], "changed again after its release"
    assert delivered == []
    assert len(manager) == 0 and manager.leases() == []
    assert counters.snapshot().leases_held == 0


def test_a_parked_task_read_from_s3_is_copied_with_its_pointer_and_keeps_its_object(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    process_state: ProcessState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 31, item 8: a parked task received again on a queue with a dead-letter queue
    was copied with the body read from S3, which may be over SQS's limit, and its object
    went with the original's delete."""
    sqs.redrive_policy = True
    objects_deleted: list[Lease] = []
    # Before the queue's lease target is made: it is told of deletes through this.
    monkeypatch.setattr(
        process_state.s3_cleanup, "deleted", lambda _, leases: objects_deleted.extend(leases)
    )
    channel, _ = open_channel(large_payload_bucket="tasks")
    message = sqs_message(channel, "again", eta_in=3600, receive_count=2)
    full_body, pointer = message["Body"], S3Pointer("tasks", "k-1").body()
    message["Body"] = pointer
    monkeypatch.setattr(payload_reader, "_read", lambda *_: full_body)
    monkeypatch.setattr(SQSQueue, "delete", REAL_DELETE)

    def all_ok(_: SQSQueue, operation: str, leases: Any, request: Any) -> Any:
        return dict.fromkeys(leases, (EntryResult.OK, ""))

    monkeypatch.setattr(SQSQueue, "_batch_call", all_ok)

    answers = iter([{"Messages": [message]}])
    monkeypatch.setattr(channel.sqs(queue="jobs"), "receive_message", lambda **_: next(answers, {}))
    with contextlib.suppress(Empty):
        channel._get_bulk("jobs")
    wait_for_copy_threads()
    clock.advance(60)
    manager.check()

    [sent] = sqs.copies_sent
    assert sent[0] == pointer, "the copy carries the body read from S3"
    size = len(full_body.encode("utf-8"))
    assert sent[1] == {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": str(size)}}
    assert objects_deleted == [], "the copy's S3 object went with the original's delete"


@pytest.mark.parametrize("path", ["event loop", "blocking"])
def test_a_no_ack_message_whose_delete_fails_is_delivered_once_and_deleted_at_a_later_check(
    open_channel: OpenChannel,
    sqs: FakeSQS,
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """Issue 33, item 1: kombu deleted a mailbox's message on the event loop, and a 5xx
    there ended the worker. The delete goes through the outbox there, and after a failed
    blocking delete elsewhere: retried, never raised."""
    channel, _ = open_channel()
    channel.basic_cancel("consumer")
    delivered: list[Any] = []
    channel.basic_consume("jobs", True, delivered.append, "mailbox")
    outbox_fails = {"rh-1": 1 if path == "event loop" else 0}
    blocking_deletes: list[str] = []

    def delete(_: SQSQueue, leases: Any) -> Any:
        sqs.deletes += [lease.receipt_handle for lease in leases]
        answers = {}
        for lease in leases:
            fails = outbox_fails.get(lease.receipt_handle, 0)
            outbox_fails[lease.receipt_handle] = fails - 1
            answers[lease] = (EntryResult.TRANSIENT, "HTTP 500") if fails else (EntryResult.OK, "")
        return answers

    def blocking_delete(**call: Any) -> None:
        blocking_deletes.append(call["ReceiptHandle"])
        error = {"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}
        raise ClientError(error, "DeleteMessage")  # type: ignore[arg-type]

    monkeypatch.setattr(SQSQueue, "delete", delete)
    monkeypatch.setattr(channel.sqs(queue="jobs"), "delete_message", blocking_delete)
    # As kombu publishes it; a no-ack message keeps the tag it was published with.
    message = sqs_message(channel, "rh-1")
    body = json.loads(message["Body"])
    body["properties"]["delivery_tag"] = "published-tag"
    message["Body"] = json.dumps(body)
    if path == "event loop":
        monkeypatch.setattr(channel, "hub", Hub())
        receive(channel, message)
    else:
        receive_blocking(channel, clock, 0, monkeypatch, message)
    manager.check()
    clock.advance(60)
    manager.check()
    clock.advance(60)
    manager.check()

    assert len(delivered) == 1
    assert (blocking_deletes, sqs.deletes) == (
        ([], ["rh-1", "rh-1"]) if path == "event loop" else (["rh-1"], ["rh-1"])
    )
    assert manager.leases() == []
