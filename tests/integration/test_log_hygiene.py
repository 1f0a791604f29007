"""The check every integration test ends with: no secret and no receipt handle in the log."""

from __future__ import annotations

from tests.integration.harness import SECRET_KEY, leaks

HANDLE = "abcdefghijklmnopqrstuvwxyzabcdefghij"


def test_a_receipt_handle_at_info_or_above_is_found() -> None:
    log = (
        "[2026-11-23 14:20:25,797: INFO/MainProcess] ready.\n"
        f"[2026-11-23 14:20:26,107: CRITICAL/MainProcess] Couldn't ack '{HANDLE}'\n"
    )
    assert leaks(log) == [
        f"[2026-11-23 14:20:26,107: CRITICAL/MainProcess] Couldn't ack '{HANDLE}'\n"
    ]


def test_the_secret_key_in_the_banner_or_a_traceback_line_is_found() -> None:
    banner = f"transport: sqs://testing:{SECRET_KEY}@127.0.0.1:1//\n"
    traceback = (
        "[2026-11-23 14:20:25,797: ERROR/MainProcess] failed\n"
        f"Traceback (most recent call last):\n  secret={SECRET_KEY}\n"
    )
    assert len(leaks(banner + traceback)) == 2


def test_debug_records_and_clean_records_are_not_reported() -> None:
    log = (
        f"[2026-11-23 14:20:25,797: DEBUG/MainProcess] wire: ReceiptHandle={HANDLE}\n"
        "[2026-11-23 14:20:25,798: WARNING/MainProcess] Lost the SQS lease of task t[1]\n"
    )
    assert leaks(log) == []
