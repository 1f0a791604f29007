"""A forked child (a prefork pool process) never waits on a lock some parent thread held.

A child has only the thread that forked: a lock another thread held at the fork stays
held in the child for ever, so its first S3 offload or first client waited for ever.
Nor does a child use the parent's clients, whose connection pools (sockets) the parent
goes on using, nor its manager, publisher, S3 clean-up or leftovers. All of them are
the process's state (:mod:`celery_sqs_heartbeat.process`), replaced whole in a child.
Each test holds a lock of the parent's state in another thread (or has a thread making
a client), forks, and has the child do what needs that lock under an alarm; the child
answers through its exit status. The parent keeps what it had.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import botocore.session
import pytest
from botocore.client import BaseClient

from celery_sqs_heartbeat import process
from celery_sqs_heartbeat.aws import clients as clients_module
from celery_sqs_heartbeat.payloads.options import LargePayloadOptions
from celery_sqs_heartbeat.payloads.pointers import S3Pointer
from celery_sqs_heartbeat.payloads.store import PayloadStore
from celery_sqs_heartbeat.process import ProcessState, this_process
from tests.unit.conftest import make_lease
from tests.unit.forking import held_by_another_thread, in_child

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12 warns at every fork of a process with threads; here that is the point.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def source() -> BaseClient:
    """A queue's SQS client; made without any call to AWS."""
    return botocore.session.Session().create_client(
        "sqs",
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_a_child_forked_during_a_client_build_makes_its_own_clients(
    process_state: ProcessState, source: BaseClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = os.getpid()
    clients = process_state.clients
    renewal = clients.renewal(source)
    building, finish = threading.Event(), threading.Event()
    sqs_like = clients_module._sqs_like

    def slow_in_the_parent(session: Any, client: BaseClient, config: Any) -> BaseClient:
        if os.getpid() == parent:  # the parent's build is under way at the fork
            building.set()
            finish.wait(10)
        return sqs_like(session, client, config)

    monkeypatch.setattr(clients_module, "_sqs_like", slow_in_the_parent)
    builder = threading.Thread(target=clients.receive, args=(source,), daemon=True)
    builder.start()
    assert building.wait(5)

    def own_clients() -> bool:
        childs = this_process().clients
        receive = childs.receive(source)
        mine = childs.renewal(source)
        return (
            childs is not clients
            and mine is not renewal
            and childs.renewal(source) is mine
            and receive is not mine
        )

    try:
        answer = in_child(own_clients)
    finally:
        finish.set()
        builder.join(10)

    assert answer == "ok"
    assert this_process().clients.renewal(source) is renewal  # the parent keeps its own


def test_a_child_makes_its_own_s3_client_while_a_parent_thread_makes_one(
    process_state: ProcessState, source: BaseClient
) -> None:
    parents = process_state.clients.s3(source)

    def own_client() -> bool:
        mine = this_process().clients.s3(source)
        return mine is not parents and this_process().clients.s3(source) is mine

    with held_by_another_thread(process_state.clients._lock):
        answer = in_child(own_client)

    assert answer == "ok"
    assert this_process().clients.s3(source) is parents


def test_a_child_makes_its_own_manager_and_publisher_while_parent_threads_hold_the_state(
    process_state: ProcessState,
) -> None:
    """One parent thread is asking for the state, another for its manager, at the fork."""
    parents_manager, parents_publisher = process_state.manager, process_state.publisher

    def own_manager_and_publisher() -> bool:
        state = this_process()
        manager, publisher = state.manager, state.publisher
        return (
            state is not process_state
            and state.pid == os.getpid()
            and manager is not parents_manager
            and len(manager) == 0
            and state.manager is manager
            and publisher is not parents_publisher
            and state.publisher is publisher
        )

    with held_by_another_thread(process._state_lock), held_by_another_thread(process_state._lock):
        answer = in_child(own_manager_and_publisher)

    assert answer == "ok"
    assert this_process() is process_state
    assert process_state.manager is parents_manager
    assert process_state.publisher is parents_publisher


def test_a_child_keeps_objects_of_its_own_while_a_parent_thread_holds_them(
    process_state: ProcessState,
) -> None:
    store = PayloadStore(LargePayloadOptions("tasks"))
    cleanup = process_state.s3_cleanup
    parents = make_lease("jobs", task_id="parent's")
    store.remember(parents, S3Pointer("tasks", "parent's"))
    cleanup._failures.failed()  # the parent is in a streak of failed deletes
    asked: list[str] = []

    def no_client() -> BaseClient:
        asked.append("client")
        raise AssertionError("nothing of the child's to delete")

    def objects_of_its_own() -> bool:
        store.remember(make_lease("jobs", task_id="child's"), S3Pointer("tasks", "child's"))
        childs = this_process().s3_cleanup
        # The parent's message is the parent's to delete, and its object with it.
        childs.deleted(no_client, [parents])
        return childs is not cleanup and not asked and childs._failures.failures == 0

    with held_by_another_thread(cleanup._lock):
        answer = in_child(objects_of_its_own)

    assert answer == "ok"
    assert cleanup._objects.get(parents) == (S3Pointer("tasks", "parent's"), None)
    assert cleanup._failures.failures == 1


class Channel:
    """A channel that declared an auto-delete queue: it notes its removals."""

    def __init__(self) -> None:
        self.removals = 0

    def remove_queues_still_consumed(self) -> None:
        self.removals += 1


def test_a_child_leaves_with_leftovers_of_its_own_while_a_parent_thread_holds_them(
    process_state: ProcessState,
) -> None:
    """The child's leaving removes its own queues; the parent's stay the parent's."""
    parents, parents_channel = process_state.leftovers, Channel()
    parents.add_channel(parents_channel, os.getpid())
    deleted: list[str] = []
    parents.reply_queues.used("url-parent", lambda: deleted.append("parent"), os.getpid(), 0.0)

    def leftovers_of_its_own() -> bool:
        state = this_process()
        childs_channel = Channel()
        state.leftovers.add_channel(childs_channel, os.getpid())
        state.leftovers.reply_queues.used(
            "url-child", lambda: deleted.append("child"), os.getpid(), 0.0
        )
        state.leave()
        return (
            state.leftovers is not parents
            and childs_channel.removals == 1
            and parents_channel.removals == 0
            and deleted == ["child"]
        )

    with held_by_another_thread(parents._lock), held_by_another_thread(parents.reply_queues._lock):
        answer = in_child(leftovers_of_its_own)

    assert answer == "ok"
    assert deleted == [] and parents_channel.removals == 0
    assert list(parents.reply_queues.take_all(os.getpid())) == ["url-parent"]
