"""The ``throughput`` scenario: a backlog of no-op tasks, drained by one worker (prefork
-c 2, threads -c 4, and prefork -c 2 without kombu's ``polling_interval``).

Timed on the server, from the first ReceiveMessage that returned a message to the
DeleteMessage (the late ack) of the last one; SQS calls are counted from the worker's
start to that moment and divided by the number of tasks, so that a transport that
renews or polls more shows it per task.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench_report import grouped, median_of, rates, ratio_text, spread
from bench_runs import LEASE, OURS, STOCK, TRANSPORTS, Plan, Run, Setup, Workload
from bench_workers import Bench, Scenario, measure_cells

SETUPS = (
    Setup("prefork -c 2", "prefork", 2),
    Setup("threads -c 4", "threads", 4),
    # kombu waits polling_interval (1 s by default) whenever the prefetch window is full,
    # which caps prefork at one window per second for both transports; without that wait
    # the transports themselves are compared.
    Setup("prefork -c 2, polling_interval 0", "prefork", 2, {"polling_interval": 0}),
)


def measure(bench: Bench, plan: Plan) -> list[Run]:
    workload = Workload("throughput", "noop", (), plan.tasks, LEASE, timeout=180.0)
    return measure_cells(bench, workload, setups=SETUPS, sides=[STOCK, OURS], reps=plan.reps)


def section(runs: Sequence[Run], plan: Plan, elapsed: float) -> str:
    return (
        f"Throughput: {plan.tasks} no-op tasks per run, lease {LEASE} s, wait_time_seconds 1"
        "\n\n" + throughput_table(runs)
    )


def failed(run: Run) -> bool:
    return not run.all_acked


def throughput_table(runs: Sequence[Run]) -> str:
    lines = [
        "| worker | transport | runs | tasks/s | ours/stock | Receive/task | Delete/task "
        "| DeleteBatch/task | CMVBatch calls/task (entries) | CMV/task | other/task "
        "| worker warnings |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pool, group in grouped(runs, lambda r: r.setup).items():
        by_transport = grouped(group, lambda r: r.transport)
        ours_ratio = ratio_text(
            median_of(rates(by_transport.get("ours", []))),
            median_of(rates(by_transport.get("stock", []))),
        )
        for transport in TRANSPORTS:
            mine = by_transport.get(transport)
            if mine:
                ratio = ours_ratio if transport == "ours" else ""
                lines.append(_throughput_row(pool, transport, mine, ratio))
    return "\n".join(lines)


def _throughput_row(pool: str, transport: str, mine: Sequence[Run], ratio: str) -> str:
    batch_entries = [r.entries.get("ChangeMessageVisibilityBatch", 0) / r.tasks for r in mine]
    return (
        f"| {pool} | {transport} | {len(mine)} | {spread(rates(mine), 1)} | {ratio} "
        f"| {spread([r.per_task('ReceiveMessage') for r in mine])} "
        f"| {spread([r.per_task('DeleteMessage') for r in mine])} "
        f"| {spread([r.per_task('DeleteMessageBatch') for r in mine])} "
        f"| {spread([r.per_task('ChangeMessageVisibilityBatch') for r in mine], 3)} "
        f"({spread(batch_entries, 3)}) "
        f"| {spread([r.per_task('ChangeMessageVisibility') for r in mine], 3)} "
        f"| {spread([r.other_per_task() for r in mine], 3)} "
        f"| {', '.join(str(r.warnings) for r in mine)} |"
    )


SCENARIO = Scenario("throughput", measure, section, failed)
