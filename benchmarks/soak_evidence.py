"""What a soak run keeps on disk, read back into what the verdicts take.

Per pool, under the run's workdir: ``records.jsonl`` (each run and receive the workers
wrote), ``driver.jsonl`` (each act of the driver), ``published.jsonl`` (each task SQS
took). The run judges from them, and so can anyone later (``chaos_soak.py --judge``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soak_verdicts import Chaos, Kill, OutageWindow, Published, Receipt, TaskRun


def json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def runs_and_receipts(records: Path) -> tuple[list[TaskRun], list[Receipt]]:
    lines = json_lines(records)
    runs = [
        TaskRun(r["task_id"], r["worker"], r["start"], r["end"], r["outcome"])
        for r in lines
        if r["event"] == "run"
    ]
    receipts = [
        Receipt(r["task_id"], r["worker"], r["at"]) for r in lines if r["event"] == "received"
    ]
    return runs, receipts


def chaos_of(
    acts: Sequence[dict[str, Any]], lease: float, receive_slack: float, pool: str
) -> Chaos:
    """The driver's acts that may make SQS hand a message out again, on ``pool``'s workers."""
    return Chaos(
        lease,
        receive_slack=receive_slack,
        kills=[Kill(a["worker"], a["t"]) for a in acts if a["kind"] == "sigkill"],
        outages=[OutageWindow(a["t"], a["seconds"]) for a in acts if a["kind"] == "outage"],
        crashes=[Kill(a["worker"], a["t"]) for a in acts if a["kind"] == "crashed"],
        warm_stops=[Kill(a["worker"], a["t"]) for a in acts if a["kind"] == "sigterm"],
        prefork=pool == "prefork",
    )


def published(path: Path) -> list[Published]:
    return [Published(**task) for task in json_lines(path)]
