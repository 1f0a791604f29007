"""The benchmarks' modules, imported for their unit tests.

The benchmarks are scripts, not a package: their modules import each other from their own
folder, as they do when a script runs, so that folder is on ``sys.path`` while one loads.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def bench_module(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH_DIR))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH_DIR))
