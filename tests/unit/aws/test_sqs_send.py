"""The SendMessageBatch call: its request, and each answer read as sent, retry or refused."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from botocore.stub import Stubber

from celery_sqs_heartbeat.aws.sqs_facts import SQS_MAX_MESSAGE_SIZE
from celery_sqs_heartbeat.aws.sqs_send import MessageLimits, may_have_arrived, send_message_batch
from celery_sqs_heartbeat.process import this_process
from celery_sqs_heartbeat.publishing.book import SendOutcome

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs.fifo"
OPERATION = "send_message_batch"

ENTRIES = [
    {"MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d-a"},
    {"MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "d-b"},
    {"MessageBody": "c", "MessageGroupId": "g", "MessageDeduplicationId": "d-c"},
]


@pytest.fixture
def publish(source: BaseClient) -> BaseClient:
    """The client the sends actually go through: the process's publish client of ``source``."""
    return this_process().clients.publish(source)


@pytest.fixture
def stub(publish: BaseClient) -> Iterator[Stubber]:
    """The stubber of the client the sends actually go through."""
    with Stubber(publish) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def request() -> dict[str, Any]:
    return {
        "QueueUrl": QUEUE_URL,
        "Entries": [{"Id": str(index), **entry} for index, entry in enumerate(ENTRIES)],
    }


def ok(entry_id: str) -> dict[str, str]:
    return {"Id": entry_id, "MessageId": f"m{entry_id}", "MD5OfMessageBody": "x"}


def failed(entry_id: str, code: str, sender_fault: bool) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": sender_fault, "Code": code, "Message": "why"}


def test_every_entry_goes_in_one_call_with_ids_by_place_and_its_fifo_ids(
    publish: BaseClient, stub: Stubber
) -> None:
    stub.add_response(
        OPERATION, {"Successful": [ok("0"), ok("1"), ok("2")], "Failed": []}, request()
    )
    results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert results == dict.fromkeys(range(3), (SendOutcome.SENT, ""))


def test_each_failed_entry_is_retried_unless_its_code_refuses_the_message_for_good(
    publish: BaseClient, stub: Stubber
) -> None:
    answer = {
        "Successful": [],
        "Failed": [
            failed("0", "InternalError", sender_fault=False),
            failed("1", "RequestThrottled", sender_fault=True),
            failed("2", "InvalidMessageContents", sender_fault=True),
        ],
    }
    stub.add_response(OPERATION, answer, request())
    results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert results == {
        0: (SendOutcome.RETRY, "InternalError: why"),
        1: (SendOutcome.RETRY, "RequestThrottled: why"),
        2: (SendOutcome.REFUSED, "InvalidMessageContents: why"),
    }


def test_an_entry_in_no_list_is_left_for_the_book_to_retry(
    publish: BaseClient, stub: Stubber
) -> None:
    stub.add_response(OPERATION, {"Successful": [ok("0")], "Failed": []}, request())
    assert send_message_batch(publish, QUEUE_URL, ENTRIES) == {0: (SendOutcome.SENT, "")}


@pytest.mark.parametrize(
    ("code", "status", "outcome"),
    [
        ("ThrottlingException", 400, SendOutcome.RETRY),
        ("InternalError", 500, SendOutcome.RETRY),
        ("SomethingNew", 400, SendOutcome.RETRY),
        ("AWS.SimpleQueueService.NonExistentQueue", 400, SendOutcome.REFUSED),
        ("AccessDenied", 403, SendOutcome.REFUSED),
        # AWS's JSON protocol without the query-compatible header: still for good.
        ("com.amazon.coral.service#AccessDeniedException", 400, SendOutcome.REFUSED),
    ],
)
def test_a_call_refused_whole_gives_each_entry_the_call_s_outcome(
    publish: BaseClient, stub: Stubber, code: str, status: int, outcome: SendOutcome
) -> None:
    stub.add_client_error(OPERATION, code, "no", status, expected_params=request())
    results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert {kind for kind, _ in results.values()} == {outcome}
    assert set(results) == {0, 1, 2}


@contextlib.contextmanager
def failing_before_send(publish: BaseClient, fail: Callable[..., None]) -> Iterator[None]:
    """``fail`` runs where botocore would send each SendMessageBatch request."""
    events = publish.meta.events
    events.register("before-send.sqs.SendMessageBatch", fail, unique_id="network-fault")
    try:
        yield
    finally:
        events.unregister("before-send.sqs.SendMessageBatch", unique_id="network-fault")


