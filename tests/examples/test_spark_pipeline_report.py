"""The report and the timeline, fed hand-made records: no worker, SQS or Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from examples.spark_pipeline import records
from examples.spark_pipeline.report import (
    RUN_INFO,
    SERVER_EVENTS,
    Run,
    format_comparison,
    format_run,
    load_executions,
    load_messages,
    load_run,
)

STEPS = ("generate", "transform", "aggregate")
QUEUE = "spark-pipeline-test-heartbeat"
T0 = 1_700_000_000.0


def _execution(
    task_id: str, step: str, pid: int, start: float, end: float, **extra: Any
) -> list[dict[str, Any]]:
    base = {"task_id": task_id, "step": step, "pid": pid, "worker": f"w{pid % 2 + 1}@host"}
    return [
        {
            **base,
            "event": "start",
            "time": T0 + start,
            "session_reused": extra.get("reused", False),
        },
        {
            **base,
            "event": "end",
            "time": T0 + end,
            "status": extra.get("status", "ok"),
            "tables": extra.get("tables", {}),
        },
    ]


def _receive(task_id: str, step: str, message_id: str, at: float) -> dict[str, Any]:
    return {
        "event": "receive",
        "task_id": task_id,
        "task_name": f"spark_pipeline.{step}",
        "message_id": message_id,
        "time": T0 + at,
    }


def _server(
    action: str, message_id: str, at: float, visibility: int | None = None
) -> dict[str, Any]:
    return {
        "t": T0 + at,
        "action": action,
        "message_id": message_id,
        "queue": QUEUE,
        "visibility": visibility,
        "result": "ok",
    }


def heartbeat_records() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Three steps, each received once, renewed while running, deleted at the end."""
    executions: list[dict[str, Any]] = []
    worker: list[dict[str, Any]] = []
    server: list[dict[str, Any]] = []
    start = 0.0
    for index, step in enumerate(STEPS):
        task, message = f"task-{step}", f"msg-{step}"
        worker.append(_receive(task, step, message, start))
        server.append(_server("receive", message, start, 10))
        for renewal in (5.0, 10.0, 15.0):
            server.append(_server("change_visibility", message, start + renewal, 10))
            worker.append(
                {
                    "event": "renew",
                    "task_id": task,
                    "task_name": step,
                    "renewals": 1,
                    "time": T0 + start + renewal,
                }
            )
        tables = {f"{step}_table": {"path": f"/out/{step}", "rows": 100 * (index + 1)}}
        executions += _execution(
            task, step, 42, start + 0.1, start + 18, reused=index > 0, tables=tables
        )
        server.append(_server("delete", message, start + 18.2))
        start += 20
    return executions, worker, server


def stock_records() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """generate outlives its lease: received again by the second pool process, and each
    run sends its own message for transform."""
    executions = _execution("g", "generate", 1, 0.1, 30) + _execution("g", "generate", 2, 10.1, 40)
    executions += _execution("t", "transform", 1, 30.6, 35) + _execution(
        "t", "transform", 2, 40.6, 45
    )
    executions += _execution("a", "aggregate", 1, 35.6, 38)
    worker = [
        _receive("g", "generate", "m-g", 0),
        _receive("g", "generate", "m-g", 10),
        _receive("t", "transform", "m-t1", 30.5),
        _receive("t", "transform", "m-t2", 40.5),
        _receive("a", "aggregate", "m-a", 35.5),
    ]
    server = [
        _server("receive", "m-g", 0, 10),
        _server("receive", "m-g", 10, 10),
        _server("delete", "m-g", 30.2),
        _server("receive", "m-t1", 30.5, 10),
        _server("delete", "m-t1", 35.2),
        _server("receive", "m-a", 35.5, 10),
        _server("delete", "m-a", 38.2),
        _server("receive", "m-t2", 40.5, 10),
        _server("delete", "m-t2", 45.2),
    ]
    return executions, worker, server


def make_run(
    transport: str, data: tuple[list[Any], list[Any], list[Any]], server: bool = True
) -> Run:
    executions, worker, server_events = data
    return Run(
        transport=transport,
        lease=10,
        started=T0,
        finished=T0 + max(r["time"] for r in executions) - T0 + 0.5,
        executions=load_executions(executions),
        messages=load_messages(worker, server_events if server else None, QUEUE),
        source="server" if server else "worker",
        steps=STEPS,
    )


def test_a_clean_run_is_exactly_once() -> None:
    run = make_run("heartbeat", heartbeat_records())
    assert run.exactly_once()
    assert [run.receives(s) for s in STEPS] == [1, 1, 1]
    assert [run.renewals(s) for s in STEPS] == [3, 3, 3]
    assert all(m.deleted is not None for m in run.messages)
    report = format_run(run)
    assert "EXACTLY ONCE: yes - 3 steps, 3 executions, 3 SQS receives, 9 lease renewals" in report
    assert "Ran on 1 worker: w1@host: generate, transform, aggregate" in report
    assert "Spark sessions: 1 started (in 1 worker process), reused by 2 later tasks" in report
    assert "aggregate_table" in report and "300 rows" in report


