"""S3 pointers a worker must not follow, and malformed messages at the door (issue 32).

Anyone allowed to send to a task queue could send a pointer, in AWS's extended-client
format, to any S3 object: the worker read it, Celery logged "Received and deleted
unknown message", and the worker deleted the object with the message. Now a worker
reads only the buckets its options name, up to a size, and a message it refuses goes to
the dead-letter queue, its object untouched. Real solo workers on the strict server;
the messages are sent straight to the queue, as an attacker or a broken producer would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.harness import Bed, settle, worker
from tests.integration.test_large_payloads import new_bucket, objects, s3

LEASE = 5
#: The account the strict server (moto) owns every bucket with.
MOTO_ACCOUNT = "123456789012"
VICTIM_KEY = "ledger.csv"
VICTIM_BODY = b"account,amount\n1,100\n"
REFUSED = "Refused the S3 pointer of message"
UNKNOWN = "Received and deleted unknown message"


def pointer_body(where: dict[str, Any]) -> str:
    return json.dumps(["software.amazon.payloadoffloading.PayloadS3Pointer", where])


def size_attribute(size: int) -> dict[str, Any]:
    return {"ExtendedPayloadSize": {"DataType": "Number", "StringValue": str(size)}}


def send_raw(bed: Bed, url: str, body: str, attributes: dict[str, Any] | None = None) -> str:
    """A message sent straight to the queue, not through Celery."""
    answer = bed.sqs().send_message(
        QueueUrl=url, MessageBody=body, MessageAttributes=attributes or {}
    )
    return str(answer["MessageId"])


def queue_counts(bed: Bed, name: str) -> tuple[int, int]:
    """Visible and in-flight messages of queue ``name``, without receiving any."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


def dead_letter_ids(bed: Bed) -> list[str]:
    """The ids of the messages in the dead-letter queue, read once every one is there."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=f"{bed.queue}-dlq")["QueueUrl"]
    found = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    return [message["MessageId"] for message in found.get("Messages", [])]


def dead_lettered_and_queue_empty(bed: Bed) -> Callable[[], bool]:
    return lambda: (
        queue_counts(bed, f"{bed.queue}-dlq") == (1, 0) and queue_counts(bed, bed.queue) == (0, 0)
    )


def victim(bed: Bed) -> str:
    bucket = f"victim-{uuid.uuid4().hex[:8]}"
    s3(bed).create_bucket(Bucket=bucket)
    s3(bed).put_object(Bucket=bucket, Key=VICTIM_KEY, Body=VICTIM_BODY)
    return bucket


@pytest.mark.parametrize("app_bucket", [False, True], ids=["no-bucket", "with-bucket"])
def test_a_pointer_to_another_bucket_is_neither_read_nor_deleted(
    bed: Bed, app_bucket: bool
) -> None:
    """The issue's headline: s3://victim/ledger.csv sent straight to the task queue."""
    target = victim(bed)
    url = bed.create_queue(visibility_timeout=LEASE, max_receive_count=2)
    options: dict[str, Any] = {"visibility_timeout": LEASE}
    if app_bucket:
        options["large_payload_bucket"] = new_bucket(bed)
    sent = send_raw(
        bed,
        url,
        pointer_body({"s3BucketName": target, "s3Key": VICTIM_KEY}),
        size_attribute(len(VICTIM_BODY)),
    )
    bed.server.reset_calls()
    with worker(bed, "solo", 1, options=options) as process:
        moved = settle(dead_lettered_and_queue_empty(bed))
        bed.send("sized", "after", "y" * 10)
        done = bed.wait_for_executions(1, timeout=20)
        alive = process.process.poll() is None
        log = process.log
    calls = bed.server.calls()
    assert s3(bed).get_object(Bucket=target, Key=VICTIM_KEY)["Body"].read() == VICTIM_BODY
    assert (calls.get("s3:GetObject", 0), calls.get("s3:DeleteObjects", 0)) == (0, 0), calls
    assert moved and dead_letter_ids(bed) == [sent], log
    assert [r["name"] for r in done] == ["after"] and alive, log
    assert log.count(REFUSED) == 1 and f"s3://{target}/{VICTIM_KEY}" in log, log
    assert UNKNOWN not in log


def _missing_key(bed: Bed, url: str, bucket: str) -> str:
    return send_raw(bed, url, pointer_body({"s3BucketName": bucket}))