def test_a_network_fault_is_a_retry_for_every_entry_never_raised_and_tried_once(
    publish: BaseClient,
) -> None:
    attempts: list[Any] = []

    def fail(request: Any, **_: Any) -> None:
        attempts.append(request)
        raise EndpointConnectionError(endpoint_url=QUEUE_URL)

    with failing_before_send(publish, fail):
        results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert {kind for kind, _ in results.values()} == {SendOutcome.RETRY}
    assert len(results) == 3 and len(attempts) == 1


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [
        (EndpointConnectionError(endpoint_url=QUEUE_URL), SendOutcome.RETRY),
        (ConnectTimeoutError(endpoint_url=QUEUE_URL), SendOutcome.RETRY),
        (ReadTimeoutError(endpoint_url=QUEUE_URL), SendOutcome.UNANSWERED),
        (ConnectionClosedError(endpoint_url=QUEUE_URL), SendOutcome.UNANSWERED),
    ],
)
def test_a_fault_after_the_request_left_is_unanswered_one_before_a_plain_retry(
    publish: BaseClient, fault: Exception, outcome: SendOutcome
) -> None:
    """After a read timeout or a connection closed mid-call SQS may have taken the
    messages: their S3 objects must stay even if the entries are given up later."""

    def fail(**_: Any) -> None:
        raise fault

    with failing_before_send(publish, fail):
        results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert {kind for kind, _ in results.values()} == {outcome}
    assert outcome.worth_another_try


@pytest.mark.parametrize(
    ("fault", "arrived"),
    [
        (EndpointConnectionError(endpoint_url=QUEUE_URL), False),
        (ConnectTimeoutError(endpoint_url=QUEUE_URL), False),
        (ReadTimeoutError(endpoint_url=QUEUE_URL), True),
        (ConnectionClosedError(endpoint_url=QUEUE_URL), True),
        (ConnectionResetError(), True),
    ],
)
def test_only_a_connection_never_made_proves_the_request_never_arrived(
    fault: Exception, arrived: bool
) -> None:
    assert may_have_arrived(fault) is arrived


def request_of(*indexes: int) -> dict[str, Any]:
    """The request that carries these of :data:`ENTRIES`, numbered afresh."""
    entries = [ENTRIES[index] for index in indexes]
    return {
        "QueueUrl": QUEUE_URL,
        "Entries": [{"Id": str(number), **entry} for number, entry in enumerate(entries)],
    }


@pytest.mark.parametrize(
    "code", ["InvalidParameterValue", "AWS.SimpleQueueService.BatchRequestTooLong"]
)
def test_a_call_refused_whole_for_one_entry_is_split_until_only_that_entry_is_refused(
    publish: BaseClient, stub: Stubber, code: str
) -> None:
    """Issue 31, 5: SQS names no entry when one message is too long for the queue; the
    others of its call are not to blame, and go in halves until the culprit is alone."""
    stub.add_client_error(OPERATION, code, "too long", 400, expected_params=request())
    stub.add_response(OPERATION, {"Successful": [ok("0")], "Failed": []}, request_of(0))
    stub.add_client_error(OPERATION, code, "too long", 400, expected_params=request_of(1, 2))
    stub.add_response(OPERATION, {"Successful": [ok("0")], "Failed": []}, request_of(1))
    stub.add_client_error(OPERATION, code, "too long", 400, expected_params=request_of(2))
    results = send_message_batch(publish, QUEUE_URL, ENTRIES)
    assert results == {
        0: (SendOutcome.SENT, ""),
        1: (SendOutcome.SENT, ""),
        2: (SendOutcome.REFUSED, f"{code.rsplit('.', 1)[-1]}: too long"),
    }


def test_a_split_call_sends_its_second_half_only_once_the_first_needs_no_retry(
    publish: BaseClient, stub: Stubber
) -> None:
    """The entries of a FIFO group go in order: a later half never overtakes an earlier
    entry that SQS failed for now. Left unanswered, the book retries it in its place."""
    stub.add_client_error(OPERATION, "InvalidParameterValue", "no", 400, expected_params=request())
    failed_now = {"Successful": [], "Failed": [failed("0", "InternalError", sender_fault=False)]}
    stub.add_response(OPERATION, failed_now, request_of(0))
    assert send_message_batch(publish, QUEUE_URL, ENTRIES) == {
        0: (SendOutcome.RETRY, "InternalError: why")
    }


def test_the_queue_s_maximum_message_size_is_read_once_and_its_default_when_unreadable(
    publish: BaseClient, stub: Stubber
) -> None:
    readable, unreadable = f"{QUEUE_URL}-256", f"{QUEUE_URL}-denied"
    stub.add_response(
        "get_queue_attributes",
        {"Attributes": {"MaximumMessageSize": "262144"}},
        {"QueueUrl": readable, "AttributeNames": ["MaximumMessageSize"]},
    )
    stub.add_client_error("get_queue_attributes", "AccessDenied", "no", 403)
    limits = MessageLimits()
    assert limits.of(publish, readable) == 262_144
    assert limits.of(publish, readable) == 262_144
    assert limits.of(publish, unreadable) == SQS_MAX_MESSAGE_SIZE
    assert limits.of(publish, unreadable) == SQS_MAX_MESSAGE_SIZE