def test_worker_records_alone_give_the_same_counts() -> None:
    """On real SQS there is no server log: receives and renewals come from the worker."""
    run = make_run("heartbeat", heartbeat_records(), server=False)
    assert run.source == "worker"
    assert run.exactly_once()
    assert [run.renewals(s) for s in STEPS] == [3, 3, 3]


def test_redeliveries_and_duplicate_messages_are_counted_per_step() -> None:
    run = make_run("stock", stock_records())
    assert not run.exactly_once()
    assert run.completed()
    assert [len(run.executions_of(s)) for s in STEPS] == [2, 2, 1]
    assert [run.receives(s) for s in STEPS] == [2, 2, 1]
    assert run.duplicate_executions() == 2
    assert run.duplicated_seconds() == pytest.approx((40 - 10.1) + (45 - 40.6))
    report = format_run(run)
    assert "EXACTLY ONCE: no - 2 duplicate executions" in report
    assert (
        "Ran on 2 workers: w2@host: generate, transform, aggregate; w1@host: generate, transform"
        in report
    )
    assert "2 redeliveries" in report


def test_a_run_that_never_finished_says_so() -> None:
    executions, worker, server = heartbeat_records()
    run = make_run("heartbeat", (executions[:-1], worker, server))
    assert not run.completed()
    assert not run.exactly_once()
    assert "the pipeline did not finish" in format_run(run)


def test_events_of_other_queues_and_failed_calls_are_ignored() -> None:
    executions, worker, server = heartbeat_records()
    noise = [
        {**_server("receive", "msg-generate", 1), "queue": "someone-else"},
        {**_server("change_visibility", "msg-generate", 2, 10), "result": "MessageNotInflight"},
    ]
    run = make_run("heartbeat", (executions, worker, server + noise))
    assert run.receives("generate") == 1
    assert run.renewals("generate") == 3


def test_comparison_puts_both_transports_side_by_side() -> None:
    text = format_comparison(
        make_run("heartbeat", heartbeat_records()), make_run("stock", stock_records())
    )
    lines = text.splitlines()
    assert [line.split() for line in lines if line.strip().startswith("generate ")] == [
        ["generate", "1", "1", "2", "2"]
    ]
    assert re.search(r"kombu stock SQS\s+2 duplicate executions", text)
    assert re.search(r"celery_sqs_heartbeat\s+0 duplicate executions", text)
    # The stock run's fake executions wrote no tables: every output is flagged.
    assert re.search(r"generate_table\s+100\s+missing\s+<< DIFFERENT", text)


def test_comparison_flags_outputs_whose_row_counts_differ() -> None:
    executions, worker, server = heartbeat_records()
    corrupted = [dict(r) for r in executions]
    corrupted[-1] = {**corrupted[-1], "tables": {"aggregate_table": {"path": "/x", "rows": 7}}}
    text = format_comparison(
        make_run("heartbeat", (executions, worker, server)),
        make_run("stock", (corrupted, worker, server)),
    )
    assert re.search(r"transform_table\s+200\s+200\n", text)
    assert re.search(r"aggregate_table\s+300\s+7\s+<< DIFFERENT", text)


def test_comparison_flags_tables_written_with_several_row_counts() -> None:
    """Two successful runs of one step writing different counts: one read the other's
    half-written files. The last write is what is on disk."""
    executions, worker, server = stock_records()
    executions = [dict(r) for r in executions]
    written = iter([10, 12])
    for record in executions:
        if record["event"] == "end" and record["task_id"] == "t":
            record["tables"] = {"clean": {"path": "/c", "rows": next(written)}}
    stock = make_run("stock", (executions, worker, server))
    assert stock.row_counts_written("clean") == [10, 12]
    assert stock.output_tables()["clean"]["rows"] == 12
    text = format_comparison(make_run("heartbeat", heartbeat_records()), stock)
    assert re.search(r"clean\s+missing\s+12\s+<< DIFFERENT\s+<< also written as 10", text)


def test_a_run_directory_loads_back(tmp_path: Path) -> None:
    executions, worker, server = heartbeat_records()
    for record in executions:
        records.append(tmp_path / records.EXECUTIONS, record)
    for record in worker:
        records.append(tmp_path / records.WORKER_EVENTS, record)
    (tmp_path / SERVER_EVENTS).write_text(json.dumps(server))
    info = {
        "transport": "heartbeat",
        "lease": 10,
        "queue": QUEUE,
        "started": T0,
        "finished": T0 + 60,
        "timed_out": False,
    }
    (tmp_path / RUN_INFO).write_text(json.dumps(info))
    run = load_run(tmp_path, STEPS)
    assert run.exactly_once()
    assert run.source == "server"


def test_a_partly_written_last_record_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / records.EXECUTIONS
    records.append(path, {"event": "start", "time": 1})
    with path.open("a") as file:
        file.write('{"event": "end", "ti')
    assert records.read(path) == [{"event": "start", "time": 1}]
    assert records.read(tmp_path / "missing.jsonl") == []


def test_timeline_png_is_written_for_both_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from examples.spark_pipeline.timeline import write_timeline

    runs = [make_run("heartbeat", heartbeat_records()), make_run("stock", stock_records())]
    path = write_timeline(runs, tmp_path / "sub" / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
