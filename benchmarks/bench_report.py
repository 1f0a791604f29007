"""Figures and tables the scenarios of ``worker_throughput.py`` share, so that a number
means the same in every section: medians with their range, ratios against stock's
median, and the machine and versions a report was measured on.
"""

from __future__ import annotations

import collections
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from bench_runs import STOCK, Run, Side

REPO = Path(__file__).resolve().parent.parent
#: The columns of the acks table; everything else (ChangeMessageVisibility included,
#: which neither side should send for a no-op task) is summed as "other".
ACK_ACTIONS = (
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
)
#: The packages whose versions decide the figures, in the order the report lists them.
VERSIONED = ("celery", "kombu", "boto3", "botocore", "moto", "celery-sqs-heartbeat")

K = TypeVar("K", bound=Hashable)


def grouped(runs: Sequence[Run], key: Callable[[Run], K]) -> dict[K, list[Run]]:
    """Runs by ``key``, in the order they were first run, which is the order tables list."""
    groups: dict[K, list[Run]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return groups


def rates(runs: Sequence[Run]) -> list[float]:
    """Only runs that deleted every message have a rate."""
    return [r.rate for r in runs if r.rate is not None]


def spread(values: Sequence[float], digits: int = 2) -> str:
    """Median and range: ``12.3 [11.9..13.0]``, or just the value for a single run."""
    if not values:
        return "n/a"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def ms(latency: float) -> str:
    return f"{latency * 1000:g} ms"


def median_of(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def median_text(values: Sequence[float], digits: int = 2) -> str:
    return "n/a" if not values else f"{statistics.median(values):.{digits}f}"


def ratio_text(mine: float | None, stock: float | None) -> str:
    return "" if mine is None or not stock else f"{mine / stock:.2f}"


def runs_per_cell(runs: Sequence[Run]) -> int:
    """The most runs of one side in one cell: what the report calls runs per cell."""
    counts = collections.Counter((r.latency, r.setup, r.transport) for r in runs)
    return max(counts.values(), default=0)


def acks_table(runs: Sequence[Run], sides: Sequence[Side]) -> str:
    """One row per latency, worker and side; every ratio is a median over stock's median.

    The receive scenario prints the same table, so that its figures read like the acks
    scenario's.
    """
    lines = [
        "| latency | worker | transport | runs | tasks/s | tasks/s vs stock "
        "| requests/task | requests/task vs stock | "
        + " | ".join(ACK_ACTIONS)
        + " | entries per DeleteMessageBatch | other | every task run exactly once "
        "| worker warnings / errors |",
        "|---:|---|---|---:|---:|---:|---:|---:|"
        + "---:|" * len(ACK_ACTIONS)
        + "---:|---:|---|---|",
    ]
    for (latency, setup), group in grouped(runs, lambda r: r.cell).items():
        stock = [r for r in group if r.transport == STOCK.label]
        stock_rate = median_of(rates(stock))
        stock_requests = median_of([r.requests_per_task() for r in stock if r.all_acked])
        for side in sides:
            mine = [r for r in group if r.transport == side.label]
            if mine:
                lines.append(_acks_row(latency, setup, side, mine, stock_rate, stock_requests))
    return "\n".join(lines)


def _acks_row(
    latency: float,
    setup: str,
    side: Side,
    mine: Sequence[Run],
    stock_rate: float | None,
    stock_requests: float | None,
) -> str:
    """Figures come from the runs that deleted every message; the others are only counted."""
    done = [r for r in mine if r.all_acked]
    done_rates = rates(done)
    requests = [r.requests_per_task() for r in done]
    rate_ratio = requests_ratio = ""
    if side is not STOCK:
        rate_ratio = ratio_text(median_of(done_rates), stock_rate)
        requests_ratio = ratio_text(median_of(requests), stock_requests)
    actions = " | ".join(median_text([r.per_task(action) for r in done]) for action in ACK_ACTIONS)
    batch_sizes = [
        r.entries.get("DeleteMessageBatch", 0) / r.calls["DeleteMessageBatch"]
        for r in done
        if r.calls.get("DeleteMessageBatch")
    ]
    unfinished = len(mine) - len(done)
    rate_text = spread(done_rates, 1) + (f"; {unfinished} run(s) unfinished" if unfinished else "")
    return (
        f"| {ms(latency)} | {setup} | {side.label} | {len(mine)} | {rate_text} "
        f"| {rate_ratio} | {spread(requests)} | {requests_ratio} | {actions} "
        f"| {median_text(batch_sizes, 1) if batch_sizes else '-'} "
        f"| {median_text([r.other_per_task(ACK_ACTIONS) for r in done], 3)} "
        f"| {_exactly_once_text(mine)} "
        f"| {', '.join(f'{r.warnings} / {r.errors}' for r in mine)} |"
    )


def _exactly_once_text(runs: Sequence[Run]) -> str:
    bad = [r for r in runs if not r.exactly_once]
    if not bad:
        return "yes"
    return "**NO**: " + "; ".join(f"run {r.order}: {violation(r)}" for r in bad)


def violation(run: Run) -> str:
    parts = []
    if run.missing:
        parts.append(f"{run.missing} of {run.tasks} never ran")
    if run.repeated:
        parts.append(f"{run.repeated} ran more than once")
    if run.unknown:
        parts.append(f"{run.unknown} executions of unknown task ids")
    return ", ".join(parts)


def progress_line(run: Run, exactly_once: bool) -> None:
    """On stderr as each run ends, so that a long session shows where it is, and a
    violation is seen before the report."""
    rate = f"{run.rate:.1f} tasks/s" if run.rate else "not all acked"
    executions = sum(run.executions.values())
    print(
        f"[{run.order:2d}] {run.scenario:10s} {run.setup} {ms(run.latency)} {run.transport:5s} "
        f"{rate}, {executions} executions of {run.tasks} tasks, calls {run.calls}, "
        f"shutdown {run.shutdown_calls}, exit {run.exit_code}, "
        f"{run.warnings} warnings, {run.errors} errors",
        file=sys.stderr,
        flush=True,
    )
    if exactly_once and not run.exactly_once:
        print(
            f"!!! EXACTLY-ONCE VIOLATION in run {run.order} ({run.transport}, {run.setup}, "
            f"{ms(run.latency)}): {violation(run)}; see {run.log}",
            file=sys.stderr,
            flush=True,
        )


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def environment(command: str, elapsed: float) -> str:
    """What a figure depends on besides the code, so that a report can be compared later."""
    return "\n".join(
        [
            f"- command: `{command}`",
            f"- run: {utc_stamp()}, {elapsed:.0f} s in all",
            f"- machine: nproc {_nproc()} ({_cpu_model()}), {platform.system()} "
            f"{platform.release()} {platform.machine()}",
            f"- Python {platform.python_version()}; {_versions()}",
            f"- package: {_package_state()}",
        ]
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _nproc() -> int:
    """What ``nproc`` prints: the CPUs this process may run on, not the machine's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 0


def _git(*args: str) -> str:
    # --no-optional-locks: a status must not rewrite the index others are using.
    done = subprocess.run(
        ["git", "--no-optional-locks", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout if done.returncode == 0 else ""


def _package_state() -> str:
    """The commit under test, and what of the package differs from it (others edit it too)."""
    commit = _git("rev-parse", "--short", "HEAD").strip()
    if not commit:
        return "not a git checkout"
    # Porcelain lines are "XY path"; the status letters may begin with a space.
    changed = [line[3:] for line in _git("status", "--porcelain").splitlines() if line]
    package = [path for path in changed if path.startswith("celery_sqs_heartbeat/")]
    if not changed:
        return f"at {commit}, no local changes"
    text = f"at {commit} with local changes to {', '.join(package) or 'nothing in the package'}"
    others = len(changed) - len(package)
    return text + (f" (and {others} file(s) outside it)" if others else "")


def _versions() -> str:
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)
