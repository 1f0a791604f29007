"""The batch publisher's scopes: whose publishes a scope takes, FIFO order across clients, fork.

SQS is a botocore ``Stubber`` on the clients the sends go through; the publisher's own
sending threads make the calls, so each test waits for a scope's end, never sleeps.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import botocore.session
import gevent
import gevent.event
import pytest
from botocore.client import BaseClient
from botocore.stub import ANY, Stubber
from kombu import Connection

from celery_sqs_heartbeat.process import this_process
from celery_sqs_heartbeat.publishing.book import Unsent
from celery_sqs_heartbeat.publishing.publisher import BatchPublisher, SendTarget
from celery_sqs_heartbeat.publishing.scope import active_publisher, publishing_in_batches
from tests.unit.forking import OK, RAISED, WRONG, wait_for_child

URL = "http://127.0.0.1:9/123456789012/jobs.fifo"
PREDEFINED_URL = "http://127.0.0.1:9/123456789012/jobs"
GUARD = 10

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def publisher() -> BatchPublisher:
    """The process's batch publisher, the one every scope of the process publishes to."""
    return this_process().publisher


def new_client() -> BaseClient:
    """A kombu channel's own client: each channel (each producer) has one."""
    return botocore.session.Session().create_client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


@dataclass
class Producers:
    """Two producers' clients to one queue, each send answered by its Stubber."""

    clients: list[BaseClient]
    stubs: list[Stubber]
    #: The MessageBody of each call's entries, in the order the calls were made.
    wire: list[list[str]] = field(default_factory=list)


@pytest.fixture
def producers() -> Iterator[Producers]:
    made = Producers([], [])

    def note(params: dict[str, Any], **_: Any) -> None:
        made.wire.append([entry["MessageBody"] for entry in params["Entries"]])

    for _ in range(2):
        client = new_client()
        sender = this_process().clients.publish(client)
        sender.meta.events.register("before-parameter-build.sqs.SendMessageBatch", note)
        stub = Stubber(sender)
        stub.activate()
        made.clients.append(client)
        made.stubs.append(stub)
    yield made
    for stub in made.stubs:
        stub.deactivate()


def fifo_message(task_id: str, client: BaseClient, url: str = URL) -> Unsent:
    entry = {"MessageBody": task_id, "MessageGroupId": "g", "MessageDeduplicationId": task_id}
    return Unsent(task_id, SendTarget(client, url), entry, 100, "g", queue=url)


def sent(*task_ids: str) -> dict[str, Any]:
    return {
        "Successful": [
            {"Id": str(index), "MessageId": task_id, "MD5OfMessageBody": "x"}
            for index, task_id in enumerate(task_ids)
        ],
        "Failed": [],
    }


def test_a_publish_on_a_thread_without_a_scope_is_no_other_thread_s_to_take() -> None:
    """Thread A's scope must not take thread B's publish: B's ``apply_async`` promises a
    message SQS took, or an exception, to B, and A's scope would report B's failure."""
    opened, checked = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def other_thread() -> None:
        assert opened.wait(GUARD)
        seen["other thread"] = active_publisher() is not None
        checked.set()

    other = threading.Thread(target=other_thread)
    other.start()
    with publishing_in_batches():
        seen["own thread"] = active_publisher() is not None
        opened.set()
        assert checked.wait(GUARD)
    other.join(GUARD)
    assert seen == {"own thread": True, "other thread": False}


def test_each_greenlet_has_scopes_of_its_own() -> None:
    """gevent's greenlets share one thread: a thread-local would let one greenlet's scope
    take the publishes of every other, which a context variable does not."""
    opened, checked = gevent.event.Event(), gevent.event.Event()
    seen: dict[str, bool] = {}

    def opener() -> None:
        with publishing_in_batches():
            opened.set()
            checked.wait()
            seen["opener"] = active_publisher() is not None

    def other() -> None:
        opened.wait()
        seen["other greenlet"] = active_publisher() is not None
        checked.set()

    gevent.joinall([gevent.spawn(opener), gevent.spawn(other)], timeout=GUARD, raise_error=True)
    assert seen == {"opener": True, "other greenlet": False}


