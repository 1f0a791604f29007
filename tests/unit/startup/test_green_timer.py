"""A gevent worker's timer stops a repeated call when asked (Celery's heartbeat at a reconnect).

Celery's gevent timer hands out the greenlet of a repeated call's first run as its handle;
cancelling it left the call repeating for ever, and each lost connection's heartbeat kept
that connection, its channels and their botocore clients alive. The fakes stand for the
timer's greenlets; the last tests drive Celery's own gevent timer with gevent's hub (no
monkey-patching), counting runs, with generous guards only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gevent
import pytest
from celery.concurrency.gevent import Timer as GeventTimer
from kombu.asynchronous.timer import Entry
from kombu.asynchronous.timer import Timer as KombuTimer

from celery_sqs_heartbeat.startup.green_timer import cancel_repeated_calls, mend_gevent_timer


class FakeRun:
    """A greenlet of the timer: one run of an entry, pending or done."""

    def __init__(self, entry: Entry | None) -> None:
        self.entry = entry
        self.killed = False
        self.cancelled = False

    def kill(self, block: bool = True) -> None:
        self.killed = True

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    def __init__(self) -> None:
        self.queue: set[FakeRun] = set()
        self.cancelled: list[Any] = []

    def cancel(self, handle: Any) -> None:
        self.cancelled.append(handle)


def _entry() -> Entry:
    return Entry(lambda: None)


def test_cancelling_the_first_runs_handle_cancels_the_entry_and_kills_its_pending_run() -> None:
    timer = FakeTimer()
    heartbeat, other = _entry(), _entry()
    first_run = FakeRun(heartbeat)  # done long ago: no longer in the queue
    pending, other_pending = FakeRun(heartbeat), FakeRun(other)
    timer.queue |= {pending, other_pending}
    cancel_repeated_calls(timer)

    timer.cancel(first_run)

    assert heartbeat.canceled
    assert pending.killed
    assert not other.canceled and not other_pending.killed
    assert timer.cancelled == [first_run]


def test_a_handle_without_an_entry_is_cancelled_as_before() -> None:
    timer = FakeTimer()
    pending = FakeRun(_entry())
    timer.queue.add(pending)
    cancel_repeated_calls(timer)
    handle = _entry()

    timer.cancel(handle)

    assert timer.cancelled == [handle]
    assert not pending.killed


def test_installed_once_per_timer() -> None:
    timer = FakeTimer()
    cancel_repeated_calls(timer)
    cancel_repeated_calls(timer)
    handle = FakeRun(_entry())

    timer.cancel(handle)

    assert timer.cancelled == [handle]


def test_other_timers_are_left_as_they_are() -> None:
    timer = KombuTimer()
    kombu_cancel = timer.cancel

    assert not mend_gevent_timer(timer)
    assert timer.cancel == kombu_cancel


def _wait_until(condition: Callable[[], bool], guard: float = 10.0) -> bool:
    """Let gevent's hub run the timer's greenlets until ``condition``; a failure guard only."""
    deadline = time.monotonic() + guard
    while not condition():
        if time.monotonic() > deadline:
            return False
        gevent.sleep(0.001)
    return True


@pytest.fixture
def gevent_timer() -> Any:
    timer = GeventTimer()
    yield timer
    timer.clear()


def test_a_cancelled_heartbeat_stops_repeating_on_celerys_gevent_timer(gevent_timer: Any) -> None:
    beats: list[int] = []
    assert mend_gevent_timer(gevent_timer)
    handle = gevent_timer.call_repeatedly(0.001, beats.append, (1,))
    assert _wait_until(lambda: len(beats) >= 3)

    gevent_timer.cancel(handle)

    assert _wait_until(lambda: not gevent_timer.queue), "the call is still scheduled"
    beats_at_cancel = len(beats)
    gevent.sleep(0.02)
    assert len(beats) == beats_at_cancel


def test_celerys_gevent_timer_alone_keeps_a_cancelled_call_repeating(gevent_timer: Any) -> None:
    """What the mend is for: if this starts failing, Celery fixed its timer."""
    beats: list[int] = []
    handle = gevent_timer.call_repeatedly(0.001, beats.append, (1,))
    assert _wait_until(lambda: len(beats) >= 3)

    gevent_timer.cancel(handle)
    beats_at_cancel = len(beats)

    assert _wait_until(lambda: len(beats) >= beats_at_cancel + 3)
