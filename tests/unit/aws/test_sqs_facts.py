"""SQS's facts: error codes read the same whatever wrote them, and FIFO queue names."""

from __future__ import annotations

import botocore.session
import pytest

from celery_sqs_heartbeat.aws.sqs_facts import (
    FATAL_CODES,
    LOST_LEASE_CODES,
    QUEUE_MISSING_CODES,
    canonical_code,
    error_code,
    is_beyond_hold_limit,
    is_fifo,
    says_retry_later,
)
from tests.unit.conftest import BEYOND_THE_LIMIT, EXPIRED_HANDLE

FAMILIES = {
    "lost lease": LOST_LEASE_CODES,
    "queue missing": QUEUE_MISSING_CODES,
    "fatal": FATAL_CODES,
}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("AWS.SimpleQueueService.NonExistentQueue", "NonExistentQueue"),
        ("com.amazonaws.sqs#QueueDoesNotExist", "QueueDoesNotExist"),
        ("com.amazon.coral.service#UnrecognizedClientException", "UnrecognizedClientException"),
        ("MessageNotInflight", "MessageNotInflight"),
        ("InvalidParameterValueException", "InvalidParameterValueException"),
        (None, "Unknown"),
        ("", "Unknown"),
    ],
)
def test_the_error_code_is_the_name_without_its_protocols_prefix(
    raw: str | None, code: str
) -> None:
    assert error_code(raw) == code


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("InvalidParameterValueException", "InvalidParameterValue"),
        ("AWS.SimpleQueueService.MessageNotInflight", "MessageNotInflight"),
        ("com.amazonaws.sqs#AccessDeniedException", "AccessDenied"),
        ("QueueDoesNotExist", "QueueDoesNotExist"),
        ("ThrottlingException", "Throttling"),
    ],
)
def test_the_canonical_code_also_drops_an_exception_suffix(raw: str, code: str) -> None:
    assert canonical_code(raw) == code


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_families_are_written_as_canonical_codes(name: str) -> None:
    family = FAMILIES[name]
    assert {canonical_code(code) for code in family} == family


def test_dropping_the_suffix_moves_no_modelled_sqs_code_into_a_family() -> None:
    model = botocore.session.get_session().get_service_model("sqs")
    codes = {shape.error_code or shape.name for shape in model.error_shapes}
    assert "QueueDoesNotExist" in codes  # the model is the one this test means
    suffixed = {code for code in codes if canonical_code(code) != code}
    for family in FAMILIES.values():
        assert not {canonical_code(code) for code in suffixed} & family


@pytest.mark.parametrize(
    ("name", "fifo"),
    [("orders.fifo", True), ("orders", False), ("orders-fifo", False), ("fifo", False)],
)
def test_a_fifo_queue_is_told_by_its_name(name: str, fifo: bool) -> None:
    assert is_fifo(name) is fifo


@pytest.mark.parametrize(
    ("code", "message", "beyond"),
    [
        ("InvalidParameterValue", BEYOND_THE_LIMIT, True),
        ("AWS.SimpleQueueService.InvalidParameterValue", BEYOND_THE_LIMIT, True),
        # LocalStack's spelling of the code.
        ("InvalidParameterValueException", BEYOND_THE_LIMIT, True),
        ("InvalidParameterValue", EXPIRED_HANDLE, False),
        ("InvalidParameterValue", "", False),
        ("InvalidParameterValue", None, False),
        ("ReceiptHandleIsInvalid", "The input receipt handle is invalid.", False),
        ("MessageNotInflight", BEYOND_THE_LIMIT, False),
        (None, BEYOND_THE_LIMIT, False),
    ],
)
def test_only_sqs_refusal_past_its_12_hours_reads_as_beyond_the_hold_limit(
    code: str | None, message: str | None, beyond: bool
) -> None:
    assert is_beyond_hold_limit(code, message) is beyond


@pytest.mark.parametrize(
    ("code", "status", "later"),
    [
        ("InternalError", 500, True),
        ("ServiceUnavailable", 503, True),
        ("InternalFailure", 500, True),
        ("Unknown", 502, True),
        # Throttled, as each protocol and service words it.
        ("Throttling", 400, True),
        ("ThrottlingException", 400, True),
        ("AWS.SimpleQueueService.RequestThrottled", 403, True),
        ("KmsThrottled", 400, True),
        ("Throttled", 429, True),  # SNS
        # Mistakes of the configuration, whatever status they come with.
        ("AccessDenied", 403, False),
        ("AccessDeniedException", 400, False),
        ("InvalidClientTokenId", 403, False),
        ("com.amazon.coral.service#UnrecognizedClientException", 400, False),
        ("SignatureDoesNotMatch", 403, False),
        ("AWS.SimpleQueueService.NonExistentQueue", 400, False),
        ("QueueDoesNotExist", 400, False),
        ("KmsAccessDenied", 500, False),
        # A refusal of the call itself says nothing of later.
        ("InvalidParameterValue", 400, False),
        ("SomethingNew", 400, False),
        ("SomethingNew", None, False),
        (None, None, False),
    ],
)
def test_only_a_5xx_or_a_throttle_says_to_retry_later(
    code: str | None, status: int | None, later: bool
) -> None:
    assert says_retry_later(code, status) is later
