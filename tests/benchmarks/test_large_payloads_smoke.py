"""Keeps ``benchmarks/large_payloads.py`` working; nothing here is timed."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import run_benchmark


@pytest.mark.integration
def test_smoke_run_counts_the_s3_requests_of_each_size() -> None:
    printed = run_benchmark("large_payloads.py", "--smoke")
    small = re.search(r"^\| 100 kB \|.* \| none \|$", printed, re.M)
    large = re.search(r"^\| 1 MiB \|.* / 1\.00 \|.*GetObject 1\.00", printed, re.M)
    assert small and large, printed
