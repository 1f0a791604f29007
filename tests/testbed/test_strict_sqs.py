"""Tests of the strict SQS test bed itself: plain boto3 against the real subprocess server.

Each rule test also checks the behaviour plain moto gets wrong, so it fails against an
unpatched moto server.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError
from botocore.parsers import ResponseParserError

import celery_sqs_heartbeat
from celery_sqs_heartbeat.testing import FaultKind, StrictSQSServer

# Faults must reach the test, not be hidden by botocore's retries.
NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})
NOT_INFLIGHT = "AWS.SimpleQueueService.MessageNotInflight"
SHORT_HOLD = 4


def make_client(server: StrictSQSServer) -> Any:
    return boto3.client("sqs", config=NO_RETRIES, **server.boto3_kwargs)


@pytest.fixture(autouse=True)
def _clear_faults(sqs_server: StrictSQSServer) -> Iterator[None]:
    yield
    sqs_server.clear_faults()


@pytest.fixture
def sqs(sqs_server: StrictSQSServer) -> Any:
    return make_client(sqs_server)


@pytest.fixture
def queue_url(sqs: Any) -> str:
    url: str = sqs.create_queue(QueueName=f"testbed-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    return url


def receive_one(sqs: Any, queue_url: str, visibility: int) -> dict[str, Any]:
    messages = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=1, VisibilityTimeout=visibility
    ).get("Messages", [])
    assert len(messages) == 1
    message: dict[str, Any] = messages[0]
    return message


def receive_none(sqs: Any, queue_url: str) -> None:
    assert "Messages" not in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)


def change(sqs: Any, queue_url: str, handle: str, visibility: int) -> None:
    sqs.change_message_visibility(
        QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=visibility
    )


def error_code(excinfo: pytest.ExceptionInfo[ClientError]) -> str:
    code: str = excinfo.value.response["Error"]["Code"]
    return code


def query_call(server: StrictSQSServer, params: dict[str, str]) -> tuple[int, str]:
    """A query-protocol (form-encoded) call, as older SQS clients make."""
    request = urllib.request.Request(
        f"{server.endpoint_url}/",
        data=urllib.parse.urlencode(params).encode(),
        method="POST",
        headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
            # moto routes by the SigV4 credential scope and does not check signatures.
            "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20240101/us-east-1/sqs/"
            "aws4_request, SignedHeaders=host, Signature=0",
        },
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# -- rule 1: only the latest receipt handle may change the lease ----------------------


def test_stale_handle_is_refused_and_does_not_move_the_new_lease(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    first = receive_one(sqs, queue_url, visibility=1)
    time.sleep(1.1)
    second = receive_one(sqs, queue_url, visibility=30)
    assert second["MessageId"] == first["MessageId"]

    with pytest.raises(ClientError) as excinfo:
        change(sqs, queue_url, first["ReceiptHandle"], 0)
    assert error_code(excinfo) == "InvalidParameterValue"
    assert "is not available for visibility timeout change" in str(excinfo.value)
    receive_none(sqs, queue_url)  # moto would have released the second receive's lease

    change(sqs, queue_url, second["ReceiptHandle"], 60)
    receive_none(sqs, queue_url)


def test_handle_of_deleted_message_is_refused(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)

    with pytest.raises(ClientError) as excinfo:
        change(sqs, queue_url, handle, 30)
    assert error_code(excinfo) == "InvalidParameterValue"


def test_unknown_handle_is_invalid(sqs: Any, queue_url: str) -> None:
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        change(sqs, queue_url, "not-a-handle", 30)


# -- rule 2: only an in-flight message's lease can change ------------------------------


def test_change_within_lease_extends_it(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=1)["ReceiptHandle"]
    change(sqs, queue_url, handle, 30)
    time.sleep(1.1)
    receive_none(sqs, queue_url)


def test_change_after_expiry_is_message_not_inflight(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=1)["ReceiptHandle"]
    time.sleep(1.1)

    with pytest.raises(sqs.exceptions.MessageNotInflight) as excinfo:
        change(sqs, queue_url, handle, 30)
    assert error_code(excinfo) == NOT_INFLIGHT
    receive_one(sqs, queue_url, visibility=30)  # moto would have hidden it again


# -- rule 3: at most max-hold seconds after the receive --------------------------------


def test_hold_limit_counts_from_the_receive(short_hold_server: StrictSQSServer) -> None:
    sqs = make_client(short_hold_server)
    queue_url = sqs.create_queue(QueueName="hold")["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    time.sleep(2)  # counted from the send (as moto does), 3 s more would pass the limit
    handle = receive_one(sqs, queue_url, visibility=2)["ReceiptHandle"]

    change(sqs, queue_url, handle, SHORT_HOLD - 1)
    with pytest.raises(ClientError) as excinfo:
        change(sqs, queue_url, handle, SHORT_HOLD + 1)
    assert error_code(excinfo) == "InvalidParameterValue"
    assert "beyond the limit [4 seconds]" in str(excinfo.value)

    result = sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "within", "ReceiptHandle": handle, "VisibilityTimeout": 1},
            {"Id": "beyond", "ReceiptHandle": handle, "VisibilityTimeout": 60},
        ],
    )
    assert [entry["Id"] for entry in result["Successful"]] == ["within"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in result["Failed"]] == [
        ("beyond", "InvalidParameterValue", True)
    ]


# -- rule 4: batch errors are per entry ------------------------------------------------


def test_batch_reports_each_bad_entry_in_failed(sqs: Any, queue_url: str) -> None:
    # moto serves a standard queue in send order, which makes the receives predictable.
    for body in ("good", "stale", "expired"):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    good = receive_one(sqs, queue_url, visibility=30)
    stale = receive_one(sqs, queue_url, visibility=1)
    expired = receive_one(sqs, queue_url, visibility=1)
    assert [good["Body"], stale["Body"], expired["Body"]] == ["good", "stale", "expired"]
    time.sleep(1.1)
    assert receive_one(sqs, queue_url, visibility=30)["Body"] == "stale"

    result = sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "good", "ReceiptHandle": good["ReceiptHandle"], "VisibilityTimeout": 60},
            {"Id": "stale", "ReceiptHandle": stale["ReceiptHandle"], "VisibilityTimeout": 60},
            {"Id": "expired", "ReceiptHandle": expired["ReceiptHandle"], "VisibilityTimeout": 60},
        ],
    )
    assert result["Successful"] == [{"Id": "good"}]
    failed = {entry["Id"]: entry for entry in result["Failed"]}
    assert failed["stale"]["Code"] == "InvalidParameterValue"
    assert failed["expired"]["Code"] == NOT_INFLIGHT
    assert all(entry["SenderFault"] is True and entry["Message"] for entry in failed.values())


def test_malformed_batches_fail_as_a_whole(sqs: Any, queue_url: str) -> None:
    entry = {"ReceiptHandle": "h", "VisibilityTimeout": 1}
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=[])
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.change_message_visibility_batch(
            QueueUrl=queue_url, Entries=[{"Id": str(i), **entry} for i in range(11)]
        )
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.change_message_visibility_batch(
            QueueUrl=queue_url, Entries=[{"Id": "same", **entry}, {"Id": "same", **entry}]
        )


# -- rule 5: visibility 0 releases at once ---------------------------------------------


def test_release_makes_message_visible_at_once(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    change(sqs, queue_url, handle, 0)

    # A released message is no longer in flight (moto would hide it again).
    with pytest.raises(sqs.exceptions.MessageNotInflight):
        change(sqs, queue_url, handle, 30)
    receive_one(sqs, queue_url, visibility=30)


def test_release_wakes_a_waiting_long_poll(sqs_server: StrictSQSServer, queue_url: str) -> None:
    sqs = make_client(sqs_server)
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    received: list[float] = []

    def long_poll() -> None:
        poller = make_client(sqs_server)
        if poller.receive_message(QueueUrl=queue_url, WaitTimeSeconds=10).get("Messages"):
            received.append(time.monotonic())

    thread = threading.Thread(target=long_poll)
    thread.start()
    time.sleep(0.3)  # the poll is now waiting inside the server
    released = time.monotonic()
    change(sqs, queue_url, handle, 0)
    thread.join(timeout=15)
    assert received, "the long poll did not get the released message"
    assert received[0] - released < 0.5


# -- rule 6: only the latest receipt handle deletes ------------------------------------


def receive_again(sqs: Any, queue_url: str, message_id: str, timeout: float = 5) -> dict[str, Any]:
    """Receive ``message_id`` once its 1 s lease has run out (polled, at most ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=1, VisibilityTimeout=30
        ).get("Messages", [])
        if messages:
            message: dict[str, Any] = messages[0]
            assert message["MessageId"] == message_id
            return message
        time.sleep(0.1)
    raise AssertionError(f"message {message_id} was not received again within {timeout} s")


