"""What the runner of Celery's suite hands pytest: which modules, in which order."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.celery_suite.run import RUN_LAST, pytest_command, suite_modules


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    modules = tmp_path / "t" / "integration"
    modules.mkdir(parents=True)
    for name in ("conftest.py", "tasks.py", "test_tasks.py", "test_security.py", "test_beat.py"):
        (modules / name).touch()
    return tmp_path


def _paths(suite: Path, *pytest_args: str) -> list[str]:
    args = argparse.Namespace(pytest_args=list(pytest_args), broker="redis", no_deselect=True)
    command = pytest_command(args, suite)
    return command[3 : command.index("-p")]


def test_every_test_module_runs_and_those_that_change_the_process_run_last(suite: Path) -> None:
    assert RUN_LAST == ("test_security.py",)
    assert suite_modules(suite) == [
        "t/integration/test_beat.py",
        "t/integration/test_tasks.py",
        "t/integration/test_security.py",
    ]
    assert _paths(suite) == suite_modules(suite)


def test_paths_among_the_arguments_replace_the_modules(suite: Path) -> None:
    assert _paths(suite, "t/integration/test_beat.py", "-k", "remote") == []


def test_a_path_given_to_deselect_or_ignore_is_not_one_to_run(suite: Path) -> None:
    assert _paths(suite, "--deselect", "t/integration/test_beat.py") == suite_modules(suite)
    assert _paths(suite, "--ignore", "t/integration/test_beat.py") == suite_modules(suite)
