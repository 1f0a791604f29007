"""The large-payload format and decisions (payloads/pointers.py), and its options
(payloads/options.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from celery_sqs_heartbeat.options import HeartbeatOptions, InvalidTransportOption
from celery_sqs_heartbeat.payloads.options import (
    DEFAULT_MAX_READ_BYTES,
    LargePayloadOptions,
    PayloadAccess,
)
from celery_sqs_heartbeat.payloads.pointers import (
    DEFAULT_THRESHOLD,
    FailureStreak,
    S3Pointer,
    message_size,
    new_key,
    pointer_in,
    refusal,
    should_offload,
    size_attribute,
    size_in,
    unavailable_release_delay,
)
from celery_sqs_heartbeat.startup.settings_line import describe


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
        "[not json",
        "",
    ],
)
def test_any_other_body_is_no_pointer(body: str) -> None:
    assert pointer_in(body) is None


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ('["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3Key": "k"}]', ("", "k")),
        ('["com.amazon.sqs.javamessaging.MessageS3Pointer", {"s3BucketName": "b"}]', ("b", "")),
        ('["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3Key": 5}]', ("", "")),
    ],
)
def test_a_pointer_with_a_part_missing_is_still_a_pointer_and_refused(
    body: str, pointer: tuple[str, str]
) -> None:
    """Issue 32, item 5: handed to Celery, it was deleted as an unknown message."""
    found = pointer_in(body)
    assert found == S3Pointer(*pointer)
    assert refusal(found, frozenset({"b"}), 100, None) == "the pointer names no bucket or no key"


def test_only_the_buckets_named_in_the_options_are_read() -> None:
    """Issue 32, item 1: a worker read, then deleted, any object a pointer named."""
    readable = frozenset({"payloads", "partner-out"})
    assert refusal(S3Pointer("payloads", "k"), readable, 100, None) is None
    assert refusal(S3Pointer("partner-out", "k"), readable, 100, None) is None
    assert refusal(S3Pointer("victim", "ledger.csv"), readable, 100, None) == (
        "bucket victim is neither large_payload_bucket nor in large_payload_read_buckets"
    )
    assert refusal(S3Pointer("victim", "ledger.csv"), frozenset(), 100, None) == (
        "bucket victim is neither large_payload_bucket nor in large_payload_read_buckets"
    )


def test_a_size_attribute_over_the_limit_is_refused_before_any_read() -> None:
    readable = frozenset({"payloads"})
    assert refusal(S3Pointer("payloads", "k"), readable, 100, 100) is None
    assert refusal(S3Pointer("payloads", "k"), readable, 100, 101) == (
        "101 bytes, over large_payload_max_read_bytes (100)"
    )


def test_the_size_is_read_from_either_attribute() -> None:
    assert size_in({"ExtendedPayloadSize": {"DataType": "Number", "StringValue": "12"}}) == 12
    assert size_in({"SQSLargePayloadSize": {"DataType": "Number", "StringValue": "7"}}) == 7
    assert size_in({"ExtendedPayloadSize": {"DataType": "Number", "StringValue": "x"}}) is None
    assert size_in({}) is None and size_in(None) is None


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


def access(**options: Any) -> PayloadAccess:
    return PayloadAccess.from_transport_options(options)


def test_only_the_app_s_bucket_and_those_named_are_read() -> None:
    assert access() == PayloadAccess(frozenset(), DEFAULT_MAX_READ_BYTES, None, True)
    assert DEFAULT_MAX_READ_BYTES == 64 * 1024 * 1024
    assert access(large_payload_bucket="tasks").readable == frozenset({"tasks"})
    given = access(
        large_payload_bucket="tasks",
        large_payload_read_buckets=["partner-out", "other.bucket"],
        large_payload_max_read_bytes="1000000",
    )
    assert given.readable == frozenset({"tasks", "partner-out", "other.bucket"})
    assert given.max_read_bytes == 1_000_000
    assert access(large_payload_read_buckets="a-1, b-2").readable == frozenset({"a-1", "b-2"})


AWS_QUEUE = "https://sqs.eu-west-1.amazonaws.com/210987654321/celery"


def test_the_expected_bucket_owner_defaults_to_the_account_of_an_aws_queue() -> None:
    derived = access()
    assert derived.owner_for(AWS_QUEUE) == "210987654321"
    assert derived.owner_for("https://sqs.cn-north-1.amazonaws.com.cn/210987654321/q") == (
        "210987654321"
    )
    assert derived.owner_for("http://127.0.0.1:9324/123456789012/celery") is None
    assert derived.owner_for(None) is None
    given = access(large_payload_expected_bucket_owner="012345678901")
    assert given.owner_for(AWS_QUEUE) == given.owner_for(None) == "012345678901"
    assert access(large_payload_expected_bucket_owner=False).owner_for(AWS_QUEUE) is None


def test_server_side_encryption_of_the_objects_put() -> None:
    assert parse(large_payload_bucket="tasks", large_payload_sse="AES256") == (
        LargePayloadOptions("tasks", sse="AES256")
    )
    kms = parse(
        large_payload_bucket="tasks",
        large_payload_sse="aws:kms",
        large_payload_kms_key_id="alias/k",
    )
    assert kms == LargePayloadOptions("tasks", sse="aws:kms", kms_key_id="alias/k")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"large_payload_read_buckets": ["ok-1", "Bad"]},
            "large_payload_read_buckets=\\['ok-1', 'Bad'\\]: must be a list of S3 bucket names",
        ),
        ({"large_payload_read_buckets": 5}, "large_payload_read_buckets=5"),
        (
            {"large_payload_max_read_bytes": 0},
            "large_payload_max_read_bytes=0: must be a size in bytes, 1 to 2147483648",
        ),
        ({"large_payload_max_read_bytes": 2**31 + 1}, "large_payload_max_read_bytes=2147483649"),
        ({"large_payload_max_read_bytes": "lots"}, "large_payload_max_read_bytes='lots'"),
        (
            {"large_payload_expected_bucket_owner": "1234"},
            "large_payload_expected_bucket_owner='1234': must be a 12-digit AWS account id",
        ),
        (
            {"large_payload_expected_bucket_owner": 123456789012},
            "large_payload_expected_bucket_owner=123456789012",
        ),
    ],
)
def test_bad_access_options_are_refused_naming_the_option(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTransportOption, match=message):
        PayloadAccess.from_transport_options(given)


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
        ({"large_payload_sse": "aes"}, "large_payload_sse='aes': must be 'AES256' or 'aws:kms'"),
        (
            {"large_payload_kms_key_id": "k"},
            "large_payload_kms_key_id='k': only with large_payload_sse 'aws:kms'",
        ),
        (
            {"large_payload_sse": "aws:kms", "large_payload_kms_key_id": 5},
            "large_payload_kms_key_id=5: must be",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_option(given: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTransportOption, match=message.replace("(", r"\(")):
        LargePayloadOptions.from_transport_options({"large_payload_bucket": "tasks", **given})


def test_the_start_up_line_says_what_guards_s3_when_not_the_defaults() -> None:
    given = {
        "large_payload_bucket": "tasks",
        "large_payload_read_buckets": ["partner"],
        "large_payload_max_read_bytes": 1000,
        "large_payload_expected_bucket_owner": "012345678901",
        "large_payload_sse": "aws:kms",
    }
    line = describe(
        HeartbeatOptions(), LargePayloadOptions.from_transport_options(given), access(**given)
    )
    assert line.split("; ")[-4:] == [
        "pointers also read from partner (large_payload_read_buckets)",
        "bodies read up to 1000 bytes (large_payload_max_read_bytes)",
        "S3 buckets expected of account 012345678901",
        "objects put with aws:kms encryption (large_payload_sse)",
    ]
    defaults = {"large_payload_bucket": "tasks"}
    assert describe(HeartbeatOptions(), parse(**defaults), access(**defaults)) == describe(
        HeartbeatOptions(), parse(**defaults)
    )
