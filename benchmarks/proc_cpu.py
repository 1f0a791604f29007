"""The CPU a process and its children have used, read from ``/proc`` (Linux only).

``cpu_per_task.py`` reads it in the worker (when the load is let in) and from outside
(when the load is done); both read the same counters, so the difference is the worker's.
A prefork pool's children live as long as the worker, so their own counters cover the
window; ``cutime`` would only count children that have exited and been waited for.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/PID/stat`` line after the command name, which may itself
    hold spaces and parentheses: field 3 (state) is the first of them."""
    return stat[stat.rindex(")") + 2 :].split()


def cpu_ticks(stat: str) -> int:
    """User plus system time (fields 14 and 15) in clock ticks."""
    fields = stat_fields(stat)
    return int(fields[11]) + int(fields[12])


def parent_pid(stat: str) -> int:
    return int(stat_fields(stat)[1])


def _stat(pid: int) -> str | None:
    try:
        return (PROC / str(pid) / "stat").read_text()
    except OSError:  # it exited between the listing and the read
        return None


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and parent_pid(stat) == pid:
                found.append(int(entry.name))
    return sorted(found)


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of each of its live children, by pid."""
    seconds = {}
    for each in [pid, *children(pid)]:
        stat = _stat(each)
        if stat is not None:
            seconds[each] = cpu_ticks(stat) / TICKS_PER_SECOND
    return seconds
