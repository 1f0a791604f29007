from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer


@pytest.fixture(scope="session")
def sqs_server() -> Iterator[StrictSQSServer]:
    """A strict SQS server (moto with SQS's real lease rules) shared by the session."""
    with StrictSQSServer() as server:
        yield server
