"""Keeps ``benchmarks/cpu_per_task.py`` working; nothing here is timed.

Redis is compared only where the ``bench`` extra and a ``redis-server`` are installed;
the two SQS sides run everywhere the tests extra does.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_benchmark

HAS_REDIS = bool(shutil.which("redis-server") and importlib.util.find_spec("redis"))
SIDES = ["redis", "ours", "stock"] if HAS_REDIS else ["ours", "stock"]


@pytest.mark.integration
def test_smoke_run_drains_every_side_once_with_each_task_run_once(tmp_path: Path) -> None:
    printed = run_benchmark(
        "cpu_per_task.py", "--smoke", "--sides", *SIDES, "--workdir", str(tmp_path)
    )
    rows = re.findall(r"^\| (\w+) \| 1 \| \d+ \| \d+ \| \d+ \|.*\| (\w+) \|$", printed, re.M)
    assert rows == [(side, "yes") for side in SIDES], printed
    # Each side's worker reads its CPU when let in, and every task's execution is recorded.
    assert len(list(tmp_path.glob("*.cpu"))) == len(SIDES)
    for records in tmp_path.glob("*.jsonl"):
        assert len(records.read_text().splitlines()) == 20