def _not_utf8(bed: Bed, url: str, bucket: str) -> str:
    s3(bed).put_object(Bucket=bucket, Key="tasks/latin-1", Body="café".encode("latin-1"))
    return send_raw(bed, url, pointer_body({"s3BucketName": bucket, "s3Key": "tasks/latin-1"}))


def _size_that_lies(bed: Bed, url: str, bucket: str) -> str:
    s3(bed).put_object(Bucket=bucket, Key="tasks/big", Body=b"x" * 5000)
    where = {"s3BucketName": bucket, "s3Key": "tasks/big"}
    return send_raw(bed, url, pointer_body(where), size_attribute(10))


def _object_missing(bed: Bed, url: str, bucket: str) -> str:
    return send_raw(bed, url, pointer_body({"s3BucketName": bucket, "s3Key": "tasks/gone"}))


def _json_but_no_task(bed: Bed, url: str, bucket: str) -> str:
    return send_raw(bed, url, json.dumps({"hello": "world"}))


@pytest.mark.parametrize(
    ("send", "log_line", "logged"),
    [
        (_missing_key, REFUSED, 1),
        (_not_utf8, "(UnicodeDecodeError)", 1),
        (_size_that_lies, REFUSED, 1),
        (_object_missing, "(NoSuchKey)", 1),
        # Celery's own warning, at each receive: it rejects the message, which the
        # transport leaves to the redrive policy (release_on_failure off).
        (_json_but_no_task, UNKNOWN, 2),
    ],
    ids=["missing-key", "not-utf8", "size-that-lies", "object-missing", "json-no-task"],
)
def test_a_malformed_message_is_dealt_with_once_and_nothing_of_another_is_lost(
    bed: Bed, send: Callable[[Bed, str, str], str], log_line: str, logged: int
) -> None:
    """Issue 32, item 5: each kind of bad input, then a task: the worker goes on, and the
    message ends in the dead-letter queue after its two receives, its object untouched."""
    bucket = new_bucket(bed)
    s3(bed).put_object(Bucket=bucket, Key="tasks/other", Body=b"another message's body")
    url = bed.create_queue(visibility_timeout=LEASE, max_receive_count=2)
    sent = send(bed, url, bucket)
    before = sorted(objects(bed, bucket))
    options = {
        "visibility_timeout": LEASE,
        "large_payload_bucket": bucket,
        "large_payload_prefix": "tasks/",
        "large_payload_max_read_bytes": 1000,
    }
    bed.server.reset_calls()
    with worker(bed, "solo", 1, options=options) as process:
        dealt_with = settle(dead_lettered_and_queue_empty(bed))
        bed.send("sized", "after", "y" * 10)
        done = bed.wait_for_executions(1, timeout=20)
        alive = process.process.poll() is None
        log = process.log
    assert dealt_with, log
    assert [r["name"] for r in done] == ["after"] and alive, log
    assert dead_letter_ids(bed) == [sent]
    assert sorted(objects(bed, bucket)) == before
    assert bed.server.calls().get("s3:DeleteObjects", 0) == 0
    assert log.count(log_line) == logged, log
    receives = [
        e
        for e in bed.server.events()
        if e["action"] == "receive" and e["queue"] == bed.queue and e["message_id"] == sent
    ]
    assert len(receives) == 2, receives


def test_a_body_goes_through_s3_and_back_with_owner_and_encryption_set(bed: Bed) -> None:
    """Issue 32, item 2: ExpectedBucketOwner and SSE on the strict server's S3."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    options = {
        "visibility_timeout": LEASE,
        "large_payload_bucket": bucket,
        "large_payload_prefix": "tasks/",
        "large_payload_expected_bucket_owner": MOTO_ACCOUNT,
        "large_payload_sse": "AES256",
    }
    bed.send("sized", "large", "x" * 1_100_000, transport_options=options)
    [key] = objects(bed, bucket)
    encryption = s3(bed).head_object(Bucket=bucket, Key=key).get("ServerSideEncryption")
    with worker(bed, "solo", 1, options=options) as process:
        done = bed.wait_for_executions(1, timeout=20)
        gone = settle(lambda: not objects(bed, bucket))
        log = process.log
    assert encryption == "AES256"
    assert [r["outcome"] for r in done] == ["ok:1100000"], log
    assert gone
