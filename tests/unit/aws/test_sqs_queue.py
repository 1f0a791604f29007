"""The SQS layer: one ChangeMessageVisibilityBatch call, every outcome an EntryResult.

A real botocore client with a ``Stubber`` on the process's renewal client derived from
it (:class:`~celery_sqs_heartbeat.aws.clients.DerivedClients`), the client a queue's
calls go through in a worker: no network.
Network faults are raised from botocore's ``before-send`` hook, where a real one would be.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.session
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber

from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease
from celery_sqs_heartbeat.process import this_process
from tests.unit.conftest import BEYOND_THE_LIMIT, EXPIRED_HANDLE, make_lease

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"
OPERATION = "change_message_visibility_batch"
BEFORE_SEND = "before-send.sqs.ChangeMessageVisibilityBatch"

#: Source clients share a session, so its service model is loaded once: the suite stays fast.
_SESSION = botocore.session.Session()


def sqs_client(access_key: str = "x", config: Config | None = None, **kwargs: Any) -> BaseClient:
    kwargs.setdefault("region_name", "us-east-1")
    return _SESSION.create_client(
        "sqs",
        aws_access_key_id=access_key,
        aws_secret_access_key="x",
        config=config,
        **kwargs,
    )


@pytest.fixture(scope="module")
def source() -> BaseClient:
    """The kombu client renewals derive from; one for the module (deriving is slow)."""
    return sqs_client()


def renewal_client(source: BaseClient) -> BaseClient:
    """The client renewals of ``source``'s queues go through in this process."""
    return this_process().clients.renewal(source)


@pytest.fixture
def stub(source: BaseClient) -> Iterator[Stubber]:
    """The stubber of the client renewals actually go through."""
    with Stubber(renewal_client(source)) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def sqs_queue(source: BaseClient) -> SQSQueue:
    """The queue as the process's lease targets make it: calls on the renewal client."""
    return SQSQueue("jobs", QUEUE_URL, lambda: renewal_client(source))


def leases(count: int) -> list[Lease]:
    return [make_lease("jobs", task_id=f"t{i}", receipt_handle=f"handle-{i}") for i in range(count)]


def request_for(entries: list[tuple[Lease, int]]) -> dict[str, Any]:
    return {
        "QueueUrl": QUEUE_URL,
        "Entries": [
            {"Id": str(i), "ReceiptHandle": lease.receipt_handle, "VisibilityTimeout": seconds}
            for i, (lease, seconds) in enumerate(entries)
        ],
    }


def failed(entry_id: str, code: str) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": True, "Code": code, "Message": f"{code} happened"}


# --- the request and per-entry answers ------------------------------------------------------


def test_all_successful_entries_are_ok(stub: Stubber, sqs_queue: SQSQueue) -> None:
    entries = [(lease, 30) for lease in leases(3)]
    stub.add_response(
        OPERATION,
        {"Successful": [{"Id": "0"}, {"Id": "1"}, {"Id": "2"}], "Failed": []},
        request_for(entries),
    )

    results = sqs_queue.change_visibility(entries)

    assert results == {lease: (EntryResult.OK, "") for lease, _ in entries}


