"""Workers that stop before their tasks end: SIGKILL, cold shutdown, and SQS's hold limit.

Every count here comes from the tasks' own records (one JSON line per finished run) and
from the strict SQS server's per-message event log, never from the worker's word.

A worker that should report the lease signals it sends imports this module
(``CELERY_WORKER_INCLUDE``, Celery's environment spelling of ``--include``) with
``IT_LEASE_SIGNAL_FILE`` set: it then writes one JSON line per ``lease_lost`` and
``lease_released`` to that file.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.integration.harness import (
    UNDELAYED,
    Bed,
    Sent,
    Worker,
    no_copy_left,
    process_gone,
    report,
    send_recorded,
    wait_for,
    wait_out_copies,
)
from tests.integration.sqs_reads import releases

BUSY = "tests.integration.app.busy"

#: The lease of the SIGKILL and hold-limit scenarios; tasks run several of them.
LEASE = 4
#: The queue's own visibility timeout: a message that came back after this long was left
#: to the queue's setting, not to the lease the transport asks for.
QUEUE_VISIBILITY = 60
#: How much later than its lease a message may reach the other worker: that worker's
#: long poll turn, stretched by a loaded 2-core machine. Only a failure guard of one more
#: lease: that nothing hid the message longer, the event log shows (no visibility change
#: but of one lease before the kill, no event at all between the kill and the receive).
RECEIVE_SLACK = LEASE
#: The lease of the cold-shutdown scenarios, long so that "released" and "expired" differ.
COLD_LEASE = 30
#: Only a failure guard on how soon after a shutdown the other worker has the released
#: messages: the shutdown's own work is in it, which a loaded machine stretches. That
#: they were released, not left to expire, the event log shows (:func:`lease_end`).
HANDOVER_SECONDS = 10.0
#: The server limit of the hold-limit scenarios, SQS's 12 hours scaled down.
SHORT_HOLD = 12

LEASE_SIGNAL_FILE = os.environ.get("IT_LEASE_SIGNAL_FILE")
if LEASE_SIGNAL_FILE:  # imported by a worker, see the module docstring
    from celery_sqs_heartbeat import signals as lease_signals

    def _write_lease_signal(signal: Any, sender: Any, **fields: Any) -> None:
        assert LEASE_SIGNAL_FILE is not None
        with open(LEASE_SIGNAL_FILE, "a") as out:
            out.write(json.dumps({"signal": signal.name, "t": time.time(), **fields}) + "\n")

    lease_signals.lease_lost.connect(_write_lease_signal, weak=False)
    lease_signals.lease_released.connect(_write_lease_signal, weak=False)


def start(stack: ExitStack, bed: Bed, pool: str, concurrency: int, name: str, **env: Any) -> Worker:
    """A worker that is stopped (or, past 30 s, killed) when ``stack`` closes."""
    process = Worker(bed, pool, concurrency, name, bed.env(**env))
    stack.callback(process.warm_shutdown, 30)
    return process


def lease_signal_env(bed: Bed, name: str) -> dict[str, str]:
    return {
        "CELERY_WORKER_INCLUDE": "tests.integration.test_worker_stops",
        "IT_LEASE_SIGNAL_FILE": str(bed.logs / f"lease-signals-{name}.jsonl"),
    }


def lease_signals_of(bed: Bed, name: str) -> list[dict[str, Any]]:
    path = bed.logs / f"lease-signals-{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def received(process: Worker, task: Sent) -> bool:
    return f"Task {BUSY}[{task.task_id}] received" in process.log


def events_of(bed: Bed, task: Sent) -> list[dict[str, Any]]:
    return [dict(e) for e in bed.server.events() if e["message_id"] == task.message_id]


def of_action(events: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [e for e in events if e["action"] == action]


def lease_end(events: list[dict[str, Any]], at: float) -> float:
    """When the lease held at ``at`` was to end: its last receive or renewal, plus its length.

    The strict server hands a message out again no sooner, unless it was released.
    """
    hides = [
        e
        for e in events
        if e["action"] in ("receive", "change_visibility") and e["result"] == "ok" and e["t"] < at
    ]
    return float(hides[-1]["t"] + hides[-1]["visibility"])


def deleted(bed: Bed, *tasks: Sent) -> bool:
    return all(
        any(e["result"] == "ok" for e in of_action(events_of(bed, task), "delete"))
        for task in tasks
    )


def calls_since(bed: Bed, before: dict[str, int]) -> dict[str, int]:
    now = bed.server.calls()
    return {action: now[action] - before.get(action, 0) for action in sorted(now)}


def watch_until_gone(pids: list[int], timeout: float) -> float:
    """Poll until every pid has exited; when the last one was seen gone."""
    deadline = time.monotonic() + timeout
    while not all(process_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"pool processes {pids} outlived their worker"
        time.sleep(0.02)
    return time.time()


def kill_leftovers(pids: list[int]) -> None:
    """SIGKILL pool processes of a worker of this test that outlived it."""
    for pid in pids:
        try:
            # Still a celery process, not a new one that reuses the pid.
            ours = b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if ours and not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------
# 1. SIGKILL mid-task
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_sigkill_mid_task_hands_the_message_to_another_worker_within_one_lease(
    bed: Bed, pool: str
) -> None:
    bed.create_queue(visibility_timeout=QUEUE_VISIBILITY)
    options = {"visibility_timeout": LEASE}
    calls_before = bed.server.calls()
    with ExitStack() as stack:
        workers = {name: start(stack, bed, pool, 1, name, options=options) for name in "ab"}
        for process in workers.values():
            process.wait_ready()
        task = send_recorded(bed, "busy", "killed", 4 * LEASE)
        victim_name = wait_for(
            lambda: next((n for n, w in workers.items() if received(w, task)), None),
            30,
            "the receive",
        )
        victim = workers[victim_name]
        [survivor_name] = set(workers) - {victim_name}
        survivor = workers[survivor_name]
        received_at = of_action(events_of(bed, task), "receive")[0]["t"]
        # Killed once the task has outlived its first lease, which was renewed meanwhile.
        wait_for(
            lambda: (
                time.time() > received_at + LEASE + 0.5
                and of_action(events_of(bed, task), "change_visibility")
            ),
            30,
            "a renewal",
        )
        assert bed.executions() == [], "the task ended before the kill"
        pool_pids = victim.pool_pids()
        assert len(pool_pids) == (1 if pool == "prefork" else 0), pool_pids
        stack.callback(kill_leftovers, pool_pids)
        victim.kill(signal.SIGKILL)
        killed_at = time.time()
        assert victim.process.wait(10) == -signal.SIGKILL
        # Celery's prefork children die with their parent (PR_SET_PDEATHSIG).
        pool_gone_at = watch_until_gone(pool_pids, timeout=5)
        runs = bed.wait_for_executions(1, timeout=LEASE + RECEIVE_SLACK + 4 * LEASE + 30)
        # A pool process that outlived the kill would have finished before the survivor.
        runs = bed.wait_for_executions(2, timeout=2)
        wait_for(lambda: deleted(bed, task), 10, "the delete")
        survivor_alive = survivor.process.poll() is None
        survivor_log = survivor.log
    events = events_of(bed, task)
    receives = of_action(events, "receive")
    changes = of_action(events, "change_visibility")
    back_after = receives[1]["t"] - killed_at if len(receives) > 1 else None
    renewed_until = lease_end(events, killed_at)
    report(
        f"sigkill/{pool}",
        sent=1,
        executed=len(runs),
        runs_per_task=bed.runs_per_task(),
        receives=len(receives),
        renewals_before_kill=sum(e["t"] < killed_at for e in changes),
        renewals_after=sum(e["t"] > killed_at for e in changes),
        deletes=len(of_action(events, "delete")),
        kill_to_next_receive=back_after and round(back_after, 2),
        lease_end_to_next_receive=back_after and round(receives[1]["t"] - renewed_until, 2),
        pool_gone_after=round(pool_gone_at - killed_at, 2) if pool_pids else "-",
        calls=calls_since(bed, calls_before),
    )
    assert bed.runs_per_task() == {task.task_id: 1}
    [run] = runs
    assert run["worker"] == survivor_name
    assert run["outcome"] == "ok"
    assert len(receives) == 2, events
    # Held by the victim until the kill, renewed at least once: the task outlived a lease.
    assert receives[0]["t"] < killed_at < receives[1]["t"], events
    assert any(e["t"] < killed_at for e in changes), events
    # Back within one lease: the victim renewed for one lease at a time, nothing hid the
    # message after the kill, and the survivor's poll took it once that lease ran out.
    # Counted from the kill instead, what was left of the lease, up to all of it, would
    # eat into the slack of the survivor's poll.
    assert {e["visibility"] for e in changes if e["t"] < killed_at} == {LEASE}, events
    assert [e for e in events if killed_at < e["t"] < receives[1]["t"]] == [], events
    assert receives[1]["t"] - renewed_until <= RECEIVE_SLACK, events
    assert all(e["result"] == "ok" for e in events), events
    assert [e["action"] for e in events][-1] == "delete", events
    assert len(of_action(events, "delete")) == 1, events
    assert survivor_alive, survivor_log
    assert "Lost the SQS lease" not in survivor_log
    assert "Traceback" not in survivor_log


# ---------------------------------------------------------------------------------------
# 2. Cold shutdown
# ---------------------------------------------------------------------------------------

RUNNING_SECONDS = 15
COUNTDOWN_SECONDS = 15


class Held(NamedTuple):
    running: Sent
    unstarted: list[Sent]
    first: Worker
    pool_pids: list[int]
    countdown_due: float


def hold_a_running_task_and_prefetched_ones(
    stack: ExitStack, bed: Bed, env: dict[str, str]
) -> Held:
    """Worker "a" runs one long task and holds three prefetched and one countdown task."""
    bed.create_queue(visibility_timeout=QUEUE_VISIBILITY)
    first = start(
        stack,
        bed,
        "prefork",
        1,
        "a",
        options={"visibility_timeout": COLD_LEASE},
        IT_PREFETCH_MULTIPLIER=8,
        **lease_signal_env(bed, "a"),
        **env,
    )
    first.wait_ready()
    running = send_recorded(bed, "busy", "running", RUNNING_SECONDS)
    wait_for(lambda: received(first, running), 30, "the running task")
    unstarted = [send_recorded(bed, "busy", f"waiting-{n}", 0.1) for n in range(3)]
    countdown_due = time.time() + COUNTDOWN_SECONDS
    unstarted.append(
        send_recorded(
            bed,
            "busy",
            "countdown",
            0.1,
            countdown=COUNTDOWN_SECONDS,
            transport_options=UNDELAYED,
        )
    )
    wait_for(lambda: all(received(first, task) for task in unstarted), 30, "the prefetch")
    pool_pids = first.pool_pids()
    assert len(pool_pids) == 1, pool_pids
    stack.callback(kill_leftovers, pool_pids)
    return Held(running, unstarted, first, pool_pids, countdown_due)


def start_second(stack: ExitStack, bed: Bed) -> Worker:
    second = start(
        stack,
        bed,
        "threads",
        4,
        "b",
        options={"visibility_timeout": COLD_LEASE},
        IT_PREFETCH_MULTIPLIER=2,
    )
    second.wait_ready()
    return second


COLD_SHUTDOWNS = [
    pytest.param(["SIGQUIT"], {}, id="sigquit"),
    # Celery 5.5+: REMAP_SIGTERM=SIGQUIT turns SIGTERM into a cold shutdown.
    pytest.param(["SIGTERM"], {"REMAP_SIGTERM": "SIGQUIT"}, id="sigterm-remapped"),
    # A SIGQUIT during a warm shutdown turns it cold.
    pytest.param(["SIGTERM", "SIGQUIT"], {}, id="sigterm-then-sigquit"),
]


@pytest.mark.parametrize(("signals", "env"), COLD_SHUTDOWNS)
def test_cold_shutdown_releases_unstarted_messages_at_once(
    bed: Bed, signals: list[str], env: dict[str, str]
) -> None:
    calls_before = bed.server.calls()
    with ExitStack() as stack:
        held = hold_a_running_task_and_prefetched_ones(stack, bed, env)
        second = start_second(stack, bed)
        assert bed.executions() == [], "the running task ended before the shutdown"
        for n, name in enumerate(signals):
            if n:
                time.sleep(1)
            held.first.kill(getattr(signal, name))
        shutdown_at = time.time()
        child_gone_at = watch_until_gone(held.pool_pids, timeout=30)
        first_exit = held.first.process.wait(30)
        everything = [held.running, *held.unstarted]
        runs = bed.wait_for_executions(len(everything), timeout=COLD_LEASE + RUNNING_SECONDS + 30)
        wait_for(lambda: deleted(bed, *everything), 10, "the deletes")
        drained = no_copy_left(bed)["drained"]
        runs = wait_out_copies(bed, len(everything), RUNNING_SECONDS)
        second_alive = second.process.poll() is None
        first_log, second_log = held.first.log, second.log
    by_task = {run["task_id"]: run for run in runs}
    events = {task: events_of(bed, task) for task in everything}

    def back_after(task: Sent) -> float | None:
        later = [e["t"] for e in of_action(events[task], "receive") if e["t"] > shutdown_at]
        return round(later[0] - shutdown_at, 2) if later else None

    report(
        f"cold/{'+'.join(signals)}",
        sent=len(everything),
        executed=len(runs),
        duplicates=sum(n - 1 for n in bed.runs_per_task().values()),
        lost=sum(task.task_id not in by_task for task in everything),
        first_exit=first_exit,
        pool_gone_after=round(child_gone_at - shutdown_at, 2),
        running_released=[round(e["t"] - shutdown_at, 2) for e in releases(events[held.running])],
        running_back_after=back_after(held.running),
        unstarted_back_after=[back_after(task) for task in held.unstarted],
        releases=sum(len(releases(e)) for e in events.values()),
        calls=calls_since(bed, calls_before),
    )
    assert drained, first_log + second_log
    assert bed.runs_per_task() == {task.task_id: 1 for task in everything}, first_log
    # The running task was killed in "a" before it could finish; it ran whole in "b".
    assert {run["worker"] for run in runs} == {"b"}, runs
    # Held for its countdown in "b" too, not run early.
    assert by_task[held.unstarted[-1].task_id]["start"] >= held.countdown_due - 0.5
    for task in held.unstarted:
        # Released, not expired: "b" has it before the lease "a" held could have run out.
        assert [e["result"] for e in releases(events[task])] == ["ok"], events[task]
        [release] = releases(events[task])
        taken_at = of_action(events[task], "receive")[-1]["t"]
        assert release["t"] < taken_at < lease_end(events[task], release["t"]), events[task]
        came_back = back_after(task)
        assert came_back is not None and came_back <= HANDOVER_SECONDS, events[task]
    came_back = back_after(held.running)
    assert came_back is not None and came_back <= COLD_LEASE + RECEIVE_SLACK, events
    for release in releases(events[held.running]):
        # Releasing the running task is safe only once the process that ran it is dead.
        assert release["t"] >= child_gone_at, (release, child_gone_at)
    for task in everything:
        # One receive by "a", one by "b": nothing swallowed the released message on the way.
        receives = of_action(events[task], "receive")
        assert [e["t"] > shutdown_at for e in receives] == [False, True], events[task]
        assert receives[-1]["t"] <= by_task[task.task_id]["start"]
        assert [e["action"] for e in events[task]][-1] == "delete", events[task]
    released = {s["task_id"] for s in lease_signals_of(bed, "a") if s["signal"] == "lease_released"}
    assert {task.task_id for task in held.unstarted} <= released
    assert second_alive, second_log
    assert "Traceback" not in second_log


def test_a_second_sigterm_is_still_a_warm_shutdown(bed: Bed) -> None:
    """Celery 5.5+ no longer escalates a repeated SIGTERM (without REMAP_SIGTERM).

    Each SIGTERM only sets the warm shutdown flag again, and worker_soft_shutdown_timeout
    defaults to 0. So the running task ends in "a", and the prefetched messages go to
    "b" when the channel closes, right after the pool has drained.
    """
    calls_before = bed.server.calls()
    with ExitStack() as stack:
        held = hold_a_running_task_and_prefetched_ones(stack, bed, {})
        second = start_second(stack, bed)
        assert bed.executions() == [], "the running task ended before the shutdown"
        held.first.kill(signal.SIGTERM)
        time.sleep(1)
        held.first.kill(signal.SIGTERM)
        shutdown_at = time.time()
        first_exit = held.first.process.wait(RUNNING_SECONDS + 30)
        everything = [held.running, *held.unstarted]
        runs = bed.wait_for_executions(len(everything), timeout=COUNTDOWN_SECONDS + 30)
        wait_for(lambda: deleted(bed, *everything), 10, "the deletes")
        drained = no_copy_left(bed)["drained"]
        runs = wait_out_copies(bed, len(everything), RUNNING_SECONDS)
        second_alive = second.process.poll() is None
        first_log, second_log = held.first.log, second.log
    by_task = {run["task_id"]: run for run in runs}
    events = {task: events_of(bed, task) for task in everything}
    [running_deleted] = of_action(events[held.running], "delete")
    # The pool has drained when the running task ends. Its delete and the releases of the
    # unstarted ones then go out side by side, in either order.
    drained_at = by_task[held.running.task_id]["end"]

    def back_after_drain(task: Sent) -> float | None:
        later = [e["t"] for e in of_action(events[task], "receive") if e["t"] > shutdown_at]
        return round(later[0] - drained_at, 2) if later else None

    report(
        "warm/SIGTERM+SIGTERM",
        sent=len(everything),
        executed=len(runs),
        duplicates=sum(n - 1 for n in bed.runs_per_task().values()),
        lost=sum(task.task_id not in by_task for task in everything),
        first_exit=first_exit,
        running_done_after=round(running_deleted["t"] - shutdown_at, 2),
        unstarted_back_after_drain=[back_after_drain(task) for task in held.unstarted],
        calls=calls_since(bed, calls_before),
    )
    assert first_log.count("Warm shutdown") == 2, first_log
    assert "Cold shutdown" not in first_log
    assert first_exit == 0
    assert drained, first_log + second_log
    assert bed.runs_per_task() == {task.task_id: 1 for task in everything}
    assert by_task[held.running.task_id]["worker"] == "a"
    assert releases(events[held.running]) == [], events[held.running]
    for task in held.unstarted:
        assert by_task[task.task_id]["worker"] == "b"
        assert len(of_action(events[task], "receive")) == 2, events[task]
        assert [e["result"] for e in releases(events[task])] == ["ok"], events[task]
        [release] = releases(events[task])
        taken_at = of_action(events[task], "receive")[-1]["t"]
        assert release["t"] < taken_at < lease_end(events[task], release["t"]), events[task]
        came_back = back_after_drain(task)
        assert came_back is not None and 0 < came_back <= HANDOVER_SECONDS, events[task]
    assert second_alive, second_log


# ---------------------------------------------------------------------------------------
# 3. SQS's hold limit, scaled down on a server of its own
# ---------------------------------------------------------------------------------------


def run_past_the_hold_limit(bed: Bed, options: dict[str, Any]) -> tuple[Sent, str, bool, Sent]:
    """One long task on one worker, then a short one to show the worker still consumes."""
    bed.create_queue(visibility_timeout=QUEUE_VISIBILITY)
    with ExitStack() as stack:
        process = start(
            stack,
            bed,
            "threads",
            1,
            "w1",
            options={"visibility_timeout": LEASE, **options},
            **lease_signal_env(bed, "w1"),
        )
        process.wait_ready()
        task = send_recorded(bed, "busy", "held", SHORT_HOLD + LEASE)
        bed.wait_for_executions(1, timeout=SHORT_HOLD + LEASE + 30)
        after = send_recorded(bed, "busy", "after", 0.1)
        bed.wait_for_executions(2, timeout=30)
        wait_for(lambda: deleted(bed, task, after), 10, "the deletes")
        alive = process.process.poll() is None
        log = process.log
    return task, log, alive, after


def after_the_last_renewal(
    events: list[dict[str, Any]], last: dict[str, Any], again: list[dict[str, Any]]
) -> None:
    """After the last renewal, nothing but the ack's delete, which lands.

    The lease ran out while the task still ran, so the worker's next poll, as the ack
    frees its slot, may receive the message again before the delete lands. Then it is
    deleted by that receipt and not run again (the callers check the runs).
    """
    later = [e for e in events if e["t"] > last["t"]]
    assert len(again) <= 1, events
    assert {e["action"] for e in later} <= {"receive", "delete"}, events
    assert later[-1]["action"] == "delete" and later[-1]["result"] == "ok", events


def test_visibility_extension_max_under_the_servers_limit_caps_the_last_renewal(
    short_hold_bed: Bed,
) -> None:
    bed = short_hold_bed
    maximum = SHORT_HOLD - 2
    task, log, alive, after = run_past_the_hold_limit(bed, {"visibility_extension_max": maximum})
    events = events_of(bed, task)
    receive, *again = of_action(events, "receive")
    changes = of_action(events, "change_visibility")
    report(
        "hold/capped",
        runs_per_task=bed.runs_per_task(),
        renewals=[(round(e["t"] - receive["t"], 2), e["visibility"], e["result"]) for e in changes],
        hidden_until=round(changes[-1]["t"] + changes[-1]["visibility"] - receive["t"], 2),
        warnings=log.count("Stopped renewing the SQS lease"),
    )
    assert bed.runs_per_task() == {task.task_id: 1, after.task_id: 1}
    # A delete by the receipt the later receive replaced is "stale": see after_the_last_renewal.
    assert all(e["result"] in ("ok", "stale") for e in events), events
    assert all(e["result"] == "ok" for e in changes), events
    assert len(changes) >= 3, events
    *full, capped = changes
    assert {e["visibility"] for e in full} == {LEASE}, events
    assert 1 <= capped["visibility"] < LEASE, events
    # The last renewal ends the hold at the cap, inside the server's limit.
    assert capped["t"] + capped["visibility"] <= receive["t"] + maximum + 0.5, events
    # After the capped renewal, only the ack's delete; see after_the_last_renewal.
    after_the_last_renewal(events, capped, again)
    assert log.count("Stopped renewing the SQS lease") == 1, log
    assert f"Stopped renewing the SQS lease of task {BUSY}[{task.task_id}]" in log
    assert "Lost the SQS lease" not in log
    assert lease_signals_of(bed, "w1") == []
    assert alive, log
    assert "Traceback" not in log


def test_a_server_limit_below_the_workers_reads_as_the_hold_limit_once(short_hold_bed: Bed) -> None:
    """SQS refuses a renewal past its 12 hours ("beyond the limit"), here scaled down.

    The refusal is told apart from a stale receipt handle (issue 24, item 4): the lease
    reached SQS's limit, as a capped one does, and is not reported lost.
    """
    bed = short_hold_bed
    task, log, alive, after = run_past_the_hold_limit(bed, {})
    events = events_of(bed, task)
    receive, *again = of_action(events, "receive")
    changes = of_action(events, "change_visibility")
    refused = [e for e in changes if e["result"] != "ok"]
    report(
        "hold/refused",
        runs_per_task=bed.runs_per_task(),
        renewals=[(round(e["t"] - receive["t"], 2), e["visibility"], e["result"]) for e in changes],
        warnings=log.count("Stopped renewing the SQS lease"),
    )
    assert bed.runs_per_task() == {task.task_id: 1, after.task_id: 1}
    assert [e["result"] for e in refused] == ["InvalidParameterValue"], events
    # The refusal is the last word on this message until the ack: no retry storm.
    after_the_last_renewal(events, refused[0], again)
    assert all(e["visibility"] == LEASE for e in changes), events
    assert log.count("Stopped renewing the SQS lease") == 1, log
    assert f"Stopped renewing the SQS lease of task {BUSY}[{task.task_id}]" in log
    assert "Lost the SQS lease" not in log
    assert lease_signals_of(bed, "w1") == []
    assert alive, log
    assert "Traceback" not in log
