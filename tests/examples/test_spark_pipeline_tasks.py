"""The Celery tasks run in-process (no broker): they chain paths, record executions and
share one Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from examples.spark_pipeline import app, records, session
from examples.spark_pipeline.report import load_executions

pytestmark = pytest.mark.spark


def test_steps_chain_through_paths_and_record_each_execution(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    monkeypatch.setenv(records.RECORD_DIR_ENV, str(record_dir))
    out_dir = str(tmp_path / "data")

    result = app.aggregate(app.transform(app.generate(out_dir, 3_000, seed=5)))

    tables = result["tables"]
    assert tables["orders_raw"]["rows"] == 3_000
    assert 0 < tables["orders_clean"]["rows"] < 3_000
    assert tables["daily_region_revenue"]["rows"] > 0
    assert tables["customer_summary"]["rows"] <= tables["customers"]["rows"]
    for table in tables.values():
        assert spark.read.parquet(table["path"]).count() == table["rows"]

    executions = load_executions(records.read(record_dir / records.EXECUTIONS))
    assert [e.step for e in executions] == list(app.STEPS)
    assert all(e.status == "ok" for e in executions)
    # The test session already exists, so every step reused it.
    assert all(e.session_reused for e in executions)
    assert set(executions[-1].tables) == {
        "daily_region_revenue",
        "top_products",
        "customer_summary",
    }


def test_a_failing_step_is_recorded_as_failed(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(records.RECORD_DIR_ENV, str(tmp_path))
    missing = {"path": str(tmp_path / "missing"), "rows": 0}
    previous = {
        "out_dir": str(tmp_path),
        "tables": {"orders_raw": missing, "customers": missing, "products": missing},
    }
    with pytest.raises(Exception, match=r"PATH_NOT_FOUND|does not exist"):
        app.transform(previous)
    (execution,) = load_executions(records.read(tmp_path / records.EXECUTIONS))
    assert (execution.step, execution.status) == ("transform", "failed")


def test_the_session_is_made_once_per_process(spark: SparkSession) -> None:
    assert session.session_started()
    assert session.get_spark() is session.get_spark() is spark


def test_spark_master_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert session.spark_master() == "local[*]"
    monkeypatch.setenv("SPARK_MASTER", "spark://head:7077")
    assert session.spark_master() == "spark://head:7077"
