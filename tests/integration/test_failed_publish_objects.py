"""A publish SQS does not take leaves no S3 object behind (issue 33, item 1).

With ``large_payload_bucket`` the producer puts the body in S3, then sends the pointer.
The chaos soak found that when SQS refused the send (a 5xx after botocore's retries),
the object stayed, with no message pointing at it. Now it is deleted before the error
reaches the producer: a SendMessage's, and a batch-publishing scope's entries that SQS
refused (a whole call, or some of its entries, after the scope's retries); entries
sent keep theirs, retried ones included. A send that got no answer keeps its object:
SQS may hold that message.
"""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from celery_sqs_heartbeat import PublishingFailed, publishing_in_batches
from celery_sqs_heartbeat.payloads.pointers import pointer_in
from tests.integration.harness import Bed, report
from tests.integration.test_large_payloads import new_bucket, objects, options

SIZED = "tests.integration.app.sized"
#: A body kombu encodes past the test's threshold of 1 KiB: it goes through S3.
BODY = "x" * 5000


def keys_in_queue(bed: Bed, url: str) -> list[str]:
    """The S3 key of every pointer the queue holds, read as a receive; hidden after."""
    found: list[str] = []
    while True:
        answer = bed.sqs().receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60, WaitTimeSeconds=0
        )
        messages = answer.get("Messages") or []
        if not messages:
            return found
        for message in messages:
            pointer = pointer_in(message["Body"])
            assert pointer is not None, message["Body"][:100]
            found.append(pointer.key)


def test_a_failed_publish_leaves_no_object_in_the_bucket(bed: Bed) -> None:
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=10)
    bed.server.outage(30, "server_error", ["SendMessage"])
    with pytest.raises(Exception, match="InternalError"):
        bed.send(
            "sized", "large", BODY, transport_options=options(bucket, large_payload_threshold=1024)
        )
    bed.server.end_outages()
    assert objects(bed, bucket) == []


def test_a_publish_that_got_no_answer_keeps_its_object(bed: Bed) -> None:
    """Every try's connection dropped after the request went out: SQS may hold the
    message, which needs its object, so it stays for the bucket's lifecycle rule."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=10)
    bed.server.outage(30, "drop_connection", ["SendMessage"])
    with pytest.raises(OperationalError, match="Connection was closed"):
        bed.send(
            "sized",
            "large",
            BODY,
            transport_options=options(bucket, large_payload_threshold=1024),
            retry=False,
        )
    bed.server.end_outages()
    assert len(objects(bed, bucket)) == 1


def test_a_batch_scope_in_an_outage_leaves_no_object_in_the_bucket(bed: Bed) -> None:
    """Every SendMessageBatch call fails whole (a 5xx) until the scope gives up."""
    bucket = new_bucket(bed)
    bed.create_queue(visibility_timeout=10)
    bed.server.reset_calls()  # the server is the session's: count this test's puts only
    bed.server.outage(300, "server_error", ["SendMessageBatch"])
    transport_options = options(bucket, large_payload_threshold=1024)
    with bed.client_app("producer", transport_options=transport_options) as app:
        sent: list[str] = []
        with pytest.raises(PublishingFailed) as failed, publishing_in_batches():
            sent.extend(
                app.send_task(SIZED, args=(f"large{n}", BODY), queue=bed.queue).id for n in range(3)
            )
    bed.server.end_outages()
    puts = bed.server.calls().get("s3:PutObject", 0)
    report("batch outage", puts=puts, reasons=failed.value.reasons)
    assert puts == 3
    assert sorted(failed.value.task_ids) == sorted(sent)
    assert all("InternalError" in reason for reason in failed.value.reasons.values())
    assert objects(bed, bucket) == []


def test_entries_sqs_refused_lose_their_objects_and_those_sent_keep_theirs(bed: Bed) -> None:
    """Two entries fail once (SQS's fault) and are sent again; two are refused for good."""
    bucket = new_bucket(bed)
    url = bed.create_queue(visibility_timeout=10)
    bed.server.fail_entries("SendMessageBatch", "InternalError", count=2)
    bed.server.fail_entries("SendMessageBatch", "InvalidMessageContents", count=2)
    transport_options = options(bucket, large_payload_threshold=1024)
    with bed.client_app("producer", transport_options=transport_options) as app:
        sent: list[str] = []
        with pytest.raises(PublishingFailed) as failed, publishing_in_batches():
            sent.extend(
                app.send_task(SIZED, args=(f"large{n}", BODY), queue=bed.queue).id for n in range(6)
            )
    held = keys_in_queue(bed, url)
    left = objects(bed, bucket)
    report("refused entries", refused=failed.value.reasons, held=len(held), left=len(left))
    assert len(failed.value.task_ids) == 2 and set(failed.value.task_ids) <= set(sent)
    assert all("InvalidMessageContents" in r for r in failed.value.reasons.values())
    assert bed.server.pending_faults() == []
    assert len(set(held)) == len(held) == 4
    assert sorted(left) == sorted(held)
