"""The renewal manager, driven by ``check()`` and a hand-moved clock against a fake queue."""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import replace
from typing import Any

import pytest

from celery_sqs_heartbeat.aws import sqs_queue as sqs_module
from celery_sqs_heartbeat.aws.clients import MAX_CALLS_IN_FLIGHT
from celery_sqs_heartbeat.leasing import manager as manager_module
from celery_sqs_heartbeat.leasing.call_starter import BATCHES_PER_HOLD
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease, LeasePolicy
from celery_sqs_heartbeat.leasing.manager import LeaseStatus, VisibilityExtensionManager
from celery_sqs_heartbeat.leasing.reporting import SUMMARY_INTERVAL
from celery_sqs_heartbeat.leasing.schedule import LOOKS_PER_BATCH
from celery_sqs_heartbeat.monitoring.metrics import LeaseMetrics
from celery_sqs_heartbeat.process import ProcessState
from tests.unit.conftest import BEYOND_THE_LIMIT, POLICY, FakeClock, FakeQueue, make_lease

MANAGER_LOGGER = "celery_sqs_heartbeat.leasing.manager"
INTERVAL = 1.0


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == MANAGER_LOGGER and r.levelno == logging.WARNING
    ]


def tracked(manager: VisibilityExtensionManager, queue: FakeQueue, **kwargs: Any) -> Lease:
    lease = make_lease(queue, received_at=manager.clock(), **kwargs)
    manager.track(lease, INTERVAL)
    return lease


# --- renewing -----------------------------------------------------------------------------


