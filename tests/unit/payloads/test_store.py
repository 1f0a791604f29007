"""The S3 layer's decisions around its calls: what is offloaded, where S3 is asked."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest
from botocore.client import BaseClient
from botocore.response import StreamingBody
from botocore.stub import Stubber

from celery_sqs_heartbeat.payloads.options import LargePayloadOptions, PayloadAccess
from celery_sqs_heartbeat.payloads.pointers import S3Pointer, pointer_in
from celery_sqs_heartbeat.payloads.store import PayloadStore, PayloadUnavailable
from celery_sqs_heartbeat.process import ProcessState
from tests.unit.conftest import make_lease


class FakeS3:
    def __init__(self) -> None:
        self.puts: list[dict[str, Any]] = []

    def put_object(self, **request: Any) -> None:
        self.puts.append(request)


@pytest.fixture
def s3(process_state: ProcessState, monkeypatch: pytest.MonkeyPatch) -> FakeS3:
    """The S3 client the process derives from any SQS client."""
    fake = FakeS3()
    monkeypatch.setattr(process_state.clients, "s3", lambda _: fake)
    return fake


def test_a_body_at_the_threshold_is_sent_as_it_is(s3: FakeS3) -> None:
    store = PayloadStore(LargePayloadOptions("tasks", threshold=10))
    params = {"QueueUrl": "q", "MessageBody": "x" * 10}
    assert store.offload(object(), params) is None  # type: ignore[arg-type]
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


def test_without_a_bucket_nothing_is_offloaded(s3: FakeS3) -> None:
    params = {"MessageBody": "x" * 2_000_000}
    PayloadStore(None).offload(object(), params)  # type: ignore[arg-type]
    assert params == {"MessageBody": "x" * 2_000_000}
    assert s3.puts == []


#: A queue of AWS's: its URL names the account that owns the app's buckets.
AWS_QUEUE = "https://sqs.us-east-1.amazonaws.com/210987654321/celery"
OWNER = "210987654321"


class Stream(io.BytesIO):
    """An object's bytes, counting those read."""

    taken = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.taken += len(data)
        return data


class S3Calls:
    """A real botocore S3 client, stubbed: the calls' parameters as made, and answers."""

    def __init__(self, state: ProcessState, sqs: BaseClient) -> None:
        self.s3 = state.clients.s3(sqs)
        self.stub = Stubber(self.s3)
        self.made: list[tuple[str, dict[str, Any]]] = []
        self.deleted = threading.Event()
        self.s3.meta.events.register("provide-client-params.s3", self._note)

    def _note(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.made.append((model.name, dict(params)))
        if model.name == "DeleteObjects":
            self.deleted.set()

    def get_answer(self, data: bytes, content_length: int | None = None) -> Stream:
        stream = Stream(data)
        length = len(data) if content_length is None else content_length
        body = StreamingBody(stream, length)
        self.stub.add_response("get_object", {"Body": body, "ContentLength": length})
        return stream


@pytest.fixture
def aws_sqs() -> BaseClient:
    return botocore.session.Session().create_client(
        "sqs", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )


@pytest.fixture
def calls(process_state: ProcessState, aws_sqs: BaseClient) -> Iterator[S3Calls]:
    made = S3Calls(process_state, aws_sqs)
    with made.stub:
        yield made


@pytest.mark.parametrize("bucket", [None, "payloads"])
def test_a_pointer_outside_the_buckets_named_is_neither_read_nor_deleted(
    aws_sqs: BaseClient, calls: S3Calls, bucket: str | None
) -> None:
    """Issue 32, item 1: any pointer's object was read, then deleted after the ack."""
    store = PayloadStore(None if bucket is None else LargePayloadOptions(bucket))
    with pytest.raises(PayloadUnavailable) as refused:
        store.fetch(aws_sqs, S3Pointer("victim", "ledger.csv"))
    assert calls.made == []
    assert refused.value.code == (
        "bucket victim is neither large_payload_bucket nor in large_payload_read_buckets"
    )


def test_a_bucket_of_the_read_list_is_read(aws_sqs: BaseClient, calls: S3Calls) -> None:
    access = PayloadAccess.from_transport_options({"large_payload_read_buckets": ["partner"]})
    calls.get_answer(b"body")
    assert PayloadStore(None, access).fetch(aws_sqs, S3Pointer("partner", "k")) == "body"


@pytest.mark.parametrize(("content_length", "data"), [(100, b"x" * 100), (5, b"x" * 100)])
def test_an_object_over_the_limit_is_not_read(
    aws_sqs: BaseClient, calls: S3Calls, content_length: int, data: bytes
) -> None:
    """Checked with S3's ContentLength before the stream is read, and while reading it,
    so neither a size attribute nor a length that lies gets a larger body in."""
    access = PayloadAccess(frozenset({"payloads"}), max_read_bytes=10)
    stream = calls.get_answer(data, content_length)
    with pytest.raises(PayloadUnavailable) as refused:
        PayloadStore(None, access).fetch(aws_sqs, S3Pointer("payloads", "k"))
    assert "over large_payload_max_read_bytes (10)" in refused.value.code
    assert stream.taken == (0 if content_length > 10 else 11)


def test_every_s3_call_names_the_bucket_owner_and_puts_are_encrypted(
    process_state: ProcessState, aws_sqs: BaseClient, calls: S3Calls
) -> None:
    """Issue 32, item 2: the owner is the account in the AWS queue's URL."""
    options = LargePayloadOptions("payloads", threshold=0, sse="aws:kms", kms_key_id="alias/t")
    store = PayloadStore(options, PayloadAccess(frozenset({"payloads"})))
    calls.stub.add_response("put_object", {})
    params = {"QueueUrl": AWS_QUEUE, "MessageBody": "xx"}
    put = store.offload(aws_sqs, params)
    pointer = pointer_in(params["MessageBody"])
    assert pointer is not None
    # The object and owner put, for the sender to delete if SQS does not take the message.
    assert put == (pointer, OWNER)
    calls.get_answer(b"xx")
    assert store.fetch(aws_sqs, pointer, queue_url=AWS_QUEUE) == "xx"
    lease = make_lease("jobs")
    store.remember(lease, pointer, queue_url=AWS_QUEUE)
    calls.stub.add_response("delete_objects", {})
    process_state.s3_cleanup.deleted(lambda: aws_sqs, [lease])
    assert calls.deleted.wait(5)
    assert [(name, made.get("ExpectedBucketOwner")) for name, made in calls.made] == [
        ("PutObject", OWNER),
        ("GetObject", OWNER),
        ("DeleteObjects", OWNER),
    ]
    put = calls.made[0][1]
    assert (put["ServerSideEncryption"], put["SSEKMSKeyId"]) == ("aws:kms", "alias/t")


def test_behind_a_local_server_no_owner_is_named_unless_given(
    aws_sqs: BaseClient, calls: S3Calls
) -> None:
    local = "http://127.0.0.1:9324/123456789012/celery"
    calls.get_answer(b"a")
    calls.get_answer(b"b")
    PayloadStore(LargePayloadOptions("p-1")).fetch(aws_sqs, S3Pointer("p-1", "k"), queue_url=local)
    given = PayloadAccess(frozenset({"p-1"}), expected_owner="012345678901")
    PayloadStore(None, given).fetch(aws_sqs, S3Pointer("p-1", "k"), queue_url=local)
    assert [made.get("ExpectedBucketOwner") for _, made in calls.made] == [None, "012345678901"]
