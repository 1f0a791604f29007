"""Which queues are remote control's, by the names kombu's ``Mailbox`` gives them.

A worker's mailbox is ``<hostname>.<namespace>.pidbox`` and a client's reply queue
``<oid>.reply.<namespace>.pidbox``; SQS's queue names have dashes for the dots. Remote
control's queues are treated apart (a reply queue's poll is bounded by its caller's
timeout, it is kept between calls, a mailbox is polled again at once), and only their
names tell them apart: kombu declares them like any other queue.

A monitor's event queue (``celery events``, Flower) is told apart here too, since the
reaper (:mod:`celery_sqs_heartbeat.reaping`) sorts left queues by these names alone:
Celery's event receiver names it ``celeryev.<uuid4>`` (SQS: ``celeryev-<uuid4>``) unless
its caller passes a ``node_id``.
"""

from __future__ import annotations

import re

__all__ = ["is_event_queue", "is_mailbox", "is_reply_queue", "reply_queue_of"]

_REPLY_QUEUE = re.compile(r".+[.-]reply[.-].+[.-]pidbox")
_PIDBOX_QUEUE = re.compile(r".+[.-]pidbox")
#: kombu's Mailbox names a remote-control reply queue ``<routing key>.<reply exchange>``.
_PIDBOX_REPLY_EXCHANGE = re.compile(r"reply\..+\.pidbox")
_EVENT_QUEUE = re.compile(
    r"celeryev[.-][0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)


def is_reply_queue(queue: str) -> bool:
    """Whether ``queue`` is a remote-control client's reply queue (kombu or SQS name)."""
    return _REPLY_QUEUE.fullmatch(queue) is not None


def is_mailbox(queue: str) -> bool:
    """Whether ``queue`` is a worker's remote-control mailbox (kombu or SQS name)."""
    return _PIDBOX_QUEUE.fullmatch(queue) is not None and not is_reply_queue(queue)


def is_event_queue(queue: str) -> bool:
    """Whether ``queue`` (its queue name prefix removed) is an event receiver's own queue,
    named with the fresh UUID Celery gives it (kombu or SQS name)."""
    return _EVENT_QUEUE.fullmatch(queue) is not None


def reply_queue_of(exchange: str | None, routing_key: str | None) -> str | None:
    """The reply queue a remote-control reply to ``exchange`` with ``routing_key`` is for.

    None unless ``exchange`` is a reply exchange and the routing key names the client.
    SQS keeps bindings only in the memory of the process that declared them, so a worker
    never knows the reply queue of ``celery inspect``: its name is all there is.
    """
    if routing_key and _PIDBOX_REPLY_EXCHANGE.fullmatch(exchange or ""):
        return f"{routing_key}.{exchange}"
    return None
