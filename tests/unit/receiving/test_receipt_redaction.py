"""Celery's report of a message it cannot run shows no receipt handle."""

from __future__ import annotations

import logging

import pytest
from celery.utils.saferepr import saferepr

from celery_sqs_heartbeat.receiving.receipt_redaction import (
    CELERY_CONSUMER_LOGGER,
    RedactReceiptHandles,
    redact_celery_reports,
)

HANDLE = "abcdefghijklmnopqrstuvwxyzabcdef"


def test_celery_s_unknown_message_report_loses_the_handle_and_keeps_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The line Celery's ``on_unknown_message`` writes, through the consumer's logger."""
    redact_celery_reports()
    delivery_info = {
        "sqs_message": {"MessageId": "m-1", "ReceiptHandle": HANDLE, "Body": "{}"},
        "sqs_queue": "http://127.0.0.1/123/celery",
    }
    with caplog.at_level(logging.WARNING, logger=CELERY_CONSUMER_LOGGER):
        logging.getLogger(CELERY_CONSUMER_LOGGER).warning(
            "Received and deleted unknown message.\n%s", f"delivery_info:{saferepr(delivery_info)}"
        )
    (record,) = caplog.records
    assert HANDLE not in record.getMessage()
    assert "'ReceiptHandle': '<redacted>'" in record.getMessage()
    assert "'MessageId': 'm-1'" in record.getMessage()


def test_installed_once_however_many_connections_are_made() -> None:
    redact_celery_reports()
    redact_celery_reports()
    filters = logging.getLogger(CELERY_CONSUMER_LOGGER).filters
    assert sum(isinstance(f, RedactReceiptHandles) for f in filters) == 1


def test_a_record_without_a_handle_is_left_as_it_was() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "ping %s", ("ok",), None)
    assert RedactReceiptHandles().filter(record)
    assert (record.msg, record.args) == ("ping %s", ("ok",))
