"""Keeps ``benchmarks/publishing.py`` working; nothing here is timed."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import run_benchmark


@pytest.mark.integration
def test_smoke_run_compares_both_sides_in_both_shapes_and_counts_the_requests() -> None:
    printed = run_benchmark("publishing.py", "--tasks", "30", "--latency", "0")
    for shape in ("loop", "group"):
        # Stock: one SendMessage a task. Ours: SendMessageBatch calls only, three if every
        # call was full; a call also leaves once its first message waited 50 ms, so a
        # producer slowed by the machine's load sends more, never one a task.
        row = rf"^\| {shape} \| 0 ms \|.*\| 1\.000 \| ([0-9.]+) \| SendMessageBatch (\d+) \|$"
        found = re.search(row, printed, re.M)
        assert found, printed
        calls = int(found.group(2))
        assert 3 <= calls < 30, printed
        assert float(found.group(1)) == pytest.approx(calls / 30, abs=0.001), printed
