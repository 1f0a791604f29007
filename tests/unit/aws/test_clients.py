"""The clients a process derives from kombu's: each one's configuration, made once a source.

Real botocore clients, made without a call to AWS; a call's request is caught in
botocore's ``before-send`` hook, where the network would take it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError

from celery_sqs_heartbeat.aws.clients import (
    MAX_PUBLISH_CALLS_IN_FLIGHT,
    POOL_CONNECTIONS,
    DerivedClients,
    _s3_endpoint,
)
from celery_sqs_heartbeat.aws.sessions import client_as_kombu_makes_it
from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from tests.unit.aws.test_sqs_queue import sqs_client
from tests.unit.conftest import make_lease

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"
BEFORE_SEND = "before-send.sqs.ChangeMessageVisibilityBatch"

@pytest.fixture
def clients() -> DerivedClients:
    """A process's derived clients of the test's own: none made yet."""
    return DerivedClients()


def test_the_renewal_client_fails_fast_has_a_connection_per_call_and_keeps_the_rest(
    clients: DerivedClients,
) -> None:
    source = sqs_client(
        region_name="eu-west-1",
        endpoint_url="http://localhost:9324",
        config=Config(
            connect_timeout=60,
            read_timeout=60,
            retries={"max_attempts": 10, "mode": "standard"},
            max_pool_connections=3,
        ),
    )

    derived = clients.renewal(source)

    assert derived is not source
    assert derived.meta.config.connect_timeout == 5
    assert derived.meta.config.read_timeout == 5
    assert derived.meta.config.retries["total_max_attempts"] == 1
    # Room for every renewal, delete and release the manager may have on the wire at once.
    assert derived.meta.config.max_pool_connections == POOL_CONNECTIONS
    assert derived.meta.region_name == "eu-west-1"
    assert derived.meta.endpoint_url == "http://localhost:9324"


def test_the_renewal_client_shares_the_source_credentials_object(clients: DerivedClients) -> None:
    source = sqs_client()

    derived = clients.renewal(source)

    assert derived._request_signer._credentials is source._request_signer._credentials


def test_renewals_are_signed_with_the_source_credentials(clients: DerivedClients) -> None:
    source = sqs_client(access_key="AKIDFROMSOURCE")
    sent: list[Any] = []

    def capture(request: Any, **_: Any) -> None:
        sent.append(request)
        raise EndpointConnectionError(endpoint_url=QUEUE_URL)

    clients.renewal(source).meta.events.register(BEFORE_SEND, capture)
    lease = make_lease("jobs", task_id="t0", receipt_handle="handle-0")

    SQSQueue("jobs", QUEUE_URL, lambda: clients.renewal(source)).change_visibility([(lease, 30)])

    (request,) = sent
    authorization = request.headers["Authorization"]
    if isinstance(authorization, bytes):
        authorization = authorization.decode()
    assert "Credential=AKIDFROMSOURCE/" in authorization


def test_the_renewal_client_is_made_once_per_source(clients: DerivedClients) -> None:
    first, second = sqs_client(), sqs_client()

    assert clients.renewal(first) is clients.renewal(first)
    assert clients.renewal(first) is not clients.renewal(second)


def test_derived_clients_read_the_models_kombus_client_has_already_loaded(
    clients: DerivedClients,
) -> None:
    """A session of their own would parse the service model again: 40 to 50 ms each."""
    source = kombus_client()

    assert clients.renewal(source)._loader is source._loader
    assert clients.receive(source)._loader is source._loader
    assert clients.s3(source)._loader is source._loader


def kombus_client(key: str = "AKIDFROMSOURCE") -> BaseClient:
    return client_as_kombu_makes_it(
        "sqs",
        "eu-west-1",
        key,
        "secret",
        None,
        is_secure=False,
        endpoint_url="http://127.0.0.1:9",
        transport_options={"client-config": {"connect_timeout": 3}},
    )


def test_kombus_clients_share_one_parse_of_botocores_data_but_not_credentials() -> None:
    """The chaos soak: each connection's client held its own parse of botocore's
    endpoints (6.7 MiB) and model, and a reconnect made them again."""
    first, second = kombus_client("AKIDFIRST"), kombus_client("AKIDSECOND")

    assert first._loader is second._loader
    assert first._endpoint.host == "http://127.0.0.1:9"
    assert first.meta.config.connect_timeout == 3
    assert first._request_signer._credentials.access_key == "AKIDFIRST"
    assert second._request_signer._credentials.access_key == "AKIDSECOND"


def test_calls_starting_side_by_side_on_a_new_queue_share_one_renewal_client(
    clients: DerivedClients,
) -> None:
    """The first deletes of a busy worker start together, each on a thread of its own."""
    source = sqs_client()
    start_together = threading.Barrier(6)
    got: list[BaseClient] = []

    def first_call() -> None:
        start_together.wait()
        got.append(clients.renewal(source))

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(got) == 6
    assert all(client is got[0] for client in got)


def test_the_receive_client_makes_one_attempt_and_outwaits_the_longest_long_poll(
    clients: DerivedClients,
) -> None:
    source = sqs_client(
        endpoint_url="http://localhost:9324",
        config=Config(read_timeout=10, retries={"max_attempts": 10}, max_pool_connections=3),
    )

    derived = clients.receive(source)

    assert derived is not source
    assert derived is not clients.renewal(source)
    assert derived is clients.receive(source)
    assert derived.meta.config.retries["total_max_attempts"] == 1
    # SQS holds a long poll for 20 s at most.
    assert derived.meta.config.read_timeout > 20
    assert derived.meta.config.max_pool_connections == 3
    assert derived.meta.endpoint_url == "http://localhost:9324"
    assert derived._request_signer._credentials is source._request_signer._credentials


@pytest.mark.parametrize(
    ("sqs_endpoint", "s3_endpoint"),
    [
        ("https://sqs.us-east-1.amazonaws.com", None),
        ("https://sqs.cn-north-1.amazonaws.com.cn", None),
        ("http://127.0.0.1:4566", "http://127.0.0.1:4566"),
        ("http://localstack:4566", "http://localstack:4566"),
        (None, None),
    ],
)
def test_s3_is_asked_at_aws_behind_aws_and_at_a_local_stack_s_endpoint(
    sqs_endpoint: str | None, s3_endpoint: str | None
) -> None:
    assert _s3_endpoint(sqs_endpoint) == s3_endpoint


def test_the_publish_client_has_a_connection_per_call_in_flight_and_the_source_s_credentials(
    clients: DerivedClients,
) -> None:
    source = sqs_client()
    client = clients.publish(source)
    assert client is clients.publish(source)
    assert client.meta.config.max_pool_connections >= MAX_PUBLISH_CALLS_IN_FLIGHT
    assert client.meta.config.retries["total_max_attempts"] == 1
    assert client._request_signer._credentials is source._request_signer._credentials
