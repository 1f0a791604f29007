"""Parking: whether a received task waits in SQS for its ETA, and for how long. Pure.

A Celery worker keeps a task with an ETA (or countdown) unacked in memory until it is
due, and the transport renews its lease all that time. That costs a renewal per lease
period of the wait, and it cannot last: SQS hides a received message for at most 12
hours, after which another worker may receive it and the task runs twice. A *parked*
message is instead hidden again at the receive, until shortly before its ETA (or for as
long as one receive may hide it), and forgotten: no lease, nothing in memory. Whoever
receives it next decides again.

This module only reads and decides; the park step (:mod:`celery_sqs_heartbeat.receiving.parker`)
sends the visibility change. Time is passed in as seconds since the epoch, because an
ETA is a wall-clock instant that every worker must read the same way.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..aws.sqs_facts import SQS_MAX_DELAY_SECONDS
from ..payloads.pointers import LEGACY_SIZE_ATTRIBUTE, SIZE_ATTRIBUTE, size_attribute

__all__ = [
    "PARK_WAIT_SHARE",
    "RETURN_LEAD",
    "Due",
    "ParkingPolicy",
    "copy_attributes",
    "due_of_headers",
    "read_due",
]

#: Seconds before its ETA a parked message becomes visible again (at most half the
#: threshold): a worker's long poll in progress receives it at once, one between polls at
#: its next. Plus the park's wait for company (:data:`PARK_WAIT_SHARE`), 25 s at most at
#: the default 30 s lease: the worker then holds it within its first lease, unrenewed.
RETURN_LEAD = 10.0

#: The share of its receive's lease a park may wait for company in its call. The
#: message is hidden by that lease anyway, and a full call of ten parks costs a tenth of
#: one: at the default 30 s lease, 15 s fill every call from under one park a second
#: (benchmarks/parking_requests.py). Half leaves the other half for the call to land
#: before the lease runs out. The price: a park sent at once comes back up to that much
#: earlier (:meth:`ParkingPolicy.hide_for`), within the first lease still.
PARK_WAIT_SHARE = 0.5

#: Seconds after its ``expires`` that a message parked past it comes back: it is then
#: delivered, and Celery discards it as expired instead of holding it for its ETA.
EXPIRED_SLACK = 1.0


@dataclass(frozen=True)
class Due:
    """What a task message's headers (Celery's message protocol 2) say about its time."""

    task_id: str | None
    task_name: str | None
    #: Seconds since the epoch; None: no ETA, the task is due now.
    eta: float | None
    expires: float | None


@dataclass(frozen=True)
class ParkingPolicy:
    """When to park, and for how long at most."""

    #: Park a message whose ETA is further away than this many seconds.
    threshold: float
    #: The longest one receive may hide a message: SQS's limit less the lease margin,
    #: or ``visibility_extension_max`` (:attr:`LeasePolicy.hold_limit`).
    longest_hide: float

    @property
    def lead(self) -> float:
        return min(RETURN_LEAD, self.threshold / 2)

    def hide_for(self, due: Due | None, now: float, sent_within: float = 0.0) -> int | None:
        """Whole seconds to hide the message for, or None to deliver it to Celery now.

        Delivered: no ETA, an ETA within the threshold, or an ``expires`` already past
        (Celery then discards it as it does any expired task). A message due to expire
        before its ETA comes back just after it expires, to be discarded then. SQS counts
        a hide from when the call lands, which may wait ``sent_within`` seconds for
        company: the hide is reckoned from then, so it never ends later than meant
        (sent sooner, it ends up to that much earlier).
        """
        if due is None or due.eta is None or due.eta - now <= self.threshold:
            return None
        if due.expires is not None and due.expires <= now:
            return None
        back_at = due.eta - self.lead
        if due.expires is not None:
            back_at = min(back_at, due.expires + EXPIRED_SLACK)
        start = now + sent_within
        hide = back_at - start
        if hide > self.longest_hide:
            # Not back in time with one hide: come back while still beyond the threshold,
            # to be parked again (one more hop), not held for the rest of the wait. SQS
            # counts its 12 hours from the receive, not the send: the manager cuts the
            # hop as it goes out (Lease.capped_visibility), to the longest SQS takes then.
            hide = min(self.longest_hide, due.eta - start - self.threshold - 1)
        return max(1, math.floor(hide))

    def fresh_copy_delay(
        self, due: Due | None, hide: int | None, receive_count: int, now: float
    ) -> int | None:
        """On a queue with a dead-letter queue: the delay of a fresh copy, None for none.

        Every receive counts towards the queue's ``maxReceiveCount``, so a task that came
        back from a park (received before: ``receive_count`` 2 or more) and is parked
        again, or is delivered before its ETA, is sent again as a new message instead,
        which SQS counts from 1: waiting never moves a task to the dead-letter queue, and
        its delivery keeps every receive the queue allows for its failures. A new message
        waits at most 15 minutes before it is first visible; then it is parked again.
        """
        if receive_count < 2 or due is None or due.eta is None:
            return None
        if hide is None:
            expired = due.expires is not None and due.expires <= now
            if expired or due.eta - now < 1:
                return None
            hide = math.ceil(due.eta - now)
        return min(SQS_MAX_DELAY_SECONDS, hide)


def copy_attributes(
    sent_body: str, body: str, received: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The message attributes of a fresh copy whose body went through S3, if it did.

    The copy is sent with the body SQS held (``sent_body``), never the one read from S3
    (``body``), which may be over SQS's limit; so, like the original, it is marked as
    an S3 pointer, with the attribute as the sender wrote it when the receive asked for
    it (``received``), or else with the size of the object, which is what AWS's clients
    and this package write. A body that did not go through S3 needs no attribute.
    """
    if sent_body == body:
        return {}
    marks = {
        name: {part: value for part, value in attribute.items() if part in _ATTRIBUTE_PARTS}
        for name, attribute in received.items()
        if name in (SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE)
    }
    return marks or size_attribute(len(body.encode("utf-8")))


