"""kombu 5.5's receive, off the event loop: made on a thread, handed back to the loop.

kombu 5.5's asynchronous client made each long poll inline and held the worker's loop
for it. The transport makes the receive on a thread of its own and hands the answer to
the loop through a :class:`LoopWaker`, which also ends the loop's poll at once. A real
kombu ``Hub``, a botocore client with a ``Stubber``: no network. (kombu 5.7's own hub
also wakes itself on ``call_soon`` from another thread; kombu 5.5's does not.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from kombu.asynchronous import Hub
from vine import promise

from celery_sqs_heartbeat.compat import (
    KOMBU_RECEIVES_ON_THE_LOOP,
    LoopWaker,
    SQSChannel,
    call_soon_waking,
)
from celery_sqs_heartbeat.process import this_process

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"
REQUEST = {
    "QueueUrl": QUEUE_URL,
    "MaxNumberOfMessages": 4,
    "VisibilityTimeout": 30,
    "WaitTimeSeconds": 10,
    "AttributeNames": ["ApproximateReceiveCount"],
}
MESSAGE = {"MessageId": "m1", "ReceiptHandle": "handle-1", "Body": "{}"}


class Ran(Exception):
    """Raised by the handed-over call: it ends the loop's turn where it ran."""


def stop() -> None:
    raise Ran()


@pytest.fixture
def hub() -> Iterator[Hub]:
    hub = Hub()
    # With a timer this far off, the loop polls for seconds when nothing wakes it.
    hub.call_later(30, lambda: None)
    yield hub
    hub.close()


def run_until_stopped(hub: Hub, turns: int = 3) -> float:
    """Turn the loop until a handed-over :func:`stop` runs; how long that took."""
    loop = hub.create_loop()
    started = time.monotonic()
    with pytest.raises(Ran):
        for _ in range(turns):
            next(loop)  # the poll, ended by the wake-up; then the call, first thing
    return time.monotonic() - started


# --- the waker -------------------------------------------------------------------------------


def test_a_call_from_another_thread_wakes_the_loop_out_of_its_poll(hub: Hub) -> None:
    waker = LoopWaker.of(hub)
    threading.Timer(0.2, waker.call_soon, (stop,)).start()

    # Without the wake-up, kombu 5.5's loop sleeps 2 s in its poll first.
    assert run_until_stopped(hub) < 1.0


def test_a_call_from_a_pool_thread_wakes_the_loop_once_it_has_a_waker(hub: Hub) -> None:
    LoopWaker.of(hub)
    threading.Timer(0.2, call_soon_waking, (hub, stop)).start()

    assert run_until_stopped(hub) < 1.0


def test_a_loop_without_a_waker_gets_the_call_the_usual_way(hub: Hub) -> None:
    call_soon_waking(hub, stop)

    run_until_stopped(hub, turns=1)
    assert not hub.readers


def test_the_loop_has_one_waker_watched_again_after_it_restarts(hub: Hub) -> None:
    waker = LoopWaker.of(hub)
    assert LoopWaker.of(hub) is waker
    watched = set(hub.readers)
    assert len(watched) == 1

    hub.reset()  # what Celery's consumer does to its loop when it reconnects
    assert not hub.readers

    assert LoopWaker.of(hub) is waker
    assert set(hub.readers) == watched


def test_many_calls_before_the_loop_turns_neither_block_nor_get_lost(hub: Hub) -> None:
    waker = LoopWaker.of(hub)
    done: list[int] = []
    # More wake-ups than a pipe holds (64 KiB): the writer never blocks on a full pipe.
    for n in range(70_000):
        waker.call_soon(done.append, n)
    next(hub.create_loop())
    assert sorted(done) == list(range(70_000))


# --- the receive on a thread -----------------------------------------------------------------


class FakeChannel:
    """What the receive needs of kombu's channel: a client, the loop, whether it closed."""

    def __init__(self, hub: Hub, client: BaseClient) -> None:
        self.hub = hub
        self.client = client
        self.closed = False

    def sqs(self, queue: str | None = None) -> BaseClient:
        assert queue == "jobs"
        return self.client


