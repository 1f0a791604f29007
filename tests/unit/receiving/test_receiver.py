"""The receiver on its own: a fake channel port, kombu's steps as plain callables."""

from __future__ import annotations

from queue import Empty
from typing import Any

import pytest
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.receiving.receiver import Receiver
from tests.unit.conftest import FakeClock


class Qos:
    prefetch_count = 10

    def __init__(self, room: int | None) -> None:
        self.room = room

    def can_consume_max_estimate(self) -> int | None:
        return self.room


class Port:
    """The few things of a kombu channel the receiver reads."""

    hub: Any = None
    closed = False
    visibility_timeout = 30
    wait_time_seconds = 10

    def __init__(self, room: int | None = None) -> None:
        self.qos = Qos(room)
        self._active_queues: list[str] = ["jobs"]
        self._tag_to_queue: dict[str, str] = {}
        self._consumers: set[str] = {"consumer"}

    def canonical_queue_name(self, queue_name: str) -> str:
        return queue_name

    def basic_cancel(self, consumer_tag: str) -> Any:
        raise AssertionError("not expected")

    def sqs(self, queue: str | None = None) -> Any:
        raise AssertionError("not expected")

    def _new_queue(self, queue: str) -> str:
        return f"https://sqs/{queue}"

    def _send_long_poll(self, *args: Any) -> None:
        raise AssertionError("not expected")


def receiver(port: Port, clock: FakeClock) -> Receiver:
    return Receiver(port, clock, lambda queue: None, lambda: 1.0, 4)  # type: ignore[arg-type]


def throttled() -> ClientError:
    return ClientError({"Error": {"Code": "ThrottlingException"}}, "ReceiveMessage")


def test_a_failed_blocking_receive_reads_as_empty_and_the_next_waits_out_its_backoff() -> None:
    clock = FakeClock()
    part = receiver(Port(), clock)
    calls: list[dict[str, Any]] = []

    def kombu_receive(queue: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        raise throttled()

    with pytest.raises(Empty):
        part.blocking.receive_message("jobs", {"max_number_of_messages": 10}, kombu_receive)
    with pytest.raises(Empty):
        part.blocking.receive_message("jobs", {"max_number_of_messages": 10}, kombu_receive)

    assert calls == [{"max_number_of_messages": 10}]  # the second waited, without a call


def test_a_fifo_queue_receives_one_message_at_a_time() -> None:
    part = receiver(Port(), FakeClock())
    asked: list[dict[str, Any]] = []

    def kombu_receive(queue: str, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return {"Messages": []}

    part.blocking.receive_message("jobs.fifo", {"max_number_of_messages": 10}, kombu_receive)

    assert asked == [{"max_number_of_messages": 1}]


def test_a_drain_with_the_window_full_times_out_without_asking_kombu() -> None:
    part = receiver(Port(room=0), FakeClock())
    drained: list[bool] = []

    with pytest.raises(TimeoutError):
        part.blocking.drain_events(1.0, lambda: drained.append(True))
    assert drained == []
    roomy = receiver(Port(room=5), FakeClock())
    assert roomy.blocking.drain_events(1.0, lambda: "kombu's") == "kombu's"


def test_the_blocking_path_is_marked_while_kombus_get_bulk_runs() -> None:
    part = receiver(Port(), FakeClock())
    seen = part.blocking.get_bulk(lambda: part.blocking.in_bulk)

    assert seen is True and part.blocking.in_bulk is False


class Hub:
    """The event loop's calls, run when the test says."""

    def __init__(self) -> None:
        self.soon: list[Any] = []
        self.later: list[Any] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))

    def call_later(self, delay: float, callback: Any, *args: Any) -> None:
        self.later.append((delay, callback, args))

    def run_soon(self) -> None:
        soon, self.soon = self.soon, []
        for callback, args in soon:
            callback(*args)


class LoopPort(Port):
    """A channel on an event loop whose window holds 40; kombu's turn sends a receive."""

    def __init__(self) -> None:
        super().__init__()
        self.hub = Hub()
        self.qos.prefetch_count = 40
        self.delivered = 0
        self.sent: list[tuple[int, int, Any]] = []

    def room(self) -> int:
        return 40 - self.delivered

    def _send_long_poll(
        self, name: str, url: str, connection: Any, count: int, wait: int, answered: Any
    ) -> None:
        self.sent.append((count, wait, answered))


def on_the_loop() -> tuple[LoopPort, Receiver]:
    port = LoopPort()
    port.qos.can_consume_max_estimate = port.room  # type: ignore[method-assign]

    def kombu_turn(queue: str) -> None:
        # kombu's _schedule_queue, then _on_messages_ready and _loop1 on the answer.
        def delivered(answer: Any) -> None:
            port.delivered += len(answer.get("Messages") or [])
            part.next_turn(queue, lambda: port.hub.call_soon(part.schedule_queue, queue))

        part.get_from_sqs(queue, f"https://sqs/{queue}", None, min(port.room(), 10), delivered)

    part = Receiver(port, FakeClock(), kombu_turn, lambda: 1.0, 4)  # type: ignore[arg-type]
    return port, part


