"""Objects of messages SQS did not take: deleted at once, a failure logged, never raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from celery_sqs_heartbeat.payloads.cleanup import Owned
from celery_sqs_heartbeat.payloads.orphans import discard
from celery_sqs_heartbeat.payloads.pointers import S3Pointer

OWNER = "210987654321"


class FakeS3:
    def __init__(self, answer: dict[str, Any] | None = None, fault: Exception | None = None):
        self.calls: list[dict[str, Any]] = []
        self._answer = answer or {}
        self._fault = fault

    def delete_objects(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        if self._fault is not None:
            raise self._fault
        return self._answer


def owned(bucket: str, key: str, owner: str | None = OWNER) -> Owned:
    return (S3Pointer(bucket, key), owner)


def test_objects_go_in_one_call_per_bucket_and_owner() -> None:
    s3 = FakeS3()
    discard(lambda: s3, [owned("a", "k1"), owned("b", "k2"), owned("a", "k3")])  # type: ignore[arg-type, return-value]
    assert s3.calls == [
        {
            "Bucket": "a",
            "Delete": {"Objects": [{"Key": "k1"}, {"Key": "k3"}], "Quiet": True},
            "ExpectedBucketOwner": OWNER,
        },
        {
            "Bucket": "b",
            "Delete": {"Objects": [{"Key": "k2"}], "Quiet": True},
            "ExpectedBucketOwner": OWNER,
        },
    ]


@pytest.mark.parametrize(
    "s3",
    [
        FakeS3(answer={"Errors": [{"Key": "k2", "Code": "AccessDenied"}]}),
        FakeS3(fault=ClientError({"Error": {"Code": "AccessDenied"}}, "DeleteObjects")),
    ],
)
def test_a_failed_delete_names_bucket_and_key_and_is_not_raised(
    s3: FakeS3, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        discard(lambda: s3, [owned("a", "k2")])  # type: ignore[arg-type, return-value]
    [record] = caplog.records
    assert "in bucket a: k2 (AccessDenied)" in record.getMessage()
    assert "lifecycle rule" in record.getMessage()


def test_an_unforeseen_error_is_logged_naming_the_objects_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_client() -> Any:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING):
        discard(no_client, [owned("a", "k1")])
    [record] = caplog.records
    assert "s3://a/k1" in record.getMessage() and record.exc_info is not None


def test_an_unknown_owner_is_not_named_and_a_network_fault_not_raised() -> None:
    s3 = FakeS3(fault=EndpointConnectionError(endpoint_url="http://s3"))
    discard(lambda: s3, [owned("a", "k1", owner=None)])  # type: ignore[arg-type, return-value]
    assert "ExpectedBucketOwner" not in s3.calls[0]
