"""What a worker says at start-up: the mistakes that stop it, and the line of its settings."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from celery.utils.log import worker_logger
from kombu import Connection

from celery_sqs_heartbeat import transport
from celery_sqs_heartbeat.options import HeartbeatOptions
from celery_sqs_heartbeat.payloads.options import LargePayloadOptions
from celery_sqs_heartbeat.startup.checks import (
    NoCredentialsFound,
    QueueNotFound,
    check_before_connecting,
    missing_credentials,
    missing_queue_declared,
    queue_not_found,
)
from celery_sqs_heartbeat.startup.settings_line import describe

URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"


def sqs_error(code: str, message: str, operation: str = "GetQueueAttributes") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


# --- a queue that does not exist ----------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("AWS.SimpleQueueService.NonExistentQueue", "NonExistentQueue"),  # query protocol
        ("QueueDoesNotExist", "QueueDoesNotExist"),  # JSON protocol
    ],
)
def test_a_missing_predefined_queue_is_named_with_its_url_and_sqs_answer(
    code: str, said: str
) -> None:
    error = sqs_error(code, "The specified queue does not exist.")

    explained = queue_not_found("jobs", URL, predefined=True, error=error)

    assert str(explained) == (
        f"SQS queue jobs does not exist at {URL} (its URL in predefined_queues): "
        f"GetQueueAttributes answered {said} (The specified queue does not exist). Create the "
        "queue, or correct its URL in predefined_queues (account, region, name)."
    )
    # Still what it was for whoever catches botocore's error.
    assert isinstance(explained, ClientError)
    assert explained.response["Error"]["Code"] == code


def test_a_missing_queue_kombu_found_by_name_gets_the_remedy_for_that() -> None:
    error = sqs_error("QueueDoesNotExist", "")

    explained = queue_not_found("jobs", None, predefined=False, error=error)

    assert str(explained) == (
        "SQS queue jobs does not exist: GetQueueAttributes answered QueueDoesNotExist. "
        "Create the queue, or check its name, the region and the account."
    )


@pytest.mark.parametrize(
    "error",
    [sqs_error("AccessDenied", "not yours"), sqs_error("Throttling", "slow"), OSError("reset")],
)
def test_other_errors_are_left_as_they_are(error: BaseException) -> None:
    assert queue_not_found("jobs", URL, predefined=True, error=error) is None


# --- no credentials -----------------------------------------------------------------------


def test_a_declare_names_the_predefined_url_or_the_cached_one_and_no_other_error() -> None:
    missing = sqs_error("QueueDoesNotExist", "The specified queue does not exist.")
    predefined = {"jobs": {"url": URL}}

    by_predefined = missing_queue_declared("jobs", predefined, {}, missing)
    by_cache = missing_queue_declared("jobs", {}, {"jobs": URL}, missing)

    assert by_predefined is not None and "(its URL in predefined_queues)" in str(by_predefined)
    assert by_cache is not None and f"at {URL}:" in str(by_cache)
    assert missing_queue_declared("jobs", {}, {}, sqs_error("AccessDenied", "no")) is None


def test_no_credentials_anywhere_says_where_botocore_looked(nowhere: Path) -> None:
    problem = missing_credentials(None, None, {})

    assert problem is not None
    assert problem.startswith(
        "No AWS credentials found for SQS: none in the broker URL "
        "(sqs://ACCESS_KEY_ID:SECRET_ACCESS_KEY@...); botocore found none in AWS_ACCESS_KEY_ID "
        f"and AWS_SECRET_ACCESS_KEY, nor in profile 'default' of {nowhere} and {nowhere}, nor "
        "elsewhere in its chain (env, assume-role, "
    )
    assert "iam-role" in problem
    assert problem.endswith("retrying will not find them.")


@pytest.mark.parametrize("url_key", [("AKIA", "secret"), ("", "")])
def test_credentials_in_the_url_or_the_environment_are_enough(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, url_key: tuple[str, str]
) -> None:
    if not url_key[0]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")

    assert missing_credentials(*url_key, {}) is None


def test_credentials_in_the_shared_file_are_enough(nowhere: Path) -> None:
    nowhere.write_text("[default]\naws_access_key_id = AKIA\naws_secret_access_key = secret\n")

    assert missing_credentials(None, None, {}) is None


def test_each_predefined_queue_is_checked_with_its_own_key(nowhere: Path) -> None:
    queues = {
        "keyed": {"url": URL, "access_key_id": "AKIA", "secret_access_key": "secret"},
        "keyless": {"url": URL},
    }

    problem = missing_credentials(None, None, {"predefined_queues": queues})

    assert problem is not None
    assert problem.startswith("No AWS credentials found for SQS queue(s) keyless: none in")
    # The broker URL's key stands in for a queue without one, as in kombu.
    assert missing_credentials("AKIA", "secret", {"predefined_queues": queues}) is None


def test_a_role_is_assumed_with_the_default_credentials_not_the_urls(nowhere: Path) -> None:
    options = {"predefined_queues": {"jobs": {"url": URL}}, "sts_role_arn": "arn:aws:iam::1:role/r"}

    problem = missing_credentials("AKIA", "secret", options)

    assert problem is not None
    assert problem.startswith(
        "No AWS credentials found to assume sts_role_arn with: kombu assumes the role with "
        "boto3's default credentials, not the broker URL's; botocore found none in"
    )


# --- how a worker logs them ---------------------------------------------------------------


def test_the_worker_logs_such_an_error_as_its_one_line_without_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.CRITICAL, logger=worker_logger.name):
        try:
            raise NoCredentialsFound("No AWS credentials found for SQS: ...")
        except NoCredentialsFound as exc:
            # What Celery's WorkController.start does with an exception from its steps.
            worker_logger.critical("Unrecoverable error: %r", exc, exc_info=True)

    (record,) = caplog.records
    assert record.getMessage() == "No AWS credentials found for SQS: ..."
    assert record.exc_info is None
    assert "Traceback" not in caplog.text


def test_other_unrecoverable_errors_keep_celerys_record(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.CRITICAL, logger=worker_logger.name):
        try:
            raise RuntimeError("a bug")
        except RuntimeError as exc:
            worker_logger.critical("Unrecoverable error: %r", exc, exc_info=True)

    (record,) = caplog.records
    assert record.getMessage() == "Unrecoverable error: RuntimeError('a bug')"
    assert record.exc_info is not None


def test_a_missing_queue_error_is_logged_the_same_way(caplog: pytest.LogCaptureFixture) -> None:
    error = queue_not_found("jobs", URL, True, sqs_error("QueueDoesNotExist", "gone"))
    assert isinstance(error, QueueNotFound)
    with caplog.at_level(logging.CRITICAL, logger=worker_logger.name):
        try:
            raise error
        except QueueNotFound as exc:
            worker_logger.critical("Unrecoverable error: %r", exc, exc_info=True)

    (record,) = caplog.records
    assert record.getMessage().startswith(f"SQS queue jobs does not exist at {URL}")
    assert record.exc_info is None


# --- the settings line --------------------------------------------------------------------


def test_the_settings_line_with_every_default() -> None:
    assert describe(HeartbeatOptions.from_transport_options({}), None) == (
        "SQS leases of 30 s (visibility_timeout), renewed when at most 10 s are left (adaptive "
        "margin), checked every 1 s, until the ack or 43140 s after the receive (SQS's 12 "
        "hours less a minute); a rejected message is deleted, or left to the queue's redrive "
        "policy (release_on_failure off); messages not started are released at shutdown; ETA "
        "tasks due in more than 900 s wait in SQS (eta_parking_threshold); countdowns "
        "published here are sent with an SQS delay of up to 900 s (eta_send_delay); large "
        "payloads off: every body in SQS (large_payload_bucket)"
    )


def test_the_settings_line_names_what_was_set() -> None:
    given: dict[str, Any] = {
        "visibility_timeout": 60,
        "visibility_extension_threshold": 15,
        "visibility_extension_interval": 2,
        "visibility_extension_max": 3600,
        "release_on_failure": True,
        "release_delay": [10, 60, 300],
        "release_on_shutdown": False,
        "eta_parking": False,
        "eta_send_delay": False,
        "large_payload_bucket": "task-bodies",
        "large_payload_prefix": "big/",
    }
    options = HeartbeatOptions.from_transport_options(given)

    assert describe(options, LargePayloadOptions.from_transport_options(given)).split("; ") == [
        "SQS leases of 60 s (visibility_timeout), renewed when 15 s are left "
        "(visibility_extension_threshold), checked every 2 s, until the ack or 3600 s after "
        "the receive (visibility_extension_max)",
        "a rejected message is released, visible again after 10, 60, 300 s by receive count "
        "(release_on_failure, release_delay)",
        "messages not started are left to their lease at shutdown (release_on_shutdown off)",
        "ETA tasks are held until due (eta_parking off)",
        "countdowns published here are sent at once (eta_send_delay off)",
        "bodies over 262144 bytes go through s3://task-bodies/big/ (large_payload_threshold)",
    ]


def test_the_settings_line_without_renewals_and_every_body_through_s3() -> None:
    given = {
        "visibility_extension": False,
        "large_payload_bucket": "task-bodies",
        "large_payload_threshold": "always",
    }
    line = describe(
        HeartbeatOptions.from_transport_options(given),
        LargePayloadOptions.from_transport_options(given),
    )

    assert line.startswith("SQS leases of 1800 s (visibility_timeout), not renewed ")
    assert line.endswith("; every body goes through s3://task-bodies/ (large_payload_threshold)")


def test_the_settings_line_of_a_solo_worker_says_it_receives_one_at_a_time() -> None:
    options = HeartbeatOptions.from_transport_options({"receives_in_flight": 3})

    assert describe(options, None, tasks_run_on_the_loop=True).endswith(
        "; one receive per queue at a time, not receives_in_flight=3: tasks run on the "
        "event loop (solo pool)"
    )
    assert "one receive per queue" not in describe(options, None)
    single = HeartbeatOptions.from_transport_options({"receives_in_flight": 1})
    assert "one receive per queue" not in describe(single, None, tasks_run_on_the_loop=True)


def test_a_ready_worker_of_this_transport_logs_the_line(caplog: pytest.LogCaptureFixture) -> None:
    connection = Connection(
        "sqs://",
        transport="celery_sqs_heartbeat:Transport",
        transport_options={"visibility_timeout": 45},
    )
    ready = SimpleNamespace(conf=SimpleNamespace(worker_enable_remote_control=False))
    with caplog.at_level(logging.INFO, logger=transport.__name__):
        transport._say_at_worker_ready(SimpleNamespace(connection=connection, app=ready))
        transport._say_at_worker_ready(
            SimpleNamespace(connection=Connection("memory://"), app=ready)
        )

    (line,) = [r.getMessage() for r in caplog.records if r.name == transport.__name__]
    assert line.startswith("SQS leases of 45 s (visibility_timeout), renewed ")


def test_a_channel_without_credentials_stops_before_it_connects(nowhere: Path) -> None:
    """The check a channel makes first, on the transport's connection, before any part."""
    client = SimpleNamespace(transport_options={}, userid=None, password=None)
    connection = SimpleNamespace(
        client=client, heartbeat_options=HeartbeatOptions.from_transport_options({})
    )

    with pytest.raises(NoCredentialsFound):
        check_before_connecting(connection)
