"""The ``long`` scenario: tasks that outlive the lease (8 x 12 s on a 5 s lease, prefork
-c 4), the case the heartbeat exists for.

The worker runs for a fixed window, then gets SIGTERM (a warm shutdown lets running
tasks finish). Executions are counted from the file every execution appends to, not
from logs: with the stock transport SQS hands the message out again while it runs, and
those duplicate runs are the finding.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench_report import spread
from bench_runs import OURS, STOCK, TRANSPORTS, Plan, Run, Setup, Workload
from bench_workers import Bench, Scenario, measure_cells

SETUP = Setup("prefork -c 4", "prefork", 4)
TASKS = 8
TASK_SECONDS = 12.0
LEASE = 5


def measure(bench: Bench, plan: Plan) -> list[Run]:
    workload = Workload(
        "long",
        "sleep_for",
        (TASK_SECONDS,),
        TASKS,
        LEASE,
        timeout=plan.window,
        window=plan.window,
    )
    return measure_cells(bench, workload, setups=[SETUP], sides=[STOCK, OURS], reps=plan.long_reps)


def section(runs: Sequence[Run], plan: Plan, elapsed: float) -> str:
    return (
        f"Long tasks: {TASKS} x {TASK_SECONDS:g} s, lease {LEASE} s, {SETUP.label}, "
        f"worker stopped after {plan.window:g} s\n\n" + long_table(runs)
    )


def failed(run: Run) -> bool:
    """Stock is expected to run tasks twice here; ours must run each exactly once."""
    return run.transport == OURS.label and set(_padded(run)) != {1}


def long_table(runs: Sequence[Run]) -> str:
    lines = [
        "| transport | runs | tasks | executions (all runs) | executions per task "
        "| tasks run >1 time | all acked after (s) | CMVBatch calls (entries) | CMV calls "
        "| worker warnings / errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for transport in TRANSPORTS:
        mine = [r for r in runs if r.transport == transport]
        if mine:
            lines.append(_long_row(transport, mine))
    return "\n".join(lines)


def _long_row(transport: str, mine: Sequence[Run]) -> str:
    per_task = [n for r in mine for n in _padded(r)]
    repeated = sum(1 for n in per_task if n > 1)
    acked = [r.seconds for r in mine if r.seconds is not None]
    acked_text = spread(acked, 1)
    if len(acked) != len(mine):
        acked_text += f"; {len(mine) - len(acked)} run(s) never acked all"
    batch_calls = [float(r.calls.get("ChangeMessageVisibilityBatch", 0)) for r in mine]
    batch_entries = [float(r.entries.get("ChangeMessageVisibilityBatch", 0)) for r in mine]
    single = [float(r.calls.get("ChangeMessageVisibility", 0)) for r in mine]
    return (
        f"| {transport} | {len(mine)} | {mine[0].tasks} | {sum(per_task)} "
        f"| min {min(per_task)}, median {statistics.median(per_task):g}, max {max(per_task)} "
        f"| {repeated} of {len(per_task)} | {acked_text} "
        f"| {spread(batch_calls, 0)} ({spread(batch_entries, 0)}) | {spread(single, 0)} "
        f"| {', '.join(f'{r.warnings} / {r.errors}' for r in mine)} |"
    )


def _padded(run: Run) -> list[int]:
    """Executions per task, with 0 for tasks that never ran, so that they count too."""
    counts = sorted(run.executions.values(), reverse=True)
    return counts + [0] * max(0, run.tasks - len(counts))


SCENARIO = Scenario("long", measure, section, failed)
