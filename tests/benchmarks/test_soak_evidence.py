"""What a soak run keeps, read back for the verdicts (benchmarks/soak_evidence.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks.bench_modules import bench_module


@pytest.fixture(scope="module")
def evidence() -> ModuleType:
    return bench_module("soak_evidence")


def write(path: Path, *lines: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_records_split_into_runs_and_receipts(evidence: ModuleType, tmp_path: Path) -> None:
    records = write(
        tmp_path / "records.jsonl",
        {"event": "received", "task_id": "t1", "worker": "w1.1", "pid": 7, "at": 1.0},
        {
            "event": "run",
            "task_id": "t1",
            "worker": "w1.1",
            "pid": 8,
            "start": 1.5,
            "end": 2.0,
            "outcome": "ok",
        },
    )
    runs, receipts = evidence.runs_and_receipts(records)
    assert [(r.task_id, r.worker, r.start, r.end, r.outcome) for r in runs] == [
        ("t1", "w1.1", 1.5, 2.0, "ok")
    ]
    assert [(r.task_id, r.worker, r.at) for r in receipts] == [("t1", "w1.1", 1.0)]
    assert evidence.runs_and_receipts(tmp_path / "none.jsonl") == ([], [])


def test_the_driver_s_acts_give_kills_outages_crashes_and_warm_stops(
    evidence: ModuleType,
) -> None:
    acts = [
        {"t": 1.0, "kind": "sigkill", "worker": "w2.1"},
        {"t": 2.0, "kind": "sigkill", "worker": "w3.1", "after": "grace"},
        {"t": 3.0, "kind": "outage", "seconds": 12.0},
        {"t": 4.0, "kind": "crashed", "worker": "w1.1", "code": 1},
        {"t": 5.0, "kind": "sigterm", "worker": "w2.2"},
        {"t": 6.0, "kind": "throttle", "seconds": 1.0},
    ]
    chaos = evidence.chaos_of(acts, 8.0, 13.0, "prefork")
    assert (chaos.lease, chaos.receive_slack, chaos.prefork) == (8.0, 13.0, True)
    assert [(k.worker, k.at) for k in chaos.kills] == [("w2.1", 1.0), ("w3.1", 2.0)]
    assert [(o.start, o.seconds) for o in chaos.outages] == [(3.0, 12.0)]
    assert [(c.worker, c.at) for c in chaos.crashes] == [("w1.1", 4.0)]
    assert [(s.worker, s.at) for s in chaos.warm_stops] == [("w2.2", 5.0)]
    assert not evidence.chaos_of(acts, 8.0, 13.0, "threads").prefork


def test_published_tasks_come_back_as_written(evidence: ModuleType, tmp_path: Path) -> None:
    path = write(
        tmp_path / "published.jsonl",
        {"task_id": "t1", "shape": "fifo", "group": "g1", "seq": 2},
        {"task_id": "t2", "shape": "short", "group": None, "seq": 0},
    )
    tasks = evidence.published(path)
    assert [(t.task_id, t.shape, t.group, t.seq) for t in tasks] == [
        ("t1", "fifo", "g1", 2),
        ("t2", "short", None, 0),
    ]
