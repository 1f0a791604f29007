"""Keeps ``benchmarks/renewal_requests.py`` working: a seconds-long run, nothing timed.

The figures depend on the simulated workload, not the machine, but they are the
benchmark's to report, not this test's to pin: only the exit status and the table's
shape are checked.
"""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.scripts import run_benchmark


def test_smoke_run_reports_every_strategy_per_load_queue_count_and_latency(
    tmp_path: Path,
) -> None:
    report = tmp_path / "renewals.md"
    printed = run_benchmark("renewal_requests.py", "--smoke", "--markdown", str(report))

    assert report.read_text().strip() == printed.strip()
    rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| 1")]
    cells = {(row[0], row[1], row[2]) for row in rows}
    assert cells == {
        (f"| {n}", queues, latency)
        for n in ("10", "100")
        for queues in ("1", "2")
        for latency in ("0 s", "2 s")
    }
    for cell in cells:
        strategies = [row[3] for row in rows if (row[0], row[1], row[2]) == cell]
        assert strategies[:3] == ["floor", "ours (defaults)", ".NET rule"]
    assert "Command: `python benchmarks/renewal_requests.py --smoke" in printed
    assert "Machine: " in printed
