"""Which queues are remote control's, by the names kombu's ``Mailbox`` gives them.

A worker's mailbox is ``<hostname>.<namespace>.pidbox`` and a client's reply queue
``<oid>.reply.<namespace>.pidbox``; SQS's queue names have dashes for the dots. Remote
control's queues are treated apart (a reply queue's poll is bounded by its caller's
timeout, it is kept between calls, a mailbox is polled again at once), and only their
names tell them apart: kombu declares them like any other queue.
"""

from __future__ import annotations

import re

__all__ = ["is_mailbox", "is_reply_queue"]

_REPLY_QUEUE = re.compile(r".+[.-]reply[.-].+[.-]pidbox")
_PIDBOX_QUEUE = re.compile(r".+[.-]pidbox")


def is_reply_queue(queue: str) -> bool:
    """Whether ``queue`` is a remote-control client's reply queue (kombu or SQS name)."""
    return _REPLY_QUEUE.fullmatch(queue) is not None


def is_mailbox(queue: str) -> bool:
    """Whether ``queue`` is a worker's remote-control mailbox (kombu or SQS name)."""
    return _PIDBOX_QUEUE.fullmatch(queue) is not None and not is_reply_queue(queue)
