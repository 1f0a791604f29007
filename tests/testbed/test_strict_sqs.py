"""Tests of the strict SQS test bed itself: plain boto3 against the real subprocess server.

Each rule test also checks the behaviour plain moto gets wrong, so it fails against an
unpatched moto server.
"""

from __future__ import annotations

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError

import celery_sqs_heartbeat
from celery_sqs_heartbeat.testing import StrictSQSServer

# Faults must reach the test, not be hidden by botocore's retries.
NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})
NOT_INFLIGHT = "AWS.SimpleQueueService.MessageNotInflight"
SHORT_HOLD_SECONDS = 4


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


@pytest.fixture(scope="module")
def short_hold_server() -> Iterator[StrictSQSServer]:
    with StrictSQSServer(max_hold_seconds=SHORT_HOLD_SECONDS) as server:
        yield server


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

    change(sqs, queue_url, handle, SHORT_HOLD_SECONDS - 1)
    with pytest.raises(ClientError) as excinfo:
        change(sqs, queue_url, handle, SHORT_HOLD_SECONDS + 1)
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
    assert time.monotonic() - started < 1
    thread.join(timeout=10)
    assert bodies == ["second"]


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
    sqs_server.inject_fault("GetQueueAttributes", "delay", seconds=0.5)
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert time.monotonic() - started < 0.5


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
