"""The blocking receive loop's receives, side by side while a queue has a backlog.

kombu's blocking loop (gevent, eventlet, plain kombu: ``drain_events``, then ``_get_bulk``)
makes one ReceiveMessage and delivers its answer before it makes the next. While the
queue's answers come back full, :class:`~celery_sqs_heartbeat.receiving.chains.ReceiveChains`
plans a *round* of several calls instead; they are made at once, each asking SQS not to
wait (a long poll beside the others could hold the whole round for ``wait_time_seconds``
on a queue that just drained, with their messages undelivered), and kombu gets their
messages together. Each call goes through the intake on its own, so each answer's leases
start at its own send time.

The calls beside the first run on threads: in gevent's and eventlet's pools, which patch
threading, those are greenlets. kombu reads a ``WaitTimeSeconds`` of 0 as "its default",
so the receiver's client hook asks for no wait when :func:`asks_without_wait` says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from queue import Empty
from typing import Any, TypeVar

from .chains import FAILED, Receive, ReceiveChains

__all__ = ["ReceiveRounds", "asks_without_wait"]

T = TypeVar("T")

#: Set while a call of a round is made: its ReceiveMessage asks SQS not to wait.
_WITHOUT_WAIT: ContextVar[bool] = ContextVar("celery_sqs_heartbeat_without_wait", default=False)

#: One receive of a round: kombu's response (after the intake), and how many messages SQS
#: returned (the intake takes out those it parks), or FAILED.
OneReceive = Callable[[Receive], tuple[Any, int]]


def asks_without_wait() -> bool:
    """Whether the ReceiveMessage being made in this thread or greenlet must not wait."""
    return _WITHOUT_WAIT.get()


class ReceiveRounds:
    """One channel's blocking receives: one call, or a round of them side by side."""

    def __init__(self, chains: ReceiveChains) -> None:
        self._chains = chains

    def receive(self, queue_name: str, wanted: int, one_receive: OneReceive) -> Any:
        """The response kombu's ``_get_bulk`` reads: every message the round brought.

        Raises Empty, as one receive does, when no call could be made (a failing queue's
        backoff).
        """
        receives = self._chains.round(queue_name, wanted)
        if len(receives) == 1:
            try:
                response, returned = one_receive(receives[0])
            except Empty:
                self._chains.round_answered(queue_name, [(receives[0].size, FAILED)])
                raise
            self._chains.round_answered(queue_name, [(receives[0].size, returned)])
            return response
        outcomes = _side_by_side([_without_wait(one_receive, receive) for receive in receives])
        self._chains.round_answered(
            queue_name,
            [
                (receive.size, FAILED if isinstance(outcome, BaseException) else outcome[1])
                for receive, outcome in zip(receives, outcomes, strict=True)
            ],
        )
        return _merged(outcomes)


def _without_wait(one_receive: OneReceive, receive: Receive) -> Callable[[], tuple[Any, int]]:
    def call() -> tuple[Any, int]:
        token = _WITHOUT_WAIT.set(True)
        try:
            return one_receive(receive)
        finally:
            _WITHOUT_WAIT.reset(token)

    return call


def _side_by_side(calls: list[Callable[[], T]]) -> list[T | BaseException]:
    """Run ``calls`` at once: the first here, the others on threads; each outcome or error."""
    outcomes: list[T | BaseException] = [Empty() for _ in calls]

    def run(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except BaseException as exc:
            outcomes[index] = exc

    # Daemon threads: a process stopped while a round is out (Ctrl-C in `celery events`)
    # must not wait at its exit for the round's other calls. Python 3.13 waits there for a
    # thread whose join Ctrl-C interrupted; 3.10 to 3.12 do not.
    threads = [
        threading.Thread(
            target=run, args=(index,), name="celery-sqs-heartbeat-receive", daemon=True
        )
        for index in range(1, len(calls))
    ]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    return outcomes


def _merged(outcomes: list[tuple[Any, int] | BaseException]) -> Any:
    """One response of every call's messages; a call's error other than Empty is raised
    once all are back (what the others brought is released by the intake, unclaimed)."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, Empty):
            raise outcome
    answers = [outcome[0] for outcome in outcomes if not isinstance(outcome, BaseException)]
    if not answers:
        raise Empty()
    return {"Messages": [message for answer in answers for message in answer.get("Messages") or []]}