def test_nested_scopes_of_one_thread_each_count_what_was_published_inside_them(
    producers: Producers,
) -> None:
    """As before per-thread scopes: the inner publish is the outer scope's too."""
    client, stub = producers.clients[0], producers.stubs[0]
    stub.add_response("send_message_batch", sent("inner"))
    stub.add_response("send_message_batch", sent("outer"))
    confirmed: dict[str, list[str]] = {"outer": [], "inner": []}
    with publishing_in_batches(on_confirmed=confirmed["outer"].extend):
        with publishing_in_batches(on_confirmed=confirmed["inner"].extend):
            publisher().publish(fifo_message("inner", client))
        assert producers.wire == [["inner"]]
        assert active_publisher() is not None
        publisher().publish(fifo_message("outer", client))
    assert active_publisher() is None
    assert producers.wire == [["inner"], ["outer"]]
    # on_confirmed runs on a sending thread once the scope's count is settled: wait for it.
    deadline = time.monotonic() + GUARD
    while len(confirmed["outer"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {name: sorted(ids) for name, ids in confirmed.items()} == {
        "outer": ["inner", "outer"],
        "inner": ["inner"],
    }


def test_a_fifo_group_through_two_producers_keeps_its_order_behind_a_retry(
    producers: Producers,
) -> None:
    """Issue 31, 4: m1 through one producer fails once; m2 to m4 through another producer
    must wait for it, since the group's order is the queue's, whichever client sends."""
    (first, second), (first_stub, second_stub) = producers.clients, producers.stubs
    failed_once = {
        "Successful": [],
        "Failed": [{"Id": "0", "SenderFault": False, "Code": "InternalError", "Message": "x"}],
    }
    first_stub.add_response("send_message_batch", failed_once)
    first_stub.add_response("send_message_batch", sent("m1"))
    second_stub.add_response("send_message_batch", sent("m2", "m3", "m4"))
    with publishing_in_batches():
        publisher().publish(fifo_message("m1", first))
        for task_id in ("m2", "m3", "m4"):
            publisher().publish(fifo_message(task_id, second))
    assert producers.wire == [["m1"], ["m1"], ["m2", "m3", "m4"]]


def publish_in_child(channel: Any) -> bool:
    """In the child, inside the inherited scope: a publish is one SendMessage, made now."""
    client = channel.sqs(queue="jobs")
    with Stubber(client) as stub:
        stub.add_response("send_message", {"MessageId": "c", "MD5OfMessageBody": "x"})
        channel._put("jobs", channel.prepare_message("child", headers={"id": "child"}))
        stub.assert_no_pending_responses()
    return active_publisher() is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_a_scope_leaves_it_and_publishes_unbatched(
    producers: Producers,
) -> None:
    """Issue 31, 6: the child has no sending thread; waiting for the parent's scope there
    waited for ever. The parent's scope still settles its own message, and only it."""
    client, stub = producers.clients[0], producers.stubs[0]
    stub.add_response("send_message_batch", sent("parent"))
    connection = Connection(
        "sqs://key:secret@127.0.0.1:9/",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={
            "region": "us-east-1",
            "predefined_queues": {"jobs": {"url": PREDEFINED_URL}},
        },
    )
    channel = connection.channel()
    pid = -1
    code = RAISED
    try:
        with publishing_in_batches():
            publisher().publish(fifo_message("parent", client))
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm ends a hung child
                signal.alarm(GUARD)
                unbatched = publish_in_child(channel)
        if pid == 0:
            code = OK if unbatched else WRONG
    except BaseException:
        if pid != 0:
            raise
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        if pid == 0:
            os._exit(code)
    assert wait_for_child(pid, GUARD) == "ok"
    assert producers.wire == [["parent"]]


def test_a_batched_body_put_in_s3_names_the_queue_s_account_as_the_bucket_owner() -> None:
    """Issue 32, item 2, on the batched path: kombu's QueueUrl is taken off the entry
    before the body goes to S3, so the owner must come from the queue's URL given apart."""
    aws_url = "https://sqs.us-east-1.amazonaws.com/210987654321/jobs"
    connection = Connection(
        "sqs://key:secret@",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={
            "region": "us-east-1",
            "predefined_queues": {"jobs": {"url": aws_url}},
            "large_payload_bucket": "payloads",
            "large_payload_threshold": 100,
        },
    )
    channel = connection.channel()
    client = channel.sqs(queue="jobs")
    clients = this_process().clients
    sqs_stub, s3_stub = Stubber(clients.publish(client)), Stubber(clients.s3(client))
    sqs_stub.add_response("get_queue_attributes", {"Attributes": {"MaximumMessageSize": "1048576"}})
    s3_stub.add_response(
        "put_object",
        {},
        {
            "Bucket": "payloads",
            "Key": ANY,
            "Body": ANY,
            "ExpectedBucketOwner": "210987654321",
        },
    )
    message = channel.prepare_message("x" * 500, headers={"id": "big"})
    with sqs_stub, s3_stub:
        entry = channel.sender.unsent(
            "jobs", message, client, {"QueueUrl": aws_url, "MessageBody": "x" * 500}
        )
        s3_stub.assert_no_pending_responses()
    assert entry.entry["MessageBody"].startswith('["software.amazon.payloadoffloading')
