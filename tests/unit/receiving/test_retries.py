"""Which receive failures stop the worker, and how long a failing queue waits."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.parsers import ResponseParserError

from celery_sqs_heartbeat.compat import DoesNotExistQueueException
from celery_sqs_heartbeat.receiving.retries import (
    RECEIVE_RETRY_CAP,
    ReceiveBackoff,
    classify_receive_error,
    ends_worker,
)


def client_error(code: str, message: str = "no") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "ReceiveMessage")


@pytest.mark.parametrize(
    "code",
    [
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "KmsAccessDenied",
    ],
)
def test_errors_retrying_cannot_fix_are_fatal(code: str) -> None:
    failure = classify_receive_error(client_error(code))
    assert failure.fatal
    assert failure.code == code.rsplit(".", 1)[-1]


@pytest.mark.parametrize(
    "code", ["ThrottlingException", "RequestThrottled", "InternalError", "ServiceUnavailable"]
)
def test_throttling_and_server_errors_are_retried(code: str) -> None:
    assert not classify_receive_error(client_error(code)).fatal


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ResponseParserError("unparsable"),
        ConnectionResetError(104, "Connection reset by peer"),
        KeyError("Messages"),
    ],
)
def test_network_faults_unparsable_answers_and_surprises_are_retried(error: Exception) -> None:
    failure = classify_receive_error(error)
    assert not failure.fatal
    assert failure.code == type(error).__name__


def test_a_queue_kombu_cannot_find_is_fatal() -> None:
    failure = classify_receive_error(DoesNotExistQueueException("Queue with name 'x' ..."))
    assert failure.fatal
    assert failure.code == "QueueDoesNotExist"


def test_kombu_async_error_text_in_the_query_protocol_gives_the_code() -> None:
    # What kombu's asynchronous client raises for a non-5xx error answer.
    error = Exception(
        'Request HTTP Error  HTTP 400  Bad Request (b\'<?xml version="1.0"?><ErrorResponse>'
        "<Error><Type>Sender</Type><Code>AWS.SimpleQueueService.NonExistentQueue</Code>"
        "<Message>The specified queue does not exist.</Message></Error></ErrorResponse>')"
    )
    failure = classify_receive_error(error)
    assert (failure.code, failure.fatal) == ("NonExistentQueue", True)
    assert failure.detail == "The specified queue does not exist."


def test_kombu_async_error_text_in_the_json_protocol_gives_the_code() -> None:
    error = Exception(
        "Request HTTP Error  HTTP 400  Bad Request "
        '(b\'{"__type": "com.amazonaws.sqs#ThrottlingException", "message": "Rate exceeded"}\')'
    )
    failure = classify_receive_error(error)
    assert (failure.code, failure.fatal) == ("ThrottlingException", False)
    assert failure.detail == "Rate exceeded"


def test_kombu_async_error_text_from_aws_front_end_gives_the_code() -> None:
    error = Exception(
        "Request HTTP Error  HTTP 400  Bad Request (b'{\"__type\": "
        '"com.amazon.coral.service#UnrecognizedClientException", '
        "\"message\": \"The security token included in the request is invalid.\"}')"
    )
    failure = classify_receive_error(error)
    assert (failure.code, failure.fatal) == ("UnrecognizedClientException", True)


def test_kombu_async_error_without_a_code_is_named_by_its_status() -> None:
    failure = classify_receive_error(Exception("Request Empty body  HTTP 403  Forbidden (b'')"))
    assert (failure.code, failure.fatal) == ("HTTP 403", False)


def test_the_first_failure_starts_a_streak_and_later_ones_do_not() -> None:
    backoff = ReceiveBackoff(jitter=lambda: 0.0)
    assert backoff.failed("jobs", now=0.0) is True
    assert backoff.failed("jobs", now=1.0) is False
    assert backoff.failed("other", now=1.0) is True


def test_the_wait_doubles_and_is_capped() -> None:
    backoff = ReceiveBackoff(base=0.25, cap=2.0, jitter=lambda: 1.0)
    waits = []
    for _ in range(7):
        backoff.failed("jobs", now=100.0)
        waits.append(backoff.wait("jobs", now=100.0))
    assert waits == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_jitter_keeps_at_least_half_of_the_delay() -> None:
    backoff = ReceiveBackoff(base=1.0, cap=RECEIVE_RETRY_CAP, jitter=lambda: 0.0)
    backoff.failed("jobs", now=0.0)
    assert backoff.wait("jobs", now=0.0) == 0.5


def test_the_wait_counts_down_with_the_clock() -> None:
    backoff = ReceiveBackoff(base=1.0, jitter=lambda: 1.0)
    backoff.failed("jobs", now=10.0)
    assert backoff.wait("jobs", now=10.4) == pytest.approx(0.6)
    assert backoff.wait("jobs", now=12.0) == 0.0


def test_success_ends_the_streak_and_says_how_long_it_lasted() -> None:
    backoff = ReceiveBackoff(jitter=lambda: 0.0)
    backoff.failed("jobs", now=10.0)
    backoff.failed("jobs", now=11.0)
    recovery = backoff.succeeded("jobs", now=13.5)
    assert recovery is not None
    assert (recovery.failures, recovery.seconds) == (2, 3.5)
    assert backoff.wait("jobs", now=13.5) == 0.0
    assert backoff.succeeded("jobs", now=14.0) is None


def test_a_receive_sent_before_the_streak_began_does_not_end_it() -> None:
    """Several receives in flight on a queue: one sent before another failed comes back
    fine, which says nothing of SQS working again."""
    backoff = ReceiveBackoff(base=1.0, jitter=lambda: 1.0)
    backoff.failed("jobs", now=10.0)

    assert backoff.succeeded("jobs", now=10.1, sent_at=9.99) is None
    assert backoff.wait("jobs", now=10.1) == pytest.approx(0.9)
    recovery = backoff.succeeded("jobs", now=11.5, sent_at=11.0)
    assert recovery is not None and recovery.failures == 1


def test_a_new_streak_starts_from_the_base_delay_again() -> None:
    backoff = ReceiveBackoff(base=0.25, cap=2.0, jitter=lambda: 1.0)
    for _ in range(5):
        backoff.failed("jobs", now=0.0)
    backoff.succeeded("jobs", now=1.0)
    assert backoff.failed("jobs", now=2.0) is True
    assert backoff.wait("jobs", now=2.0) == 0.25


@pytest.mark.parametrize(
    "error",
    [
        client_error("AWS.SimpleQueueService.NonExistentQueue"),
        client_error("QueueDoesNotExist"),
        DoesNotExistQueueException("gone"),
    ],
)
def test_a_missing_task_queue_ends_the_worker_and_a_remote_control_queue_does_not(
    error: Exception,
) -> None:
    failure = classify_receive_error(error)
    assert ends_worker(failure, "celery")
    assert ends_worker(failure, "orders-pidbox-archive")
    # A client's reply queue and a worker's broadcast queue, as SQS names them.
    assert not ends_worker(failure, "4f1c2e-reply-celery-pidbox")
    assert not ends_worker(failure, "celery_w1_host-celery-pidbox")


def test_a_remote_control_queue_the_worker_may_not_read_still_ends_it() -> None:
    """Denied is a misconfiguration whichever the queue; only a missing one is Celery's."""
    assert ends_worker(classify_receive_error(client_error("AccessDenied")), "x-celery-pidbox")
    assert not ends_worker(classify_receive_error(client_error("Throttling")), "celery")
