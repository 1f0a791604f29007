"""The thin layer that talks to SQS: one batch call (visibility change or delete) and its answer.

Every answer of SQS and every fault of botocore or the network becomes an
:class:`EntryResult` per entry: a call's thread that died on one bad answer would leave
its leases marked as being renewed. The manager still guards against what nobody
foresaw (a bug, an answer botocore cannot parse) and counts it as a failed call.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import botocore.session
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ..leasing.leases import EntryResult, Lease
from ..payloads.store import delete_objects_of
from .sqs_facts import (
    LOST_LEASE_CODES,
    QUEUE_MISSING_CODES,
    canonical_code,
    error_code,
    is_beyond_hold_limit,
)

__all__ = [
    "MAX_CALLS_IN_FLIGHT",
    "MAX_PUBLISH_CALLS_IN_FLIGHT",
    "MAX_SENDS_IN_FLIGHT",
    "FreshCopy",
    "SQSQueue",
    "publish_client",
    "receive_client",
    "renewal_client",
]

#: A fresh copy of a received message: its lease, body, message attributes and delay.
FreshCopy = tuple[Lease, str, dict[str, dict[str, Any]], int]

#: How much of a receipt handle a log line may show.
HANDLE_PREFIX = 8

#: Renewal calls a process has on the wire at once. A call renews ten leases for about
#: 26 s: when SQS takes 2 s a call, ten calls in flight keep only about 1,300 leases, 100
#: keep 13,000 (benchmarks/renewal_requests.py). On a fast SQS a few are in flight at
#: once, whatever the number of leases.
MAX_CALLS_IN_FLIGHT = 100

#: Deletes and releases on the wire at once, a budget apart from the renewals' so that a
#: brownout of deletes can never take the slots renewals need. At 4 s a call, 50 calls
#: of ten settle 125 acks a second; past that, acks wait in the outbox with their leases
#: renewed, which costs calls but no task.
MAX_SENDS_IN_FLIGHT = 50

#: The client's connection pool: one connection per call that may be on the wire, so no
#: call waits for a connection or opens one that urllib3 throws away.
POOL_CONNECTIONS = MAX_CALLS_IN_FLIGHT + MAX_SENDS_IN_FLIGHT

#: Renewals are retried by the manager on its next check, so a call must fail fast rather
#: than hang in botocore's retries while other leases come due.
RENEWAL_CLIENT_CONFIG = Config(connect_timeout=5, read_timeout=5, retries={"total_max_attempts": 1})

#: SQS holds a long poll for 20 s at most (``WaitTimeSeconds``): the receive client waits
#: that long, and a few seconds more, for an answer.
SQS_MAX_WAIT_SECONDS = 20

#: The receive that kombu 5.5 would make on the event loop, made on a thread instead
#: (:mod:`celery_sqs_heartbeat.compat`): one attempt, like kombu's asynchronous client, so
#: that a failure reaches the receive loop's backoff at once, not after botocore's retries.
RECEIVE_CLIENT_CONFIG = Config(
    connect_timeout=5, read_timeout=SQS_MAX_WAIT_SECONDS + 5, retries={"total_max_attempts": 1}
)

#: SendMessageBatch calls a batch-publishing process has on the wire at once
#: (:mod:`celery_sqs_heartbeat.publishing.scope`), one per sending thread, each with a
#: connection of its own. One Python process builds some 500 to 600 tasks a second with
#: ``apply_async`` (docs/benchmarks.md): eight calls of ten keep up with it up to 50 ms a
#: call (four fell to about 430 a second there, two to 260), and a waiting thread costs
#: the producer nothing.
MAX_PUBLISH_CALLS_IN_FLIGHT = 8

#: The batch publisher retries with a backoff of its own
#: (:mod:`celery_sqs_heartbeat.publishing.book`), entry by entry, so botocore makes one
#: attempt: its retries would resend the whole
#: call, entries SQS took included, and hide throttling from the backoff.
PUBLISH_CLIENT_CONFIG = Config(
    connect_timeout=5, read_timeout=20, retries={"total_max_attempts": 1}
)

_renewal_clients: weakref.WeakKeyDictionary[BaseClient, BaseClient] = weakref.WeakKeyDictionary()
_publish_clients: weakref.WeakKeyDictionary[BaseClient, BaseClient] = weakref.WeakKeyDictionary()
_receive_clients: weakref.WeakKeyDictionary[BaseClient, BaseClient] = weakref.WeakKeyDictionary()
#: Making a client loads SQS's service model: a fifth of a second of interpreter time and
#: several MB. Calls start on threads of their own, tens at once after a burst of acks or
#: parks; unserialised, each made a client of its own and all but one were thrown away,
#: while the receive loop and the pool waited (a worker's first second, at 15 ms a call),
#: and 50 at once added up to 100 MB to the worker.
_making_clients = threading.Lock()


def _reset_at_fork() -> None:
    """Reset at fork: a child makes clients of its own, under a lock of its own.

    A child has only the thread that forked. One of the parent's other threads may be
    making a client at the fork, holding the lock: the child, a prefork pool process
    (a replaced one, ``max_tasks_per_child``), would wait on it for ever. And a client
    made in the parent shares its connection pools, sockets and all, with the child.
    """
    global _renewal_clients, _receive_clients, _making_clients, _publish_clients
    _renewal_clients = weakref.WeakKeyDictionary()
    _publish_clients = weakref.WeakKeyDictionary()
    _receive_clients = weakref.WeakKeyDictionary()
    _making_clients = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_at_fork)


def renewal_client(source: BaseClient) -> BaseClient:
    """The queue's own client, but with :data:`RENEWAL_CLIENT_CONFIG`."""
    pool = max(source.meta.config.max_pool_connections, POOL_CONNECTIONS)
    config = RENEWAL_CLIENT_CONFIG.merge(Config(max_pool_connections=pool))
    return _derived_client(source, config, _renewal_clients)


