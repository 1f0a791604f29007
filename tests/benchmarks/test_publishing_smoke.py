"""Keeps ``benchmarks/publishing.py`` working; nothing here is timed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_smoke_run_compares_both_sides_in_both_shapes_and_counts_the_requests() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "publishing.py"),
            "--tasks",
            "30",
            "--latency",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    for shape in ("loop", "group"):
        # Stock: one SendMessage a task. Ours: SendMessageBatch calls only, three if every
        # call was full; a call also leaves once its first message waited 50 ms, so a
        # producer slowed by the machine's load sends more, never one a task.
        row = rf"^\| {shape} \| 0 ms \|.*\| 1\.000 \| ([0-9.]+) \| SendMessageBatch (\d+) \|$"
        found = re.search(row, done.stdout, re.M)
        assert found, done.stdout
        calls = int(found.group(2))
        assert 3 <= calls < 30, done.stdout
        assert float(found.group(1)) == pytest.approx(calls / 30, abs=0.001), done.stdout
