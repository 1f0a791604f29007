"""The clients a process derives from kombu's: for renewals, receives, publishes and S3.

Each is kombu's client for a queue (a predefined queue's STS role holds for it) with a
configuration of its own: renewals fail fast and are retried at the next check, a
receive makes one attempt like kombu's asynchronous client, a batch publish makes one
attempt and backs off entry by entry, and S3 goes to the same region, endpoint and
credentials. One :class:`DerivedClients` per process (:mod:`celery_sqs_heartbeat.process`):
a client made in a parent would share its connection pools, sockets and all, with a
forked child.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from urllib.parse import urlsplit

import botocore.session
from botocore.client import BaseClient
from botocore.config import Config

from .sessions import new_session

__all__ = [
    "MAX_CALLS_IN_FLIGHT",
    "MAX_PUBLISH_CALLS_IN_FLIGHT",
    "MAX_SENDS_IN_FLIGHT",
    "DerivedClients",
]

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
#: (:mod:`celery_sqs_heartbeat.publishing.publisher`), one per sending thread, each with a
#: connection of its own. One Python process builds some 500 to 600 tasks a second with
#: ``apply_async`` (docs/benchmarks.md): eight calls of ten keep up with it up to 50 ms a
#: call (four fell to about 430 a second there, two to 260), and a waiting thread costs
#: the producer nothing.
MAX_PUBLISH_CALLS_IN_FLIGHT = 8

#: The batch publisher retries with a backoff of its own
#: (:mod:`celery_sqs_heartbeat.publishing.book`), entry by entry, so botocore makes one
#: attempt: its retries would resend the whole call, entries SQS took included, and hide
#: throttling from the backoff.
PUBLISH_CLIENT_CONFIG = Config(
    connect_timeout=5, read_timeout=20, retries={"total_max_attempts": 1}
)

#: A read that fails is not retried here: the message is released and read again on
#: its next receive, so the lease, which covers the read, is never held by a hung call.
S3_CLIENT_CONFIG = Config(
    connect_timeout=5,
    read_timeout=20,
    retries={"mode": "standard", "total_max_attempts": 2},
)
#: A local stack on an address has no bucket host names: path-style there.
LOCAL_STACK_CONFIG = Config(s3={"addressing_style": "path"})

_Made = weakref.WeakKeyDictionary[BaseClient, BaseClient]


class DerivedClients:
    """The clients derived from each kombu client, made once per source; thread safe.

    Made under one lock: making a client loads a service model, a fifth of a second of
    interpreter time and several MB. Calls start on threads of their own, tens at once
    after a burst of acks or parks; unserialised, each made a client of its own and all
    but one were thrown away, while the receive loop and the pool waited, and 50 at once
    added up to 100 MB to the worker. Kept weakly: a source kombu dropped takes its
    derived clients with it.

    Made from one botocore session, which reads the models through the process's loader
    (:mod:`~celery_sqs_heartbeat.aws.sessions`), where kombu's client has already parsed
    them, so a derived client costs about 2 ms of CPU rather than the 40 to 50 ms of a
    session of its own, which a worker paid twice in its first seconds
    (docs/benchmarks.md, "CPU per task"). A session is not thread safe; it is only used
    under the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: botocore.session.Session | None = None
        self._renewal: _Made = weakref.WeakKeyDictionary()
        self._receive: _Made = weakref.WeakKeyDictionary()
        self._publish: _Made = weakref.WeakKeyDictionary()
        self._s3: _Made = weakref.WeakKeyDictionary()

    def renewal(self, source: BaseClient) -> BaseClient:
        """``source`` with :data:`RENEWAL_CLIENT_CONFIG`, pooled for every call in flight.

        Asked before every renewal, delete and release call: the configuration is only
        built for a client still to be made (a merge costs some 20 µs).
        """
        return self._derived(
            source,
            self._renewal,
            lambda session: _sqs_like(
                session, source, _pooled(RENEWAL_CLIENT_CONFIG, source, POOL_CONNECTIONS)
            ),
        )

    def receive(self, source: BaseClient) -> BaseClient:
        """``source`` with :data:`RECEIVE_CLIENT_CONFIG`."""
        return self._derived(
            source, self._receive, lambda session: _sqs_like(session, source, RECEIVE_CLIENT_CONFIG)
        )

    def publish(self, source: BaseClient) -> BaseClient:
        """``source`` with :data:`PUBLISH_CLIENT_CONFIG`, pooled for every sending thread."""
        return self._derived(
            source,
            self._publish,
            lambda session: _sqs_like(
                session, source, _pooled(PUBLISH_CLIENT_CONFIG, source, MAX_PUBLISH_CALLS_IN_FLIGHT)
            ),
        )

    def s3(self, sqs_client: BaseClient) -> BaseClient:
        """The S3 client that goes with a queue's SQS client."""
        return self._derived(sqs_client, self._s3, lambda session: _s3_beside(session, sqs_client))

    def _derived(
        self,
        source: BaseClient,
        made: _Made,
        make: Callable[[botocore.session.Session], BaseClient],
    ) -> BaseClient:
        with self._lock:
            derived = made.get(source)
            if derived is None:
                if self._session is None:
                    self._session = new_session()
                derived = made[source] = make(self._session)
        return derived


def _pooled(config: Config, source: BaseClient, at_least: int) -> Config:
    """``config`` with at least ``at_least`` connections, or ``source``'s if more."""
    pool = max(source.meta.config.max_pool_connections, at_least)
    return config.merge(Config(max_pool_connections=pool))


def _sqs_like(session: botocore.session.Session, source: BaseClient, config: Config) -> BaseClient:
    """Same region, endpoint and configuration, and the same credentials object.

    So credentials that refresh themselves (instance roles, SSO) keep refreshing here
    too. botocore has no public way to share credentials between clients, hence the signer.
    """
    derived = session.create_client(
        "sqs",
        region_name=source.meta.region_name,
        endpoint_url=source.meta.endpoint_url,
        config=source.meta.config.merge(config),
        aws_access_key_id="replaced-below",
        aws_secret_access_key="replaced-below",
    )
    derived._request_signer._credentials = source._request_signer._credentials
    return derived


def _s3_beside(session: botocore.session.Session, sqs_client: BaseClient) -> BaseClient:
    """S3 in the SQS client's region, on its endpoint if a local stack's, same credentials."""
    endpoint = _s3_endpoint(sqs_client.meta.endpoint_url)
    config = S3_CLIENT_CONFIG if endpoint is None else S3_CLIENT_CONFIG.merge(LOCAL_STACK_CONFIG)
    made = session.create_client(
        "s3",
        region_name=sqs_client.meta.region_name,
        endpoint_url=endpoint,
        config=config,
        aws_access_key_id="replaced-below",
        aws_secret_access_key="replaced-below",
    )
    made._request_signer._credentials = sqs_client._request_signer._credentials
    return made


def _s3_endpoint(sqs_endpoint: str | None) -> str | None:
    """AWS's own S3 endpoint behind AWS's SQS; a local stack's own endpoint otherwise."""
    host = urlsplit(sqs_endpoint or "").hostname or ""
    if not host or host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return None
    return sqs_endpoint