def test_check_before_anything_is_due_makes_no_call(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    tracked(manager, queue)
    clock.now = 19.9

    manager.check()

    assert queue.calls == []


def test_check_renews_a_due_lease_and_signals_it(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    renewed: list[dict[str, Any]],
) -> None:
    lease = tracked(manager, queue, task_id="t-1", task_name="tasks.crunch")
    clock.now = 20

    manager.check()

    assert queue.calls == [[(lease, 30)]]
    assert renewed == [
        {
            "sender": "tasks.crunch",
            "task_id": "t-1",
            "task_name": "tasks.crunch",
            "queue": "jobs",
            "visibility_timeout": 30,
            "renewals": 1,
        }
    ]


def test_a_lease_is_renewed_every_time_it_comes_due_until_it_ends(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    lease = tracked(manager, queue)
    for _ in range(100):  # 100 seconds, one check a second
        clock.advance(1)
        manager.check()

    assert len(queue.calls) == 5  # at 20, 40, 60, 80, 100
    manager.end(lease)
    clock.advance(100)
    manager.check()
    assert len(queue.calls) == 5
    assert len(manager) == 0


def test_leases_of_two_queues_are_renewed_in_separate_calls(
    manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    first, second = FakeQueue("first"), FakeQueue("second")
    a = tracked(manager, first, task_id="a")
    b = tracked(manager, second, task_id="b")
    clock.now = 20

    manager.check()

    assert first.calls == [[(a, 30)]]
    assert second.calls == [[(b, 30)]]


def test_end_before_the_check_means_no_renewal_call(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    lease = tracked(manager, queue)
    manager.end(lease)
    clock.now = 20

    manager.check()

    assert queue.calls == []


# --- losing -------------------------------------------------------------------------------


def test_a_lost_lease_logs_one_warning_with_its_task_and_signals_it(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    lost: list[dict[str, Any]],
    renewed: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = tracked(manager, queue, task_id="t-42", task_name="tasks.slow")
    queue.answer(lease, EntryResult.LOST, "ReceiptHandleIsInvalid: gone")
    clock.now = 20

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        manager.check()
        clock.now = 60
        manager.check()

    (warning,) = warnings_in(caplog)
    assert "t-42" in warning
    assert "tasks.slow" in warning
    assert lost == [
        {
            "sender": "tasks.slow",
            "task_id": "t-42",
            "task_name": "tasks.slow",
            "queue": "jobs",
            "reason": "ReceiptHandleIsInvalid: gone",
        }
    ]
    assert renewed == []
    assert len(queue.calls) == 1
    assert len(manager) == 0


def test_a_lease_that_runs_out_while_renewals_fail_is_reported_lost(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    lost: list[dict[str, Any]],
) -> None:
    tracked(manager, queue, task_id="t-7")
    queue.answer_all(EntryResult.TRANSIENT, "Throttling")
    for now in range(20, 31):
        clock.now = now
        manager.check()

    assert len(queue.calls) == 11
    (signal,) = lost
    assert signal["task_id"] == "t-7"
    assert "ran out" in signal["reason"]
    assert len(manager) == 0


def run_as_the_thread(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    until: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Drive the manager as its thread runs, in 10 ms steps of the clock until ``until``.

    It checks when it is woken (a renewal or a send came back with the outbox not empty)
    or when its sleep runs out.
    """
    woken = threading.Event()
    notify_all = manager._state.changed.notify_all

    def wake() -> None:
        woken.set()
        notify_all()

    monkeypatch.setattr(manager._state.changed, "notify_all", wake)
    wakes_at = clock.now
    while clock.now < until:
        if woken.is_set() or clock.now >= wakes_at:
            woken.clear()
            manager.check()
            with manager._state.lock:
                wakes_at = clock.now + (manager._sleep_time() or float("inf"))
        clock.advance(0.01)


def test_a_failed_renewal_waits_for_the_next_check_whatever_wakes_the_thread_meanwhile(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33: SQS down, a delete waiting; every wake-up used to send the renewal again."""
    held = tracked(manager, queue, task_id="held")
    acked = tracked(manager, queue, task_id="acked")
    queue.answer_all(EntryResult.TRANSIENT, "ConnectionError: SQS is down")
    queue.delete_default = (EntryResult.TRANSIENT, "ConnectionError: SQS is down")
    clock.now = 20
    manager.delete(acked, wait=0)
    run_as_the_thread(manager, clock, until=23, monkeypatch=monkeypatch)

    renewals = [call for call in queue.calls if held in dict(call)]
    assert len(renewals) <= 3, f"{len(renewals)} renewal calls in 3 s at one check a second"
    assert len(queue.deletes) >= 2  # the delete's own retries went on meanwhile


def test_transient_failures_log_one_warning_not_one_per_check_and_info_on_recovery(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=MANAGER_LOGGER)
    tracked(manager, queue)
    queue.answer_all(EntryResult.TRANSIENT, "Throttling: slow down")
    for now in range(20, 29):
        clock.now = now
        manager.check()
    assert len(queue.calls) == 9
    (warning,) = warnings_in(caplog)
    assert "jobs" in warning
    assert "Throttling: slow down" in warning

    queue.answer_all(EntryResult.OK)
    clock.now = 29
    manager.check()
    clock.now = 49
    manager.check()

    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == MANAGER_LOGGER]
    assert len(messages) == 2
    level, recovered = messages[1]
    assert level == logging.INFO
    assert "jobs" in recovered
    assert "works again" in recovered


def test_a_queue_that_fails_again_after_recovering_warns_again(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracked(manager, queue)
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        queue.answer_all(EntryResult.TRANSIENT, "InternalError")
        clock.now = 20
        manager.check()
        queue.answer_all(EntryResult.OK)
        clock.now = 21
        manager.check()
        queue.answer_all(EntryResult.TRANSIENT, "InternalError")
        clock.now = 41
        manager.check()

    assert len(warnings_in(caplog)) == 2


def test_each_failing_queue_gets_its_own_warning(
    manager: VisibilityExtensionManager, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = FakeQueue("first"), FakeQueue("second")
    tracked(manager, first, task_id="a")
    tracked(manager, second, task_id="b")
    first.answer_all(EntryResult.TRANSIENT, "InternalError")
    second.answer_all(EntryResult.TRANSIENT, "InternalError")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        for now in (20, 21, 22):
            clock.now = now
            manager.check()

    warnings = warnings_in(caplog)
    assert len(warnings) == 2
    assert any("first" in w for w in warnings)
    assert any("second" in w for w in warnings)


# --- the 12-hour rule ---------------------------------------------------------------------


def test_the_capped_renewal_warns_naming_the_task_and_stops_renewing(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=10, max_hold=70)
    tracked(manager, queue, policy=policy, task_id="t-long", task_name="tasks.long")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        for now in range(1, 200):
            clock.now = now
            manager.check()

    assert [[length for _, length in call] for call in queue.calls] == [[30], [30], [10]]
    (warning,) = warnings_in(caplog)
    assert "t-long" in warning
    assert "tasks.long" in warning
    assert len(manager) == 0


def test_an_exhausted_lease_warns_naming_the_task_and_is_not_renewed(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = LeasePolicy(visibility_timeout=30, threshold=0.5, max_hold=30)
    tracked(manager, queue, policy=policy, task_id="t-short", task_name="tasks.short")
    clock.now = 29.5

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        manager.check()

    assert queue.calls == []
    (warning,) = warnings_in(caplog)
    assert "t-short" in warning
    assert "tasks.short" in warning
    assert len(manager) == 0


# --- no visibility change past SQS's 12 hours ---------------------------------------------

#: SQS's 12 hours from the receive, less the margin the receive's timestamp needs.
LONGEST_HIDE = 43_200 - 60


def infos_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == MANAGER_LOGGER and r.levelno == logging.INFO
    ]


class TwelveHoursUp(FakeQueue):
    """Answers as SQS does once the 12 hours of a receive are up by its clock (not ours).

    Every visibility but 0 is refused as beyond the limit, in SQS's words, read as
    :class:`~celery_sqs_heartbeat.aws.sqs_queue.SQSQueue` reads them.
    """

    def change_visibility(self, entries: Any) -> Any:
        super().change_visibility(entries)
        leases = [lease for lease, _ in entries]
        refusal = {"Code": "InvalidParameterValue", "Message": BEYOND_THE_LIMIT}
        response = {
            "Successful": [{"Id": str(i)} for i, (_, seconds) in enumerate(entries) if not seconds],
            "Failed": [
                {"Id": str(i), **refusal} for i, (_, seconds) in enumerate(entries) if seconds
            ],
        }
        return sqs_module._entry_results(leases, response)


def test_a_12_hour_backoff_is_cut_to_what_sqs_allows_after_the_receive(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    released: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = tracked(manager, queue, task_id="t-b", task_name="tasks.backoff")
    for now in range(10, 1001, 10):  # the task ran for 1,000 s, its lease renewed
        clock.now = now
        manager.check()
    renewals = len(queue.calls)

    with caplog.at_level(logging.INFO, logger=MANAGER_LOGGER):
        manager.release([(lease, 43_200)], "failure")
        manager.check()

    assert queue.calls[renewals:] == [[(lease, LONGEST_HIDE - 1000)]]
    assert [signal["delay"] for signal in released] == [LONGEST_HIDE - 1000]
    note, release = infos_in(caplog)
    assert "tasks.backoff[t-b]" in note
    assert "43200" in note
    assert str(LONGEST_HIDE - 1000) in note
    assert release == (
        "Released to SQS on queue jobs: task tasks.backoff[t-b] "
        f"(failure, visible again in {LONGEST_HIDE - 1000} s)"
    )


def test_each_release_call_is_one_info_line_and_parks_are_not_logged_again(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = tracked(manager, queue, task_id="t-f", task_name="tasks.fails")
    unstarted = tracked(manager, queue, task_id="t-u", task_name="tasks.waits")
    parked = tracked(manager, queue, task_id="t-p", task_name="tasks.later")

    with caplog.at_level(logging.INFO, logger=MANAGER_LOGGER):
        manager.release([(failed, 60)], "failure")
        manager.release([(unstarted, 0)], "shutdown")
        manager.release([(parked, 600)], "parked")
        manager.check()

    assert len(queue.calls) == 1  # one call for the three
    assert infos_in(caplog) == [
        "Released to SQS on queue jobs: task tasks.fails[t-f] (failure, visible again in 60 s), "
        "task tasks.waits[t-u] (shutdown, visible again in 0 s)"
    ]


def test_a_park_sent_after_its_wait_for_company_is_cut_to_the_12_hours(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    """A 24-hour countdown parked for 43,140 s, sent 150 s after the receive."""
    park = make_lease(queue, policy=LeasePolicy(visibility_timeout=300), task_id="t-p")

    manager.release([(park, 43_140)], "parked", wait=150)
    clock.now = 149
    manager.check()
    assert queue.calls == []
    clock.now = 150
    manager.check()

    assert queue.calls == [[(park, LONGEST_HIDE - 150)]]


def test_a_release_after_the_12_hours_makes_the_message_visible_now(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    late = make_lease(queue, task_id="late")
    on_time = make_lease(queue, task_id="on-time", received_at=49_000)
    clock.now = 50_000

    manager.release([(late, 600), (on_time, 600)], "shutdown")
    manager.check()

    assert queue.calls == [[(late, 0), (on_time, 600)]]


def test_a_renewal_sqs_refuses_as_past_the_12_hours_stops_renewing_and_is_not_lost(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    counters: LeaseMetrics,
    lost: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = TwelveHoursUp()
    tracked(counted, queue, task_id="t-old", task_name="tasks.old")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        for now in range(20, 200):
            clock.now = now
            counted.check()

    assert len(queue.calls) == 1
    assert lost == []
    assert counters.snapshot().leases_lost == 0
    (warning,) = warnings_in(caplog)
    assert "Stopped renewing" in warning
    assert "tasks.old[t-old]" in warning
    assert len(counted) == 0


def test_a_release_sqs_refuses_as_past_the_12_hours_is_sent_again_as_visible_now(
    counted: VisibilityExtensionManager,
    counters: LeaseMetrics,
    lost: list[dict[str, Any]],
    released: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = TwelveHoursUp()
    lease = tracked(counted, queue, task_id="t-r", task_name="tasks.rel")

    with caplog.at_level(logging.INFO, logger=MANAGER_LOGGER):
        counted.release([(lease, 600)], "failure")
        counted.check()
        counted.check()

    assert queue.calls == [[(lease, 600)], [(lease, 0)]]
    assert [(signal["task_id"], signal["delay"]) for signal in released] == [("t-r", 0)]
    assert lost == []
    assert counters.snapshot().leases_lost == 0
    assert warnings_in(caplog) == []
    note, release = infos_in(caplog)
    assert "tasks.rel[t-r]" in note
    assert (
        release
        == "Released to SQS on queue jobs: task tasks.rel[t-r] (failure, visible again in 0 s)"
    )
    assert counted.flush(0) == 0


# --- acks and releases racing a renewal ---------------------------------------------------


def test_an_ack_while_the_renewal_is_in_flight_triggers_no_further_call(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    renewed: list[dict[str, Any]],
) -> None:
    lease = tracked(manager, queue)
    queue.during_call = lambda entries: manager.end(lease)
    clock.now = 20

    manager.check()
    for now in (40, 60, 1000):
        clock.now = now
        manager.check()

    assert queue.calls == [[(lease, 30)]]
    assert renewed == []
    assert len(manager) == 0


def test_a_release_asked_for_during_a_renewal_is_sent_after_that_renewal_returned(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    released: list[dict[str, Any]],
) -> None:
    lease = tracked(manager, queue, task_id="t-9", task_name="tasks.flaky")
    waiting: list[bool] = []

    def reject_meanwhile(entries: list[tuple[Lease, int]]) -> None:
        manager.release([(lease, 7)], "failure")
        waiting.append(manager.flush(0))

    queue.during_call = reject_meanwhile
    clock.now = 20

    manager.check()

    assert queue.events == [
        ("sent", [(lease, 30)]),
        ("returned", [(lease, 30)]),
        ("sent", [(lease, 7)]),
        ("returned", [(lease, 7)]),
    ]
    assert waiting == [1]
    assert manager.flush(0) == 0
    assert released == [
        {
            "sender": "tasks.flaky",
            "task_id": "t-9",
            "task_name": "tasks.flaky",
            "queue": "jobs",
            "delay": 7,
            "reason": "failure",
        }
    ]
    clock.now = 1000
    manager.check()
    assert len(queue.calls) == 2


def test_a_released_lease_tracked_again_is_neither_held_nor_renewed(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    """Issue 31, item 7: whatever path tracks a lease that ended, it stays ended."""
    lease = make_lease(queue)
    counted.release([(lease, 0)], "shutdown")

    counted.track(lease, INTERVAL)
    for now in (0, 20, 40, 1000):
        clock.now = now
        counted.check()

    assert queue.calls == [[(lease, 0)]]
    assert len(counted) == 0 and counted.leases() == []
    assert counters.snapshot().leases_held == 0


def test_releases_go_out_at_the_next_check_in_batches_of_ten(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    released: list[dict[str, Any]],
) -> None:
    leases = [tracked(manager, queue, task_id=f"t-{i}") for i in range(12)]
    clock.now = 5

    manager.release([(lease, 0) for lease in leases], "shutdown")
    assert queue.calls == []  # the caller never waits for SQS
    manager.check()

    assert [len(call) for call in queue.calls] == [10, 2]
    assert [entry for call in queue.calls for entry in call] == [(lease, 0) for lease in leases]
    assert len(released) == 12
    assert manager.flush(0) == 0
    clock.now = 20
    manager.check()
    assert len(queue.calls) == 2


def test_a_release_waits_its_batch_interval_unless_ten_are_waiting(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    leases = [tracked(manager, queue, task_id=f"t-{i}") for i in range(11)]

    manager.release([(leases[0], 0)], "failure", wait=0.5)
    manager.check()
    assert queue.calls == []
    clock.now = 0.5
    manager.check()
    assert queue.calls == [[(leases[0], 0)]]

    manager.release([(lease, 0) for lease in leases[1:]], "failure", wait=0.5)
    manager.check()
    assert [len(call) for call in queue.calls] == [1, 10]


def test_a_failed_release_is_retried_while_the_lease_holds_then_logged_once(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    released: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = tracked(manager, queue, task_id="t-r", task_name="tasks.rel")
    queue.answer_all(EntryResult.TRANSIENT, "InternalError: try later")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        manager.release([(lease, 30)], "failure")
        for now in range(31):
            clock.now = now
            manager.check()

    # At 0, then every RETRY_DELAY until the lease ran out at 30 s.
    assert len(queue.calls) == 30 / manager_module.RETRY_DELAY + 1
    notes = [w for w in warnings_in(caplog) if "t-r" in w]
    assert len(notes) == 1
    assert "Could not release" in notes[0]
    assert "InternalError: try later" in notes[0]
    assert released == []
    assert manager.flush(0) == 0


def test_a_release_sqs_refuses_is_logged_at_once(
    manager: VisibilityExtensionManager,
    queue: FakeQueue,
    released: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = tracked(manager, queue, task_id="t-r", task_name="tasks.rel")
    queue.answer_all(EntryResult.LOST, "ReceiptHandleIsInvalid: gone")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        manager.release([(lease, 30)], "failure")
        manager.check()

    (warning,) = warnings_in(caplog)
    assert "t-r" in warning
    assert "ReceiptHandleIsInvalid: gone" in warning
    assert released == []


def test_flush_with_nothing_pending_returns_at_once(
    manager: VisibilityExtensionManager,
) -> None:
    assert manager.flush(0) == 0


# --- deletes ------------------------------------------------------------------------------


def test_an_acked_message_is_deleted_after_its_wait_and_renewed_until_sqs_confirms(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    lease = tracked(counted, queue)
    queue.delete_default = (EntryResult.TRANSIENT, "InternalError: later")
    clock.now = 19.5

    counted.delete(lease, wait=0.5)
    assert queue.deletes == []  # the ack never waits for SQS
    assert counters.snapshot().deletes_pending == 1
    clock.now = 20
    counted.check()

    assert queue.calls == [[(lease, 30)]]  # still renewed: the delete has not landed
    assert queue.deletes == [[lease]]
    assert len(counted) == 1
    queue.delete_default = (EntryResult.OK, "")
    clock.now = 21
    counted.check()

    assert queue.deletes == [[lease], [lease]]
    assert len(counted) == 0
    current = counters.snapshot()
    assert (current.delete_calls, current.messages_deleted) == (2, 1)
    assert (current.deletes_retried, dict(current.delete_failures)) == (1, {"InternalError": 1})
    assert current.deletes_pending == 0
    clock.now = 100
    counted.check()
    assert len(queue.calls) == 1


def test_ten_acks_go_out_at_once_in_one_call(
    manager: VisibilityExtensionManager, queue: FakeQueue
) -> None:
    leases = [tracked(manager, queue, task_id=f"t-{i}") for i in range(10)]

    for lease in leases:
        manager.delete(lease, wait=0.5)
    manager.check()

    assert queue.deletes == [leases]


def test_a_failing_delete_warns_once_per_streak_and_says_when_it_works_again(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    lost: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    leases = [tracked(manager, queue, task_id=f"t-{i}") for i in range(3)]
    queue.delete_default = (EntryResult.TRANSIENT, "ThrottlingException: slow down")

    with caplog.at_level(logging.INFO, logger=MANAGER_LOGGER):
        for lease in leases:
            manager.delete(lease, wait=0)
        for now in range(8):
            clock.now = now
            manager.check()
        queue.delete_default = (EntryResult.OK, "")
        clock.now = 8
        manager.check()

    notes = [r.getMessage() for r in caplog.records if r.name == MANAGER_LOGGER]
    assert notes == [
        "Deleting acked messages on queue jobs failed, retrying while the leases hold: "
        "ThrottlingException: slow down",
        "Deleting acked messages on queue jobs works again",
    ]
    assert lost == []
    assert len(manager) == 0


def test_a_delete_sqs_refuses_loses_the_lease_once(
    manager: VisibilityExtensionManager,
    queue: FakeQueue,
    lost: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = tracked(manager, queue, task_id="t-1", task_name="tasks.crunch")
    queue.delete_default = (EntryResult.LOST, "ReceiptHandleIsInvalid: gone")

    with caplog.at_level(logging.WARNING, logger=MANAGER_LOGGER):
        manager.delete(lease, wait=0)
        manager.check()
        manager.check()

    (warning,) = warnings_in(caplog)
    assert "t-1" in warning and "ReceiptHandleIsInvalid: gone" in warning
    assert [event["task_id"] for event in lost] == ["t-1"]
    assert len(manager) == 0
    assert queue.deletes == [[lease]]


def test_a_lease_lost_while_its_delete_fails_is_reported_once(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    lost: list[dict[str, Any]],
) -> None:
    lease = tracked(manager, queue)
    queue.delete_default = (EntryResult.TRANSIENT, "InternalError: later")
    queue.answer_all(EntryResult.TRANSIENT, "InternalError: later")
    manager.delete(lease, wait=0)

    for now in range(40):
        clock.now = now
        manager.check()

    assert len(lost) == 1  # by the renewal that found the lease gone, not by the delete too
    assert len(manager) == 0
    assert manager.flush(0) == 0
    assert len(queue.deletes) == 31  # every second from 0 to 30, when the lease had run out


def test_a_failing_delete_in_its_lease_s_last_second_is_not_sent_again_at_once(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33: 560 deletes in one run, each retry due at once in the lease's last second."""
    lease = tracked(manager, queue)  # received at 0: the lease runs out at 30
    queue.answer_all(EntryResult.TRANSIENT, "ConnectionError: SQS is down")
    queue.delete_default = (EntryResult.TRANSIENT, "ConnectionError: SQS is down")
    clock.now = 29
    manager.delete(lease, wait=0)

    run_as_the_thread(manager, clock, until=30, monkeypatch=monkeypatch)

    assert len(queue.deletes) <= 3, f"{len(queue.deletes)} deletes in the lease's last second"
    assert len(queue.deletes) >= 2  # one more try before the lease ends


def test_an_unacked_lease_s_delete_without_renewals_still_goes_out(
    manager: VisibilityExtensionManager, queue: FakeQueue
) -> None:
    """With visibility_extension off the lease is not tracked; the ack is still batched."""
    lease = make_lease(queue)

    manager.delete(lease, wait=0)
    manager.check()

    assert queue.deletes == [[lease]]
    assert queue.calls == []


def test_a_failed_delete_without_renewals_is_retried_and_its_lease_never_renewed(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a flaky CI run: the retried delete's lease went into the renewal schedule,
    and was renewed although the user opted out; with no delete left to retry, the
    thread, owed a check every ``inf`` seconds, died (OverflowError) at each start."""
    lease = make_lease(queue, policy=replace(POLICY, renewed=False))  # lease ends at 30
    queue.delete_default = (EntryResult.TRANSIENT, "InternalError: later")
    manager.delete(lease, wait=0)

    run_as_the_thread(manager, clock, until=25, monkeypatch=monkeypatch)
    queue.delete_default = (EntryResult.OK, "")
    run_as_the_thread(manager, clock, until=40, monkeypatch=monkeypatch)

    assert queue.calls == []  # never renewed, though due from 20 s
    assert len(queue.deletes) > 2
    assert len(manager) == 0
    with manager._state.lock:
        assert manager._sleep_time() is None  # nothing owed: asleep until woken


def test_a_message_received_again_before_its_delete_landed_is_deleted_by_the_new_receipt(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    acked = tracked(manager, queue, task_id="t-1", task_name="tasks.crunch")
    acked.message_id = "m-1"
    manager.delete(acked, wait=0.5)
    again = tracked(manager, queue, receipt_handle="rh-again")
    again.message_id = "m-1"

    assert manager.redirect_delete(again) is acked

    assert (again.task_id, again.task_name) == ("t-1", "tasks.crunch")
    assert len(manager) == 1  # the new receive's lease, renewed until the delete lands
    clock.now = 0.5
    manager.check()
    assert queue.deletes == [[again]]
    assert len(manager) == 0


def test_a_message_received_again_just_after_its_delete_landed_is_deleted_again(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    """SQS confirmed a delete by the old receipt, which deleted nothing (the message was
    received again meanwhile), and that receive reached the channel after the answer."""
    acked = tracked(manager, queue, task_id="t-1", task_name="tasks.crunch")
    acked.message_id = "m-1"
    manager.delete(acked, wait=0)
    manager.check()
    assert queue.deletes == [[acked]]
    again = tracked(manager, queue, receipt_handle="rh-again")
    again.message_id = "m-1"

    assert manager.redirect_delete(again) is acked

    assert (again.task_id, again.task_name) == ("t-1", "tasks.crunch")
    manager.check()
    assert queue.deletes == [[acked], [again]]
    assert len(manager) == 0


def test_a_copied_message_received_again_before_its_delete_landed_keeps_its_s3_object(
    manager: VisibilityExtensionManager, queue: FakeQueue
) -> None:
    """Issue 31, item 8: a parked task's fresh copy carries its S3 pointer, so the delete
    of the original, by whichever receipt, must leave the object."""
    copied = tracked(manager, queue)
    copied.message_id, copied.copied = "m-1", True
    manager.delete(copied, wait=0.5)
    again = tracked(manager, queue, receipt_handle="rh-again")
    again.message_id = "m-1"

    assert manager.redirect_delete(again) is copied

    assert again.copied


def test_a_message_never_acked_here_is_not_redirected(
    manager: VisibilityExtensionManager, queue: FakeQueue
) -> None:
    fresh = tracked(manager, queue)
    fresh.message_id = "m-9"

    assert manager.redirect_delete(fresh) is None


def test_flush_sends_every_pending_delete_and_release_now(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acked, rejected = tracked(manager, queue, task_id="a"), tracked(manager, queue, task_id="r")
    manager.delete(acked, wait=5)
    manager.release([(rejected, 0)], "failure", wait=5)
    # What the thread would do once woken: send what is owed.
    monkeypatch.setattr(manager, "_ensure_thread", manager.check)

    assert manager.flush(1) == 0

    assert queue.deletes == [[acked]]
    assert queue.calls == [[(rejected, 0)]]
    assert clock.now == 0


def test_flush_says_how_many_sqs_did_not_confirm(
    manager: VisibilityExtensionManager,
    queue: FakeQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leases = [tracked(manager, queue, task_id=f"t-{i}") for i in range(3)]
    queue.delete_default = (EntryResult.TRANSIENT, "InternalError: later")
    for lease in leases:
        manager.delete(lease, wait=5)
    monkeypatch.setattr(manager, "_ensure_thread", manager.check)

    assert manager.flush(0) == 3
    assert queue.deletes == [leases]


def test_the_thread_sleeps_until_the_next_delete_is_due(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    lease = make_lease(queue)
    assert manager._sleep_time() is None

    manager.delete(lease, wait=0.5)

    assert manager._sleep_time() == 0.5
    clock.now = 0.2
    assert manager._sleep_time() == pytest.approx(0.3)


# --- robustness ---------------------------------------------------------------------------


class _StopLoop(BaseException):
    """Raised by a test to leave the manager's endless loop."""


def test_an_exception_in_check_is_logged_and_the_loop_goes_on(
    manager: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracked(manager, queue)
    manager._interval = 0  # the loop's wait returns at once: no sleeping
    queue.error = RuntimeError("bug in the queue")
    clock.now = 20
    real_check = manager.check
    checks: list[int] = []

    def check(wait: bool = True) -> None:
        checks.append(1)
        if len(checks) > 2:
            raise _StopLoop
        real_check()  # waiting for the answers, so the errors are logged by now

    monkeypatch.setattr(manager, "check", check)

    with caplog.at_level(logging.ERROR, logger=MANAGER_LOGGER), pytest.raises(_StopLoop):
        manager._loop.run()

    assert len(checks) == 3  # the loop survived the first failure
    errors = [r for r in caplog.records if r.name == MANAGER_LOGGER]
    assert errors
    assert all(r.levelno == logging.ERROR for r in errors)
    assert isinstance(errors[0].exc_info[1], RuntimeError)


def test_leases_are_renewed_again_after_a_check_that_raised(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    lease = tracked(manager, queue)
    queue.error = RuntimeError("bug in the queue")
    clock.now = 20
    with contextlib.suppress(RuntimeError):  # raising or not is up to check()
        manager.check()

    queue.error = None
    clock.now = 21
    manager.check()

    assert queue.calls == [[(lease, 30)], [(lease, 30)]]


def test_a_queue_whose_call_raises_does_not_stop_other_queues_renewals(
    manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    broken, healthy = FakeQueue("broken"), FakeQueue("healthy")
    tracked(manager, broken, task_id="a")
    lease = tracked(manager, healthy, task_id="b")
    broken.error = RuntimeError("bug in the queue")

    for now in (20, 21):
        clock.now = now
        with contextlib.suppress(RuntimeError):
            manager.check()

    assert healthy.calls == [[(lease, 30)]]


# --- the thread and the process -----------------------------------------------------------


def test_the_thread_starts_at_the_first_track_not_before(queue: FakeQueue) -> None:
    manager = VisibilityExtensionManager(clock=FakeClock())
    assert manager._loop._thread is None
    manager.check()
    manager.flush(0)
    assert manager._loop._thread is None

    lease = make_lease(queue)
    # A long interval: the thread waits and does nothing while the test runs.
    manager.track(lease, check_interval=3600)
    thread = manager._loop._thread
    manager.end(lease)

    assert thread is not None
    assert thread.is_alive()
    assert thread.daemon
    manager.track(make_lease(queue, task_id="second"), check_interval=3600)
    assert manager._loop._thread is thread


def test_stop_ends_the_thread_for_good(queue: FakeQueue) -> None:
    manager = VisibilityExtensionManager(clock=FakeClock())
    manager.track(make_lease(queue), check_interval=3600)
    thread = manager._loop._thread
    assert thread is not None

    assert manager.stop(5) == 0
    thread.join(5)

    assert not thread.is_alive()
    manager.track(make_lease(queue, task_id="second"), check_interval=3600)
    assert manager._loop._thread is thread  # not started again


# --- counters -----------------------------------------------------------------------------


@pytest.fixture
def counters() -> LeaseMetrics:
    return LeaseMetrics()


@pytest.fixture
def counted(
    clock: FakeClock, counters: LeaseMetrics, monkeypatch: pytest.MonkeyPatch
) -> VisibilityExtensionManager:
    """A manager like ``manager``, counting into ``counters`` rather than the process's."""
    instance = VisibilityExtensionManager(clock=clock, metrics=counters)
    monkeypatch.setattr(instance, "_ensure_thread", lambda: None)
    return instance


def test_the_process_manager_counts_into_the_process_counters(
    process_state: ProcessState,
) -> None:
    manager = process_state.manager

    assert manager._state.report.metrics is process_state.metrics


def test_each_renewal_call_is_counted_with_its_entries_and_their_margins(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    tracked(counted, queue, task_id="a")  # due at 20, expires at 30
    clock.now = 5
    tracked(counted, queue, task_id="b")  # expires at 35: renewed early to fill the call
    clock.now = 21

    counted.check()

    current = counters.snapshot()
    assert current.renewal_calls == 1
    assert current.renewal_entries == 2
    margin = current.renewal_margin
    assert (margin.count, margin.min, margin.max, margin.sum) == (2, 9, 14, 23)
    assert current.renewal_failures == {}


def test_the_margin_is_counted_from_the_renewed_expiry_next_time(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    tracked(counted, queue)
    clock.now = 20
    counted.check()  # renewed until 50
    clock.now = 40.5
    counted.check()

    margin = counters.snapshot().renewal_margin
    assert (margin.count, margin.min, margin.max) == (2, 9.5, 10)


@pytest.mark.parametrize(
    ("result", "reason", "code"),
    [
        (EntryResult.TRANSIENT, "ThrottlingException: Rate exceeded", "ThrottlingException"),
        (EntryResult.TRANSIENT, "ReadTimeoutError('Read timeout')", "ReadTimeoutError"),
        (EntryResult.LOST, "MessageNotInflight: not in flight", "MessageNotInflight"),
    ],
)
def test_failed_entries_are_counted_by_error_code(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
    result: EntryResult,
    reason: str,
    code: str,
) -> None:
    ok = tracked(counted, queue, task_id="ok")
    failing = tracked(counted, queue, task_id="failing")
    queue.answer(failing, result, reason)
    clock.now = 20

    counted.check()

    assert counters.snapshot().renewal_failures == {code: 1}
    assert ok.renewals == 1


def test_a_call_that_raises_counts_each_entry_as_failed_under_the_error_name(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    tracked(counted, queue, task_id="a")
    tracked(counted, queue, task_id="b")
    queue.error = RuntimeError("bug in the queue")
    clock.now = 20

    counted.check()

    current = counters.snapshot()
    assert current.renewal_calls == 1
    assert current.renewal_failures == {"RuntimeError": 2}


def test_a_missing_answer_counts_as_a_failure_with_no_answer(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    counters: LeaseMetrics,
) -> None:
    class Silent(FakeQueue):
        def change_visibility(self, entries: Any) -> dict[Lease, tuple[EntryResult, str]]:
            return {}

    tracked(counted, Silent())
    clock.now = 20

    counted.check()

    assert counters.snapshot().renewal_failures == {"NoAnswer": 1}


def test_a_renewal_failing_after_its_lease_ended_is_not_counted_as_a_failure(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    lease = tracked(counted, queue)
    queue.answer(lease, EntryResult.LOST, "ReceiptHandleIsInvalid: deleted")
    queue.during_call = lambda entries: counted.end(lease)  # the ack won the race
    clock.now = 20

    counted.check()

    current = counters.snapshot()
    assert current.renewal_calls == 1
    assert current.renewal_failures == {}
    assert current.leases_lost == 0


def test_an_ack_during_a_renewal_is_deleted_only_when_the_renewal_is_back(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    """Renewals go out on threads of their own: a delete sent meanwhile could land first."""
    lease = tracked(manager, queue)
    on_the_wire, answer = threading.Event(), threading.Event()

    def ack_meanwhile(entries: Any) -> None:
        manager.delete(lease, wait=0)
        on_the_wire.set()
        assert answer.wait(10)

    queue.during_call = ack_meanwhile
    clock.now = 20
    manager.check(wait=False)
    assert on_the_wire.wait(10)

    manager.check(wait=False)  # the thread's next turn: the delete is due, but held
    assert queue.deletes == []

    answer.set()
    manager.check()
    assert queue.deletes == [[lease]]
    assert len(manager) == 0


def test_lost_leases_are_counted_whether_gone_or_run_out(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    counters: LeaseMetrics,
) -> None:
    gone_queue, failing_queue = FakeQueue("gone"), FakeQueue("failing")
    gone = tracked(counted, gone_queue, task_id="gone")
    gone_queue.answer(gone, EntryResult.LOST, "MessageNotInflight: gone")
    tracked(counted, failing_queue, task_id="runs-out")
    failing_queue.answer_all(EntryResult.TRANSIENT, "InternalError: later")
    for now in range(20, 31):
        clock.now = now
        counted.check()

    current = counters.snapshot()
    assert current.leases_lost == 2
    assert current.renewal_failures == {"MessageNotInflight": 1, "InternalError": 11}
    assert current.leases_held == 0


def test_releases_are_counted_when_sqs_confirms_them(
    counted: VisibilityExtensionManager,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    leases = [tracked(counted, queue, task_id=f"t-{i}") for i in range(3)]
    queue.answer(leases[2], EntryResult.TRANSIENT, "InternalError: later")

    counted.release([(lease, 0) for lease in leases], "shutdown")
    counted.check()

    current = counters.snapshot()
    assert current.messages_released == 2
    assert current.renewal_calls == 0  # a release is not a renewal


def test_leases_held_follows_track_end_release_and_loss(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    counters: LeaseMetrics,
) -> None:
    def held() -> int:
        return counters.snapshot().leases_held

    acked, released, lost, kept = (tracked(counted, queue, task_id=f"t-{i}") for i in range(4))
    assert held() == 4
    counted.end(acked)
    assert held() == 3
    counted.release([(released, 0)], "requeue")
    assert held() == 2
    queue.answer(lost, EntryResult.LOST, "MessageNotInflight: gone")
    clock.now = 20
    counted.check()
    assert held() == 1
    assert kept.renewals == 1


# --- the lease listing --------------------------------------------------------------------


def test_leases_lists_each_lease_being_renewed_oldest_first(
    counted: VisibilityExtensionManager, clock: FakeClock
) -> None:
    first, second = FakeQueue("first"), FakeQueue("second")
    old = tracked(counted, first, task_id="old", task_name="tasks.old")
    clock.now = 12
    tracked(counted, second, task_id="new", task_name="tasks.new")
    clock.now = 20
    counted.check()  # "old" is renewed until 50; "new" is not due before 32
    clock.now = 25

    listing = counted.leases()

    assert listing == [
        LeaseStatus(
            task_id="old",
            task_name="tasks.old",
            queue="first",
            age=25,
            renewals=1,
            expires_in=25,
        ),
        LeaseStatus(
            task_id="new",
            task_name="tasks.new",
            queue="second",
            age=13,
            renewals=0,
            expires_in=17,
        ),
    ]
    assert old.renewals == 1


def test_leases_leaves_out_ended_leases(
    counted: VisibilityExtensionManager, queue: FakeQueue
) -> None:
    acked = tracked(counted, queue, task_id="acked")
    tracked(counted, queue, task_id="running")

    counted.end(acked)

    assert [status.task_id for status in counted.leases()] == ["running"]


def test_leases_of_an_idle_manager_is_empty(counted: VisibilityExtensionManager) -> None:
    assert counted.leases() == []


# --- the DEBUG summary --------------------------------------------------------------------


def summaries_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == MANAGER_LOGGER
        and r.levelno == logging.DEBUG
        and r.getMessage().startswith("SQS lease summary:")
    ]


def test_the_summary_comes_at_the_first_check_then_once_a_period(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=MANAGER_LOGGER)
    tracked(counted, queue)

    counted.check()
    assert summaries_in(caplog) == [
        "SQS lease summary: held=1 renewal_calls=0 renewal_entries=0 renewal_failures=0 "
        "lost=0 released=0 receive_errors=0 deletes_pending=0 delete_calls=0 deleted=0 "
        "delete_failures=0 deletes_retried=0 margin_seconds none "
        "(counts since the process started)"
    ]

    for now in range(1, int(SUMMARY_INTERVAL)):  # renewed at 20 and 40, no new summary
        clock.now = now
        counted.check()
    assert len(summaries_in(caplog)) == 1

    clock.now = SUMMARY_INTERVAL
    counted.check()
    second = summaries_in(caplog)[1]
    assert second.startswith("SQS lease summary: held=1 renewal_calls=3 renewal_entries=3 ")
    assert "margin_seconds min=10.00 median<=10.00 max=10.00" in second


def test_the_summary_stops_once_no_lease_is_held_and_nothing_moves(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=MANAGER_LOGGER)
    lease = tracked(counted, queue)
    counted.check()  # the first summary
    clock.now = 20
    counted.check()  # a renewal
    clock.now = 30
    counted.end(lease)

    for now in (SUMMARY_INTERVAL, 2 * SUMMARY_INTERVAL, 3 * SUMMARY_INTERVAL):
        clock.now = now
        counted.check()

    first, last = summaries_in(caplog)  # one more, for the lease that ended
    assert first.startswith("SQS lease summary: held=1 ")
    assert last.startswith("SQS lease summary: held=0 renewal_calls=1 ")


def test_a_summary_reports_what_happened_since_the_last_even_without_leases(
    counted: VisibilityExtensionManager,
    clock: FakeClock,
    counters: LeaseMetrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=MANAGER_LOGGER)
    counted.check()
    assert summaries_in(caplog) == []  # nothing held, nothing counted: nothing to say
    assert counted._sleep_time() is None  # so the idle thread sleeps until woken

    counters.record_receive_error("InternalError")  # the transport's receive failed
    clock.now = 10
    assert counted._sleep_time() == SUMMARY_INTERVAL - 10  # wake up when it is due
    clock.now = SUMMARY_INTERVAL
    assert counted._sleep_time() == 0
    counted.check()

    (summary,) = summaries_in(caplog)
    assert "held=0 " in summary
    assert "receive_errors=1 (InternalError=1)" in summary
    assert counted._sleep_time() is None


def test_no_summary_is_built_unless_debug_is_on(
    counted: VisibilityExtensionManager,
    queue: FakeQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=MANAGER_LOGGER)
    tracked(counted, queue)

    counted.check()

    assert summaries_in(caplog) == []
    assert counted._sleep_time() == INTERVAL  # the next check, and no summary sooner


def test_an_idle_thread_wakes_for_an_owed_summary_then_sleeps_until_woken(
    counted: VisibilityExtensionManager,
    counters: LeaseMetrics,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG, logger=MANAGER_LOGGER)
    counters.record_released(3)  # the last leases were released: worth one more line
    waits: list[float | None] = []

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        if len(waits) == 2:
            raise _StopLoop
        return False

    monkeypatch.setattr(counted._state.changed, "wait", wait)

    with pytest.raises(_StopLoop):
        counted._loop.run()

    assert waits == [0.0, None]
    (summary,) = summaries_in(caplog)
    assert "released=3" in summary


# --- renewal calls in chunks and in parallel ----------------------------------------------


class _CountingLock:
    """The manager's lock, noting how many leases the book looked at in each hold."""

    def __init__(self, manager: VisibilityExtensionManager) -> None:
        self._lock = threading.Lock()
        self._manager = manager
        self._looked_at_acquire = 0
        self.looked_at_per_hold: list[int] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self._lock.acquire(blocking, timeout)
        if taken:
            self._looked_at_acquire = self._manager._state.book.looked_at
        return taken

    def release(self) -> None:
        self.looked_at_per_hold.append(
            self._manager._state.book.looked_at - self._looked_at_acquire
        )
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_check_renewing_a_burst_holds_the_lock_for_a_few_calls_at_a_time(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    for n in range(5000):
        lease = make_lease(queue, received_at=10 * n / 5000, task_id=f"t{n}")
        manager.track(lease, INTERVAL)
    counting = _CountingLock(manager)
    manager._state.lock = counting  # type: ignore[assignment]
    manager._state.changed = threading.Condition(counting)  # type: ignore[arg-type]
    clock.now = 30  # 5,000 due

    manager.check()

    assert sum(len(call) for call in queue.calls) == 5000
    assert max(counting.looked_at_per_hold) <= 2 * BATCHES_PER_HOLD * LOOKS_PER_BATCH
    assert sum(counting.looked_at_per_hold) >= 5000


def test_the_calls_of_one_check_are_on_the_wire_together(
    manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    together = threading.Barrier(3, timeout=10)  # three calls, or a broken barrier

    class Meeting(FakeQueue):
        def change_visibility(self, entries: Any) -> Any:
            together.wait()
            return super().change_visibility(entries)

    queue = Meeting()
    for n in range(30):
        tracked(manager, queue, task_id=f"t{n}")
    clock.now = 20

    manager.check()

    assert not together.broken
    assert sorted(len(call) for call in queue.calls) == [10, 10, 10]
    assert all(lease.renewals == 1 for call in queue.calls for lease, _ in call)


def test_no_more_than_the_connection_pool_of_calls_are_on_the_wire_at_once(
    manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    on_wire = 0
    most = 0
    counting = threading.Lock()
    full = threading.Barrier(MAX_CALLS_IN_FLIGHT, timeout=10)

    class Counted(FakeQueue):
        def change_visibility(self, entries: Any) -> Any:
            nonlocal on_wire, most
            with counting:
                on_wire += 1
                most = max(most, on_wire)
            full.wait()  # every slot is taken before any call comes back
            with counting:
                on_wire -= 1
            return super().change_visibility(entries)

    queue = Counted()
    for n in range(20 * MAX_CALLS_IN_FLIGHT):
        tracked(manager, queue, task_id=f"t{n}")
    clock.now = 20

    manager.check()

    assert most == MAX_CALLS_IN_FLIGHT
    assert len(queue.calls) == 2 * MAX_CALLS_IN_FLIGHT


def test_the_margin_follows_how_long_renewals_take(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    adaptive = LeasePolicy(visibility_timeout=30)
    first = tracked(manager, queue, policy=adaptive, task_id="first")
    clock.now = 20  # before any call was timed: the ceiling, 10 s
    queue.during_call = lambda entries: clock.advance(2.0)  # SQS takes 2 s

    manager.check()

    assert first.expires_at == 50
    margin = manager._state.book.margin
    assert margin.seconds(adaptive, clock.now) == pytest.approx(INTERVAL + 3 + 2 * 2.0)


def test_a_failed_renewal_brings_the_margin_back_to_its_ceiling(
    manager: VisibilityExtensionManager, clock: FakeClock, queue: FakeQueue
) -> None:
    adaptive = LeasePolicy(visibility_timeout=30)
    tracked(manager, queue, policy=adaptive)
    clock.now = 20
    manager.check()
    assert manager._state.book.margin.seconds(adaptive, 20) == pytest.approx(4)

    queue.answer_all(EntryResult.TRANSIENT, "ThrottlingException: slow down")
    clock.now = 47
    with caplog_quiet():
        manager.check()

    assert manager._state.book.margin.seconds(adaptive, 47) == 10


def caplog_quiet() -> contextlib.AbstractContextManager[None]:
    """The failure's one warning is the subject of other tests."""
    logger = logging.getLogger(MANAGER_LOGGER)
    level = logger.level

    @contextlib.contextmanager
    def quiet() -> Any:
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)

    return quiet()


# --- no call waits for another ------------------------------------------------------------


class _Gate(FakeQueue):
    """A queue whose deletes, or releases, stay on the wire until the test opens the gate.

    Renewals answer at once and say so through ``renewed``.
    """

    def __init__(self, hold: str) -> None:
        super().__init__()
        self.hold = hold
        self.gate = threading.Event()
        self.on_wire = threading.Event()
        self.renewed = threading.Event()
        #: Set when the held call came back: a check that waited for it set it first.
        self.returned = threading.Event()
        #: Deletes as they go on the wire (``deletes`` records them as they come back).
        self.sent: list[list[Lease]] = []

    def delete(self, leases: Any) -> Any:
        self.sent.append(list(leases))
        if self.hold == "delete":
            self._hold()
        return super().delete(leases)

    def _hold(self) -> None:
        self.on_wire.set()
        try:
            assert self.gate.wait(10)
        finally:
            self.returned.set()

    def change_visibility(self, entries: Any) -> Any:
        if self.hold == "release" and any(seconds == 0 for _, seconds in entries):
            self._hold()
            return super().change_visibility(entries)
        answer = super().change_visibility(entries)
        self.renewed.set()
        return answer


@pytest.mark.parametrize("hold", ["delete", "release"])
def test_a_delete_or_release_on_the_wire_holds_back_no_renewal(
    manager: VisibilityExtensionManager, clock: FakeClock, hold: str
) -> None:
    queue = _Gate(hold)
    finished = tracked(manager, queue, task_id="finished")
    running = tracked(manager, queue, task_id="running")
    if hold == "delete":
        manager.delete(finished, wait=0)
    else:
        manager.release([(finished, 0)], "failure")
    manager.check(wait=False)
    assert not queue.returned.is_set()  # the check did not wait for the slow call
    assert queue.on_wire.wait(10)
    clock.now = 20  # the running task's lease is due while the other call hangs

    manager.check(wait=False)

    try:
        assert queue.renewed.wait(10), "the renewal waited for the slow call"
        renewed = [lease for lease, _ in queue.calls[-1]]
        # A lease whose delete is on the wire is renewed too; a released one is not.
        assert renewed == ([finished, running] if hold == "delete" else [running])
    finally:
        queue.gate.set()
    assert manager.flush(10) == 0


def test_a_lease_whose_delete_is_on_the_wire_is_renewed_until_the_delete_lands(
    manager: VisibilityExtensionManager, clock: FakeClock
) -> None:
    """SQS answering a delete late must not let the lease run out meanwhile."""
    queue = _Gate("delete")
    queue.delete_default = (EntryResult.TRANSIENT, "InternalError: later")
    lease = tracked(manager, queue)
    manager.delete(lease, wait=0)
    manager.check(wait=False)
    assert queue.on_wire.wait(10)
    clock.now = 20

    manager.check(wait=False)
    assert queue.renewed.wait(10), "the lease was not renewed while its delete was out"
    assert len(manager) == 1
    queue.gate.set()
    manager.check()  # the delete failed: the lease stays, renewed as before

    assert queue.calls[0] == [(lease, 30)]
    assert len(manager) == 1


def test_when_every_send_slot_is_taken_deletes_wait_in_the_outbox(
    manager: VisibilityExtensionManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager._calls.sends, "limit", 1)
    queue = _Gate("delete")
    first, second = (tracked(manager, queue, task_id=f"t{n}") for n in range(2))
    manager.delete(first, wait=0)
    manager.check(wait=False)
    assert queue.on_wire.wait(10)

    manager.delete(second, wait=0)
    manager.check(wait=False)

    assert queue.sent == [[first]]
    assert manager._sleep_time() == INTERVAL  # no spinning on a delete it cannot send
    queue.gate.set()
    manager.check()  # waits for the slot, then sends the second delete

    assert queue.sent == [[first], [second]]
    assert len(manager) == 0
