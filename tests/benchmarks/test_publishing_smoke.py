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
        # Stock: one SendMessage a task; ours: three full calls of ten.
        row = rf"^\| {shape} \| 0 ms \|.*\| 1\.000 \| 0\.100 \| SendMessageBatch 3 \|$"
        assert re.search(row, done.stdout, re.M), done.stdout
