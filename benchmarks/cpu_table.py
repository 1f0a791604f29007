"""One run's CPU figures for ``cpu_per_task.py``, and the table of them: medians, ranges,
and each side's ratio to Redis within each round of the alternation."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench_report import spread

#: The side every other side is divided by.
BASELINE = "redis"
MICRO = 1e6


@dataclass(frozen=True)
class CpuRun:
    """One worker's drain of one backlog; CPU in seconds, over the load's window and then
    over as long again with an empty queue."""

    side: str
    order: int
    tasks: int
    window: float
    busy_main: float
    busy_pool: float
    idle_main: float
    idle_pool: float
    exactly_once: bool
    profiled: bool = False

    @property
    def per_task_us(self) -> float:
        return (self.busy_main + self.busy_pool) * MICRO / self.tasks

    @property
    def idle_per_task_us(self) -> float:
        """The idle worker's CPU over the same span, spread over the same tasks."""
        return (self.idle_main + self.idle_pool) * MICRO / self.tasks

    def progress(self) -> str:
        return (
            f"run {self.order} {self.side}: {self.per_task_us:.0f} µs/task "
            f"(main {self.busy_main * MICRO / self.tasks:.0f}, pool "
            f"{self.busy_pool * MICRO / self.tasks:.0f}), {self.window:.2f} s, idle "
            f"{self.idle_per_task_us:.0f} µs/task, exactly once: {self.exactly_once}"
        )


def round_ratios(runs: Sequence[CpuRun], side: str) -> list[float]:
    """``side`` over the baseline in each round of the alternation (one run of each side,
    one after the other on the machine), so that a drift between rounds cancels."""
    sides = list(dict.fromkeys(run.side for run in runs))
    size = len(sides)
    ratios = []
    for start in range(0, len(runs), size):
        by_side = {run.side: run for run in runs[start : start + size]}
        if side in by_side and BASELINE in by_side:
            ratios.append(by_side[side].per_task_us / by_side[BASELINE].per_task_us)
    return ratios


def cpu_table(runs: Sequence[CpuRun]) -> str:
    lines = [
        "| broker | runs | worker CPU µs/task | main | pool | ratio to redis, per round "
        "| idle, same span, µs/task | drain s | tasks exactly once |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for side in dict.fromkeys(run.side for run in runs):
        mine = [run for run in runs if run.side == side]
        ratios = round_ratios(runs, side)
        ratio = f"{spread(ratios)}" if ratios and side != BASELINE else ""
        cells = [
            side,
            str(len(mine)),
            spread([run.per_task_us for run in mine], 0),
            f"{statistics.median(run.busy_main * MICRO / run.tasks for run in mine):.0f}",
            f"{statistics.median(run.busy_pool * MICRO / run.tasks for run in mine):.0f}",
            ratio,
            spread([run.idle_per_task_us for run in mine], 0),
            spread([run.window for run in mine]),
            "yes" if all(run.exactly_once for run in mine) else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if any(run.profiled for run in runs):
        lines.append("\nProfiled by py-spy: the sampler's pauses are in these figures.")
    return "\n".join(lines)
