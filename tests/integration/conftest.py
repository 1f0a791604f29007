from __future__ import annotations

from pathlib import Path

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer

from .harness import Bed, new_bed


@pytest.fixture
def bed(sqs_server: StrictSQSServer, tmp_path: Path) -> Bed:
    """A fresh queue and record file on the shared SQS server."""
    return new_bed(sqs_server, tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
