"""A message past its queue's retention is deleted, and the younger ones are handed out,
on the strict server as on SQS: found by the chaos soak (issue 33, item 1).

moto's receive (kept by the strict server, whose ``_is_within_retention`` only makes the
check cheaper) stopped scanning the queue at the first message past retention and left it
there: from then on the queue answered every receive with nothing, though it counted its
messages. A killed monitor's ``celeryev-*`` queue (60 s of retention) thus looked empty a
minute after the kill, and ``celery sqs-reap`` kept it ("no event waiting"), where on SQS
it would find the recent events and reap it. A defect of the test bed, not of the
transport; the strict server now drops such messages before each receive.

SQS's shortest retention is a minute; moto, and so the strict server, takes shorter ones,
which lets this run in seconds.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer

#: The queue's retention: shorter than SQS allows (see above).
RETENTION = 10
#: How long before the old message expires the young one is sent: its age when the old
#: one is past retention, far from its own expiry however slow the machine.
YOUNGER_BY = 6


@pytest.mark.integration
def test_a_message_past_retention_leaves_the_younger_ones_to_be_received(
    sqs_server: StrictSQSServer,
) -> None:
    sqs: Any = boto3.client("sqs", **sqs_server.boto3_kwargs)
    url = sqs.create_queue(
        QueueName=f"retention-{time.monotonic_ns()}",
        Attributes={"MessageRetentionPeriod": str(RETENTION)},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="old")
    old_sent = time.monotonic()
    # Waits of the rule itself: a message expires by its age.
    time.sleep(YOUNGER_BY)
    sqs.send_message(QueueUrl=url, MessageBody="young")
    time.sleep(max(0.0, old_sent + RETENTION + 1 - time.monotonic()))
    answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert [m["Body"] for m in answer.get("Messages", [])] == ["young"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "1"
