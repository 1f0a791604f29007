"""The sender on its own: kombu's put as a callable, no kombu channel."""

from __future__ import annotations

from typing import Any

from celery_sqs_heartbeat.payloads.options import PayloadAccess
from celery_sqs_heartbeat.payloads.store import PayloadStore
from celery_sqs_heartbeat.publishing.sender import Sender


def sender() -> Sender:
    return Sender(PayloadStore(None, PayloadAccess(frozenset())), lambda name: name)


def test_outside_a_scope_kombus_put_sends_through_the_client_as_it_is() -> None:
    client = object()
    clients: list[Any] = []
    part = sender()

    part.put("jobs", {"body": "x"}, lambda: clients.append(part.catching(client)))  # type: ignore[arg-type]

    assert clients == [client]
    assert part.catching(client) is client  # type: ignore[arg-type]


def test_a_redelivery_in_a_scope_is_kombus_own_at_once() -> None:
    from celery_sqs_heartbeat.publishing.scope import publishing_in_batches

    client = object()
    clients: list[Any] = []
    part = sender()

    with publishing_in_batches():
        part.put("jobs", {"redelivered": True}, lambda: clients.append(part.catching(client)))  # type: ignore[arg-type]

    assert clients == [client]


def test_a_remote_control_reply_in_a_scope_is_kombus_own_at_once() -> None:
    """Issue 31: a reply caught for a batch escaped the reply keeper, which drops a reply
    to a reply queue that is gone; the batch then failed the scope of a task whose thread
    happened to answer. A reply is remote control's, never a scope's."""
    from celery_sqs_heartbeat.publishing.scope import publishing_in_batches

    client = object()
    clients: list[Any] = []
    part = sender()
    reply_queue = "2f1c0a4e-9b7d-4c39-8a0e-3d1f2b6c7a55.reply.celery.pidbox"

    with publishing_in_batches():
        part.put(reply_queue, {"body": "pong"}, lambda: clients.append(part.catching(client)))  # type: ignore[arg-type]

    assert clients == [client]
