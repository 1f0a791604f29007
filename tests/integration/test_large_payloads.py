"""Task messages of any size: bodies over SQS's limit go through S3 (issue 19).

Real ``celery worker`` processes against the strict server, which serves S3 beside SQS.
A task's 1.1 MB argument makes a body SQS refuses; with ``large_payload_bucket`` set it
goes to S3, SQS carries the pointer, and the worker reads it back, runs the task once,
and deletes the object once SQS confirmed the message's delete.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import boto3
import pytest

from .harness import Bed, assert_queue_empty, settle, worker

#: Over SQS's 1 MiB once kombu base64-encodes it.
LARGE = 1_100_000
LEASE = 10


def s3(bed: Bed) -> Any:
    return boto3.client("s3", config=bed.server.s3_config, **bed.server.boto3_kwargs)


def new_bucket(bed: Bed) -> str:
    name = f"it-{uuid.uuid4().hex[:12]}"
    s3(bed).create_bucket(Bucket=name)
    return name


def objects(bed: Bed, bucket: str) -> list[str]:
    listed = s3(bed).list_objects_v2(Bucket=bucket).get("Contents") or []
    return [entry["Key"] for entry in listed]


def options(bucket: str, **more: Any) -> dict[str, Any]:
    return {
        "visibility_timeout": LEASE,
        "large_payload_bucket": bucket,
        "large_payload_prefix": "tasks/",
        **more,
    }


def test_a_large_body_goes_through_s3_and_a_small_one_is_sent_as_before(bed: Bed) -> None:
    bucket = new_bucket(bed)
    url = bed.create_queue(visibility_timeout=LEASE)
    bed.send("sized", "large", "x" * LARGE, transport_options=options(bucket))
    bed.send("sized", "small", "x" * 1000, transport_options=options(bucket))
    received = bed.sqs().receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    pointers = [m for m in received if m["Body"].startswith("[")]
    plain = [m for m in received if not m["Body"].startswith("[")]
    assert len(pointers) == 1 and len(plain) == 1
    pointer_class, where = json.loads(pointers[0]["Body"])
    assert pointer_class == "software.amazon.payloadoffloading.PayloadS3Pointer"
    assert where["s3BucketName"] == bucket and where["s3Key"].startswith("tasks/")
    size = pointers[0]["MessageAttributes"]["ExtendedPayloadSize"]
    stored = s3(bed).get_object(Bucket=bucket, Key=where["s3Key"])["Body"].read()
    assert size == {"DataType": "Number", "StringValue": str(len(stored))}
    assert len(stored) > 1_048_576
    # The small one: kombu's own base64 body, no attribute added.
    assert "MessageAttributes" not in plain[0]


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_an_offloaded_task_runs_once_and_its_object_goes_after_the_delete(
    bed: Bed, pool: str
) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=LEASE)
    bed.send("sized", "large", "x" * LARGE, transport_options=options(bucket))
    bed.send("sized", "small", "y" * 1000, transport_options=options(bucket))
    assert len(objects(bed, bucket)) == 1
    with worker(bed, pool, 2, options=options(bucket)) as process:
        done = bed.wait_for_executions(2, timeout=20)
        gone = settle(lambda: not objects(bed, bucket), timeout=10)
        log = process.log
    assert sorted(r["outcome"] for r in done) == ["ok:1000", f"ok:{LARGE}"], log
    assert all(count == 1 for count in bed.runs_per_task().values())
    assert gone, objects(bed, bucket)
    assert_queue_empty(bed)
