"""Countdowns sent with ``DelaySeconds``: SQS holds a short wait, not the worker.

A task with an ETA (a countdown, ``apply_async(eta=...)``, ``retry(countdown=...)``) is
received at once and held in a worker's memory until it is due, its lease renewed all
the while, for up to ``eta_parking_threshold`` (15 minutes); a restart hands it back.
SQS can do that wait instead: a message sent with ``DelaySeconds`` (at most 15 minutes,
standard queues only) stays invisible to every receive until then. So a publish whose
ETA is at least a second away is sent delayed by its whole seconds to the ETA, at most
SQS's limit. The message keeps its ETA: a worker receives it at, or a fraction of a
second before, its ETA and Celery holds it for that fraction, or, for an ETA further
than the limit, parks or holds it as it would any ETA
(:mod:`celery_sqs_heartbeat.receiving.parking`); ``expires`` and revokes by id are
Celery's as ever.

The delay is reckoned from the publishing process's wall clock, and SQS counts it from
when the message arrives: a producer whose clock is behind the workers' sends tasks
that arrive late by the difference; one whose clock is ahead sends them early, and
Celery holds them until their ETA.

kombu's ``_put`` sends ``properties["DelaySeconds"]`` as the SendMessage's delay on a
standard queue (every kombu from 5.5; 5.7 also reads ``delay_seconds``, and warns of
either on a FIFO queue), so the channel sets it there before kombu's part runs; a
scope's caught SendMessage carries it into its SendMessageBatch entry. The decision is
pure, the wall clock passed in; :class:`SendDelays`, the channel's part, reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..aws.sqs_facts import SQS_MAX_DELAY_SECONDS, is_fifo
from ..receiving.parking import due_of_headers

__all__ = ["DELAY_PROPERTY", "SendDelays", "send_delay"]

#: The message property kombu's ``_put`` sends as the SendMessage's ``DelaySeconds``.
DELAY_PROPERTY = "DelaySeconds"
#: kombu 5.7's other spelling of it, which it reads first.
_DELAY_PROPERTIES = (DELAY_PROPERTY, "delay_seconds")


def send_delay(queue: str, message: Mapping[str, Any], now: float) -> int | None:
    """Whole seconds SQS should hold ``message`` published to ``queue``, or None for none.

    ``now`` is seconds since the epoch. None for: a FIFO queue (no per-message delay);
    a redelivery (kombu's restore makes it visible again, it sends nothing); a message
    whose properties already name a delay (the caller's, kept as it is); anything that
    is not a protocol 2 task with an ETA; an ETA less than a second away or past. The
    delay is rounded down, so the message never arrives after its ETA.
    """
    properties = message.get("properties")
    if is_fifo(queue) or message.get("redelivered") or not isinstance(properties, Mapping):
        return None
    if any(name in properties for name in _DELAY_PROPERTIES):
        return None
    due = due_of_headers(message.get("headers"))
    if due is None or due.eta is None:
        return None
    delay = min(math.floor(due.eta - now), SQS_MAX_DELAY_SECONDS)
    return delay if delay >= 1 else None


class SendDelays:
    """A channel's publishes: each one's delay set in its message before kombu sends it."""

    def __init__(self, enabled: bool, wall_clock: Callable[[], float] = time.time) -> None:
        #: ``eta_send_delay``: False sends every message at once, as kombu does.
        self._enabled = enabled
        #: ETAs are wall-clock instants, written by the producer's clock.
        self._wall_clock = wall_clock

    def set_on(self, queue: str, message: dict[str, Any]) -> None:
        """``message``'s ``DelaySeconds`` property set to :func:`send_delay`'s, if any."""
        if not self._enabled:
            return
        delay = send_delay(queue, message, self._wall_clock())
        if delay is not None:
            message["properties"][DELAY_PROPERTY] = delay
