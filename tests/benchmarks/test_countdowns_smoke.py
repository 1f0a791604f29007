"""Keeps ``benchmarks/countdowns.py`` working; nothing here is timed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_smoke_run_delays_only_the_default_sides_countdowns_and_runs_each_once() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "countdowns.py"), "--smoke"],
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
    assert re.search(r"^\| sent with DelaySeconds \| 0 \| 0 \| 20 \|$", done.stdout, re.M)
    ran = r"^\| tasks run / distinct / duplicates / missing \|( 20 / 20 / 0 / 0 \|){3}$"
    assert re.search(ran, done.stdout, re.M), done.stdout
