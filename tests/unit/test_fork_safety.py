"""A forked child (a prefork pool process) never waits on a lock some parent thread held.

A child has only the thread that forked: a module lock another thread held at the
fork stays held in the child for ever, so its first S3 offload or first client waited
for ever. Nor does a child use the parent's clients, whose connection pools (sockets)
the parent goes on using. Each test holds a lock in another thread, forks, and has the
child do what needs that lock under an alarm; the child answers through its exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import botocore.session
import pytest
from botocore.client import BaseClient

from celery_sqs_heartbeat.aws import sqs_queue as sqs
from celery_sqs_heartbeat.payloads import store as payload_store
from celery_sqs_heartbeat.payloads.options import LargePayloadOptions
from celery_sqs_heartbeat.payloads.pointers import FailureStreak, S3Pointer
from celery_sqs_heartbeat.payloads.store import PayloadStore, delete_objects_of, s3_client
from tests.unit.conftest import make_lease

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12 warns at every fork of a process with threads; here that is the point.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

#: How long the child may take before it counts as hung; a client is made in well under.
CHILD_SECONDS = 5

#: The child's answers, by exit status.
OK, WRONG, RAISED = 0, 1, 2


def in_child(check: Callable[[], bool]) -> str:
    """Run ``check`` in a forked child under an alarm: "ok", "wrong", "raised" or "hung"."""
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never back into pytest
        code = RAISED
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm ends the child
            signal.alarm(CHILD_SECONDS)
            code = OK if check() else WRONG
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_SECONDS + 5
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done:
        if time.monotonic() > deadline:  # the alarm did not end it: end it here
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.01)
        done, status = os.waitpid(pid, os.WNOHANG)
    code = os.waitstatus_to_exitcode(status)
    answers = {OK: "ok", WRONG: "wrong", RAISED: "raised", -signal.SIGALRM: "hung"}
    return answers.get(code, f"exit status {code}")


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by a thread of this process for as long as the block runs."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(5)
    try:
        yield
    finally:
        done.set()
        thread.join(5)


@pytest.fixture(scope="module")
def source() -> BaseClient:
    """A queue's SQS client; made without any call to AWS."""
    return botocore.session.Session().create_client(
        "sqs",
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty client and object caches for the test; the module's own come back after."""
    monkeypatch.setattr(sqs, "_renewal_clients", weakref.WeakKeyDictionary())
    monkeypatch.setattr(sqs, "_receive_clients", weakref.WeakKeyDictionary())
    monkeypatch.setattr(payload_store, "_s3_clients", weakref.WeakKeyDictionary())
    monkeypatch.setattr(payload_store, "_objects", weakref.WeakKeyDictionary())
    monkeypatch.setattr(payload_store, "_deletes", FailureStreak())


@pytest.mark.usefixtures("fresh_caches")
def test_a_child_forked_during_a_client_build_makes_its_own_clients(
    source: BaseClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = os.getpid()
    renewal = sqs.renewal_client(source)
    building, finish = threading.Event(), threading.Event()
    made_like = sqs._made_like

    def slow_in_the_parent(client: BaseClient, config: Any) -> BaseClient:
        if os.getpid() == parent:  # the parent's build is under way at the fork
            building.set()
            finish.wait(10)
        return made_like(client, config)

    monkeypatch.setattr(sqs, "_made_like", slow_in_the_parent)
    builder = threading.Thread(target=sqs.receive_client, args=(source,), daemon=True)
    builder.start()
    assert building.wait(5)

    def own_clients() -> bool:
        receive = sqs.receive_client(source)
        mine = sqs.renewal_client(source)
        return mine is not renewal and sqs.renewal_client(source) is mine and receive is not mine

    try:
        answer = in_child(own_clients)
    finally:
        finish.set()
        builder.join(10)

    assert answer == "ok"
    assert sqs.renewal_client(source) is renewal  # the parent keeps its own


@pytest.mark.usefixtures("fresh_caches")
def test_a_child_makes_its_own_s3_client_while_a_parent_thread_makes_one(
    source: BaseClient,
) -> None:
    parents = s3_client(source)

    def own_client() -> bool:
        mine = s3_client(source)
        return mine is not parents and s3_client(source) is mine

    with held_by_another_thread(payload_store._clients_lock):
        answer = in_child(own_client)

    assert answer == "ok"
    assert s3_client(source) is parents


@pytest.mark.usefixtures("fresh_caches")
def test_a_child_keeps_objects_of_its_own_while_a_parent_thread_holds_them() -> None:
    store = PayloadStore(LargePayloadOptions("tasks"))
    parents = make_lease("jobs", task_id="parent's")
    store.remember(parents, S3Pointer("tasks", "parent's"))
    payload_store._deletes.failed()  # the parent is in a streak of failed deletes
    asked: list[str] = []

    def no_client() -> BaseClient:
        asked.append("client")
        raise AssertionError("nothing of the child's to delete")

    def objects_of_its_own() -> bool:
        store.remember(make_lease("jobs", task_id="child's"), S3Pointer("tasks", "child's"))
        # The parent's message is the parent's to delete, and its object with it.
        delete_objects_of(no_client, [parents])
        return not asked and payload_store._deletes.failures == 0

    with held_by_another_thread(payload_store._objects_lock):
        answer = in_child(objects_of_its_own)

    assert answer == "ok"
    assert payload_store._objects.get(parents) == (S3Pointer("tasks", "parent's"), None)
    assert payload_store._deletes.failures == 1
