"""What happened in a demo run, measured from records, and the report that says so.

Three independent sources go in:

* the executions the tasks recorded themselves (``records.EXECUTIONS``): how many
  times each step really ran, where, how long, and what it wrote;
* the worker's receive, lease and ack events (``records.WORKER_EVENTS``), which map
  SQS message ids to Celery task ids;
* when the demo ran its embedded SQS server, that server's own log of every receive,
  visibility change and delete, which does not rely on the transport reporting
  honestly about itself.

Nothing here starts processes or touches SQS, so it is unit-tested on hand-made records.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.spark_pipeline import records

#: Task names per step, as the app registers them.
TASK_PREFIX = "spark_pipeline."

#: Written by the demo next to the worker's records: the run's transport, lease,
#: queue and clock, and (embedded server only) the server's event log.
RUN_INFO = "run.json"
SERVER_EVENTS = "sqs-server-events.json"


@dataclass
class Execution:
    """One run of one step, as the task recorded it."""

    task_id: str
    step: str
    pid: int
    start: float
    #: The Celery worker's node name: which of several workers ran it.
    worker: str = ""
    end: float | None = None
    status: str | None = None
    session_reused: bool = False
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class Message:
    """One SQS message: each time it was received, renewed, released and deleted."""

    message_id: str
    task_id: str
    step: str
    receives: list[float] = field(default_factory=list)
    #: ``(time, visibility)`` of each successful renewal of the lease.
    renewals: list[tuple[float, int]] = field(default_factory=list)
    releases: list[float] = field(default_factory=list)
    lost: list[float] = field(default_factory=list)
    deleted: float | None = None


@dataclass
class Run:
    """One pipeline run on one transport."""

    transport: str
    lease: int
    started: float
    finished: float
    executions: list[Execution]
    messages: list[Message]
    #: ``"server"`` when the SQS server's own log backs the receive and renewal
    #: counts, ``"worker"`` when only the worker's records do (real SQS).
    source: str
    steps: tuple[str, ...]
    timed_out: bool = False

    def executions_of(self, step: str) -> list[Execution]:
        return [e for e in self.executions if e.step == step]

    def messages_of(self, step: str) -> list[Message]:
        return [m for m in self.messages if m.step == step]

    def receives(self, step: str) -> int:
        return sum(len(m.receives) for m in self.messages_of(step))

    def renewals(self, step: str) -> int:
        return sum(len(m.renewals) for m in self.messages_of(step))

    def completed(self) -> bool:
        """Whether the last step finished successfully at least once."""
        return any(e.status == "ok" for e in self.executions_of(self.steps[-1]))

    def exactly_once(self) -> bool:
        """Every step ran once, succeeded, and SQS delivered its message once."""
        return self.completed() and all(
            len(self.executions_of(step)) == 1
            and self.executions_of(step)[0].status == "ok"
            and self.receives(step) == 1
            for step in self.steps
        )

    def duplicate_executions(self) -> int:
        return sum(max(0, len(self.executions_of(step)) - 1) for step in self.steps)

    def duplicated_seconds(self) -> float:
        """Compute spent on executions beyond each step's first."""
        total = 0.0
        for step in self.steps:
            for execution in sorted(self.executions_of(step), key=lambda e: e.start)[1:]:
                end = execution.end if execution.end is not None else self.finished
                total += end - execution.start
        return total

    def _successful(self, step: str) -> list[Execution]:
        """The step's successful executions, in the order they finished."""
        done = [e for e in self.executions_of(step) if e.status == "ok"]
        return sorted(done, key=lambda e: e.end or 0.0)

    def output_tables(self) -> dict[str, dict[str, Any]]:
        """The tables as the last successful write of each left them, in step order."""
        tables: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            for execution in self._successful(step):
                tables.update(execution.tables)
        return tables

    def row_counts_written(self, table: str) -> list[int]:
        """Every distinct row count a successful execution wrote for ``table``.

        One run of a step writes one count. Several successful runs writing different
        counts from the same input means they read or wrote each other's half-written
        files.
        """
        counts: list[int] = []
        for step in self.steps:
            for execution in self._successful(step):
                rows = execution.tables.get(table, {}).get("rows")
                if rows is not None and rows not in counts:
                    counts.append(rows)
        return counts


def step_of(task_name: str) -> str:
    return task_name[len(TASK_PREFIX) :] if task_name.startswith(TASK_PREFIX) else task_name


def load_executions(records: Iterable[Mapping[str, Any]]) -> list[Execution]:
    """Pair each execution's start and end record (an execution without an end is
    still running, or died with its process)."""
    executions: list[Execution] = []
    open_by_key: dict[tuple[str, int], Execution] = {}
    for record in sorted(records, key=lambda r: r["time"]):
        key = (record["task_id"], record["pid"])
        if record["event"] == "start":
            execution = Execution(
                task_id=record["task_id"],
                step=record["step"],
                pid=record["pid"],
                start=record["time"],
                worker=record.get("worker", ""),
                session_reused=bool(record.get("session_reused")),
            )
            executions.append(execution)
            open_by_key[key] = execution
        elif record["event"] == "end" and key in open_by_key:
            execution = open_by_key.pop(key)
            execution.end = record["time"]
            execution.status = record["status"]
            execution.tables = record.get("tables") or {}
    return executions


