"""The chaos soak's verdicts (benchmarks/soak_verdicts.py): which second runs the driver's
log explains, which tasks were lost, which FIFO runs broke their group's order, and the
memory check. Pure: hand-made records, no clock."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.bench_modules import bench_module

LEASE = 8.0


@pytest.fixture(scope="module")
def v() -> ModuleType:
    return bench_module("soak_verdicts")


def run(v: ModuleType, worker: str, start: float, end: float, outcome: str = "ok") -> Any:
    return v.TaskRun("t1", worker, start, end, outcome)


def judge(v: ModuleType, runs: list[Any], shape: str = "short", **chaos: Any) -> Any:
    return v.judge(
        [v.Published("t1", shape)],
        runs,
        chaos.pop("receipts", []),
        v.Chaos(
            LEASE,
            chaos.pop("kills", []),
            chaos.pop("outages", []),
            chaos.pop("crashes", []),
            chaos.pop("receive_slack", 0.0),
            chaos.pop("warm_stops", []),
            chaos.pop("prefork", False),
        ),
    )


def test_a_task_run_once_is_counted_once_and_nothing_else(v: ModuleType) -> None:
    tally = judge(v, [run(v, "w1.1", 10, 11)])
    assert (tally.ran_once, tally.lost, tally.duplicates, tally.runs) == (1, [], [], 1)


def test_a_task_without_a_completed_run_is_lost(v: ModuleType) -> None:
    tally = judge(v, [run(v, "w1.1", 10, 11, "failed")], shape="released")
    assert tally.lost == ["t1"]
    assert tally.ran_once == 0


def test_a_second_run_after_the_first_worker_was_sigkilled_is_explained(v: ModuleType) -> None:
    tally = judge(v, [run(v, "w2.1", 10, 11), run(v, "w1.1", 20, 21)], kills=[v.Kill("w2.1", 11.5)])
    (duplicate,) = tally.duplicates
    assert (duplicate.run.worker, duplicate.reason) == ("w1.1", "sigkilled")
    assert tally.unexplained == []
    assert tally.duplicates_by_reason() == {"sigkilled": 1}


@pytest.mark.parametrize(
    "kill",
    [("w3.1", 11.5), ("w2.2", 11.5), ("w2.1", 9.0), ("w2.1", 25.0)],
    ids=["another worker", "a later incarnation", "before the run", "after the second run"],
)
def test_a_sigkill_explains_nothing_unless_it_hit_the_first_run_s_worker_between_the_runs(
    v: ModuleType, kill: tuple[str, float]
) -> None:
    tally = judge(v, [run(v, "w2.1", 10, 11), run(v, "w1.1", 20, 21)], kills=[v.Kill(*kill)])
    assert [d.reason for d in tally.duplicates] == [None]
    assert tally.duplicates_by_reason() == {"unexplained": 1}


def test_a_second_run_after_a_worker_died_by_itself_is_told_apart(v: ModuleType) -> None:
    runs = [run(v, "w2.1", 10, 11), run(v, "w1.1", 20, 21)]
    tally = judge(v, runs, crashes=[v.Kill("w2.1", 11.5)])
    assert [d.reason for d in tally.duplicates] == ["its worker died by itself"]
    assert tally.unexplained == []
    killed_too = judge(v, runs, crashes=[v.Kill("w2.1", 11.5)], kills=[v.Kill("w2.1", 11.6)])
    assert [d.reason for d in killed_too.duplicates] == ["sigkilled"]


def test_an_outage_longer_than_the_lease_while_the_message_was_held_explains_a_second_run(
    v: ModuleType,
) -> None:
    """Two runs side by side: the first worker lost its lease in the outage."""
    tally = judge(
        v,
        [run(v, "w1.1", 10, 22), run(v, "w2.1", 21, 33)],
        outages=[v.OutageWindow(12, LEASE * 1.5)],
    )
    assert [d.reason for d in tally.duplicates] == ["cut off by an outage"]


def test_an_outage_counts_from_the_receive_when_the_message_waited_in_the_prefetch(
    v: ModuleType,
) -> None:
    runs = [run(v, "w1.1", 30, 31), run(v, "w2.1", 25, 26)]
    outage = [v.OutageWindow(12, LEASE * 1.5)]
    receipts = [v.Receipt("t1", "w2.1", 20.0), v.Receipt("t1", "w1.1", 10.0)]
    assert [d.reason for d in judge(v, runs, outages=outage).duplicates] == [None]
    explained = judge(v, runs, outages=outage, receipts=receipts)
    assert [d.reason for d in explained.duplicates] == ["cut off by an outage"]


def test_a_message_may_have_been_received_a_slack_before_celery_saw_it(v: ModuleType) -> None:
    """A solo worker hands a received message to Celery once its running task ends: an
    outage just before ``task_received`` may have cut its lease off."""
    runs = [run(v, "w1.1", 18.5, 18.6), run(v, "w2.1", 35, 35.1)]
    outage = [v.OutageWindow(18, LEASE * 2)]
    receipts = [v.Receipt("t1", "w1.1", 18.4)]
    unexplained = judge(v, runs, outages=outage, receipts=receipts)
    assert [d.reason for d in unexplained.duplicates] == [None]
    explained = judge(v, runs, outages=outage, receipts=receipts, receive_slack=13.0)
    assert [d.reason for d in explained.duplicates] == ["cut off by an outage"]


@pytest.mark.parametrize(
    "outage",
    [(12, LEASE), (30, LEASE * 2), (4, LEASE * 2)],
    ids=["not longer than the lease", "a lease after the first run", "before the first run"],
)
def test_an_outage_explains_nothing_unless_it_could_have_cut_off_the_held_message(
    v: ModuleType, outage: tuple[float, float]
) -> None:
    runs = [run(v, "w1.1", 10, 20), run(v, "w2.1", 40, 41)]
    tally = judge(v, runs, outages=[v.OutageWindow(*outage)])
    assert [d.reason for d in tally.duplicates] == [None]


def test_planned_failures_and_one_retry_are_not_duplicates(v: ModuleType) -> None:
    released = [
        run(v, "w1.1", 1, 2, "failed"),
        run(v, "w2.1", 4, 5, "failed"),
        run(v, "w1.1", 8, 9),
    ]
    assert judge(v, released, shape="released").duplicates == []
    retried = [run(v, "w1.1", 1, 2, "retry"), run(v, "w2.1", 4, 5)]
    assert judge(v, retried, shape="retried").ran_once == 1


def test_a_retry_published_twice_is_a_duplicate_explained_by_the_first_worker_s_kill(
    v: ModuleType,
) -> None:
    """Killed after it published the retry, before its delete: the original ran again and
    published a second retry, so the task also completed twice."""
    runs = [
        run(v, "w2.1", 1, 2, "retry"),
        run(v, "w1.1", 12, 13, "retry"),
        run(v, "w3.1", 15, 16),
        run(v, "w1.1", 16, 17),
    ]
    tally = judge(v, runs, shape="retried", kills=[v.Kill("w2.1", 2.5)])
    assert [(d.run.outcome, d.reason) for d in tally.duplicates] == [
        ("retry", "sigkilled"),
        ("ok", "sigkilled"),
    ]


def fifo(v: ModuleType, *spans: tuple[int, float, float]) -> list[str]:
    """Out-of-order tasks of a group whose task ``seq`` ran from ``start`` to ``end``."""
    tasks = [v.Published(f"g-{seq}", "fifo", "g", seq) for seq in range(3)]
    runs = [v.TaskRun(f"g-{seq}", "w1.1", start, end, "ok") for seq, start, end in spans]
    return v.judge(tasks, runs, [], v.Chaos(LEASE)).out_of_order


def test_a_fifo_group_run_in_order_is_in_order_even_with_a_second_run(v: ModuleType) -> None:
    assert fifo(v, (0, 1, 2), (1, 3, 4), (1, 5, 6), (2, 7, 8)) == []


def test_a_fifo_task_started_before_the_one_ahead_completed_breaks_the_order(
    v: ModuleType,
) -> None:
    assert fifo(v, (0, 1, 5), (1, 3, 6), (2, 7, 8)) == ["g-1"]
    assert fifo(v, (0, 5, 6), (1, 1, 2), (2, 7, 8)) == ["g-1"]
    assert fifo(v, (1, 3, 4), (2, 7, 8)) == ["g-1"]


PREFORK_STOP = "begun as its prefork worker stopped (Celery)"


def test_a_run_begun_after_its_prefork_worker_was_told_to_stop_is_celery_s(
    v: ModuleType,
) -> None:
    runs = [run(v, "w2.1", 10.03, 10.2), run(v, "w1.1", 25, 26)]
    tally = judge(v, runs, warm_stops=[v.Kill("w2.1", 10.0)], prefork=True)
    assert tally.duplicates_by_reason() == {PREFORK_STOP: 1}
    assert tally.unexplained == []


@pytest.mark.parametrize(
    ("stop", "prefork"),
    [
        (("w2.1", 10.5), True),  # told to stop after the run began: it runs on, and is acked
        (("w3.1", 9.0), True),  # another worker's stop
        (("w2.1", 10.0), False),  # threads, gevent, solo: a stopping worker acks what it began
    ],
)
def test_a_warm_stop_explains_nothing_else(
    v: ModuleType, stop: tuple[str, float], prefork: bool
) -> None:
    runs = [run(v, "w2.1", 10.03, 10.2), run(v, "w1.1", 25, 26)]
    tally = judge(v, runs, warm_stops=[v.Kill(*stop)], prefork=prefork)
    assert [d.reason for d in tally.duplicates] == [None]


MIB = 1024 * 1024


def test_memory_is_judged_from_the_first_sample_at_or_after_the_warm_up(v: ModuleType) -> None:
    samples = [(0.0, 50 * MIB), (10.0, 90 * MIB), (30.0, 100 * MIB), (300.0, 110 * MIB)]
    verdict = v.memory_verdict("w1.1", samples, 20.0, 20 * MIB, 0.15)
    assert (verdict.start, verdict.end, verdict.ok) == (100 * MIB, 110 * MIB, True)
    assert v.memory_verdict("w1.1", samples, 10.0, 5 * MIB, 0.0).start == 90 * MIB


def test_memory_beyond_both_margins_fails(v: ModuleType) -> None:
    samples = [(0.0, 200 * MIB), (300.0, 231 * MIB)]
    assert v.memory_verdict("w1.1", samples, 0.0, 20 * MIB, 0.15).allowed == 30 * MIB
    assert not v.memory_verdict("w1.1", samples, 0.0, 20 * MIB, 0.15).ok
    assert v.memory_verdict("w1.1", samples, 0.0, 40 * MIB, 0.15).ok


def test_a_worker_that_lived_shorter_than_its_warm_up_is_not_judged(v: ModuleType) -> None:
    assert v.memory_verdict("w2.3", [(100.0, MIB), (105.0, MIB)], 120.0, MIB, 0.1) is None
    assert v.memory_verdict("w2.3", [], 20.0, MIB, 0.1) is None


def test_an_object_is_kept_for_a_lost_lease_or_a_worker_killed_before_it_could_go(
    v: ModuleType,
) -> None:
    """The 30-minute gevent soak: a worker SIGKILLed 3.4 s after its large task ended,
    its delete held 3.2 s by a slow-delete fault, left the task's object."""
    runs = [run(v, "w2.11", 10.0, 10.2), run(v, "w1.1", 20.0, 21.0), run(v, "w3.4", 30.0, 31.0)]
    runs = [v.TaskRun(f"t{n}", r.worker, r.start, r.end, r.outcome) for n, r in enumerate(runs)]
    kills = [v.Kill("w2.11", 13.6), v.Kill("w1.1", 40.0)]

    kept = v.objects_kept(runs, kills, {"t2"}, lease=8.0)

    assert kept == {"t0": v.KEPT_SIGKILLED, "t2": v.KEPT_LOST_LEASE}


def test_an_object_is_judged_by_its_task_s_last_run(v: ModuleType) -> None:
    """A task run again elsewhere after its first worker's kill: the second worker, alive,
    owes the object's delete."""
    runs = [v.TaskRun("t", "w2.1", 10.0, 11.0, "ok"), v.TaskRun("t", "w1.1", 30.0, 31.0, "ok")]

    assert v.objects_kept(runs, [v.Kill("w2.1", 12.0)], set(), lease=8.0) == {}
