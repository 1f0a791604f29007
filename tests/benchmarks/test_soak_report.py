"""The chaos soak's checks and table (benchmarks/soak_report.py), on hand-made results."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.bench_modules import bench_module

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return bench_module("soak_report")


@pytest.fixture(scope="module")
def verdicts() -> ModuleType:
    return bench_module("soak_verdicts")


def result(report: ModuleType, verdicts: ModuleType, **changes: Any) -> Any:
    tally = changes.pop("tally", verdicts.Tally(published=3, ran_once=3, runs=3))
    return report.PoolResult(
        pool="threads",
        minutes=1.0,
        seconds=95.0,
        tally=tally,
        acts=changes.pop(
            "acts",
            [
                {"kind": "sigkill", "worker": "w2.1"},
                {"kind": "sigkill", "worker": "w3.1", "after": "grace"},
                {"kind": "restart", "worker": "w2.2"},
                {"kind": "outage", "seconds": 12},
            ],
        ),
        memory=changes.pop(
            "memory", [verdicts.MemoryVerdict("w1.1", 100 * MIB, 101 * MIB, 20 * MIB)]
        ),
        leftovers=changes.pop("leftovers", report.Leftovers()),
        parked=changes.pop("parked", 1),
    )


def test_a_clean_run_passes_and_counts_its_faults_by_kind(
    report: ModuleType, verdicts: ModuleType
) -> None:
    clean = result(report, verdicts)
    assert clean.passed
    assert clean.faults() == {"sigkill": 1, "sigkill (grace over)": 1, "outage": 1}
    row = report.table([clean]).splitlines()[2]
    assert row.startswith("| threads | 1 min (95 s) | 3 | 3 |")
    assert row.endswith("| w1.1 101 (100) | pass |")


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"leftovers": "queue"}, "nothing left behind"),
        ({"tally": "lost"}, "none lost"),
        ({"acts": "crashed"}, "no worker died by itself or hung"),
        ({"acts": "stuck"}, "no worker died by itself or hung"),
        ({"tally": "unexplained"}, "every duplicate explained"),
        ({"tally": "out of order"}, "FIFO order kept"),
        ({"memory": "grown"}, "memory within margin"),
        ({"memory": "none"}, "memory measured"),
        ({"parked": 0}, "countdowns parked"),
    ],
)
def test_each_failed_check_fails_the_pool_and_is_named(
    report: ModuleType, verdicts: ModuleType, change: dict[str, Any], failed: str
) -> None:
    ((key, value),) = change.items()
    run = verdicts.TaskRun("t1", "w1.1", 1.0, 2.0, "ok")
    made = {
        "queue": report.Leftovers(queues=["soak-celeryev-1"]),
        "lost": verdicts.Tally(published=1, lost=["t1"]),
        "unexplained": verdicts.Tally(
            published=1, duplicates=[verdicts.Duplicate("t1", "short", run, None)]
        ),
        "out of order": verdicts.Tally(published=3, ran_once=3, out_of_order=["t2"]),
        "grown": [verdicts.MemoryVerdict("w1.1", 100 * MIB, 130 * MIB, 20 * MIB)],
        "none": [],
        "crashed": [{"kind": "crashed", "worker": "w2.1", "code": 1}],
        "stuck": [{"kind": "stuck", "worker": "w1.1"}],
    }
    broken = result(report, verdicts, **{key: made.get(value, value)})
    assert not broken.passed
    assert [name for name, ok in broken.checks() if not ok] == [failed]
    assert report.table([broken]).splitlines()[2].endswith(f"| FAIL: {failed} |")


def test_the_details_name_what_failed(report: ModuleType, verdicts: ModuleType) -> None:
    run = verdicts.TaskRun("t9", "w2.1", 5.0, 6.0, "ok")
    tally = verdicts.Tally(
        published=2, lost=["t8"], duplicates=[verdicts.Duplicate("t9", "long", run, None)]
    )
    left = report.Leftovers(objects=["key-1"], messages=2)
    crashed = [{"kind": "crashed", "worker": "w2.1", "code": 1}]
    lines = report.details(result(report, verdicts, tally=tally, leftovers=left, acts=crashed))
    assert lines == [
        "lost: t8",
        "died by itself: w2.1 (exit status 1), see its log",
        "unexplained second run: t9 (long) on w2.1 at 5.0",
        "left: S3 object key-1",
        "left: 2 messages in the task queues",
    ]


def test_an_object_kept_for_a_lost_lease_is_named_and_fails_nothing(
    report: ModuleType, verdicts: ModuleType
) -> None:
    """Found by the chaos soak: the object of a task whose lease ran out in an outage before
    its delete landed stays on purpose (SQS's answer cannot say whether it deleted)."""
    left = report.Leftovers(kept=["key-1 (task t1), its lease lost before its delete"])
    run = result(report, verdicts, leftovers=left)

    assert run.passed
    assert report.details(run) == [
        "kept: S3 object key-1 (task t1), its lease lost before its delete"
    ]
    assert "| 0 (kept on purpose: 1 S3 objects) |" in report.table([run])
