"""The chaos soak's readings of what it finds on the server (benchmarks/soak_remains.py)."""

from __future__ import annotations

import base64
import json
from types import ModuleType

import pytest

from tests.benchmarks.bench_modules import bench_module


@pytest.fixture(scope="module")
def remains() -> ModuleType:
    return bench_module("soak_remains")


def test_an_s3_object_is_named_by_the_task_id_in_its_message(remains: ModuleType) -> None:
    envelope = {"body": "W1tdLCB7fV0=", "headers": {"id": "3f1c", "task": "soak_app.work"}}
    body = base64.b64encode(json.dumps(envelope).encode())
    assert remains.task_id_of(body) == "3f1c"
    assert remains.task_id_of(b"not base64 JSON") is None
    assert remains.task_id_of(base64.b64encode(b'{"body": ""}')) is None


@pytest.mark.parametrize(
    ("queue", "kept"),
    [
        ("soak-w1_vm-celery-pidbox", True),
        ("soak-w3_vm-celery-pidbox", True),
        ("soak-w4_vm-celery-pidbox", False),
        ("soak-celeryev-5991888d", False),
        ("soak-4b1c-reply-celery-pidbox", False),
    ],
)
def test_only_the_workers_mailboxes_are_kept(remains: ModuleType, queue: str, kept: bool) -> None:
    assert remains.is_mailbox(queue, ["w1", "w2", "w3"]) is kept