def load_messages(
    worker_events: Iterable[Mapping[str, Any]],
    server_events: Sequence[Mapping[str, Any]] | None,
    queue: str,
) -> list[Message]:
    """Each SQS message of the run, from the server's log when there is one.

    The worker's receive records say which task a message carries. With a server
    log, receives, renewals, releases and the delete come from the server (a
    visibility change to 0 is a release, anything else that succeeded a renewal).
    Without one, they come from the worker's own records: a renewal or release is
    attributed to the task's most recently received message, and the delete is the
    message's last ack (SQS only promises that a delete with the latest receipt
    handle removes a message, and a later receive gives a later ack).
    """
    messages: dict[str, Message] = {}
    events = sorted(worker_events, key=lambda r: r["time"])
    for record in events:
        if record["event"] != "receive" or not record.get("message_id"):
            continue
        message = messages.get(record["message_id"])
        if message is None:
            message = Message(record["message_id"], record["task_id"], step_of(record["task_name"]))
            messages[message.message_id] = message
        if server_events is None:
            message.receives.append(record["time"])
    if server_events is None:
        _apply_worker_lease_events(events, messages)
    else:
        _apply_server_events(server_events, queue, messages)
    return sorted(messages.values(), key=lambda m: m.receives[0] if m.receives else 0.0)


def _apply_worker_lease_events(
    events: Sequence[Mapping[str, Any]], messages: Mapping[str, Message]
) -> None:
    latest_by_task: dict[str, Message] = {}
    for record in events:
        if record["event"] == "receive" and record.get("message_id") in messages:
            latest_by_task[record["task_id"]] = messages[record["message_id"]]
            continue
        if record["event"] == "ack" and record.get("message_id") in messages:
            messages[record["message_id"]].deleted = record["time"]
            continue
        message = latest_by_task.get(record.get("task_id", ""))
        if message is None:
            continue
        if record["event"] == "renew":
            message.renewals.append((record["time"], 0))
        elif record["event"] == "release":
            message.releases.append(record["time"])
        elif record["event"] == "lost":
            message.lost.append(record["time"])


def _apply_server_events(
    server_events: Sequence[Mapping[str, Any]], queue: str, messages: Mapping[str, Message]
) -> None:
    for event in sorted(server_events, key=lambda e: e["t"]):
        message = messages.get(event.get("message_id") or "")
        if message is None or not str(event.get("queue", "")).endswith(queue):
            continue
        if event["result"] != "ok":
            continue
        if event["action"] == "receive":
            message.receives.append(event["t"])
        elif event["action"] == "change_visibility":
            if event.get("visibility"):
                message.renewals.append((event["t"], int(event["visibility"])))
            else:
                message.releases.append(event["t"])
        elif event["action"] == "delete" and message.deleted is None:
            message.deleted = event["t"]


def load_run(directory: Path, steps: tuple[str, ...]) -> Run:
    """Rebuild a run from the files the worker and the demo left in ``directory``."""
    info = json.loads((directory / RUN_INFO).read_text())
    server_path = directory / SERVER_EVENTS
    server_events = json.loads(server_path.read_text()) if server_path.exists() else None
    return Run(
        transport=info["transport"],
        lease=info["lease"],
        started=info["started"],
        finished=info["finished"],
        executions=load_executions(records.read(directory / records.EXECUTIONS)),
        messages=load_messages(
            records.read(directory / records.WORKER_EVENTS), server_events, info["queue"]
        ),
        source="server" if server_events is not None else "worker",
        steps=steps,
        timed_out=info["timed_out"],
    )