#: What SendMessage takes of an attribute as ReceiveMessage gives it.
_ATTRIBUTE_PARTS = ("DataType", "StringValue", "BinaryValue")


def read_due(body: str) -> Due | None:
    """The task's id, name, ETA and expiry, from an SQS message body as kombu sends it.

    kombu sends the message's JSON envelope base64-encoded or as it is, depending on its
    version. None for anything that is not a protocol 2 task message: a message of
    Celery's protocol 1 (ETA in the body, which may be pickled) is held as before; so
    is an ETA that cannot be read, which Celery itself will reject.
    """
    envelope = _envelope(body)
    return due_of_headers(envelope.get("headers") if envelope else None)


def due_of_headers(headers: Any) -> Due | None:
    """The same from a message's headers, as a producer hands them to kombu's ``_put``.

    None for headers that are not a protocol 2 task's, or whose ETA cannot be read.
    """
    if not isinstance(headers, Mapping) or "task" not in headers:
        return None
    try:
        eta = _instant(headers.get("eta"))
        expires = _instant(headers.get("expires"))
    except ValueError:
        return None
    return Due(_text(headers.get("id")), _text(headers.get("task")), eta, expires)


def _envelope(body: str) -> dict[str, Any] | None:
    """The body read as JSON, or as base64 of JSON, whichever gives an object.

    At most one reading can: an object opens with a brace, which base64 never holds. So
    only that one is parsed; parsing the other first cost a failed ``json.loads``, an
    exception, for every message kombu sends in base64 (docs/benchmarks.md, "CPU per task").
    """
    text = body if _opens_an_object(body) else _b64_decoded(body)
    if text is None or not _opens_an_object(text):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _opens_an_object(text: str) -> bool:
    return text.lstrip().startswith("{")


def _b64_decoded(body: str) -> str | None:
    try:
        return base64.b64decode(body.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def _instant(value: Any) -> float | None:
    """An ISO 8601 instant as seconds since the epoch; naive means UTC, as for Celery.

    Celery's worker reads a naive ETA as UTC (``maybe_make_aware``); Celery's own
    producers always send an offset.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"not an ISO 8601 string: {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