def answer(port: LoopPort, index: int, count: int) -> None:
    port.sent[index][2]({"Messages": [{"MessageId": str(n)} for n in range(count)]})


def test_a_full_answer_sends_another_receive_beside_the_chain_s_next_without_waiting() -> None:
    port, part = on_the_loop()
    part.schedule_queue("jobs")
    assert [(count, wait) for count, wait, _ in port.sent] == [(10, 10)]

    answer(port, 0, 10)
    port.hub.run_soon()

    assert [(count, wait) for count, wait, _ in port.sent[1:]] == [(10, 10), (10, 0)]
    assert part.chains.chains("jobs") == 2


def test_a_short_answer_ends_the_extra_chain_and_the_last_one_long_polls_alone() -> None:
    port, part = on_the_loop()
    part.schedule_queue("jobs")
    answer(port, 0, 10)
    port.hub.run_soon()
    port.delivered = 0  # the pool ran them

    answer(port, 2, 3)  # the receive without wait: short
    port.hub.run_soon()
    assert part.chains.chains("jobs") == 1 and len(port.sent) == 3
    answer(port, 1, 0)  # the long poll: empty, and the last chain goes on
    port.hub.run_soon()

    assert [(count, wait) for count, wait, _ in port.sent[3:]] == [(10, 10)]


def test_a_chain_short_of_room_beside_the_receives_on_the_wire_waits_for_acks_to_free_it() -> (
    None
):
    port, part = on_the_loop()
    part.schedule_queue("jobs")
    answer(port, 0, 10)
    port.delivered = 22  # 18 left: the chain's next receive takes 10, which leaves 8
    port.hub.run_soon()

    assert [count for count, _, _ in port.sent[1:]] == [10]
    assert len(port.hub.later) == 1  # the other chain parked, kombu's wait its longest
    assert part.chains.chains("jobs") == 2 and part.chains.free_room("jobs") == 8

    port.delivered = 12  # ten acked: room for the parked chain's full call
    part.prefetch_room_freed()
    port.hub.run_soon()
    assert [count for count, _, _ in port.sent[2:]] == [10]
    assert part.chains.free_room("jobs") == 8


def test_the_calls_of_a_blocking_round_ask_sqs_not_to_wait_through_the_client_hook() -> None:
    """kombu's blocking receive reads a WaitTimeSeconds of 0 as its default; the hook on
    the client sets it for the calls of a round, and only for them."""
    part = receiver(Port(), FakeClock())
    handlers: list[Any] = []

    class Events:
        def register(self, event: str, handler: Any, unique_id: str) -> None:
            assert event == "provide-client-params.sqs.ReceiveMessage"
            handlers.append(handler)

    class Client:
        meta = type("Meta", (), {"events": Events()})()

    part.ask_for_lease(Client())  # type: ignore[arg-type]
    [hook] = handlers
    part.chains.round_answered("jobs", [(5, 5)])
    asked: list[dict[str, Any]] = []

    def kombu_receive(queue: str, **kwargs: Any) -> Any:
        params = {"MaxNumberOfMessages": kwargs["max_number_of_messages"], "WaitTimeSeconds": 10}
        hook(params)
        asked.append(params)
        return {"Messages": []}

    part.blocking.in_bulk = True
    side_by_side = part.blocking.receive_round(
        "jobs", {"max_number_of_messages": 5}, kombu_receive, lambda queue, call: call()
    )
    assert side_by_side == {"Messages": []}  # kombu's _get_bulk reads it as Empty
    part.blocking.receive_round(
        "jobs", {"max_number_of_messages": 5}, kombu_receive, lambda queue, call: call()
    )

    full = {"MaxNumberOfMessages": 5, "VisibilityTimeout": 30}
    assert asked == [{**full, "WaitTimeSeconds": 0}] * 2 + [{**full, "WaitTimeSeconds": 10}]


def test_a_chain_parked_for_room_a_receive_held_is_woken_when_its_answer_comes_short() -> None:
    """No ack would wake it: the room was held by a receive on the wire, not by tasks."""
    port, part = on_the_loop()
    part.schedule_queue("jobs")
    answer(port, 0, 10)
    port.delivered = 22
    port.hub.run_soon()  # one chain sends 10 (8 left), the other parks for a full call

    answer(port, 1, 0)  # the queue is empty: that chain ends, its room is the window's
    port.hub.run_soon()

    assert part.chains.chains("jobs") == 1
    assert [(count, wait) for count, wait, _ in port.sent[2:]] == [(10, 10)]
