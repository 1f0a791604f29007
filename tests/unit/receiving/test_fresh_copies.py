"""A parked task's fresh copy as it goes to SQS: the body and marks SQS held, and the
original's S3 object kept for it (issue 31, item 8)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from botocore.client import BaseClient
from botocore.stub import Stubber

from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from celery_sqs_heartbeat.leasing.leases import Lease
from celery_sqs_heartbeat.payloads.pointers import SIZE_ATTRIBUTE, S3Pointer
from tests.unit.conftest import make_lease

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"
MARK = {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": "300000"}}


@pytest.fixture
def stub(source: BaseClient) -> Iterator[Stubber]:
    with Stubber(source) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def deleting() -> list[list[Lease]]:
    """The leases whose messages' objects the queue was told to delete, by call."""
    return []


@pytest.fixture
def sqs_queue(source: BaseClient, deleting: list[list[Lease]]) -> SQSQueue:
    """The queue, calling ``source`` itself (the renewal client it is given)."""
    return SQSQueue("jobs", QUEUE_URL, lambda: source, deleting.append)


def test_a_copy_goes_out_with_its_attributes_and_a_plain_one_without(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    pointed, plain = make_lease("jobs", task_id="p"), make_lease("jobs", task_id="q")
    pointer = S3Pointer("tasks", "k-1").body()
    stub.add_response(
        "send_message_batch",
        {"Successful": [ok("0"), ok("1")], "Failed": []},
        {
            "QueueUrl": QUEUE_URL,
            "Entries": [
                {"Id": "0", "MessageBody": pointer, "DelaySeconds": 900, "MessageAttributes": MARK},
                {"Id": "1", "MessageBody": "plain", "DelaySeconds": 60},
            ],
        },
    )

    sqs_queue.send_copies([(pointed, pointer, MARK, 900), (plain, "plain", {}, 60)])


def test_the_delete_of_a_copied_message_leaves_its_s3_object(
    stub: Stubber, sqs_queue: SQSQueue, deleting: list[list[Lease]]
) -> None:
    copied, acked = make_lease("jobs", task_id="c"), make_lease("jobs", task_id="a")
    copied.copied = True
    stub.add_response(
        "delete_message_batch", {"Successful": [{"Id": "0"}, {"Id": "1"}], "Failed": []}
    )

    sqs_queue.delete([copied, acked])

    assert deleting == [[acked]]


def ok(entry_id: str) -> dict[str, str]:
    return {"Id": entry_id, "MessageId": f"m-{entry_id}", "MD5OfMessageBody": "x"}
