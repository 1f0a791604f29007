"""Keeps ``benchmarks/large_payloads.py`` working; nothing here is timed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_smoke_run_counts_the_s3_requests_of_each_size() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "large_payloads.py"), "--smoke"],
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
    small = re.search(r"^\| 100 kB \|.* \| none \|$", done.stdout, re.M)
    large = re.search(r"^\| 1 MiB \|.* / 1\.00 \|.*GetObject 1\.00", done.stdout, re.M)
    assert small and large, done.stdout
