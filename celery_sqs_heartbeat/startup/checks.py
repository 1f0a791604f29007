"""Mistakes that stop a worker at start-up, each said in one CRITICAL line.

Two mistakes a user meets first went unexplained. A predefined queue URL that does not
exist ended the worker with Celery's ``Unrecoverable error: QueueDoesNotExist(...)``
and a traceback naming no queue; and with no AWS credentials at all, botocore's
``NoCredentialsError`` is one of kombu's connection errors, so the worker retried it a
hundred times, minutes of ``Unable to locate credentials.``, before giving up.

Both are raised here as a :class:`ConfigurationError` whose message says what is wrong
and where to look. Neither is one of kombu's connection errors, so Celery does not
retry it: its worker logs it as ``Unrecoverable error`` and exits with status 1. A
filter on that logger turns the record into the error's own line, without the
traceback, which would show only kombu's and Celery's frames. A producer gets the same
exception, with the same message, raised where it connects or declares.

The channel's check before it connects is also where the options' warnings are given: a
worker reads its options before its logging is set up, and connects after.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import botocore.session
from botocore.exceptions import ClientError
from celery.utils.log import worker_logger

from ..options import warn_about_options
from ..receiving.retries import classify_receive_error

__all__ = [
    "ConfigurationError",
    "NoCredentialsFound",
    "QueueNotFound",
    "check_before_connecting",
    "missing_credentials",
    "missing_queue_declared",
    "queue_not_found",
]


class ConfigurationError(Exception):
    """A mistake in the worker's setup that no retry can fix, explained in its message."""


class NoCredentialsFound(ConfigurationError):
    """botocore found no AWS credentials for a client kombu is going to make.

    Not botocore's ``NoCredentialsError``: that is a ``BotoCoreError``, one of kombu's
    connection errors, which Celery retries at start-up.
    """


class QueueNotFound(ConfigurationError, ClientError):  # type: ignore[misc]
    """SQS answered that a queue being declared does not exist.

    Still the ``ClientError`` it was, with SQS's response, for callers that catch that.
    """

    def __init__(self, message: str, error: ClientError) -> None:
        ClientError.__init__(self, error.response, error.operation_name)
        self.args = (message,)


def queue_not_found(
    queue_name: str, url: str | None, predefined: bool, error: BaseException
) -> QueueNotFound | None:
    """The error naming the queue, if ``error`` is SQS saying it does not exist."""
    if not isinstance(error, ClientError):
        return None
    failure = classify_receive_error(error)
    if not failure.queue_missing:
        return None
    where = f" at {url}" if url else ""
    if predefined:
        where += " (its URL in predefined_queues)"
        remedy = (
            "Create the queue, or correct its URL in predefined_queues (account, region, name)."
        )
    else:
        remedy = "Create the queue, or check its name, the region and the account."
    said = f" ({failure.detail.rstrip('.')})" if failure.detail else ""
    return QueueNotFound(
        f"SQS queue {queue_name} does not exist{where}: {error.operation_name} answered "
        f"{failure.code}{said}. {remedy}",
        error,
    )


#: The keys (or their absence) with which botocore found credentials in this process.
_found_keys: set[tuple[str | None, str | None]] = set()


def missing_credentials(
    access_key_id: str | None, secret_access_key: str | None, transport_options: Mapping[str, Any]
) -> str | None:
    """Why kombu's SQS clients would have no credentials; None if botocore finds some.

    kombu makes a client with the broker URL's key and secret (``access_key_id`` and
    ``secret_access_key``); with ``predefined_queues``, one per queue with the queue's
    own key and secret if it has them; with ``predefined_queues`` and ``sts_role_arn``,
    it assumes the role with boto3's default credentials, whatever the URL holds. Where
    a client is given no key, botocore's chain looks for one: that same chain decides
    here, so what is found is what the clients would find.
    """
    queues = transport_options.get("predefined_queues") or {}
    if queues and transport_options.get("sts_role_arn"):
        if _found(None, None):
            return None
        return (
            "No AWS credentials found to assume sts_role_arn with: kombu assumes the role "
            f"with boto3's default credentials, not the broker URL's; {_where_botocore_looked()}"
        )
    if not queues:
        if _found(access_key_id, secret_access_key):
            return None
        return (
            "No AWS credentials found for SQS: none in the broker URL "
            f"(sqs://ACCESS_KEY_ID:SECRET_ACCESS_KEY@...); {_where_botocore_looked()}"
        )
    keyless = [
        name
        for name, queue in queues.items()
        if not _found(
            queue.get("access_key_id", access_key_id),
            queue.get("secret_access_key", secret_access_key),
        )
    ]
    if not keyless:
        return None
    return (
        f"No AWS credentials found for SQS queue(s) {', '.join(map(str, keyless))}: none in "
        "their predefined_queues entries (access_key_id, secret_access_key) nor in the "
        f"broker URL (sqs://ACCESS_KEY_ID:SECRET_ACCESS_KEY@...); {_where_botocore_looked()}"
    )


def _found(access_key_id: str | None, secret_access_key: str | None) -> bool:
    """Whether botocore has credentials for a client given this key: boto3's own test.

    ``boto3.Session`` sets the key it is given, if any part of it is, and otherwise
    leaves it to botocore's chain; so does this. What was found once is not looked for
    again: every channel is checked, and a worker opens several, more at a reconnect.
    """
    given = (access_key_id, secret_access_key)
    if given in _found_keys:
        return True
    session = botocore.session.Session()
    if access_key_id or secret_access_key:
        session.set_credentials(access_key_id, secret_access_key)
    if session.get_credentials() is None:
        return False
    _found_keys.add(given)
    return True


def _where_botocore_looked() -> str:
    session = botocore.session.Session()
    profile = session.get_config_variable("profile") or "default"
    chain = session.get_component("credential_provider").providers
    return (
        "botocore found none in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, nor in profile "
        f"{profile!r} of {session.get_config_variable('credentials_file')} and "
        f"{session.get_config_variable('config_file')}, nor elsewhere in its chain "
        f"({', '.join(provider.METHOD for provider in chain)}). No call to SQS can be made "
        "without credentials, and retrying will not find them."
    )


def check_before_connecting(connection: Any) -> None:
    """Before a channel's first call to SQS: the options' warnings, then its credentials.

    The warnings are given here: by the time a worker connects, Celery has set up its
    logging (:func:`~celery_sqs_heartbeat.options.warn_about_options`). No credentials
    at all raise :class:`NoCredentialsFound`.
    """
    client = connection.client
    options = client.transport_options or {}
    warn_about_options(options, connection.heartbeat_options)
    problem = missing_credentials(client.userid, client.password, options)
    if problem is not None:
        raise NoCredentialsFound(problem)


def missing_queue_declared(
    queue_name: str,
    predefined_queues: Mapping[str, Any],
    queue_cache: Mapping[str, str],
    error: ClientError,
) -> QueueNotFound | None:
    """The error naming ``queue_name`` and its URL, if its declaration failed because SQS
    says it does not exist; None for any other error, raised as it is."""
    predefined = predefined_queues.get(queue_name)
    url = predefined["url"] if predefined else queue_cache.get(queue_name)
    return queue_not_found(queue_name, url, predefined is not None, error)


class _OneLine(logging.Filter):
    """Celery's ``Unrecoverable error`` record of a :class:`ConfigurationError`: its line.

    The message already says what is wrong and what to do; the traceback would add only
    kombu's and Celery's frames, and bury the line under them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, ConfigurationError):
            record.msg, record.args = "%s", (error,)
            record.exc_info, record.exc_text = None, None
        return True


worker_logger.addFilter(_OneLine())
