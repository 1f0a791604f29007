"""Receive chains on their own: the window's room as a number, queues by name."""

from __future__ import annotations

import pytest

from celery_sqs_heartbeat.receiving.chains import (
    FAILED,
    Receive,
    ReceiveChains,
    most_receives_in_flight,
    receive_size,
)

FULL = 10


class Window:
    """A prefetch window of ``size``, with ``delivered`` messages in it."""

    def __init__(self, size: int | None) -> None:
        self.size = size
        self.delivered = 0

    def room(self) -> int | None:
        return None if self.size is None else self.size - self.delivered


def chains_of(window: Window, most: int = 4) -> ReceiveChains:
    return ReceiveChains(
        window.room, lambda queue: receive_size(queue, FULL), lambda: window.size or 0, most
    )


def deliver(
    chains: ReceiveChains, window: Window, queue: str, receive: Receive, returned: int
) -> tuple[bool, bool]:
    """A receive's answer: its room released, its messages in the window, then the verdict."""
    chains.answered(queue, receive.size)
    window.delivered += max(returned, 0)
    return chains.after_answer(queue, receive.size, returned)


def test_a_full_answer_with_room_for_another_full_call_starts_a_chain_beside_it() -> None:
    window = Window(40)
    chains = chains_of(window)
    chains.turn("jobs")
    first = chains.sending("jobs", FULL)

    assert first == Receive(FULL, long_poll=True)
    assert deliver(chains, window, "jobs", first, FULL) == (True, True)
    assert chains.chains("jobs") == 2


def test_receives_side_by_side_hold_their_room_and_never_ask_for_more_than_the_window_takes() -> (
    None
):
    window = Window(25)
    chains = chains_of(window)
    chains.turn("jobs")
    sizes = [chains.sending("jobs", FULL) for _ in range(3)]

    assert [receive.size for receive in sizes] == [10, 10, 5]
    assert chains.free_room("jobs") == 0
    chains.answered("jobs", 10)
    assert chains.free_room("jobs") == 10


def test_with_several_chains_a_receive_asks_for_a_full_call_at_most_and_alone_as_kombu() -> None:
    small = Window(16)
    several = ReceiveChains(small.room, lambda queue: 8, lambda: 16, 4)
    one = ReceiveChains(small.room, lambda queue: 8, lambda: 16, 1)

    assert several.sending("jobs", 10).size == 8
    assert one.sending("jobs", 10).size == 10


def test_only_a_queue_s_only_receive_on_the_wire_long_polls() -> None:
    chains = chains_of(Window(None))
    chains.turn("jobs")

    waits = [chains.sending("jobs", FULL).long_poll for _ in range(3)]
    other_queue = chains.sending("mail", FULL).long_poll
    for _ in range(3):
        chains.answered("jobs", FULL)
    again = chains.sending("jobs", FULL).long_poll

    assert waits == [True, False, False]
    assert other_queue is True
    assert again is True


def test_a_short_answer_or_a_failure_ends_any_chain_but_the_last() -> None:
    window = Window(None)
    chains = chains_of(window)
    chains.turn("jobs")
    for _ in range(2):  # two full answers: three chains
        deliver(chains, window, "jobs", chains.sending("jobs", FULL), FULL)
    assert chains.chains("jobs") == 3

    verdicts = [
        deliver(chains, window, "jobs", chains.sending("jobs", FULL), returned)
        for returned in (4, FAILED, 0)
    ]

    assert verdicts == [(False, False), (False, False), (True, False)]
    assert chains.chains("jobs") == 1


@pytest.mark.parametrize(
    ("window", "full", "most", "chains"),
    [(16, 8, 4, 2), (32, 10, 4, 3), (40, 10, 4, 4), (400, 10, 4, 4), (None, 10, 3, 3),
     (32, 10, 2, 2), (4, 2, 4, 2), (1, 1, 4, 1)],
)
def test_a_queue_runs_as_many_chains_as_the_window_holds_full_calls_up_to_the_option(
    window: int | None, full: int, most: int, chains: int
) -> None:
    room = Window(window)
    part = ReceiveChains(room.room, lambda queue: full, lambda: room.size or 0, most)
    part.turn("jobs")
    started = 0
    for _ in range(6):
        receive = part.sending("jobs", full)
        part.answered("jobs", receive.size)
        started += part.after_answer("jobs", receive.size, receive.size)[1]

    assert part.chains("jobs") == chains == 1 + started
    assert part.most_chains("jobs.fifo") == 1


def test_a_failing_queue_keeps_one_chain_to_wait_out_its_backoff() -> None:
    window = Window(None)
    chains = chains_of(window)
    chains.turn("jobs")
    deliver(chains, window, "jobs", chains.sending("jobs", FULL), FULL)

    assert chains.may_end("jobs") is True
    assert chains.may_end("jobs") is False
    assert chains.chains("jobs") == 1


def test_a_fifo_queue_keeps_one_chain_and_asks_for_one_message() -> None:
    window = Window(None)
    chains = chains_of(window)
    chains.turn("jobs.fifo")
    receive = chains.sending("jobs.fifo", receive_size("jobs.fifo", FULL))

    assert receive.size == 1
    assert deliver(chains, window, "jobs.fifo", receive, 1) == (True, False)
    assert chains.chains("jobs.fifo") == 1
    chains.round_answered("jobs.fifo", [(1, 1)])
    assert chains.round("jobs.fifo", 1) == [Receive(1, long_poll=True)]


def test_a_chain_of_a_queue_no_longer_consumed_ends_and_the_next_consume_starts_one() -> None:
    chains = chains_of(Window(None))
    chains.turn("jobs")
    chains.end("jobs")

    assert chains.chains("jobs") == 0
    chains.turn("jobs")
    assert chains.chains("jobs") == 1


@pytest.mark.parametrize(
    ("answers", "next_calls"),
    [
        ([(10, 10)], 2),  # a full single call: two side by side next
        ([(10, 10), (10, 10)], 3),  # all full: one more
        ([(10, 10), (10, 3)], 1),  # one full, one short: as many as were full
        ([(10, 10), (10, 10), (10, 0)], 2),
        ([(10, 0)], 1),
        ([(10, FAILED)], 1),
    ],
)
def test_a_blocking_round_grows_by_one_while_all_are_full_and_keeps_the_full_ones(
    answers: list[tuple[int, int]], next_calls: int
) -> None:
    chains = chains_of(Window(None))
    chains.round_answered("jobs", answers)

    planned = chains.round("jobs", 7)

    if next_calls == 1:
        assert planned == [Receive(7, long_poll=True)]
    else:
        assert planned == [Receive(FULL, long_poll=False)] * next_calls


def test_a_blocking_round_fits_the_room_left_and_the_chains_the_window_holds() -> None:
    window = Window(40)
    chains = chains_of(window, most=3)
    chains.round_answered("jobs", [(10, 10)] * 3)

    assert len(chains.round("jobs", 10)) == 3  # receives_in_flight
    window.delivered = 15  # 25 left: two full calls
    assert len(chains.round("jobs", 10)) == 2
    window.delivered = 30
    assert chains.round("jobs", 10) == [Receive(10, long_poll=True)]
    window.size, window.delivered = 20, 0  # a window of two full calls
    assert len(chains.round("jobs", 10)) == 2


def test_a_worker_whose_tasks_run_on_the_loop_keeps_one_receive_per_queue() -> None:
    assert most_receives_in_flight(4, tasks_run_on_the_loop=True) == 1
    assert most_receives_in_flight(4, tasks_run_on_the_loop=False) == 4
    assert most_receives_in_flight(1, tasks_run_on_the_loop=False) == 1
