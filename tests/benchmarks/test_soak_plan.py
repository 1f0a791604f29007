"""The chaos soak's seeded schedule (benchmarks/soak_plan.py): pure, so checked here with
seeded generators and no clock."""

from __future__ import annotations

import itertools
import random
from types import ModuleType

import pytest

from tests.benchmarks.bench_modules import bench_module


@pytest.fixture(scope="module")
def plan() -> ModuleType:
    return bench_module("soak_plan")


def settings(plan: ModuleType, **overrides: float) -> object:
    return plan.ChaosSettings(**{"duration": 60.0, "lease": 8.0, **overrides})


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another(
    plan: ModuleType,
) -> None:
    chaos = settings(plan, duration=600.0)
    first = plan.plan_chaos(chaos, random.Random(7))
    assert first == plan.plan_chaos(chaos, random.Random(7))
    assert first != plan.plan_chaos(chaos, random.Random(8))


@pytest.mark.parametrize("seed", range(20))
def test_a_one_minute_run_meets_every_kind_of_disruption(plan: ModuleType, seed: int) -> None:
    disruptions = plan.plan_chaos(settings(plan), random.Random(seed))
    assert {d.kind for d in disruptions} == set(plan.KINDS)


@pytest.mark.parametrize("seed", range(20))
def test_nothing_is_planned_in_the_quiet_start_and_tail(plan: ModuleType, seed: int) -> None:
    chaos = settings(plan, duration=300.0)
    disruptions = plan.plan_chaos(chaos, random.Random(seed))
    assert disruptions == sorted(disruptions, key=lambda d: d.at)
    assert all(chaos.quiet_start <= d.at < chaos.duration - chaos.quiet_tail for d in disruptions)


@pytest.mark.parametrize("seed", range(20))
def test_only_an_outage_outlasts_the_renewal_margin(plan: ModuleType, seed: int) -> None:
    """Throttling and 5xx windows stay under half the lease's renewal margin, so a second
    run can only come from a SIGKILL or an outage."""
    chaos = settings(plan, duration=1800.0)
    for d in plan.plan_chaos(chaos, random.Random(seed)):
        if d.kind in ("throttle", "server_errors"):
            assert 0 < d.seconds <= chaos.blip_max < chaos.lease / 2
        if d.kind == "outage":
            assert d.seconds > chaos.lease


@pytest.mark.parametrize("seed", range(20))
def test_renewal_fault_windows_are_a_renewal_margin_apart(plan: ModuleType, seed: int) -> None:
    """Two throttling or 5xx windows back to back are one window as long as both: the
    30-minute solo soak lost an 8 s lease through two of 1.8 s, 0.4 s apart, its renewals
    tried once a second. Between two windows, a lease's whole margin (half of it) passes."""
    chaos = settings(plan, duration=1800.0)
    disruptions = plan.plan_chaos(chaos, random.Random(seed))
    blips = [d for d in disruptions if d.kind in ("throttle", "server_errors")]
    assert len(blips) > 50
    for before, after in itertools.pairwise(blips):
        assert after.at >= before.at + before.seconds + chaos.lease / 2


@pytest.mark.parametrize("seed", range(20))
def test_outages_never_overlap_and_a_lease_passes_between_them(plan: ModuleType, seed: int) -> None:
    chaos = settings(plan, duration=1800.0)
    outages = [d for d in plan.plan_chaos(chaos, random.Random(seed)) if d.kind == "outage"]
    for before, after in itertools.pairwise(outages):
        assert after.at >= before.at + before.seconds + chaos.lease


@pytest.mark.parametrize("seed", range(20))
def test_steady_slots_are_never_stopped_and_a_slot_is_not_stopped_while_down(
    plan: ModuleType, seed: int
) -> None:
    chaos = settings(plan, duration=1800.0)
    down_until = [0.0] * chaos.workers
    for d in plan.plan_chaos(chaos, random.Random(seed)):
        if d.kind in plan.STOPS:
            assert d.worker >= chaos.steady
            assert d.at >= down_until[d.worker]
            stopping = chaos.grace if d.kind == "sigterm" else 0.0
            down_until[d.worker] = d.at + stopping + d.seconds
        if d.kind == "drop_connection":
            assert d.worker is not None and d.at >= down_until[d.worker]


def test_tasks_come_in_every_shape_in_seeded_rounds(plan: ModuleType) -> None:
    tasks = plan.plan_tasks(60.0, 1.0, random.Random(3))
    assert tasks == plan.plan_tasks(60.0, 1.0, random.Random(3))
    assert {t.shape for t in tasks} == set(plan.SHAPES)
    assert all(0 <= t.at < 60 for t in tasks)
    first_round = [t.shape for t in tasks if t.seq == 0][: len(plan.SHAPES)]
    assert sorted(first_round) == sorted(plan.SHAPES)


def test_a_fifo_turn_is_a_whole_group_in_order(plan: ModuleType) -> None:
    tasks = plan.plan_tasks(120.0, 1.0, random.Random(5))
    groups: dict[str, list[int]] = {}
    for task in tasks:
        if task.shape == "fifo":
            groups.setdefault(task.group, []).append(task.seq)
        else:
            assert task.group is None
    assert groups
    assert all(seqs == list(range(plan.FIFO_GROUP)) for seqs in groups.values())