def receive_client(source: BaseClient) -> BaseClient:
    """The queue's own client, but with :data:`RECEIVE_CLIENT_CONFIG`."""
    return _derived_client(source, RECEIVE_CLIENT_CONFIG, _receive_clients)


def publish_client(source: BaseClient) -> BaseClient:
    """The queue's own client (kombu's: a predefined queue's STS role holds), with
    :data:`PUBLISH_CLIENT_CONFIG`."""
    pool = max(source.meta.config.max_pool_connections, MAX_PUBLISH_CALLS_IN_FLIGHT)
    config = PUBLISH_CLIENT_CONFIG.merge(Config(max_pool_connections=pool))
    return _derived_client(source, config, _publish_clients)


def _derived_client(
    source: BaseClient, config: Config, made: weakref.WeakKeyDictionary[BaseClient, BaseClient]
) -> BaseClient:
    """``source`` with ``config`` on top, made once per source, by one thread at a time."""
    with _making_clients:
        derived = made.get(source)
        if derived is None:
            derived = made[source] = _made_like(source, config)
    return derived


def _made_like(source: BaseClient, config: Config) -> BaseClient:
    """Same region, endpoint and configuration, and the same credentials object.

    So credentials that refresh themselves (instance roles, SSO) keep refreshing here
    too. botocore has no public way to share credentials between clients, hence the signer.
    """
    derived = botocore.session.Session().create_client(
        "sqs",
        region_name=source.meta.region_name,
        endpoint_url=source.meta.endpoint_url,
        config=source.meta.config.merge(config),
        aws_access_key_id="replaced-below",
        aws_secret_access_key="replaced-below",
    )
    derived._request_signer._credentials = source._request_signer._credentials
    return derived