def test_ten_entries_go_out_in_one_call_with_ids_0_to_9_and_their_own_lengths(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    entries = [(lease, 20 + i) for i, lease in enumerate(leases(10))]
    expected = request_for(entries)
    assert [entry["Id"] for entry in expected["Entries"]] == [str(i) for i in range(10)]
    stub.add_response(
        OPERATION,
        {"Successful": [{"Id": str(i)} for i in range(10)], "Failed": []},
        expected,
    )

    results = sqs_queue.change_visibility(entries)

    assert len(results) == 10
    assert all(result == (EntryResult.OK, "") for result in results.values())


@pytest.mark.parametrize(
    "code",
    [
        "MessageNotInflight",
        "ReceiptHandleIsInvalid",
        "InvalidParameterValue",
        "AWS.SimpleQueueService.MessageNotInflight",
        # LocalStack's answer for a message that was deleted.
        "InvalidParameterValueException",
    ],
)
def test_an_entry_failing_because_the_handle_is_gone_is_lost(
    stub: Stubber, sqs_queue: SQSQueue, code: str
) -> None:
    ok, gone, also_ok = leases(3)
    entries = [(ok, 30), (gone, 30), (also_ok, 30)]
    stub.add_response(
        OPERATION,
        {"Successful": [{"Id": "2"}, {"Id": "0"}], "Failed": [failed("1", code)]},
        request_for(entries),
    )

    results = sqs_queue.change_visibility(entries)

    assert results[ok] == (EntryResult.OK, "")
    assert results[also_ok] == (EntryResult.OK, "")
    kind, reason = results[gone]
    assert kind is EntryResult.LOST
    assert code.rsplit(".", 1)[-1] in reason
    assert f"{code} happened" in reason


@pytest.mark.parametrize(
    "code", ["InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException"]
)
def test_an_entry_failing_for_another_reason_is_transient(
    stub: Stubber, sqs_queue: SQSQueue, code: str
) -> None:
    ok, failing = leases(2)
    entries = [(ok, 30), (failing, 30)]
    stub.add_response(
        OPERATION,
        {"Successful": [{"Id": "0"}], "Failed": [failed("1", code)]},
        request_for(entries),
    )

    results = sqs_queue.change_visibility(entries)

    assert results[ok] == (EntryResult.OK, "")
    assert results[failing][0] is EntryResult.TRANSIENT


def test_an_error_quoting_the_receipt_handle_shows_only_its_first_characters(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    handle = "AQEB" + "x" * 300
    gone = make_lease("jobs", task_id="t0", receipt_handle=handle)
    quoting = {
        "Id": "0",
        "SenderFault": True,
        "Code": "InvalidParameterValue",
        "Message": f"Value {handle} for parameter ReceiptHandle is invalid.",
    }
    stub.add_response(OPERATION, {"Successful": [], "Failed": [quoting]}, request_for([(gone, 30)]))

    kind, reason = sqs_queue.change_visibility([(gone, 30)])[gone]

    assert kind is EntryResult.LOST
    assert (
        reason == "InvalidParameterValue: Value AQEBxxxx… for parameter ReceiptHandle is invalid."
    )


def refused(entry_id: str, code: str, message: str) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": True, "Code": code, "Message": message}


@pytest.mark.parametrize("code", ["InvalidParameterValue", "InvalidParameterValueException"])
def test_an_entry_refused_as_past_the_12_hours_is_beyond_the_limit_not_lost(
    stub: Stubber, sqs_queue: SQSQueue, code: str
) -> None:
    ok, late = leases(2)
    entries = [(ok, 30), (late, 43_200)]
    stub.add_response(
        OPERATION,
        {"Successful": [{"Id": "0"}], "Failed": [refused("1", code, BEYOND_THE_LIMIT)]},
        request_for(entries),
    )

    results = sqs_queue.change_visibility(entries)

    assert results[ok] == (EntryResult.OK, "")
    kind, reason = results[late]
    assert kind is not EntryResult.LOST
    assert kind is EntryResult.BEYOND_LIMIT
    assert reason == f"{code}: {BEYOND_THE_LIMIT}"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("InvalidParameterValue", EXPIRED_HANDLE),
        ("ReceiptHandleIsInvalid", "The input receipt handle is invalid."),
        ("MessageNotInflight", "Message does not exist or is not available for visibility."),
    ],
)
def test_a_stale_handle_is_still_lost_whatever_the_code_shares_with_the_limit(
    stub: Stubber, sqs_queue: SQSQueue, code: str, message: str
) -> None:
    (gone,) = leases(1)
    stub.add_response(
        OPERATION,
        {"Successful": [], "Failed": [refused("0", code, message)]},
        request_for([(gone, 30)]),
    )

    kind, _ = sqs_queue.change_visibility([(gone, 30)])[gone]

    assert kind is EntryResult.LOST


# --- whole-call failures --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("Throttling", 400),
        ("RequestThrottled", 403),
        ("InternalError", 500),
        ("ServiceUnavailable", 503),
        ("AccessDenied", 403),
    ],
)
def test_a_failed_call_is_transient_for_every_entry(
    stub: Stubber, sqs_queue: SQSQueue, code: str, status: int
) -> None:
    entries = [(lease, 30) for lease in leases(4)]
    stub.add_client_error(OPERATION, service_error_code=code, http_status_code=status)

    results = sqs_queue.change_visibility(entries)

    assert set(results) == {lease for lease, _ in entries}
    for kind, reason in results.values():
        assert kind is EntryResult.TRANSIENT
        assert code in reason


