"""When the receive loops wake: room for a full call, or any room after kombu's wait."""

from __future__ import annotations

import threading

import pytest

from celery_sqs_heartbeat.receiving.prefetch import PrefetchRoom, full_call_room


class Window:
    """A prefetch window the tests fill and empty by hand."""

    def __init__(self, size: int, held: int) -> None:
        self.size = size
        self.held = held

    def room(self, queue: str | None = None) -> int:
        return self.size - self.held


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def room_for(window: Window, clock: Clock | None = None, patience: float = 1.0) -> PrefetchRoom:
    return PrefetchRoom(
        window.room, lambda _: full_call_room(window.size), lambda: patience, clock or Clock()
    )


@pytest.mark.parametrize(
    ("prefetch", "worth"), [(1, 1), (2, 1), (4, 2), (16, 8), (20, 10), (32, 10), (400, 10)]
)
def test_a_receive_waits_for_a_full_call_or_half_the_window(prefetch: int, worth: int) -> None:
    assert full_call_room(prefetch) == worth


def test_a_loop_with_room_for_a_full_call_is_not_parked() -> None:
    window = Window(16, held=8)
    assert room_for(window).park("q") is None


def test_a_parked_loop_wakes_only_when_acks_free_a_full_call() -> None:
    window = Window(16, held=16)
    room = room_for(window)
    assert room.park("q") is not None
    window.held = 9  # seven free: a receive now would be a small one
    assert room.freed() == []
    window.held = 8
    assert room.freed() == ["q"]
    assert room.freed() == [], "woken once"


def test_after_kombus_wait_any_room_will_do() -> None:
    window = Window(16, held=16)
    room = room_for(window)
    parked = room.park("q")
    assert parked is not None
    assert room.settle_for_any_room("q", parked) is False, "still full"
    window.held = 15
    assert room.freed() == ["q"]


def test_kombus_wait_ends_at_once_when_there_is_some_room() -> None:
    window = Window(16, held=16)
    room = room_for(window)
    parked = room.park("q")
    assert parked is not None
    window.held = 14
    assert room.settle_for_any_room("q", parked) is True
    assert room.freed() == [], "no longer parked"


def test_the_timer_of_an_earlier_park_does_not_end_a_later_one() -> None:
    window = Window(16, held=16)
    room = room_for(window)
    first = room.park("q")
    window.held = 8
    assert room.freed() == ["q"]
    window.held = 16
    second = room.park("q")
    assert first is not None and second is not None
    window.held = 15
    assert room.settle_for_any_room("q", first) is False
    assert room.freed() == [], "the second park still waits for a full call"


def test_each_queue_waits_for_the_room_worth_its_own_receive() -> None:
    window = Window(16, held=16)
    wanted = {"standard": 8, "orders.fifo": 1, None: 1}
    room = PrefetchRoom(window.room, wanted.__getitem__, lambda: 1.0, Clock())
    room.park("standard")
    room.park("orders.fifo")
    window.held = 15
    assert room.freed() == ["orders.fifo"]
    assert room.wait(0) is True, "the blocking loop serves the FIFO queue too"


def test_a_closing_channel_wakes_nothing() -> None:
    window = Window(4, held=4)
    room = room_for(window)
    room.park("q")
    room.forget()
    window.held = 0
    assert room.freed() == []


def test_two_chains_parked_on_a_queue_wake_only_with_room_for_both() -> None:
    """Receive chains side by side: the room of one full call wakes one of them, the
    oldest; another queue's room is its own."""
    window = Window(40, held=40)
    room = room_for(window)
    first, second = room.park("q"), room.park("q")
    assert first is not None and second is not None
    window.held = 30  # one full call's room

    assert room.freed() == ["q"]
    assert room.settle_for_any_room("q", first) is False, "woken already"
    window.held = 20
    assert room.freed() == ["q"]
    assert room.freed() == []


def test_an_unlimited_window_never_parks() -> None:
    room = PrefetchRoom(lambda queue: None, lambda _: 10, lambda: 1.0)
    assert room.park("q") is None
    assert room.wait(0) is True


def test_a_blocking_wait_ends_when_another_thread_acks() -> None:
    window = Window(4, held=4)
    room = room_for(window)
    answer: list[bool] = []
    waiter = threading.Thread(target=lambda: answer.append(room.wait(60)))
    waiter.start()
    window.held = 2
    while waiter.is_alive():
        room.freed()
        waiter.join(0.01)
    assert answer == [True]


def test_a_blocking_wait_without_room_gives_up_after_its_timeout() -> None:
    room = room_for(Window(4, held=4))
    assert room.wait(0) is False


def test_the_blocking_loop_takes_any_room_once_short_of_it_for_kombus_wait() -> None:
    clock = Clock()
    window = Window(16, held=15)
    room = room_for(window, clock, patience=1.0)
    assert room.wait(0) is False, "one slot: not worth a call yet"
    clock.now += 0.5
    assert room.wait(0) is False
    clock.now += 0.5
    assert room.wait(0) is True
    assert room.wait(0) is False, "the next wait starts over"


def test_room_for_a_full_call_resets_the_blocking_loops_patience() -> None:
    clock = Clock()
    window = Window(16, held=15)
    room = room_for(window, clock, patience=1.0)
    assert room.wait(0) is False
    window.held = 8
    assert room.wait(0) is True
    window.held = 15
    clock.now += 1.0
    assert room.wait(0) is False, "short of room only since now"