def message_counts(sqs: Any, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages in the queue."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def delete_results(server: StrictSQSServer, queue_url: str) -> list[tuple[str | None, str]]:
    queue = queue_url.rsplit("/", 1)[1]
    return [
        (e["message_id"], e["result"])
        for e in server.events()
        if e["queue"] == queue and e["action"] == "delete"
    ]


def test_delete_with_stale_handle_succeeds_but_keeps_the_message(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    message_id = sqs.send_message(QueueUrl=queue_url, MessageBody="m")["MessageId"]
    first = receive_one(sqs, queue_url, visibility=1)
    second = receive_again(sqs, queue_url, message_id)

    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=first["ReceiptHandle"])
    assert message_counts(sqs, queue_url) == (0, 1)  # moto would have deleted it
    assert delete_results(sqs_server, queue_url) == [(message_id, "stale")]

    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=second["ReceiptHandle"])
    assert message_counts(sqs, queue_url) == (0, 0)
    # Deleting a deleted message succeeds, with any of its handles.
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=first["ReceiptHandle"])
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=second["ReceiptHandle"])
    assert delete_results(sqs_server, queue_url) == [
        (message_id, "stale"),
        (message_id, "ok"),
        (message_id, "ok"),
        (message_id, "ok"),
    ]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle="not-a-handle")


def test_stale_delete_leaves_the_message_to_be_received_again(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    first = receive_one(sqs, queue_url, visibility=1)
    second = receive_again(sqs, queue_url, first["MessageId"])
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=first["ReceiptHandle"])
    change(sqs, queue_url, second["ReceiptHandle"], 0)  # the latest lease is untouched
    assert receive_one(sqs, queue_url, visibility=30)["Body"] == "m"


