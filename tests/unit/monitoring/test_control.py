"""The remote-control commands: registered with Celery, answering plain JSON data."""

from __future__ import annotations

import json

import pytest
from celery.worker.control import Panel

from celery_sqs_heartbeat.leasing.manager import VisibilityExtensionManager
from celery_sqs_heartbeat.monitoring import control
from celery_sqs_heartbeat.monitoring.metrics import LeaseMetrics
from celery_sqs_heartbeat.process import ProcessState
from tests.unit.conftest import FakeClock, FakeQueue, make_lease


@pytest.fixture
def leases_manager(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> VisibilityExtensionManager:
    """A manager with two leases, one renewed once, counting into counters of its own."""
    instance = VisibilityExtensionManager(clock=clock, metrics=LeaseMetrics())
    monkeypatch.setattr(instance, "_ensure_thread", lambda: None)
    first, second = FakeQueue("jobs"), FakeQueue("reports")
    instance.track(make_lease(first, task_id="t-old", task_name="tasks.crunch"), 1.0)
    clock.now = 12.5
    instance.track(make_lease(second, received_at=12.5, task_id="t-new", task_name=None), 1.0)
    clock.now = 20
    instance.check()  # t-old renewed until 50
    clock.now = 21.25
    return instance


def test_both_commands_are_registered_as_inspect_commands() -> None:
    for name in ("sqs_leases", "sqs_lease_stats"):
        assert Panel.data[name] is getattr(control, name)
        assert Panel.meta[name].type == "inspect"
        assert Panel.meta[name].visible
        assert Panel.meta[name].help  # shown by `celery inspect --list`


def test_lease_listing_is_plain_json_data_oldest_first(
    leases_manager: VisibilityExtensionManager,
) -> None:
    listing = control.lease_listing(leases_manager)

    assert json.loads(json.dumps(listing)) == listing
    assert listing == [
        {
            "task_id": "t-old",
            "task_name": "tasks.crunch",
            "queue": "jobs",
            "age": 21.25,
            "renewals": 1,
            "expires_in": 28.75,
        },
        {
            "task_id": "t-new",
            "task_name": None,  # received, not yet handed to a task
            "queue": "reports",
            "age": 8.75,
            "renewals": 0,
            "expires_in": 21.25,
        },
    ]


def test_lease_listing_rounds_times_to_the_millisecond(
    leases_manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    clock.now = 21.123456

    ages = [entry["age"] for entry in control.lease_listing(leases_manager)]

    assert ages == [21.123, 8.623]


def test_sqs_leases_answers_with_the_shared_managers_leases(
    leases_manager: VisibilityExtensionManager,
    process_state: ProcessState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_state, "_manager", leases_manager)

    reply = control.sqs_leases(state=None)

    assert [entry["task_id"] for entry in reply] == ["t-old", "t-new"]


def test_sqs_leases_of_a_worker_without_leases_is_an_empty_list(
    process_state: ProcessState, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle = VisibilityExtensionManager(clock=FakeClock(), metrics=LeaseMetrics())
    monkeypatch.setattr(process_state, "_manager", idle)

    assert control.sqs_leases(state=None) == []


def test_sqs_lease_stats_answers_with_the_process_counters_as_json(
    process_state: ProcessState,
) -> None:
    counters = process_state.metrics
    counters.record_renewal_call(3)
    counters.record_renewal_margin(4.0)
    counters.record_receive_error("InternalError")

    reply = control.sqs_lease_stats(state=None)

    assert json.loads(json.dumps(reply)) == reply
    assert reply["renewal_calls"] == 1
    assert reply["renewal_entries"] == 3
    assert reply["receive_errors"] == {"InternalError": 1}
    assert reply["renewal_margin"]["min"] == 4.0


@pytest.mark.usefixtures("process_state")
def test_commands_accept_the_arguments_celery_may_pass() -> None:
    # Celery calls a handler as handler(state, **arguments).
    assert isinstance(control.sqs_leases(None, extra="ignored"), list)
    assert isinstance(control.sqs_lease_stats(None, extra="ignored"), dict)
