"""The strict server's S3 (moto's, on the same port as SQS): counted, and failed on request."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError

from celery_sqs_heartbeat.testing import StrictSQSServer

NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})


@pytest.fixture(autouse=True)
def _clear_faults(sqs_server: StrictSQSServer) -> Iterator[None]:
    yield
    sqs_server.clear_faults()


@pytest.fixture
def s3(sqs_server: StrictSQSServer) -> Any:
    return boto3.client(
        "s3", config=sqs_server.s3_config.merge(NO_RETRIES), **sqs_server.boto3_kwargs
    )


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"testbed-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def test_s3_calls_reach_moto_and_are_counted_by_operation(
    sqs_server: StrictSQSServer, s3: Any, bucket: str
) -> None:
    sqs_server.reset_calls()
    s3.put_object(Bucket=bucket, Key="a/1", Body=b"payload")
    assert s3.get_object(Bucket=bucket, Key="a/1")["Body"].read() == b"payload"
    deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a/1"}]})
    assert deleted["Deleted"] == [{"Key": "a/1"}]
    assert sqs_server.calls() == {"s3:PutObject": 1, "s3:GetObject": 1, "s3:DeleteObjects": 1}
    assert [call["action"] for call in sqs_server.call_log()] == [
        "s3:PutObject",
        "s3:GetObject",
        "s3:DeleteObjects",
    ]


@pytest.mark.parametrize(
    ("kind", "code", "status"),
    [
        ("throttle", "SlowDown", 503),
        ("server_error", "InternalError", 500),
        ("access_denied", "AccessDenied", 403),
        ("invalid_credentials", "InvalidAccessKeyId", 403),
    ],
)
def test_s3_faults_are_answered_as_s3_answers_them(
    sqs_server: StrictSQSServer, s3: Any, bucket: str, kind: Any, code: str, status: int
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    sqs_server.inject_fault("s3:GetObject", kind)
    with pytest.raises(ClientError) as raised:
        s3.get_object(Bucket=bucket, Key="k")
    assert raised.value.response["Error"]["Code"] == code
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


def test_a_dropped_s3_call_never_reaches_moto(
    sqs_server: StrictSQSServer, s3: Any, bucket: str
) -> None:
    sqs_server.inject_fault("s3:PutObject", "drop_connection")
    with pytest.raises(ConnectionClosedError):
        s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3.get_object(Bucket=bucket, Key="k")


def test_an_sqs_outage_spares_s3_and_an_s3_outage_spares_sqs(
    sqs_server: StrictSQSServer, s3: Any, bucket: str
) -> None:
    sqs = boto3.client("sqs", config=NO_RETRIES, **sqs_server.boto3_kwargs)
    sqs_server.outage(seconds=60, kind="server_error")
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError):
        sqs.list_queues()
    sqs_server.end_outages()
    sqs_server.outage(seconds=60, kind="server_error", actions=["s3:GetObject", "s3:PutObject"])
    sqs.list_queues()
    with pytest.raises(ClientError, match="InternalError"):
        s3.get_object(Bucket=bucket, Key="k")
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "k"}]})
