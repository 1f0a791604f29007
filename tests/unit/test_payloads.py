"""The large-payload format and decisions (payloads.py) and its options (payload_options.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from celery_sqs_heartbeat.options import InvalidTransportOption
from celery_sqs_heartbeat.payload_options import LargePayloadOptions
from celery_sqs_heartbeat.payloads import (
    DEFAULT_THRESHOLD,
    FailureStreak,
    S3Pointer,
    message_size,
    new_key,
    pointer_in,
    should_offload,
    size_attribute,
    unavailable_release_delay,
)


def test_the_pointer_body_is_the_one_aws_extended_clients_write() -> None:
    body = S3Pointer("my-bucket", "tasks/0b8f").body()
    assert json.loads(body) == [
        "software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": "my-bucket", "s3Key": "tasks/0b8f"},
    ]
    assert pointer_in(body) == S3Pointer("my-bucket", "tasks/0b8f")


def test_the_legacy_java_pointer_class_is_read_too() -> None:
    body = json.dumps(
        ["com.amazon.sqs.javamessaging.MessageS3Pointer", {"s3BucketName": "b-1", "s3Key": "k"}]
    )
    assert pointer_in(body.encode()) == S3Pointer("b-1", "k")


@pytest.mark.parametrize(
    "body",
    [
        "eyJib2R5IjogIiJ9",  # a kombu message, base64-encoded
        '{"body": "", "properties": {}}',
        '["software.amazon.payloadoffloading.PayloadS3Pointer"]',
        '["another.Class", {"s3BucketName": "b", "s3Key": "k"}]',
        '["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3Key": "k"}]',
        '["com.amazon.sqs.javamessaging.MessageS3Pointer", {"s3BucketName": "", "s3Key": "k"}]',
        "[not json",
        "",
    ],
)
def test_any_other_body_is_no_pointer(body: str) -> None:
    assert pointer_in(body) is None


def test_message_size_counts_body_and_attributes_as_aws_clients_do() -> None:
    attributes = {"trace": {"DataType": "String", "StringValue": "é1"}}
    assert message_size("ab") == 2
    assert message_size("é", attributes) == 2 + len("trace") + len("String") + 3
    binary = {"blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}
    assert message_size("", binary) == 4 + 6 + 2


def test_offload_above_the_threshold_or_always() -> None:
    assert not should_offload(DEFAULT_THRESHOLD, DEFAULT_THRESHOLD)
    assert should_offload(DEFAULT_THRESHOLD + 1, DEFAULT_THRESHOLD)
    assert should_offload(1, None)


def test_the_size_attribute_marks_the_message_for_aws_clients() -> None:
    assert size_attribute(1234) == {
        "ExtendedPayloadSize": {"DataType": "Number", "StringValue": "1234"}
    }


def test_keys_are_the_prefix_and_a_uuid() -> None:
    fixed = uuid.UUID(int=7)
    assert new_key("celery/", lambda: fixed) == f"celery/{fixed}"
    assert new_key("") != new_key("")


@pytest.mark.parametrize(
    ("receive_count", "delay"), [(0, 1), (1, 1), (2, 2), (5, 16), (9, 256), (10, 300), (99, 300)]
)
def test_an_unreadable_object_backs_off_with_the_receive_count(
    receive_count: int, delay: int
) -> None:
    assert unavailable_release_delay(receive_count) == delay


def test_a_failure_streak_is_reported_once_and_its_end_once() -> None:
    streak = FailureStreak()
    assert streak.succeeded() == 0
    assert [streak.failed(), streak.failed(), streak.failed()] == [True, False, False]
    assert streak.succeeded() == 3
    assert streak.succeeded() == 0
    assert streak.failed() is True


def parse(**options: Any) -> LargePayloadOptions | None:
    return LargePayloadOptions.from_transport_options(options)


def test_no_bucket_no_offloading() -> None:
    assert parse() is None
    assert parse(large_payload_bucket=None, large_payload_threshold=5) is None


def test_defaults_with_a_bucket() -> None:
    assert parse(large_payload_bucket="my.bucket-1") == LargePayloadOptions(
        bucket="my.bucket-1", prefix="", threshold=262_144, keep_objects=False
    )


def test_every_option_given() -> None:
    options = parse(
        large_payload_bucket="tasks",
        large_payload_prefix="celery/",
        large_payload_threshold="100000",
        large_payload_keep_objects=True,
    )
    assert options == LargePayloadOptions("tasks", "celery/", 100_000, True)
    assert parse(large_payload_bucket="tasks", large_payload_threshold="Always") == (
        LargePayloadOptions("tasks", threshold=None)
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"large_payload_bucket": "AB"}, "large_payload_bucket='AB': must be an S3 bucket name"),
        ({"large_payload_bucket": "-abc"}, "large_payload_bucket='-abc'"),
        ({"large_payload_bucket": 3}, "large_payload_bucket=3"),
        ({"large_payload_prefix": 5}, "large_payload_prefix=5: must be text"),
        ({"large_payload_prefix": "x" * 989}, "at most 988 bytes"),
        ({"large_payload_threshold": -1}, "large_payload_threshold=-1: must be a size in bytes"),
        ({"large_payload_threshold": 1_048_576}, "0 to 1048575"),
        ({"large_payload_threshold": 2.5}, "large_payload_threshold=2.5"),
        ({"large_payload_threshold": True}, "large_payload_threshold=True"),
        ({"large_payload_threshold": "sometimes"}, "or 'always'"),
        ({"large_payload_keep_objects": "yes"}, "large_payload_keep_objects='yes'"),
    ],
)
def test_bad_values_are_refused_naming_the_option(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTransportOption, match=message.replace("(", r"\(")):
        LargePayloadOptions.from_transport_options({"large_payload_bucket": "tasks", **given})
