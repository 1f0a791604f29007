"""The CPU benchmark's pure parts (benchmarks/proc_cpu.py, cpu_profile.py, cpu_table.py):
``/proc`` lines, py-spy's raw stacks and the per-round ratios, from literal inputs."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.benchmarks.bench_modules import bench_module

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
MAIN = 'process 10:"python -m celery worker"'
CHILD = 'process 11:"python -m celery worker"'


@pytest.fixture(scope="module")
def profile() -> ModuleType:
    return bench_module("cpu_profile")


def test_cpu_ticks_are_user_plus_system_even_with_a_command_holding_parentheses() -> None:
    proc_cpu = bench_module("proc_cpu")
    stat = "42 (celery (worker) x) S 7 42 42 0 -1 4194560 1 2 3 4 150 25 9 9 20 0 3 0"
    assert proc_cpu.cpu_ticks(stat) == 175
    assert proc_cpu.parent_pid(stat) == 7


def test_samples_go_to_the_main_process_or_the_pool_by_their_process_frames(
    profile: ModuleType,
) -> None:
    lines = [
        f"{MAIN};loop ({SITE}/kombu/asynchronous/hub.py:1);recv ({STDLIB}/ssl.py:2) 3",
        f"{MAIN};{CHILD};run ({SITE}/celery/app/trace.py:9) 5",
    ]
    kinds = profile.breakdown(lines)
    assert (kinds["main"].total, kinds["pool"].total) == (3, 5)
    assert kinds["pool"].own == {"Celery (celery, billiard, vine, click)": 5}


def test_stdlib_leaves_are_owned_by_the_nearest_package_above_them(profile: ModuleType) -> None:
    stack = (
        f"{MAIN};tick (/repo/celery_sqs_heartbeat/leases.py:4);"
        f"call ({SITE}/botocore/client.py:5);urlopen ({SITE}/urllib3/pool.py:6);"
        f"send ({STDLIB}/http/client.py:7);recv ({STDLIB}/ssl.py:8) 4"
    )
    main = profile.breakdown([stack, f"{MAIN};run ({STDLIB}/threading.py:1) 1"])["main"]
    assert main.own == {"Python stdlib": 5}
    assert main.owner == {"botocore, boto3, urllib3": 4, "Python stdlib": 1}
    assert main.through_ours == 4
    assert main.ours_inclusive == {"tick (celery_sqs_heartbeat/leases.py)": 4}


def test_ratios_are_taken_within_each_round_of_the_alternation() -> None:
    table = bench_module("cpu_table")

    def run(side: str, order: int, main: float) -> object:
        return table.CpuRun(side, order, 100, 1.0, main, 0.0, 0.0, 0.0, True)

    runs = [run("redis", 1, 0.1), run("ours", 2, 0.2), run("ours", 3, 0.3), run("redis", 4, 0.1)]
    assert table.round_ratios(runs, "ours") == [2.0, 3.0]
