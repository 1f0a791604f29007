from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import Bed, fresh_bed, leaks, new_bed
from tests.integration.iam import enforcing


@pytest.fixture
def bed(sqs_server: StrictSQSServer, tmp_path: Path) -> Bed:
    """A fresh queue and record file on the shared SQS server, with none of the faults
    or deleted queue names of the tests before (:func:`fresh_bed`)."""
    return fresh_bed(sqs_server, tmp_path)


@pytest.fixture
def short_hold_bed(short_hold_server: StrictSQSServer, tmp_path: Path) -> Bed:
    """A fresh queue and record file on the module's short-hold server (tests/conftest.py)."""
    return new_bed(short_hold_server, tmp_path)


@pytest.fixture(scope="module")
def enforced(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A server of the module's own that enforces IAM, and what the module made on it first.

    The module's ``iam_setup(iam: Iam)`` makes its users, roles, queues and buckets and
    returns what its tests use; IAM is enforced after it. With ``IAM_RECORDING = True``
    in the module, moto's recorder keeps every request from then on (``iam.recorded``).
    """
    module = request.module
    recording = None
    if getattr(module, "IAM_RECORDING", False):
        recording = tmp_path_factory.mktemp("moto-recording") / "requests.jsonl"
    with enforcing(recording) as iam:
        setup = module.iam_setup(iam)
        iam.enforce()
        yield setup


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