def test_delete_batch_with_stale_handle_succeeds_but_keeps_the_message(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    # moto serves a standard queue in send order, which makes the receives predictable.
    stale_id = sqs.send_message(QueueUrl=queue_url, MessageBody="stale")["MessageId"]
    fresh_id = sqs.send_message(QueueUrl=queue_url, MessageBody="fresh")["MessageId"]
    first = receive_one(sqs, queue_url, visibility=1)
    fresh = receive_one(sqs, queue_url, visibility=30)
    assert [first["MessageId"], fresh["MessageId"]] == [stale_id, fresh_id]
    latest = receive_again(sqs, queue_url, stale_id)

    result = sqs.delete_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "stale", "ReceiptHandle": first["ReceiptHandle"]},
            {"Id": "fresh", "ReceiptHandle": fresh["ReceiptHandle"]},
            {"Id": "unknown", "ReceiptHandle": "not-a-handle"},
        ],
    )
    assert sorted(entry["Id"] for entry in result["Successful"]) == ["fresh", "stale"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in result["Failed"]] == [
        ("unknown", "ReceiptHandleIsInvalid", True)
    ]
    assert message_counts(sqs, queue_url) == (0, 1)  # moto would have deleted both
    assert delete_results(sqs_server, queue_url) == [
        (stale_id, "stale"),
        (fresh_id, "ok"),
        (None, "ReceiptHandleIsInvalid"),
    ]

    result = sqs.delete_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "latest", "ReceiptHandle": latest["ReceiptHandle"]},
            {"Id": "again", "ReceiptHandle": fresh["ReceiptHandle"]},
        ],
    )
    assert sorted(entry["Id"] for entry in result["Successful"]) == ["again", "latest"]
    assert result.get("Failed", []) == []
    assert message_counts(sqs, queue_url) == (0, 0)
    assert delete_results(sqs_server, queue_url)[3:] == [(stale_id, "ok"), (fresh_id, "ok")]


def receive_all(sqs: Any, queue_url: str, count: int) -> list[str]:
    """The receipt handles of ``count`` messages, received for 60 s."""
    handles: list[str] = []
    while len(handles) < count:
        answer = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        )
        handles.extend(m["ReceiptHandle"] for m in answer.get("Messages", []))
    return handles


def test_oversized_and_ambiguous_delete_batches_fail_as_a_whole(sqs: Any, queue_url: str) -> None:
    sqs.send_message_batch(
        QueueUrl=queue_url, Entries=[{"Id": str(n), "MessageBody": "m"} for n in range(10)]
    )
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handles = receive_all(sqs, queue_url, 11)
    entries = [{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(handles)]

    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.delete_message_batch(
            QueueUrl=queue_url, Entries=[entries[0], {**entries[1], "Id": "0"}]
        )
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=[{**entries[0], "Id": "no spaces"}])
    assert message_counts(sqs, queue_url) == (0, 11)  # moto would have deleted them all


# -- concurrency ----------------------------------------------------------------------


def test_concurrent_receives_hand_out_each_message_once(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    for batch in range(3):
        sqs.send_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "MessageBody": f"{batch}-{i}"} for i in range(10)],
        )
    received: list[str] = []

    def drain() -> None:
        client = make_client(sqs_server)
        while messages := client.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages"):
            received.extend(m["MessageId"] for m in messages)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(received) == len(set(received)) == 30


def test_fifo_long_poll_does_not_block_the_busy_group(
    sqs_server: StrictSQSServer, sqs: Any
) -> None:
    queue_url = sqs.create_queue(
        QueueName=f"testbed-{uuid.uuid4().hex[:12]}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for body in ("first", "second"):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageGroupId="g")
    first = receive_one(sqs, queue_url, visibility=30)
    bodies: list[str] = []

    def long_poll() -> None:
        poller = make_client(sqs_server)
        messages = poller.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5)
        bodies.extend(m["Body"] for m in messages.get("Messages", []))

    thread = threading.Thread(target=long_poll)
    thread.start()
    time.sleep(0.3)  # the poll now waits for group "g" to be free
    started = time.monotonic()
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=first["ReceiptHandle"])
    # Held by the poll, the delete would answer when the poll's 5 s end.
    assert time.monotonic() - started < 4
    thread.join(timeout=10)
    assert bodies == ["second"]


def test_fifo_group_lapsed_together_comes_back_in_order(sqs: Any) -> None:
    queue_url = sqs.create_queue(
        QueueName=f"testbed-{uuid.uuid4().hex[:12]}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for body in ("A1", "A2", "A3"):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageGroupId="A")
    held = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=3, VisibilityTimeout=1)
    assert [m["Body"] for m in held["Messages"]] == ["A1", "A2", "A3"]
    time.sleep(1.5)
    again = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1)
    assert [m["Body"] for m in again["Messages"]] == ["A1"]


# -- fault injection ------------------------------------------------------------------


def test_throttle_fault(sqs_server: StrictSQSServer, sqs: Any, queue_url: str) -> None:
    sqs_server.inject_fault("GetQueueUrl", "throttle", count=2)
    name = queue_url.rsplit("/", 1)[1]
    for _ in range(2):
        with pytest.raises(ClientError) as excinfo:
            sqs.get_queue_url(QueueName=name)
        assert error_code(excinfo) == "ThrottlingException"
        assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == queue_url
    assert sqs_server.pending_faults() == []