def test_a_call_refused_whole_as_past_the_12_hours_is_beyond_the_limit_for_each_entry(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    entries = [(lease, 43_200) for lease in leases(2)]
    stub.add_client_error(
        OPERATION,
        service_error_code="InvalidParameterValue",
        service_message=BEYOND_THE_LIMIT,
        http_status_code=400,
    )

    results = sqs_queue.change_visibility(entries)

    kinds = {kind for kind, _ in results.values()}
    assert EntryResult.TRANSIENT not in kinds
    assert kinds == {EntryResult.BEYOND_LIMIT}
    assert all(BEYOND_THE_LIMIT in reason for _, reason in results.values())


def test_a_call_refused_whole_for_another_invalid_parameter_is_still_transient(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    entries = [(lease, 30) for lease in leases(2)]
    stub.add_client_error(
        OPERATION,
        service_error_code="InvalidParameterValue",
        service_message="Value 50000 for parameter VisibilityTimeout is invalid.",
        http_status_code=400,
    )

    results = sqs_queue.change_visibility(entries)

    assert {kind for kind, _ in results.values()} == {EntryResult.TRANSIENT}


@pytest.mark.parametrize("code", ["QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"])
def test_a_call_to_a_queue_that_is_gone_loses_every_entry(
    stub: Stubber, sqs_queue: SQSQueue, code: str
) -> None:
    entries = [(lease, 30) for lease in leases(3)]
    stub.add_client_error(OPERATION, service_error_code=code, http_status_code=400)

    results = sqs_queue.change_visibility(entries)

    assert set(results) == {lease for lease, _ in entries}
    assert {kind for kind, _ in results.values()} == {EntryResult.LOST}


@pytest.mark.parametrize(
    "fault",
    [
        EndpointConnectionError(endpoint_url=QUEUE_URL),
        ReadTimeoutError(endpoint_url=QUEUE_URL),
        ConnectTimeoutError(endpoint_url=QUEUE_URL),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=lambda fault: type(fault).__name__,
)
def test_a_network_fault_is_transient_never_raised_and_not_retried(
    source: BaseClient, sqs_queue: SQSQueue, fault: Exception
) -> None:
    attempts: list[Any] = []

    def fail(request: Any, **_: Any) -> None:
        attempts.append(request)
        raise fault

    events = renewal_client(source).meta.events
    events.register(BEFORE_SEND, fail, unique_id="network-fault")
    entries = [(lease, 30) for lease in leases(2)]
    try:
        results = sqs_queue.change_visibility(entries)
    finally:
        events.unregister(BEFORE_SEND, unique_id="network-fault")

    assert set(results) == {lease for lease, _ in entries}
    assert {kind for kind, _ in results.values()} == {EntryResult.TRANSIENT}
    assert len(attempts) == 1


# --- the client source -----------------------------------------------------------------------


def test_the_client_source_is_asked_on_every_call() -> None:
    old, new = sqs_client(), sqs_client()
    current = [old]
    sqs_queue = SQSQueue("jobs", QUEUE_URL, lambda: current[0])
    (lease,) = leases(1)
    ok = {"Successful": [{"Id": "0"}], "Failed": []}

    with Stubber(old) as old_stub, Stubber(new) as new_stub:
        old_stub.add_response(OPERATION, ok)
        new_stub.add_response(OPERATION, ok)
        sqs_queue.change_visibility([(lease, 30)])
        current[0] = new
        sqs_queue.change_visibility([(lease, 30)])

        old_stub.assert_no_pending_responses()
        new_stub.assert_no_pending_responses()


# --- deletes --------------------------------------------------------------------------------


def test_a_delete_goes_out_as_one_batch_and_each_entry_gets_its_own_result(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    done, gone, later = leases(3)
    stub.add_response(
        "delete_message_batch",
        {
            "Successful": [{"Id": "0"}],
            "Failed": [failed("1", "ReceiptHandleIsInvalid"), failed("2", "InternalError")],
        },
        {
            "QueueUrl": QUEUE_URL,
            "Entries": [
                {"Id": str(i), "ReceiptHandle": lease.receipt_handle}
                for i, lease in enumerate([done, gone, later])
            ],
        },
    )

    results = sqs_queue.delete([done, gone, later])

    assert results[done] == (EntryResult.OK, "")
    assert results[gone][0] is EntryResult.LOST
    assert results[later][0] is EntryResult.TRANSIENT


def test_a_failed_delete_call_is_transient_for_every_entry(
    stub: Stubber, sqs_queue: SQSQueue
) -> None:
    batch = leases(2)
    stub.add_client_error(
        "delete_message_batch", service_error_code="ServiceUnavailable", http_status_code=503
    )

    results = sqs_queue.delete(batch)

    assert {kind for kind, _ in results.values()} == {EntryResult.TRANSIENT}


def test_the_objects_of_a_delete_by_a_lease_that_ran_out_stay(
    stub: Stubber, source: BaseClient
) -> None:
    """SQS answers a delete by an expired receipt handle with success and deletes nothing:
    the message comes back and needs its body (found by the crossing suite: an ack in an
    outage longer than the lease, then its message received again, unreadable)."""
    held, ran_out = leases(2)
    ran_out.lost = True
    deleting: list[list[Lease]] = []
    sqs_queue = SQSQueue("jobs", QUEUE_URL, lambda: renewal_client(source), deleting.append)
    both_deleted = {"Successful": [{"Id": "0"}, {"Id": "1"}], "Failed": []}
    stub.add_response("delete_message_batch", both_deleted)

    sqs_queue.delete([held, ran_out])

    assert deleting == [[held]]
