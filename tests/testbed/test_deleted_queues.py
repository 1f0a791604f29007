"""The strict server refuses, as SQS does, to create a queue under a name deleted just now.

Against plain moto the second create succeeds, so these tests fail there.
"""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from celery_sqs_heartbeat.testing import StrictSQSServer

NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})


@pytest.fixture
def sqs(sqs_server: StrictSQSServer) -> Any:
    return boto3.client("sqs", config=NO_RETRIES, **sqs_server.boto3_kwargs)


def test_a_queue_name_deleted_just_now_cannot_be_created_again(sqs: Any) -> None:
    name = f"testbed-{uuid.uuid4().hex[:12]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)

    with pytest.raises(ClientError) as excinfo:
        sqs.create_queue(QueueName=name)

    error = excinfo.value.response["Error"]
    assert error["Code"] == "AWS.SimpleQueueService.QueueDeletedRecently", error
    assert "60 seconds" in error["Message"]
    assert name not in str(sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", []))


def test_creating_a_queue_that_exists_or_another_name_is_unaffected(sqs: Any) -> None:
    name = f"testbed-{uuid.uuid4().hex[:12]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=f"{name}-gone")["QueueUrl"])

    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
    assert sqs.create_queue(QueueName=f"{name}-other")["QueueUrl"].endswith(f"{name}-other")


def test_a_test_can_let_the_minute_pass_at_once(sqs_server: StrictSQSServer, sqs: Any) -> None:
    name = f"testbed-{uuid.uuid4().hex[:12]}"
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])

    sqs_server.forget_deleted_queues()

    assert sqs.create_queue(QueueName=name)["QueueUrl"].endswith(name)