@pytest.mark.parametrize("action", ["DeleteMessageBatch", "ChangeMessageVisibilityBatch"])
def test_entry_faults_fail_single_entries_and_let_the_rest_through(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str, action: str
) -> None:
    for n in range(3):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"m{n}")
    handles = [receive_one(sqs, queue_url, 30)["ReceiptHandle"] for _ in range(3)]
    sqs_server.fail_entries(action, "InternalError", count=2)
    assert sqs_server.pending_faults() == [
        {"type": "entries", "action": action, "code": "InternalError", "count": 2}
    ]

    entries = [{"Id": str(n), "ReceiptHandle": h} for n, h in enumerate(handles)]
    if action == "DeleteMessageBatch":
        answer = sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
    else:
        entries = [{**entry, "VisibilityTimeout": 0} for entry in entries]
        answer = sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)

    assert [entry["Id"] for entry in answer["Successful"]] == ["2"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in answer["Failed"]] == [
        ("0", "InternalError", False),
        ("1", "InternalError", False),
    ]
    assert sqs_server.pending_faults() == []


def test_send_entry_faults_fail_single_entries_and_send_only_the_rest(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.fail_entries("SendMessageBatch", "InternalError", count=1)
    sqs_server.fail_entries("SendMessageBatch", "InvalidMessageContents", count=1)
    entries = [{"Id": str(n), "MessageBody": f"m{n}"} for n in range(4)]

    answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)

    assert sorted(entry["Id"] for entry in answer["Successful"]) == ["2", "3"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in answer["Failed"]] == [
        ("0", "InternalError", False),
        ("1", "InvalidMessageContents", True),
    ]
    bodies = sorted(receive_one(sqs, queue_url, 30)["Body"] for _ in range(2))
    assert bodies == ["m2", "m3"]
    receive_none(sqs, queue_url)
    assert sqs_server.pending_faults() == []


def test_a_send_answers_alike_on_a_long_queue_and_counts_it_right(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    """The server's sends read one queue attribute; GetQueueAttributes still counts all."""
    for start in range(0, 30, 10):
        entries = [{"Id": str(n), "MessageBody": f"m{start + n}"} for n in range(10)]
        assert len(sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)["Successful"]) == 10
    sqs.send_message(QueueUrl=queue_url, MessageBody="last")
    counts = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "31"


@pytest.mark.parametrize("by_content", [True, False])
def test_a_fifo_send_reads_the_queue_s_content_based_deduplication(
    sqs: Any, by_content: bool
) -> None:
    url = sqs.create_queue(
        QueueName=f"testbed-{uuid.uuid4().hex[:12]}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": str(by_content).lower()},
    )["QueueUrl"]
    if not by_content:
        with pytest.raises(ClientError):
            sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
        return
    for _ in range(2):
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    assert receive_one(sqs, url, 30)["Body"] == "same"
    receive_none(sqs, url)


def test_server_error_fault_has_no_side_effect(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.inject_fault("SendMessage", "server_error")
    with pytest.raises(ClientError) as excinfo:
        sqs.send_message(QueueUrl=queue_url, MessageBody="lost")
    assert error_code(excinfo) == "InternalError"
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    receive_none(sqs, queue_url)


def test_drop_connection_fault(sqs_server: StrictSQSServer, sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    sqs_server.inject_fault("ChangeMessageVisibilityBatch", "drop_connection")
    entries = [{"Id": "a", "ReceiptHandle": handle, "VisibilityTimeout": 0}]
    with pytest.raises(ConnectionClosedError):
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)
    receive_none(sqs, queue_url)  # the dropped call never reached moto
    assert sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)["Successful"]


def test_delay_fault(sqs_server: StrictSQSServer, sqs: Any, queue_url: str) -> None:
    # A delay of 2 s: the call after it, undelayed, stays under that on any busy machine.
    sqs_server.inject_fault("GetQueueAttributes", "delay", seconds=2)
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert time.monotonic() - started >= 2
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert time.monotonic() - started < 2


def test_throttle_fault_in_query_protocol(sqs_server: StrictSQSServer) -> None:
    sqs_server.inject_fault("ListQueues", "throttle")
    status, body = query_call(sqs_server, {"Action": "ListQueues", "Version": "2012-11-05"})
    assert status == 400
    assert "<Code>Throttling</Code>" in body
    status, _ = query_call(sqs_server, {"Action": "ListQueues", "Version": "2012-11-05"})
    assert status == 200


def test_invalid_fault_is_rejected(sqs_server: StrictSQSServer) -> None:
    with pytest.raises(ValueError, match="kind"):
        sqs_server.inject_fault("SendMessage", "explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds"):
        sqs_server.inject_fault("SendMessage", "delay")
    assert sqs_server.pending_faults() == []


# -- fault rules: outages, failure fractions, latency ---------------------------------