class SQSQueue:
    """Where visibility changes and deletes for one queue go, with the client allowed to make them.

    ``client_source`` is asked on every call, not once: for a predefined queue with an
    STS role, kombu replaces the client when its session token is about to expire.
    """

    def __init__(self, name: str, url: str, client_source: Callable[[], BaseClient]) -> None:
        self.name = name
        self.url = url
        self._client_source = client_source

    def __repr__(self) -> str:
        return f"<SQSQueue {self.name}>"

    def change_visibility(
        self, entries: Sequence[tuple[Lease, int]]
    ) -> dict[Lease, tuple[EntryResult, str]]:
        """Set each lease's visibility, ten at most, in one call."""
        request = [
            {"Id": str(index), "ReceiptHandle": lease.receipt_handle, "VisibilityTimeout": seconds}
            for index, (lease, seconds) in enumerate(entries)
        ]
        return self._batch_call(
            "change_message_visibility_batch", [lease for lease, _ in entries], request
        )

    def delete(self, leases: Sequence[Lease]) -> dict[Lease, tuple[EntryResult, str]]:
        """Delete the leases' messages, ten at most, in one call; then their S3 objects.

        An object read from S3 goes only once SQS confirmed its message's delete.
        """
        request = [
            {"Id": str(index), "ReceiptHandle": lease.receipt_handle}
            for index, lease in enumerate(leases)
        ]
        results = self._batch_call("delete_message_batch", leases, request)
        delete_objects_of(self._client_source, _surely_deleted(results))
        return results

    def send_copies(self, copies: Sequence[FreshCopy]) -> dict[Lease, tuple[EntryResult, str]]:
        """Send each ``(lease, body, attributes, delay)`` as a new message, ten at most.

        A fresh copy of a received message, which SQS counts from its first receive.
        """
        request = [
            {"Id": str(index), "MessageBody": body, "DelaySeconds": delay}
            | ({"MessageAttributes": attributes} if attributes else {})
            for index, (_, body, attributes, delay) in enumerate(copies)
        ]
        leases = [lease for lease, _, _, _ in copies]
        return self._batch_call("send_message_batch", leases, request)

    def has_redrive_policy(self) -> bool:
        """Whether the queue moves messages to a dead-letter queue after so many receives.

        Raises what botocore raises: the caller decides what an unreadable policy means.
        """
        client = renewal_client(self._client_source())
        answer = client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["RedrivePolicy"])
        return "RedrivePolicy" in answer.get("Attributes", {})

    def _batch_call(
        self, operation: str, leases: Sequence[Lease], request: list[dict[str, Any]]
    ) -> dict[Lease, tuple[EntryResult, str]]:
        try:
            client = renewal_client(self._client_source())
            response = getattr(client, operation)(QueueUrl=self.url, Entries=request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error_code(error.get("Code"))
            # None of the queue's leases can be renewed again once the queue is gone.
            kind = _kind(code, error.get("Message"), lost=QUEUE_MISSING_CODES)
            return dict.fromkeys(leases, (kind, without_receipt_handles(f"{code}: {exc}", leases)))
        except (BotoCoreError, OSError) as exc:
            return dict.fromkeys(leases, (EntryResult.TRANSIENT, repr(exc)))
        return _entry_results(leases, response)


def _surely_deleted(results: dict[Lease, tuple[EntryResult, str]]) -> list[Lease]:
    """The leases whose messages the confirmed deletes surely deleted.

    Not those whose lease ran out first: SQS answers a delete by an expired receipt handle
    with success and deletes nothing, and the message, received again, needs its object.
    Nor those copied: the fresh copy carries the same pointer. A bucket's lifecycle rule
    removes what is left.
    """
    return [
        lease
        for lease, (outcome, _) in results.items()
        if outcome is EntryResult.OK and not lease.lost and not lease.copied
    ]


def _entry_results(
    leases: Sequence[Lease], response: dict[str, Any]
) -> dict[Lease, tuple[EntryResult, str]]:
    results: dict[Lease, tuple[EntryResult, str]] = {}
    for ok in response.get("Successful", []):
        results[leases[int(ok["Id"])]] = (EntryResult.OK, "")
    for failed in response.get("Failed", []):
        code = error_code(failed.get("Code"))
        message = failed.get("Message", "")
        kind = _kind(code, message, lost=LOST_LEASE_CODES)
        lease = leases[int(failed["Id"])]
        detail = without_receipt_handles(f"{code}: {message}", [lease])
        results[lease] = (kind, detail)
    return results


def without_receipt_handles(text: str, leases: Sequence[Lease]) -> str:
    """``text`` with each lease's receipt handle cut to a short prefix.

    SQS quotes the handle in some errors ("Value AQEB... for parameter ReceiptHandle is
    invalid"), and these texts are logged. A handle lets whoever reads the log delete or
    hide the message until its lease ends, so logs show only enough to tell handles apart.
    """
    for lease in leases:
        handle = lease.receipt_handle
        if len(handle) > HANDLE_PREFIX:
            text = text.replace(handle, handle[:HANDLE_PREFIX] + "…")
    return text


def _kind(code: str, message: str | None, lost: frozenset[str]) -> EntryResult:
    """What an error means: a visibility past the 12 hours, a code of ``lost``, or a retry.

    The 12-hour refusal is read first: SQS gives it a code of the lost family
    (``InvalidParameterValue``), but the receipt handle still holds the message.
    """
    if is_beyond_hold_limit(code, message):
        return EntryResult.BEYOND_LIMIT
    return EntryResult.LOST if canonical_code(code) in lost else EntryResult.TRANSIENT
