"""How the timeline turns SQS events into lease spans and exposure."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("matplotlib")

from examples.spark_pipeline.report import Message, load_messages
from examples.spark_pipeline.timeline import (
    EVENT_MARKERS,
    exposed_intervals,
    lease_intervals,
    marker_times,
)


def test_renewals_extend_one_continuous_lease_up_to_the_delete() -> None:
    message = Message("m", "t", "generate", receives=[0.0], renewals=[(5.0, 10), (10.0, 10)])
    message.deleted = 12.0
    assert lease_intervals(message, lease=10, end=100.0) == [(0.0, 12.0)]


def test_an_expired_lease_leaves_a_gap_until_the_next_receive() -> None:
    message = Message("m", "t", "generate", receives=[0.0, 14.0])
    assert lease_intervals(message, lease=10, end=30.0) == [(0.0, 10.0), (14.0, 24.0)]


def test_a_renewal_with_its_own_visibility_is_respected() -> None:
    message = Message("m", "t", "generate", receives=[0.0], renewals=[(8.0, 30)])
    assert lease_intervals(message, lease=10, end=100.0) == [(0.0, 38.0)]


def test_exposure_is_running_time_outside_the_lease() -> None:
    hidden = [(0.0, 10.0), (14.0, 24.0)]
    assert exposed_intervals((1.0, 30.0), hidden, deleted=None) == [(10.0, 14.0), (24.0, 30.0)]
    assert exposed_intervals((1.0, 9.0), hidden, deleted=None) == []


def test_exposure_ends_when_the_message_is_deleted() -> None:
    assert exposed_intervals((1.0, 30.0), [(0.0, 10.0)], deleted=20.0) == [(10.0, 20.0)]


def _worker_record(event: str, at: float, message_id: str | None = "m") -> dict[str, Any]:
    return {
        "event": event,
        "task_id": "t",
        "task_name": "spark_pipeline.generate",
        "message_id": message_id,
        "time": at,
    }


def test_every_event_of_the_legend_has_its_times() -> None:
    assert set(marker_times(Message("m", "t", "generate"))) == set(EVENT_MARKERS)


def test_worker_records_alone_mark_the_ack() -> None:
    """An external endpoint has no server log: the worker's ack is the delete."""
    worker = [
        _worker_record("receive", 0.0),
        {"event": "renew", "task_id": "t", "task_name": "generate", "renewals": 1, "time": 5.0},
        _worker_record("ack", 12.0),
    ]
    [message] = load_messages(worker, None, "queue")
    times = marker_times(message)
    assert times["received"] == [0.0]
    assert times["lease renewed"] == [5.0]
    assert times["acked (deleted)"] == [12.0]


def test_a_redelivered_message_is_deleted_by_its_last_ack() -> None:
    """SQS deletes for sure only with the latest receipt handle, the last one acked."""
    worker = [
        _worker_record("receive", 0.0),
        _worker_record("receive", 10.0),
        _worker_record("ack", 30.0),
        _worker_record("ack", 40.0),
    ]
    [message] = load_messages(worker, None, "queue")
    assert marker_times(message)["acked (deleted)"] == [40.0]


def test_the_server_log_decides_the_delete_when_there_is_one() -> None:
    """A stale delete is logged as such and deletes nothing; the worker's ack is not asked."""
    worker = [_worker_record("receive", 0.0), _worker_record("ack", 12.0)]
    server = [
        {"t": 0.0, "action": "receive", "message_id": "m", "queue": "q", "result": "ok"},
        {"t": 12.1, "action": "delete", "message_id": "m", "queue": "q", "result": "stale"},
    ]
    [message] = load_messages(worker, server, "q")
    assert marker_times(message)["acked (deleted)"] == []
