"""Fixtures for the Spark pipeline example's tests.

The example lives in the top-level ``examples`` package, which is not installed;
``python -m pytest`` from the repository root finds it, and so does a bare
``pytest`` thanks to the path entry below.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for all Spark tests, made by the example's own session
    module, so the tests also cover how the worker builds it."""
    pytest.importorskip("pyspark")
    from examples.spark_pipeline import session

    with pytest.MonkeyPatch.context() as patch:
        # Two cores at most: the CI machine is small and the data is tiny.
        patch.setenv("SPARK_MASTER", "local[2]")
        spark_session = session.get_spark()
        yield spark_session
    session.stop_spark()
