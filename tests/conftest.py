from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer


@pytest.fixture(scope="session")
def sqs_server() -> Iterator[StrictSQSServer]:
    """A strict SQS server (moto with SQS's real lease rules) shared by the session."""
    with StrictSQSServer() as server:
        yield server


@pytest.fixture(scope="module")
def short_hold_server(request: pytest.FixtureRequest) -> Iterator[StrictSQSServer]:
    """A strict server of the module's own whose hold limit (SQS's 12 hours from a receive)
    is the module's ``SHORT_HOLD`` seconds: a server's limit is fixed at its start, and
    would cut the other tests' holds short."""
    with StrictSQSServer(max_hold_seconds=request.module.SHORT_HOLD) as server:
        yield server