def _count(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _step_took(run: Run, step: str) -> str:
    durations = [e.seconds for e in run.executions_of(step) if e.seconds is not None]
    if not durations:
        return "not finished"
    if len(durations) == 1:
        return _seconds(durations[0])
    return f"{_seconds(min(durations))} .. {_seconds(max(durations))}"


def _transport_title(run: Run) -> str:
    names = {"heartbeat": "celery_sqs_heartbeat", "stock": "kombu's stock SQS transport"}
    return f"{names.get(run.transport, run.transport)}, lease {run.lease} s"


def format_run(run: Run) -> str:
    """The report for one run: per-step counts, the verdict, sessions and output."""
    receive_source = "SQS server log" if run.source == "server" else "worker records"
    lines = [
        f"Pipeline on {_transport_title(run)}: {run.finished - run.started:.1f} s in total",
        "",
        f"  {'step':<11}{'runs':>5}{'SQS receives':>14}{'renewals':>10}   took",
    ]
    for step in run.steps:
        lines.append(
            f"  {step:<11}{len(run.executions_of(step)):>5}{run.receives(step):>14}"
            f"{run.renewals(step):>10}   {_step_took(run, step)}"
        )
    lines.append(f"  (runs: the tasks' own records; receives and renewals: {receive_source})")
    lines.append("")
    if run.exactly_once():
        lines.append(
            f"  EXACTLY ONCE: yes - {len(run.steps)} steps, {len(run.executions)} executions, "
            f"{sum(run.receives(s) for s in run.steps)} SQS receives, "
            f"{sum(run.renewals(s) for s in run.steps)} lease renewals"
        )
    else:
        reasons = []
        if run.duplicate_executions():
            reasons.append(
                f"{_count(run.duplicate_executions(), 'duplicate execution')} "
                f"({run.duplicated_seconds():.0f} s of repeated Spark work)"
            )
        failed = sum(1 for e in run.executions if e.status == "failed")
        if failed:
            reasons.append(f"{_count(failed, 'execution')} failed (see the worker logs)")
        if not run.completed():
            reasons.append("the pipeline did not finish")
        if run.timed_out:
            reasons.append("stopped at the time limit")
        extra_receives = sum(max(0, run.receives(s) - 1) for s in run.steps)
        if extra_receives:
            reasons.append(_count(extra_receives, "redelivery", "redeliveries"))
        lines.append(f"  EXACTLY ONCE: no - {'; '.join(reasons) or 'see the counts above'}")
    lines.append(f"  {_workers_line(run)}")
    lines.append(f"  {_sessions_line(run)}")
    tables = run.output_tables()
    if tables:
        lines.append("")
        lines.append("  Output (Parquet):")
        width = max(len(name) for name in tables)
        for name, table in tables.items():
            lines.append(f"    {name:<{width}} {table['rows']:>12,} rows  {table['path']}")
    return "\n".join(lines)


def _workers_line(run: Run) -> str:
    """Which worker ran which step: with several workers on one queue, any may take any."""
    by_worker: dict[str, list[str]] = {}
    for execution in sorted(run.executions, key=lambda e: e.start):
        by_worker.setdefault(execution.worker or "?", []).append(execution.step)
    ran = "; ".join(f"{worker}: {', '.join(steps)}" for worker, steps in by_worker.items())
    return f"Ran on {_count(len(by_worker), 'worker')}: {ran}"


def _sessions_line(run: Run) -> str:
    started = Counter(e.pid for e in run.executions if not e.session_reused)
    reused = sum(1 for e in run.executions if e.session_reused)
    return (
        f"Spark sessions: {sum(started.values())} started "
        f"(in {_count(len(started), 'worker process', 'worker processes')}), "
        f"reused by {_count(reused, 'later task')}"
    )


def format_comparison(heartbeat: Run, stock: Run) -> str:
    """Both transports side by side: how often each step ran and was delivered, and
    whether they produced the same output.

    The data is a pure function of ``--rows`` and ``--seed``, so both runs must write
    the same row counts; a difference means duplicate runs corrupted the output (one
    run reading files that another was overwriting).
    """
    lines = [
        f"Same pipeline, same {heartbeat.lease} s lease, side by side",
        "",
        f"  {'':<11}{'celery_sqs_heartbeat':^24}{'kombu stock SQS':^24}",
        f"  {'step':<11}{'runs':>8}{'receives':>12}{'':<4}{'runs':>8}{'receives':>12}",
    ]
    for step in heartbeat.steps:
        lines.append(
            f"  {step:<11}{len(heartbeat.executions_of(step)):>8}{heartbeat.receives(step):>12}"
            f"{'':<4}{len(stock.executions_of(step)):>8}{stock.receives(step):>12}"
        )
    lines.append("")
    for run in (heartbeat, stock):
        name = "celery_sqs_heartbeat" if run.transport == "heartbeat" else "kombu stock SQS"
        finished = "finished" if run.completed() else "did NOT finish"
        if run.timed_out:
            finished += " (stopped at the time limit)"
        lines.append(
            f"  {name:<21} {run.duplicate_executions():>3} duplicate executions, "
            f"{run.duplicated_seconds():>6.0f} s repeated Spark work, "
            f"{run.finished - run.started:>6.1f} s wall clock, {finished}"
        )
    lines += ["", "  Rows written (same rows and seed: they must match)", ""]
    lines.append(f"  {'table':<22}{'celery_sqs_heartbeat':>20}{'kombu stock SQS':>18}")
    ours, theirs = heartbeat.output_tables(), stock.output_tables()
    for name in {**ours, **theirs}:
        mine = ours.get(name, {}).get("rows")
        other = theirs.get(name, {}).get("rows")
        flag = "" if mine == other else "   << DIFFERENT"
        others = [c for c in stock.row_counts_written(name) if c != other]
        if others:
            flag += f"   << also written as {', '.join(_rows(c) for c in others)}"
        lines.append(f"  {name:<22}{_rows(mine):>20}{_rows(other):>18}{flag}")
    return "\n".join(lines)


def _rows(count: int | None) -> str:
    return "missing" if count is None else f"{count:,}"
