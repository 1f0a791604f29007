"""The ``receive`` scenario: the issue's throughput workload at kombu's defaults
(``wait_time_seconds`` 10, ``polling_interval`` 1, prefetch multiplier 4).

A backlog of no-op tasks drained by prefork -c 4, threads -c 8 and gevent -c 8, at 0 and
15 ms per SQS call: tasks/s and SQS requests per task, as in the acks scenario. Then the
ReceiveMessage calls of the idle worker, because a faster receive loop must not poll an
empty queue more often than kombu does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from bench_report import (
    acks_table,
    environment,
    grouped,
    median_of,
    ms,
    rates,
    runs_per_cell,
    spread,
)
from bench_runs import LEASE, OURS, STOCK, Plan, Run, backlog, backlog_failed
from bench_workers import Bench, Scenario, measure_cells

#: Only what both sides must have is set, so that everything else is kombu's default.
KOMBU_DEFAULT_OPTIONS: dict[str, Any] = {"region": "us-east-1", "is_secure": False}
SETUPS = ("prefork:4", "threads:8", "gevent:8")
#: Seconds the worker is left idle after the backlog, its ReceiveMessage calls counted.
IDLE = 20.0
#: The issue's target for ours at 15 ms per call: tasks/s against the stock transport's.
TARGET_SPEEDUP = 4.0


def measure(bench: Bench, plan: Plan) -> list[Run]:
    """With ``--task-seconds`` each task sleeps, so that it can fill the prefetch window."""
    workload = dataclasses.replace(
        backlog("receive", plan.tasks),
        task="sleep_for" if plan.task_seconds else "noop",
        args=(plan.task_seconds,) if plan.task_seconds else (),
        base_options=KOMBU_DEFAULT_OPTIONS,
        idle=plan.idle,
        probes=plan.probes,
    )
    return measure_cells(
        bench,
        workload,
        setups=plan.receive_setups,
        sides=plan.sides,
        reps=plan.reps,
        latencies=plan.latencies,
    )


def section(runs: Sequence[Run], plan: Plan, elapsed: float) -> str:
    tasks = runs[0].tasks if runs else 0
    shared = {**KOMBU_DEFAULT_OPTIONS, "visibility_timeout": LEASE}
    kind = f"{plan.task_seconds:g} s" if plan.task_seconds else "no-op"
    return "\n".join(
        [
            f"## Receive: tasks/s and SQS requests per {kind} task at kombu's defaults",
            "",
            environment(plan.command, elapsed),
            f"- workload: {tasks} {kind} tasks per run, published before the worker starts; "
            "one `celery worker` per run, task_acks_late, prefetch multiplier 4; queue "
            f"VisibilityTimeout {LEASE} s; {runs_per_cell(runs)} run(s) per cell, alternated "
            "stock, ours, ours, stock, ...",
            f"- transport options of both sides: `{json.dumps(shared)}`: kombu's defaults "
            "otherwise (`wait_time_seconds` 10, `polling_interval` 1)",
            "- latency: the server answers every SQS call that much later, from the worker's "
            "start on. tasks/s and requests/task as in the acks table; idle: ReceiveMessage "
            "calls per minute while the worker sat with an empty queue after the backlog.",
            f"- worker logs and record files: {plan.workdir}",
            "",
            acks_table(runs, plan.sides),
            "",
            idle_table(runs),
            "",
            start_latency_table(runs),
            "",
            speedup(runs),
        ]
    )


def idle_table(runs: Sequence[Run]) -> str:
    lines = [
        "| latency | worker | transport | idle ReceiveMessage per minute | other idle calls |",
        "|---:|---|---|---:|---|",
    ]
    for (latency, setup, transport), group in grouped(
        runs, lambda r: (r.latency, r.setup, r.transport)
    ).items():
        idle = [r for r in group if r.idle_seconds]
        per_minute = [60 * r.idle_calls.get("ReceiveMessage", 0) / r.idle_seconds for r in idle]
        others = sorted({a for r in idle for a in r.idle_calls if a != "ReceiveMessage"})
        lines.append(
            f"| {ms(latency)} | {setup} | {transport} | {spread(per_minute, 1)} "
            f"| {', '.join(others) or 'none'} |"
        )
    return "\n".join(lines)


def start_latency_table(runs: Sequence[Run]) -> str:
    """Publish-to-start on the idle worker, every probe of a cell's runs pooled."""
    lines = [
        "| latency | worker | transport | probes | publish-to-start p50 (ms) | p99 (ms) |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for (latency, setup, transport), group in grouped(
        runs, lambda r: (r.latency, r.setup, r.transport)
    ).items():
        latencies = sorted(t for r in group for t in r.start_latencies)
        if not latencies:
            continue
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]
        lines.append(
            f"| {ms(latency)} | {setup} | {transport} | {len(latencies)} "
            f"| {1000 * p50:.1f} | {1000 * p99:.1f} |"
        )
    return "\n".join(lines)


def speedup(runs: Sequence[Run]) -> str:
    """The issue's target: ours at least 4x stock's tasks/s with 15 ms per call."""
    lines = [f"Target: ours at least {TARGET_SPEEDUP:g}x stock's tasks/s at 15 ms per call."]
    for (latency, setup), group in grouped(runs, lambda r: r.cell).items():
        ours = median_of(rates([r for r in group if r.transport == OURS.label]))
        stock = median_of(rates([r for r in group if r.transport == STOCK.label]))
        if ours is None or not stock:
            continue
        verdict = ""
        if latency == 0.015:
            verdict = " (met)" if ours / stock >= TARGET_SPEEDUP else " (not met)"
        lines.append(f"- {setup} at {ms(latency)}: {ours / stock:.2f}x{verdict}")
    return "\n".join(lines)


SCENARIO = Scenario("receive", measure, section, backlog_failed)
