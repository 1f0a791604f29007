"""The ``acks`` scenario: what an ack costs, the issue's targets of at most 0.35 SQS
requests per no-op task and no throughput loss.

A backlog of no-op tasks (300) drained by one worker, at 0 and 15 ms of latency added by
the server to every SQS call, prefork -c 4 and threads -c 8, kombu's defaults otherwise.
The delete is one request per task unless the transport batches it, so requests per task
by action show where ours saves; each "ours" variant (``--variant name=JSON``) runs
against the stock transport in the same session, so that a setting is judged on one
machine state. Every task must run exactly once; a run where one did not makes the
script exit 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from bench_report import (
    acks_table,
    environment,
    grouped,
    median_of,
    ms,
    rates,
    ratio_text,
    runs_per_cell,
    violation,
)
from bench_runs import (
    BASE_OPTIONS,
    LEASE,
    OURS,
    STOCK,
    Plan,
    Run,
    Side,
    alternate,
    backlog,
    backlog_failed,
)
from bench_workers import Bench, Scenario, measure_cells

#: The issue's reference measurement was made with prefork -c 4; threads -c 8 keeps the
#: same 8 slots per core but acks from many threads at once.
SETUPS = ("prefork:4", "threads:8")
LATENCIES = (0.0, 0.015)
#: The issue's target for ours: SQS requests per no-op task (the stock transport: 1.27).
TARGET_REQUESTS_PER_TASK = 0.35


def measure(bench: Bench, plan: Plan) -> list[Run]:
    return measure_cells(
        bench,
        backlog("acks", plan.tasks),
        setups=plan.ack_setups,
        sides=plan.sides,
        reps=plan.reps,
        latencies=plan.latencies,
    )


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=JSON``, as ``--variant`` takes it; stock cannot be one, it has no options."""
    name, sep, options = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=JSON")
    if name.strip() == STOCK.label:
        raise argparse.ArgumentTypeError("'stock' is kombu's transport and takes no options")
    return name.strip(), parse_json_object(options)


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a JSON object")
    return value


def ack_sides(
    ours_options: dict[str, Any], variants: Sequence[tuple[str, dict[str, Any]]]
) -> list[Side]:
    """stock, ours, then each variant; a variant named ``ours`` replaces ours' options.

    ``--ours-options`` applies to ours and to every variant, so that a variant only
    spells out what it changes.
    """
    sides = {STOCK.label: STOCK, OURS.label: Side(OURS.label, OURS.transport, ours_options)}
    for name, options in variants:
        if name in sides and name != OURS.label:
            raise SystemExit(f"--variant {name} given twice")
        sides[name] = Side(name, OURS.transport, {**ours_options, **options})
    return list(sides.values())


def section(runs: Sequence[Run], plan: Plan, elapsed: float) -> str:
    sides = plan.sides
    tasks = runs[0].tasks if runs else 0
    shared = {**BASE_OPTIONS, "visibility_timeout": LEASE}
    own = "; ".join(f"{side.label} {json.dumps(side.options)}" for side in sides if side.options)
    order = ", ".join(side.label for side in alternate(sides, 2))
    parts = [
        "## Ack cost: SQS requests and tasks/s per no-op task, stock transport against ours",
        "",
        environment(plan.command, elapsed),
        f"- workload: {tasks} no-op tasks per run, published before the worker starts; one "
        "`celery worker` per run, task_acks_late, Celery's default prefetch multiplier (4); "
        f"queue VisibilityTimeout {LEASE} s; {runs_per_cell(runs)} run(s) per cell, "
        f"alternated {order}, ...",
        f"- transport options of every side: `{json.dumps(shared)}`"
        + (f"; added for {own}" if own else "; nothing else"),
        "- latency: the server answers every SQS call that much later (concurrent calls "
        "wait in parallel), from the worker's start on",
        "- requests/task: every SQS call the server received from the worker's start until "
        'the last message was deleted, / tasks ("other": every other action, e.g. the '
        "start-up's ListQueues). tasks/s: tasks / (that delete - the first receive that "
        "returned a message), on the server's clock. Median of the runs, [min..max]; the "
        "per-action columns are medians; ratios are median / stock's median.",
        f"- worker logs and record files: {plan.workdir}",
        "",
        acks_table(runs, sides),
        "",
        targets(runs, sides),
    ]
    return "\n".join(parts + _violations(runs))


def _violations(runs: Sequence[Run]) -> list[str]:
    """Named run by run with their deletes and log, so that a failure can be followed up."""
    violations = [r for r in runs if not r.exactly_once or not r.all_acked]
    if not violations:
        return []
    lines = ["", "### VIOLATIONS", ""]
    for r in violations:
        problems = [] if r.all_acked else ["not every message was deleted before the timeout"]
        if not r.exactly_once:
            problems.append(violation(r))
        lines.append(
            f"- run {r.order} ({r.transport}, {r.setup}, {ms(r.latency)}): "
            f"{'; '.join(problems)}; deletes {r.delete_results}; log {r.log}"
        )
    return lines


def targets(runs: Sequence[Run], sides: Sequence[Side]) -> str:
    """The issue's two targets, per side of ours, as median figures."""
    lines = [
        f"Targets: at most {TARGET_REQUESTS_PER_TASK} SQS requests per task "
        "(stock made 1.27 when they were set), and no throughput loss at 0 ms."
    ]
    for side in sides:
        if side is STOCK:
            continue
        cells = []
        for (latency, setup), group in grouped(runs, lambda r: r.cell).items():
            mine = [r for r in group if r.transport == side.label and r.all_acked]
            stock = [r for r in group if r.transport == STOCK.label and r.all_acked]
            requests = median_of([r.requests_per_task() for r in mine])
            if requests is None:
                continue
            verdict = "met" if requests <= TARGET_REQUESTS_PER_TASK else "not met"
            text = f"{setup} at {ms(latency)}: {requests:.2f} requests/task ({verdict})"
            if latency == 0:
                rate = ratio_text(median_of(rates(mine)), median_of(rates(stock)))
                text += f", tasks/s {rate or 'n/a'} x stock"
            cells.append(text)
        lines.append(f"- {side.label}: " + ("; ".join(cells) or "no run deleted every message"))
    return "\n".join(lines)


SCENARIO = Scenario("acks", measure, section, backlog_failed)
