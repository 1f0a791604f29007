"""Keeps ``benchmarks/countdowns.py`` working; nothing here is timed."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import run_benchmark


@pytest.mark.integration
def test_smoke_run_delays_only_the_default_sides_countdowns_and_runs_each_once() -> None:
    printed = run_benchmark("countdowns.py", "--smoke")
    assert re.search(r"^\| sent with DelaySeconds \| 0 \| 0 \| 20 \|$", printed, re.M)
    ran = r"^\| tasks run / distinct / duplicates / missing \|( 20 / 20 / 0 / 0 \|){3}$"
    assert re.search(ran, printed, re.M), printed
