"""Blocking rounds on their own: calls side by side, each asking SQS not to wait."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from queue import Empty
from typing import Any

import pytest

from celery_sqs_heartbeat.receiving.chains import Receive, ReceiveChains, receive_size
from celery_sqs_heartbeat.receiving.rounds import ReceiveRounds, asks_without_wait

#: A failure guard only: the process exits at once.
EXIT_GUARD = 30


def rounds_after(answers: list[tuple[int, int]]) -> tuple[ReceiveRounds, ReceiveChains]:
    chains = ReceiveChains(lambda: None, lambda queue: receive_size(queue, 10), lambda: 0, 4)
    chains.round_answered("jobs", answers)
    return ReceiveRounds(chains), chains


def messages(label: str, count: int) -> dict[str, Any]:
    return {"Messages": [{"MessageId": f"{label}{n}"} for n in range(count)]}


def test_a_queue_without_a_backlog_gets_one_long_poll_as_kombu_asks() -> None:
    rounds, _ = rounds_after([])
    made: list[tuple[Receive, bool]] = []

    def one_receive(receive: Receive) -> tuple[Any, int]:
        made.append((receive, asks_without_wait()))
        return messages("a", 3), 3

    assert rounds.receive("jobs", 7, one_receive) == messages("a", 3)
    assert made == [(Receive(7, long_poll=True), False)]


def test_on_a_backlog_the_calls_run_side_by_side_each_without_wait() -> None:
    rounds, chains = rounds_after([(10, 10), (10, 10)])
    # Three calls: each waits for the other two, which only calls made at once can pass.
    all_out = threading.Barrier(3, timeout=10)
    made: list[tuple[Receive, bool]] = []

    def one_receive(receive: Receive) -> tuple[Any, int]:
        made.append((receive, asks_without_wait()))
        index = all_out.wait()
        return messages(f"c{index}-", 10), 10

    response = rounds.receive("jobs", 10, one_receive)

    assert made == [(Receive(10, long_poll=False), True)] * 3
    assert len(response["Messages"]) == 30
    assert asks_without_wait() is False  # only inside the round's calls
    assert len(chains.round("jobs", 10)) == 4  # all full: the next round grows


def test_a_call_that_found_its_queue_backing_off_brings_nothing_and_the_round_shrinks() -> None:
    rounds, chains = rounds_after([(10, 10)])
    answers = iter([(messages("a", 10), 10), Empty()])
    lock = threading.Lock()

    def one_receive(receive: Receive) -> tuple[Any, int]:
        with lock:
            answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    response = rounds.receive("jobs", 10, one_receive)

    assert len(response["Messages"]) == 10
    assert chains.round("jobs", 10) == [Receive(10, long_poll=True)]


def test_a_round_in_which_every_call_found_nothing_reads_as_empty() -> None:
    rounds, _ = rounds_after([(10, 10)])

    def one_receive(receive: Receive) -> tuple[Any, int]:
        raise Empty()

    with pytest.raises(Empty):
        rounds.receive("jobs", 10, one_receive)


def test_an_unexpected_error_is_raised_once_every_call_is_back() -> None:
    rounds, _ = rounds_after([(10, 10)])
    back: list[str] = []
    first_failed = threading.Event()

    def one_receive(receive: Receive) -> tuple[Any, int]:
        if not first_failed.is_set():
            first_failed.set()
            back.append("failed")
            raise RuntimeError("a bug")
        back.append("answered")
        return messages("a", 10), 10

    with pytest.raises(RuntimeError, match="a bug"):
        rounds.receive("jobs", 10, one_receive)
    assert sorted(back) == ["answered", "failed"]


#: A monitor (``celery events``) stopped with Ctrl-C while a round's other call hangs: the
#: call on its thread says so once the main thread waits for it, then waits for ever. It
#: says so with ``os.write``: a ``print`` still holding stdout's lock when Ctrl-C comes
#: leaves the lock to a thread frozen at exit, and Python aborts flushing stdout.
STOPPED_IN_A_ROUND = """
import os, signal, sys, threading
from celery_sqs_heartbeat.receiving.rounds import _side_by_side

# Ctrl-C as at a terminal: a command run in the background by a non-interactive shell
# ignores SIGINT, and its children inherit that (the harness's as_from_a_terminal).
signal.signal(signal.SIGINT, signal.default_int_handler)

main = threading.main_thread().ident

def main_joins():
    frame = sys._current_frames()[main]
    while frame is not None and frame.f_code.co_name != "join":
        frame = frame.f_back
    return frame is not None

def hangs():
    while not main_joins():
        threading.Event().wait(0.01)
    os.write(sys.stdout.fileno(), b"round started\\n")
    threading.Event().wait()

try:
    _side_by_side([lambda: ({}, 0), hangs])
except KeyboardInterrupt:  # as Celery's monitors do: Ctrl-C ends them normally
    pass
"""


def test_a_call_still_out_in_a_round_does_not_hold_the_process_at_its_exit() -> None:
    """Ctrl-C ends the round's wait; the call still on its thread must not keep the
    process from exiting. Python 3.13 waits at exit for a thread whose join Ctrl-C
    interrupted (3.10 to 3.12 do not): a monitor stopped with SIGINT waited for it."""
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPED_IN_A_ROUND], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "round started\n"
        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_GUARD) == 0
    finally:
        process.kill()
        process.wait()