@pytest.fixture
def stub(source: BaseClient) -> Iterator[Stubber]:
    """The receive goes out on the derived receive client: one attempt, no retries."""
    with Stubber(this_process().clients.receive(source)) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


class Outcome:
    """The promise the loop settles, and what it was settled with, on which thread."""

    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.errors: list[BaseException] = []
        self.threads: list[int] = []
        self.promise = promise(self._answer, on_error=self._error)

    def _answer(self, answer: Any) -> None:
        self.answers.append(answer)
        self.threads.append(threading.get_ident())

    def _error(self, error: BaseException) -> None:
        self.errors.append(error)
        self.threads.append(threading.get_ident())

    def settle(self, hub: Hub) -> None:
        """Turn the loop until the promise is settled."""
        loop = hub.create_loop()
        deadline = time.monotonic() + 5
        while not self.threads:
            assert time.monotonic() < deadline, "the promise was never settled"
            next(loop)


def receive(hub: Hub, source: BaseClient, closed: bool = False) -> Outcome:
    channel = FakeChannel(hub, source)
    channel.closed = closed
    outcome = Outcome()
    SQSChannel._receive_on_a_thread(channel, "jobs", dict(REQUEST), outcome.promise)  # type: ignore[arg-type]
    assert not outcome.answers and not outcome.errors  # on the loop, never inline
    return outcome


def wait_for_receives() -> None:
    for thread in threading.enumerate():
        if thread.name == "celery-sqs-heartbeat-receive":
            thread.join(5)


def test_the_answer_reaches_the_promise_on_the_loops_thread(
    hub: Hub, source: BaseClient, stub: Stubber
) -> None:
    stub.add_response("receive_message", {"Messages": [MESSAGE]}, REQUEST)

    outcome = receive(hub, source)
    outcome.settle(hub)

    assert [answer["Messages"] for answer in outcome.answers] == [[MESSAGE]]
    assert outcome.threads == [threading.get_ident()]


def test_an_error_is_thrown_into_the_promise_on_the_loops_thread(
    hub: Hub, source: BaseClient, stub: Stubber
) -> None:
    stub.add_client_error("receive_message", "AWS.SimpleQueueService.NonExistentQueue", "gone")

    outcome = receive(hub, source)
    outcome.settle(hub)

    assert [type(error) for error in outcome.errors] == [ClientError]
    assert outcome.threads == [threading.get_ident()]


def test_an_answer_for_a_channel_closed_meanwhile_is_dropped(
    hub: Hub, source: BaseClient, stub: Stubber
) -> None:
    stub.add_response("receive_message", {"Messages": [MESSAGE]}, REQUEST)

    outcome = receive(hub, source, closed=True)
    wait_for_receives()
    next(hub.create_loop())  # the hand-over runs first thing

    assert outcome.answers == outcome.errors == []


@pytest.mark.skipif(not KOMBU_RECEIVES_ON_THE_LOOP, reason="kombu 5.5 has no curl client")
def test_a_reconnect_cancels_the_checks_the_closed_http_client_left_on_the_loop() -> None:
    """Seen in the solo reconnect scenario: after Celery reset the hub (which closes
    kombu's curl client), a one-shot timeout check the client had asked for fired on the
    new loop and logged "Error in timer" with pycurl's "no multi handle" traceback."""
    from kombu import Connection
    from kombu.asynchronous.http.curl import CurlClient

    hub = Hub()
    client = CurlClient(hub)
    if not hasattr(client, "_closed"):
        hub.close()
        pytest.skip("kombu 5.6's hub keeps its curl client open across a reconnect")
    client._set_timeout(1000)  # pycurl asked for a check while a request was out
    client.close()  # as kombu 5.7's hub does at Celery's reset on a reconnect
    left = [
        s.entry
        for s in hub.timer.queue
        if getattr(s.entry.fun, "__self__", None) is client and not s.entry.canceled
    ]
    assert left  # fired on the new loop, each raises pycurl.error ("no multi handle")

    connection = Connection(
        "sqs://key:secret@127.0.0.1:9/",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"region": "us-east-1"},
    )
    connection.transport.register_with_event_loop(None, hub)

    assert all(entry.canceled for entry in left)
    hub.close()
