"""The S3 layer's decisions around its calls: what is offloaded, where S3 is asked."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_sqs_heartbeat import payload_store
from celery_sqs_heartbeat.payload_options import LargePayloadOptions
from celery_sqs_heartbeat.payload_store import PayloadStore, _s3_endpoint, delete_objects_of
from celery_sqs_heartbeat.payloads import S3Pointer, pointer_in

from .conftest import make_lease


class FakeS3:
    def __init__(self) -> None:
        self.puts: list[dict[str, Any]] = []

    def put_object(self, **request: Any) -> None:
        self.puts.append(request)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> FakeS3:
    fake = FakeS3()
    monkeypatch.setattr(payload_store, "s3_client", lambda _: fake)
    return fake


def test_a_body_at_the_threshold_is_sent_as_it_is(s3: FakeS3) -> None:
    store = PayloadStore(LargePayloadOptions("tasks", threshold=10))
    params = {"QueueUrl": "q", "MessageBody": "x" * 10}
    store.offload(object(), params)  # type: ignore[arg-type]
    assert params == {"QueueUrl": "q", "MessageBody": "x" * 10}
    assert s3.puts == []


def test_attributes_count_toward_the_threshold_and_are_kept(s3: FakeS3) -> None:
    store = PayloadStore(LargePayloadOptions("tasks", prefix="p/", threshold=10))
    trace = {"t": {"DataType": "String", "StringValue": "1"}}
    params = {"MessageBody": "x" * 5, "MessageAttributes": dict(trace)}
    store.offload(object(), params)  # type: ignore[arg-type]
    [put] = s3.puts
    assert put["Bucket"] == "tasks" and put["Key"].startswith("p/") and put["Body"] == b"xxxxx"
    pointer = pointer_in(params["MessageBody"])
    assert pointer is not None and pointer.key == put["Key"]
    assert params["MessageAttributes"] == {
        **trace,
        "ExtendedPayloadSize": {"DataType": "Number", "StringValue": "5"},
    }


def test_always_offloads_even_a_tiny_body(s3: FakeS3) -> None:
    store = PayloadStore(LargePayloadOptions("tasks", threshold=None))
    params = {"MessageBody": "é"}
    store.offload(object(), params)  # type: ignore[arg-type]
    assert s3.puts[0]["Body"] == "é".encode()
    assert params["MessageAttributes"]["ExtendedPayloadSize"]["StringValue"] == "2"


@pytest.mark.parametrize(
    ("sqs_endpoint", "s3_endpoint"),
    [
        ("https://sqs.us-east-1.amazonaws.com", None),
        ("https://sqs.cn-north-1.amazonaws.com.cn", None),
        ("http://127.0.0.1:4566", "http://127.0.0.1:4566"),
        ("http://localstack:4566", "http://localstack:4566"),
        (None, None),
    ],
)
def test_s3_is_asked_at_aws_behind_aws_and_at_a_local_stack_s_endpoint(
    sqs_endpoint: str | None, s3_endpoint: str | None
) -> None:
    assert _s3_endpoint(sqs_endpoint) == s3_endpoint


def test_without_a_bucket_nothing_is_offloaded(s3: FakeS3) -> None:
    params = {"MessageBody": "x" * 2_000_000}
    PayloadStore(None).offload(object(), params)  # type: ignore[arg-type]
    assert params == {"MessageBody": "x" * 2_000_000}
    assert s3.puts == []


class SlowS3:
    """An S3 whose DeleteObjects answers only when told to."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.answer = threading.Event()
        self.deleted = threading.Event()
        self.keys: list[str] = []

    def delete_objects(self, **request: Any) -> dict[str, Any]:
        self.called.set()
        self.answer.wait(30)
        self.keys += [entry["Key"] for entry in request["Delete"]["Objects"]]
        self.deleted.set()
        return {}


def test_the_objects_of_deleted_messages_go_without_holding_the_sqs_delete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 9: the DeleteObjects call ran inside the SQS delete's call slot, so
    a slow S3 held the slots SQS's deletes need."""
    s3 = SlowS3()
    monkeypatch.setattr(payload_store, "s3_client", lambda _: s3)
    lease = make_lease("jobs")
    PayloadStore(LargePayloadOptions("tasks")).remember(lease, S3Pointer("tasks", "k-1"))

    deleting = threading.Thread(target=delete_objects_of, args=(lambda: object(), [lease]))
    deleting.start()
    deleting.join(5)
    returned_at_once = not deleting.is_alive()
    s3.answer.set()

    assert returned_at_once
    assert s3.deleted.wait(5)
    assert s3.keys == ["k-1"]