def poll_until_it_succeeds(call: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
            return
        except ClientError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def test_outage_fails_every_action_until_its_window_ends(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    started = time.monotonic()
    # Long enough that both calls land in it however busy the machine.
    sqs_server.outage(seconds=4, kind="server_error")
    for call in (sqs.list_queues, lambda: sqs.get_queue_attributes(QueueUrl=queue_url)):
        with pytest.raises(ClientError) as excinfo:
            call()
        assert error_code(excinfo) == "InternalError"

    poll_until_it_succeeds(lambda: sqs.get_queue_attributes(QueueUrl=queue_url), timeout=10)
    # The server's monotonic clock is this process's one: the window began after `started`.
    assert time.monotonic() - started >= 4
    assert sqs_server.pending_faults() == []


def test_outage_of_some_actions_spares_the_others_and_can_end_early(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.outage(seconds=60, kind="throttle", actions=["ReceiveMessage"])
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    with pytest.raises(ClientError) as excinfo:
        sqs.receive_message(QueueUrl=queue_url)
    assert error_code(excinfo) == "ThrottlingException"

    sqs_server.end_outages()
    receive_one(sqs, queue_url, visibility=30)


def test_calls_failed_by_an_outage_are_counted_but_not_logged(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    sqs_server.reset_calls()
    sqs_server.outage(seconds=60, kind="drop_connection", actions=["ChangeMessageVisibility"])
    for _ in range(3):
        with pytest.raises(ConnectionClosedError):
            change(sqs, queue_url, handle, 0)

    assert sqs_server.calls() == {"ChangeMessageVisibility": 3}
    queue = queue_url.rsplit("/", 1)[1]
    assert [e["action"] for e in sqs_server.events() if e["queue"] == queue] == ["receive"]
    receive_none(sqs, queue_url)  # no release reached moto


def test_pending_faults_describe_every_rule_until_cleared(
    sqs_server: StrictSQSServer, sqs: Any
) -> None:
    sqs_server.inject_fault("SendMessage", "timeout", count=2, seconds=3)
    sqs_server.outage(seconds=60, kind="access_denied", actions="ReceiveMessage")
    sqs_server.fail_fraction(0.25, "garbage", seed=3)
    sqs_server.add_latency(0.015)

    pending = sqs_server.pending_faults()
    assert 50 < pending[1].pop("remaining_seconds") <= 60
    assert pending == [
        {"type": "count", "action": "SendMessage", "kind": "timeout", "count": 2, "seconds": 3},
        {
            "type": "outage",
            "actions": ["ReceiveMessage"],
            "kind": "access_denied",
            "fault_seconds": 0,
        },
        {
            "type": "fraction",
            "actions": None,
            "kind": "garbage",
            "fault_seconds": 0,
            "probability": 0.25,
            "seed": 3,
        },
        {"type": "latency", "actions": None, "seconds": 0.015},
    ]
    sqs_server.clear_faults()
    assert sqs_server.pending_faults() == []
    for _ in range(10):  # a fraction left behind would fail some of them
        sqs.list_queues()


def test_invalid_rules_are_rejected(sqs_server: StrictSQSServer) -> None:
    with pytest.raises(ValueError, match="'seconds' must be a positive number"):
        sqs_server.outage(seconds=0, kind="throttle")
    with pytest.raises(ValueError, match="'fault_seconds' > 0"):
        sqs_server.outage(seconds=5, kind="timeout")
    with pytest.raises(ValueError, match="'actions'"):
        sqs_server.outage(seconds=5, kind="throttle", actions=[])
    with pytest.raises(ValueError, match="'probability'"):
        sqs_server.fail_fraction(1.5, "throttle")
    with pytest.raises(ValueError, match="'seed'"):
        sqs_server.fail_fraction(0.5, "throttle", seed="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'seconds'"):
        sqs_server.add_latency(-0.1)
    assert sqs_server.pending_faults() == []


def failures_of_get_queue_url(sqs: Any, queue_url: str, calls: int) -> list[bool]:
    name = queue_url.rsplit("/", 1)[1]
    failed: list[bool] = []
    for _ in range(calls):
        try:
            sqs.get_queue_url(QueueName=name)
        except ClientError as err:
            assert err.response["Error"]["Code"] == "ThrottlingException"
            failed.append(True)
        else:
            failed.append(False)
    return failed


def test_failure_fraction_fails_about_that_share_of_calls(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.fail_fraction(0.5, "throttle", actions=["GetQueueUrl"], seed=1)
    assert 60 <= sum(failures_of_get_queue_url(sqs, queue_url, 200)) <= 140
    for _ in range(10):
        sqs.get_queue_attributes(QueueUrl=queue_url)  # other actions are spared


def test_seeded_failure_fraction_repeats_its_pattern(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    patterns = []
    for _ in range(2):
        sqs_server.clear_faults()
        sqs_server.fail_fraction(0.5, "throttle", actions=["GetQueueUrl"], seed=42)
        patterns.append(failures_of_get_queue_url(sqs, queue_url, 40))
    assert patterns[0] == patterns[1]
    assert 0 < sum(patterns[0]) < 40


#: Long enough that a loaded machine's overhead on one local call is far below it.
LATENCY = 1.0


def test_latency_delays_each_call_without_serialising_them(
    sqs_server: StrictSQSServer, queue_url: str
) -> None:
    clients = [make_client(sqs_server) for _ in range(2)]
    for client in clients:
        client.get_queue_attributes(QueueUrl=queue_url)  # connect before timing
    sqs_server.add_latency(LATENCY)
    durations: list[float] = []
    barrier = threading.Barrier(len(clients))

    def timed_call(client: Any) -> None:
        barrier.wait()
        started = time.monotonic()
        client.get_queue_attributes(QueueUrl=queue_url)
        durations.append(time.monotonic() - started)

    threads = [threading.Thread(target=timed_call, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(durations) == 2
    assert min(durations) >= LATENCY
    # Served one after the other, the second would take two latencies: the margin is a
    # whole second of load on one local call, which no busy machine adds.
    assert max(durations) < 2 * LATENCY


def test_latency_of_some_actions_spares_the_others(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    # A latency of 2 s: a call spared it stays under that on any busy machine.
    sqs_server.add_latency(2, actions=["SendMessage"])
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue_url)
    assert time.monotonic() - started < 2
    started = time.monotonic()
    sqs.send_message(QueueUrl=queue_url, MessageBody="m")
    assert time.monotonic() - started >= 2


AUTH_FAULTS = [
    ("access_denied", "AccessDenied", "AccessDeniedException"),
    ("invalid_credentials", "InvalidClientTokenId", "UnrecognizedClientException"),
]


@pytest.mark.parametrize(("kind", "code", "json_code"), AUTH_FAULTS)
def test_auth_fault_has_the_query_code_in_the_json_protocol(
    sqs_server: StrictSQSServer,
    sqs: Any,
    queue_url: str,
    kind: FaultKind,
    code: str,
    json_code: str,
) -> None:
    sqs_server.inject_fault("ReceiveMessage", kind)
    with pytest.raises(ClientError) as excinfo:
        sqs.receive_message(QueueUrl=queue_url)
    assert error_code(excinfo) == code
    assert excinfo.value.response["Error"]["QueryErrorCode"] == json_code
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


@pytest.fixture(scope="module")
def query_sqs(sqs_server: StrictSQSServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A botocore SQS client that speaks the query protocol, as botocore did until 1.31.

    Only its error answers parse properly: the JSON model it is made from lacks the
    query protocol's result wrappers.
    """
    model = botocore.loaders.Loader().load_service_model("sqs", "service-2")
    model["metadata"].update(protocol="query", protocols=["query"])
    data_path = tmp_path_factory.mktemp("botocore-data")
    model_dir = data_path / "sqs" / model["metadata"]["apiVersion"]
    model_dir.mkdir(parents=True)
    (model_dir / "service-2.json").write_text(json.dumps(model))
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(data_path))
    return session.create_client("sqs", config=NO_RETRIES, **sqs_server.boto3_kwargs)


@pytest.mark.parametrize(("kind", "code", "json_code"), AUTH_FAULTS)
def test_auth_fault_in_the_query_protocol(
    sqs_server: StrictSQSServer, query_sqs: Any, kind: FaultKind, code: str, json_code: str
) -> None:
    sqs_server.inject_fault("ListQueues", kind)
    with pytest.raises(ClientError) as excinfo:
        query_sqs.list_queues()
    assert error_code(excinfo) == code
    metadata = excinfo.value.response["ResponseMetadata"]
    assert metadata["HTTPStatusCode"] == 403
    assert metadata["HTTPHeaders"]["content-type"] == "text/xml"


def test_garbage_fault_fails_to_parse_and_has_no_side_effect(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.inject_fault("SendMessage", "garbage")
    # botocore's JSON parser would take text it cannot parse for an empty answer.
    with pytest.raises(UnicodeDecodeError):
        sqs.send_message(QueueUrl=queue_url, MessageBody="lost")
    receive_none(sqs, queue_url)


def test_garbage_fault_in_the_query_protocol(sqs_server: StrictSQSServer, query_sqs: Any) -> None:
    sqs_server.inject_fault("ListQueues", "garbage")
    with pytest.raises(ResponseParserError):
        query_sqs.list_queues()


def test_timeout_fault_is_a_read_timeout(sqs_server: StrictSQSServer, queue_url: str) -> None:
    config = NO_RETRIES.merge(Config(connect_timeout=5, read_timeout=1))
    sqs = boto3.client("sqs", config=config, **sqs_server.boto3_kwargs)
    sqs_server.inject_fault("GetQueueAttributes", "timeout", seconds=10)
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        sqs.get_queue_attributes(QueueUrl=queue_url)
    # The client's read timeout ended it, not the server's answer after the fault's 10 s:
    # a bound no busy machine comes near.
    assert 1 <= time.monotonic() - started < 10
    sqs.get_queue_attributes(QueueUrl=queue_url)


def test_timeout_fault_drops_the_connection_after_holding_it(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.inject_fault("SendMessage", "timeout", seconds=0.5)
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError):
        sqs.send_message(QueueUrl=queue_url, MessageBody="lost")
    assert time.monotonic() - started >= 0.5
    receive_none(sqs, queue_url)


# -- observability --------------------------------------------------------------------


def test_calls_are_counted_with_batch_entries(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.reset_calls()
    sqs.send_message_batch(
        QueueUrl=queue_url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(3)]
    )
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 60}
            for i, m in enumerate(messages)
        ],
    )
    query_call(
        sqs_server,
        {
            "Action": "DeleteMessageBatch",
            "QueueUrl": queue_url,
            "DeleteMessageBatchRequestEntry.1.Id": "a",
            "DeleteMessageBatchRequestEntry.1.ReceiptHandle": messages[0]["ReceiptHandle"],
            "DeleteMessageBatchRequestEntry.2.Id": "b",
            "DeleteMessageBatchRequestEntry.2.ReceiptHandle": messages[1]["ReceiptHandle"],
        },
    )
    assert sqs_server.calls() == {
        "SendMessageBatch": 1,
        "ReceiveMessage": 1,
        "ChangeMessageVisibilityBatch": 1,
        "DeleteMessageBatch": 1,
    }
    assert sqs_server.batch_entries() == {
        "SendMessageBatch": 3,
        "ChangeMessageVisibilityBatch": 3,
        "DeleteMessageBatch": 2,
    }
    sqs_server.reset_calls()
    assert sqs_server.calls() == {}


def test_the_call_log_has_each_calls_span_and_what_a_receive_asked_and_got(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    for n in range(3):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"m{n}")
    sqs_server.reset_calls()
    sqs_server.add_latency(0.2, actions=["ReceiveMessage"])
    sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=5)
    sqs.delete_message_batch(
        QueueUrl=queue_url, Entries=[{"Id": "0", "ReceiptHandle": "not-a-handle"}]
    )
    receive, delete = sqs_server.call_log()
    assert (receive["action"], receive["asked"], receive["returned"]) == ("ReceiveMessage", 5, 3)
    assert receive["answered"] - receive["arrived"] >= 0.2
    assert (delete["action"], delete["entries"], delete["asked"]) == ("DeleteMessageBatch", 1, None)
    sqs_server.reset_calls()
    assert sqs_server.call_log() == []


def test_the_call_log_has_the_delay_of_each_message_sent(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    sqs_server.reset_calls()
    sqs.send_message(QueueUrl=queue_url, MessageBody="now")
    sqs.send_message(QueueUrl=queue_url, MessageBody="later", DelaySeconds=7)
    sqs.send_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "a", "MessageBody": "a", "DelaySeconds": 3},
            {"Id": "b", "MessageBody": "b"},
        ],
    )
    query_call(
        sqs_server,
        {
            "Action": "SendMessageBatch",
            "QueueUrl": queue_url,
            "SendMessageBatchRequestEntry.1.Id": "x",
            "SendMessageBatchRequestEntry.1.MessageBody": "x",
            "SendMessageBatchRequestEntry.2.Id": "y",
            "SendMessageBatchRequestEntry.2.MessageBody": "y",
            "SendMessageBatchRequestEntry.2.DelaySeconds": "9",
        },
    )
    sqs.receive_message(QueueUrl=queue_url)

    assert [call["delays"] for call in sqs_server.call_log()] == [
        [0],
        [7],
        [3, 0],
        [0, 9],
        None,
    ]


def test_a_call_that_arrived_before_a_reset_is_not_logged_after_it(
    sqs_server: StrictSQSServer, queue_url: str
) -> None:
    """A call the server still holds at a reset is none of the calls since the reset.

    A timeout fault holds it past the client's read timeout, as one held for an earlier
    test outlives that test on the shared server.
    """
    config = NO_RETRIES.merge(Config(connect_timeout=5, read_timeout=0.25))
    sqs = boto3.client("sqs", config=config, **sqs_server.boto3_kwargs)
    sqs_server.inject_fault("GetQueueAttributes", "timeout", seconds=1)
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        sqs.get_queue_attributes(QueueUrl=queue_url)
    sqs_server.reset_calls()
    time.sleep(max(0.0, started + 1.5 - time.monotonic()))  # the server has dropped it
    sqs.list_queues()

    assert [call["action"] for call in sqs_server.call_log()] == ["ListQueues"]
    assert sqs_server.calls() == {"ListQueues": 1}


def test_events_show_each_message_operation(
    sqs_server: StrictSQSServer, sqs: Any, queue_url: str
) -> None:
    message_id = sqs.send_message(QueueUrl=queue_url, MessageBody="m")["MessageId"]
    handle = receive_one(sqs, queue_url, visibility=30)["ReceiptHandle"]
    change(sqs, queue_url, handle, 45)
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)
    with pytest.raises(ClientError):
        change(sqs, queue_url, handle, 45)

    queue = queue_url.rsplit("/", 1)[1]
    events = [e for e in sqs_server.events() if e["queue"] == queue]
    assert [(e["action"], e["visibility"], e["result"]) for e in events] == [
        ("receive", 30, "ok"),
        ("change_visibility", 45, "ok"),
        ("delete", None, "ok"),
        ("change_visibility", 45, "InvalidParameterValue"),
    ]
    assert {e["message_id"] for e in events} == {message_id}
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)


# -- IAM enforcement ------------------------------------------------------------------

QUEUE_ARN_PREFIX = "arn:aws:sqs:us-east-1:123456789012:"


@dataclass(frozen=True)
class IAMBed:
    server: StrictSQSServer
    allowed: tuple[str, str]
    """May send, receive, change visibility and create queues named ``allowed-*``."""
    nobody: tuple[str, str]
    """A user with no policy at all."""
    allowed_queue: str
    other_queue: str

    def sqs(self, access_key_id: str, secret_access_key: str) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.server.endpoint_url,
            region_name=self.server.REGION,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=NO_RETRIES,
        )


def new_user(iam: Any, name: str, policy: dict[str, Any] | None = None) -> tuple[str, str]:
    iam.create_user(UserName=name)
    if policy is not None:
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture(scope="module")
def iam_bed() -> Iterator[IAMBed]:
    """A server of its own: enforcement lasts for the server's life."""
    with StrictSQSServer() as server:
        iam = boto3.client("iam", **server.boto3_kwargs)
        sqs = make_client(server)
        actions = ["SendMessage", "ReceiveMessage", "ChangeMessageVisibility", "CreateQueue"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": [f"sqs:{action}" for action in actions],
                    "Resource": f"{QUEUE_ARN_PREFIX}allowed-*",
                }
            ],
        }
        bed = IAMBed(
            server=server,
            allowed=new_user(iam, "allowed", policy),
            nobody=new_user(iam, "nobody"),
            allowed_queue=sqs.create_queue(QueueName="allowed-1")["QueueUrl"],
            other_queue=sqs.create_queue(QueueName="other-1")["QueueUrl"],
        )
        server.enforce_iam()
        yield bed


def test_enforced_iam_refuses_unknown_keys_and_wrong_secrets(iam_bed: IAMBed) -> None:
    with pytest.raises(ClientError) as unknown:
        make_client(iam_bed.server).list_queues()
    assert error_code(unknown) == "InvalidClientTokenId"
    with pytest.raises(ClientError) as unsigned:
        iam_bed.sqs(iam_bed.allowed[0], "not-the-secret").list_queues()
    assert error_code(unsigned) == "SignatureDoesNotMatch"
    # The query protocol gets moto's own XML answer, which botocore reads alike.
    status, body = query_call(iam_bed.server, {"Action": "ListQueues"})
    assert status == 403
    assert "<Code>InvalidClientTokenId</Code>" in body


def test_enforced_iam_refuses_a_user_without_a_policy(iam_bed: IAMBed) -> None:
    sqs = iam_bed.sqs(*iam_bed.nobody)
    with pytest.raises(ClientError) as denied:
        sqs.send_message(QueueUrl=iam_bed.allowed_queue, MessageBody="m")
    # As from SQS over JSON: the query protocol's code, so that callers see AccessDenied.
    assert error_code(denied) == "AccessDenied"
    assert denied.value.response["Error"]["QueryErrorCode"] == "AccessDeniedException"
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as batch_denied:
        sqs.delete_message_batch(
            QueueUrl=iam_bed.allowed_queue, Entries=[{"Id": "1", "ReceiptHandle": "x"}]
        )
    assert error_code(batch_denied) == "AccessDenied"

    refused = [r for r in iam_bed.server.refused_calls() if r["access_key_id"] == iam_bed.nobody[0]]
    assert [(r["service"], r["action"], r["code"]) for r in refused] == [
        ("sqs", "SendMessage", "AccessDenied"),
        ("sqs", "DeleteMessageBatch", "AccessDenied"),
    ]
    # IAM has no action of its own for a batch call: it checks the single one.
    assert refused[1]["message"].endswith("is not authorized to perform: sqs:DeleteMessage")


def test_enforced_iam_allows_what_the_policy_grants_on_the_queue_arn(iam_bed: IAMBed) -> None:
    sqs = iam_bed.sqs(*iam_bed.allowed)
    url = iam_bed.allowed_queue
    sqs.send_message(QueueUrl=url, MessageBody="m")
    handle = receive_one(sqs, url, visibility=30)["ReceiptHandle"]
    # A batch call needs only the single action's permission, as in AWS.
    renewed = sqs.change_message_visibility_batch(
        QueueUrl=url, Entries=[{"Id": "1", "ReceiptHandle": handle, "VisibilityTimeout": 30}]
    )
    assert [entry["Id"] for entry in renewed["Successful"]] == ["1"]
    # CreateQueue is checked on the ARN of the queue it names, not on "*".
    sqs.create_queue(QueueName="allowed-2")

    refusals = [
        lambda: sqs.create_queue(QueueName="other-2"),
        lambda: sqs.send_message(QueueUrl=iam_bed.other_queue, MessageBody="m"),
        lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle=handle),
        lambda: sqs.list_queues(),  # granted on "*" only
    ]
    for call in refusals:
        with pytest.raises(ClientError) as denied:
            call()
        assert error_code(denied) == "AccessDenied"


# -- launcher -------------------------------------------------------------------------


LAUNCHER = [sys.executable, "-m", "celery_sqs_heartbeat.testing.strict_sqs"]
LAUNCHER_ENV = {
    **os.environ,
    "PYTHONPATH": str(Path(celery_sqs_heartbeat.__file__).resolve().parents[1]),
}


def test_launcher_refuses_other_hosts() -> None:
    result = subprocess.run(
        [*LAUNCHER, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=LAUNCHER_ENV,
    )
    assert result.returncode == 2
    assert "refusing to bind '0.0.0.0'" in result.stderr


def test_launcher_announces_its_port_and_stops_at_stdin_eof() -> None:
    with subprocess.Popen(
        [*LAUNCHER, "--port", "0", "--stop-at-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=LAUNCHER_ENV,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        ready = proc.stdout.readline()
        assert re.fullmatch(r"STRICT_SQS_READY http://127\.0\.0\.1:\d+\n", ready)
        port = int(ready.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0


def test_stop_terminates_the_server() -> None:
    server = StrictSQSServer()
    with server:
        port = server.port
        assert server.broker_url == f"sqs://testing:testing@127.0.0.1:{port}"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(RuntimeError):
        server.endpoint_url  # noqa: B018
