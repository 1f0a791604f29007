from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import Bed, leaks, new_bed


@pytest.fixture
def bed(sqs_server: StrictSQSServer, tmp_path: Path) -> Bed:
    """A fresh queue and record file on the shared SQS server.

    Each test starts as if a minute had passed since the queues of the tests before it
    were deleted: SQS refuses such a name for a minute, and tests share the server and
    worker names (``w1``'s mailbox), so one test's delete would fail the next one.
    """
    sqs_server.forget_deleted_queues()
    return new_bed(sqs_server, tmp_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _no_secret_or_receipt_handle_in_worker_logs(tmp_path: Path) -> Iterator[None]:
    """Every scenario, faults included, is also a check of what the workers logged."""
    yield
    for log in sorted(tmp_path.glob("worker-*.log")):
        found = leaks(log.read_text())
        assert not found, f"{log.name} shows a secret or a receipt handle:\n{found[0][:500]}"
