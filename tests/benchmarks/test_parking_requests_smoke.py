"""Keeps ``benchmarks/parking_requests.py`` working: a seconds-long run, nothing timed.

The figures are the benchmark's to report; only the exit status, the table's shape and
that parking costs fewer requests than holding are checked.
"""

from __future__ import annotations

from tests.benchmarks.scripts import run_benchmark


def test_smoke_run_reports_held_and_parked_for_each_countdown() -> None:
    printed = run_benchmark("parking_requests.py", "--smoke")

    rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| 1")]
    assert [(row[0], row[1]) for row in rows] == [
        (f"| {wait}", strategy)
        for wait in ("1 h", "13 h")
        for strategy in ("held", "parked", "parked, fresh copies")
    ]
    held, parked = (float(row[7].split()[0].replace(",", "")) for row in rows[3:5])
    assert parked < held
    assert "Command: `python benchmarks/parking_requests.py --smoke`" in printed
