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
