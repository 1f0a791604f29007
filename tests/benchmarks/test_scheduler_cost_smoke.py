"""Keeps ``benchmarks/scheduler_cost.py`` working, against its baseline commit when the
clone has it (a shallow clone does not).

Nothing here is timed: the figures depend on the machine.
"""

from __future__ import annotations

import subprocess

from tests.benchmarks.scripts import REPO, run_benchmark

BASELINE = "c1da785"


def _has_baseline() -> bool:
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{BASELINE}^{{commit}}"], cwd=REPO, capture_output=True
    )
    return found.returncode == 0


def test_smoke_run_compares_the_heap_with_the_scanning_book() -> None:
    baseline = BASELINE if _has_baseline() else "none"
    table = run_benchmark("scheduler_cost.py", "--smoke", "--baseline", baseline).splitlines()
    assert "heap (this tree)" in table[0]
    assert (f"before ({BASELINE})" in table[0]) == (baseline != "none")
    for size in ("1,000", "2,000"):
        rows = [line for line in table if line.startswith(f"| {size} |")]
        assert [row.split(" | ")[1] for row in rows] == [
            "idle check",
            "check renewing 10 due",
            "one ack (end)",
            "bytes per lease",
        ]
