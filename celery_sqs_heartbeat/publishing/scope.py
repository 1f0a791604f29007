"""Publishing in SendMessageBatch calls: the scope, and the threads that send for it.

kombu sends one ``SendMessage`` per task and waits for it, so one producer thread
enqueues one task per SQS round trip. Inside :func:`publishing_in_batches`, every publish
of the thread (or greenlet) that opened it, through this transport (``apply_async``,
``delay``, ``send_task``, a group's tasks, a chord's header) leaves its message in the
process's :class:`~celery_sqs_heartbeat.publishing.book.PublishBook` and returns; up to
:data:`~celery_sqs_heartbeat.aws.clients.MAX_PUBLISH_CALLS_IN_FLIGHT` sending threads take calls
of ten out of it. The scope's end returns once SQS confirmed every message published
in it, or raises one :class:`PublishingFailed` naming the tasks SQS did not take.

The channel's part, catching kombu's ``SendMessage`` in ``_put``, is in
:mod:`celery_sqs_heartbeat.publishing.sender`; the call is
:func:`~celery_sqs_heartbeat.aws.sqs_send.send_message_batch`. docs/publishing.md says what
this guarantees, and what a process that dies inside a scope leaves in SQS.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..process import this_process
from .publisher import BatchPublisher, OnConfirmed, PublishingFailed, own_scopes

__all__ = ["PublishingFailed", "active_publisher", "publishing_in_batches"]


def active_publisher() -> BatchPublisher | None:
    """The process's publisher if the current thread (or greenlet) has a scope open.

    None in a child forked inside a scope, until it opens one of its own: its publishes
    in the inherited scope go out as kombu's own ``SendMessage``, each done once SQS took
    it (or raised), since the parent's scope cannot account for them.
    """
    return this_process().publisher if own_scopes() else None


@contextmanager
def publishing_in_batches(on_confirmed: OnConfirmed | None = None) -> Iterator[None]:
    """Publish in SendMessageBatch calls until the block ends; then wait for SQS.

    Every publish of this thread (or greenlet) through ``celery_sqs_heartbeat:Transport``
    meanwhile returns once its message is queued here; other threads' publishes are
    theirs, each done once SQS took it unless they open a scope too. At the end, the block
    waits until SQS confirmed every message published in it, and raises one
    :class:`PublishingFailed` naming those it did not take (an exception of the block's
    own goes on, the failures logged). ``on_confirmed`` is called with the task ids of
    each call SQS confirmed, on a sending thread: keep it quick.

    Scopes may nest: each waits for what its thread published while it was open, the
    inner scope's messages included. Scopes of several threads share calls and sending
    threads, and each waits only for its own thread's messages.
    """
    with this_process().publisher.scope(on_confirmed):
        yield
