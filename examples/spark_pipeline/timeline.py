"""A PNG timeline of a run: one row per SQS message, from receive to delete.

Per message: when SQS had it hidden (the lease, grown by each renewal), when a
worker was running its task, and every receive, renewal, release and delete. Where
a task was still running but its lease had run out, the row turns red: that is the
moment SQS hands the message to another worker. With ``--compare`` both transports
are drawn one above the other on the same time scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from examples.spark_pipeline.report import Execution, Message, Run

STEP_COLOURS = ("#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD")
LEASE_COLOUR = "#DDE6F2"
EXPOSED_COLOUR = "#D62728"
#: How each SQS event is marked on its message's row, by its name in the legend.
EVENT_MARKERS: dict[str, dict[str, Any]] = {
    "received": {"marker": "v", "color": "black", "markersize": 7},
    "lease renewed": {"marker": "|", "color": "#1F3A93", "markersize": 14, "markeredgewidth": 1.6},
    "released": {"marker": "X", "color": "#FF7F0E", "markersize": 8},
    "lease lost": {"marker": "x", "color": EXPOSED_COLOUR, "markersize": 9},
    "acked (deleted)": {"marker": "D", "color": "#2CA02C", "markersize": 7},
}
TITLES = {
    "heartbeat": "celery_sqs_heartbeat: lease renewed until ack",
    "stock": "kombu stock SQS transport: lease runs out mid-task",
}


def lease_intervals(message: Message, lease: int, end: float) -> list[tuple[float, float]]:
    """When SQS kept ``message`` hidden: from each receive or renewal to its expiry.

    Overlapping spans are merged; nothing extends past the delete (or ``end``).
    """
    stop = message.deleted if message.deleted is not None else end
    raw = sorted(
        [(t, t + lease) for t in message.receives]
        + [(t, t + (visibility or lease)) for t, visibility in message.renewals]
    )
    merged: list[tuple[float, float]] = []
    for start, finish in raw:
        finish = min(finish, stop)
        if start >= finish:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], finish))
        else:
            merged.append((start, finish))
    return merged


def exposed_intervals(
    running: tuple[float, float], hidden: Sequence[tuple[float, float]], deleted: float | None
) -> list[tuple[float, float]]:
    """Parts of ``running`` not covered by ``hidden``: a task running on a visible message.

    Once the message is deleted nothing can receive it any more, so the exposure ends
    there even if a duplicate execution goes on running.
    """
    start, finish = running
    if deleted is not None:
        finish = min(finish, deleted)
    exposed: list[tuple[float, float]] = []
    cursor = start
    for h_start, h_finish in sorted(hidden):
        if h_finish <= cursor or h_start >= finish:
            continue
        if h_start > cursor:
            exposed.append((cursor, h_start))
        cursor = max(cursor, h_finish)
    if cursor < finish:
        exposed.append((cursor, finish))
    return exposed


def marker_times(message: Message) -> dict[str, list[float]]:
    """When each kind of event in ``EVENT_MARKERS`` happened to ``message``."""
    return {
        "received": message.receives,
        "lease renewed": [t for t, _ in message.renewals],
        "released": message.releases,
        "lease lost": message.lost,
        "acked (deleted)": [] if message.deleted is None else [message.deleted],
    }


def _executions_by_message(run: Run) -> dict[str, list[Execution]]:
    """Attach each execution to the message whose receive started it: the latest
    receive of a message for the same task before the execution began."""
    receives = sorted((t, m.message_id, m.task_id) for m in run.messages for t in m.receives)
    result: dict[str, list[Execution]] = {m.message_id: [] for m in run.messages}
    for execution in sorted(run.executions, key=lambda e: e.start):
        candidates = [
            message_id
            for t, message_id, task_id in receives
            if task_id == execution.task_id and t <= execution.start + 0.5
        ]
        if candidates:
            result[candidates[-1]].append(execution)
    return result


def _draw_run(ax: Axes, run: Run, origin: float) -> None:
    steps = list(run.steps)
    by_message = _executions_by_message(run)
    labels: list[str] = []
    for row, message in enumerate(run.messages):
        colour = STEP_COLOURS[steps.index(message.step) % len(STEP_COLOURS)]
        executions = by_message[message.message_id]
        # A message of a run cut short was never acked: its last execution ending
        # (or the run's end) bounds its spans instead.
        gone = message.deleted
        if gone is None:
            gone = max((e.end or run.finished for e in executions), default=run.finished)
        hidden = lease_intervals(message, run.lease, gone)
        for start, finish in hidden:
            ax.barh(row, finish - start, left=start - origin, height=0.8, color=LEASE_COLOUR)
        # Executions of one message overlap in time, so each gets its own lane.
        lane = 0.5 / max(1, len(executions))
        for index, execution in enumerate(executions):
            running = (
                execution.start,
                execution.end if execution.end is not None else run.finished,
            )
            y = row - 0.25 + lane * (index + 0.5)
            ax.barh(
                y,
                running[1] - running[0],
                left=running[0] - origin,
                height=lane * 0.85,
                color=colour,
            )
            if execution.status == "failed":
                ax.annotate(
                    "failed",
                    (running[1] - origin, y),
                    xytext=(8, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                    color="#B00000",
                )
            for start, finish in exposed_intervals(running, hidden, gone):
                ax.barh(
                    y,
                    finish - start,
                    left=start - origin,
                    height=lane * 0.85,
                    color=EXPOSED_COLOUR,
                    hatch="///",
                    edgecolor="white",
                    linewidth=0,
                )
        for event, times in marker_times(message).items():
            if times:
                ax.plot(
                    [t - origin for t in times],
                    [row] * len(times),
                    linestyle="",
                    **EVENT_MARKERS[event],
                )
        times = "" if len(message.receives) < 2 else f", received {len(message.receives)}x"
        labels.append(f"{message.step} [{message.message_id[:6]}]{times}")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.4, -0.6)
    runs = len(run.executions)
    ax.set_title(
        f"{TITLES.get(run.transport, run.transport)} (lease {run.lease} s): "
        f"{runs} task executions for {len(steps)} steps",
        loc="left",
        fontsize=10,
    )
    ax.grid(axis="x", color="#EEEEEE")
    ax.set_axisbelow(True)


def _legend_handles() -> list[Line2D | Patch]:
    return [
        Patch(color=LEASE_COLOUR, label="hidden by SQS (lease)"),
        Patch(color=STEP_COLOURS[0], label="task running (colour = step)"),
        Patch(
            facecolor=EXPOSED_COLOUR,
            hatch="///",
            edgecolor="white",
            label="running while visible: SQS redelivers",
        ),
        *(
            Line2D([], [], linestyle="", label=event, **style)
            for event, style in EVENT_MARKERS.items()
        ),
    ]


def write_timeline(runs: Sequence[Run], path: Path) -> Path:
    """Draw ``runs`` one above the other on a shared time axis and save a PNG."""
    heights = [max(1, len(run.messages)) for run in runs]
    # A bare Figure renders with Agg and leaves pyplot's global state alone, so this
    # works on machines without a display and inside other programs.
    fig = Figure(figsize=(12, 1.6 + 0.45 * sum(heights) + 0.9 * len(runs)))
    axes = fig.subplots(
        len(runs), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for index, run in enumerate(runs):
        _draw_run(axes[index, 0], run, origin=run.started)
    # Shared axes: set the range once, wide enough for the longest run.
    axes[-1, 0].set_xlim(-1.0, max(run.finished - run.started for run in runs) * 1.02 + 1.0)
    axes[-1, 0].set_xlabel("seconds since the pipeline was sent")
    fig.legend(
        handles=_legend_handles(),
        loc="lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
