"""Keeps ``benchmarks/reconnect_memory.py`` working; nothing here is timed, and no memory
figure is asserted: the table and the slope it gives are."""

from __future__ import annotations

import importlib
import re
import sys
from types import ModuleType

import pytest

from tests.benchmarks.scripts import BENCHMARKS, run_benchmark


@pytest.fixture(scope="module")
def rm() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("reconnect_memory")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_steady_growth_per_drop_is_its_slope(rm: ModuleType) -> None:
    assert rm.slope([100.0, 112.0, 124.0, 136.0]) == pytest.approx(12.0)
    assert rm.slope([130.0, 128.0, 130.0, 128.0]) == pytest.approx(-0.4)
    assert rm.slope([130.0]) == 0.0


def test_a_row_gives_the_levels_and_the_growth_after_the_tenth_drop(rm: ModuleType) -> None:
    levels = [90.0, *[120.0] * 9, 125.0, 126.0, 127.0]
    assert rm.row("solo", levels) == "| solo | 12 | 90 | 120 | 125 | 127 | +1.00 |"
    assert rm.row("solo", [90.0, 100.0]) == "| solo | 1 | 90 | - | - | 100 | +0.00 |"


@pytest.mark.integration
def test_smoke_run_reads_the_memory_after_each_reconnect() -> None:
    printed = run_benchmark("reconnect_memory.py", "--pools", "solo", "--drops", "2")
    assert re.search(r"^\| solo \| 2 \| \d+ \| - \| - \| \d+ \| \+0\.00 \|$", printed, re.M), (
        printed
    )
