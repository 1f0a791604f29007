"""`.ci/release_rules.py`: what a release must agree on, as release-check and a tag run it.

The repository as it is must pass (no tag: the first release's date is left to the tag),
and each rule must catch what it is there for: a second version, a tag that is not the
version, an undated release, entries left in [Unreleased], a publish job without its
guards, a matrix that drifted from tox.ini.
"""

from __future__ import annotations

import copy
import datetime
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TODAY = datetime.date(2026, 12, 1)


def _load_rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_rules", REPO / ".ci/release_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("release_rules", module)
    spec.loader.exec_module(module)
    return module


rules = _load_rules()


def _changelog(unreleased: str = "", date: str = "2026-11-30", newest: str = "1.2.0") -> str:
    return (
        "# Changelog\n\n## [Unreleased]\n"
        f"{unreleased}\n"
        f"## [{newest}] - {date}\n\n- Things.\n\n"
        "## [1.1.0] - 2026-01-02\n\n- Older things.\n\n"
        f"[Unreleased]: https://example.invalid/compare/v{newest}...HEAD\n"
        f"[{newest}]: https://example.invalid/releases/tag/v{newest}\n"
        "[1.1.0]: https://example.invalid/releases/tag/v1.1.0\n"
    )


def test_the_repository_states_one_version_and_its_changelog_agrees() -> None:
    version = rules.source_version(REPO)
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert rules.changelog_problems(text, version, tag=None, today=TODAY) == []
    assert rules.statement_problems(REPO, version) == []


def test_an_unreleased_newest_section_passes_until_a_tag_names_it() -> None:
    text = _changelog(date="unreleased")
    assert rules.changelog_problems(text, "1.2.0", tag=None, today=TODAY) == []
    problems = rules.changelog_problems(text, "1.2.0", tag="v1.2.0", today=TODAY)
    assert problems == ["CHANGELOG.md: date the section of 1.2.0 (not 'unreleased')"]


def test_a_dated_release_with_an_empty_unreleased_section_passes_for_its_tag() -> None:
    assert rules.changelog_problems(_changelog(), "1.2.0", tag="v1.2.0", today=TODAY) == []


@pytest.mark.parametrize(
    ("text", "version", "tag", "expected"),
    [
        (_changelog(), "1.2.0", "v1.2.1", "the tag v1.2.1 is not v1.2.0"),
        (_changelog(), "1.3.0", None, "the newest version section is 1.2.0, not 1.3.0"),
        (_changelog(date="2026-12-02"), "1.2.0", "v1.2.0", "dated 2026-12-02, after today"),
        (_changelog("\n- Left.\n"), "1.2.0", "v1.2.0", "move the [Unreleased] entries"),
        (
            _changelog().replace("1.1.0] - 2026-01-02", "1.1.0] - unreleased"),
            "1.2.0",
            None,
            "'## [1.1.0]' needs ' - YYYY-MM-DD'",
        ),
        (
            _changelog().replace("[1.1.0]: https", "[1.1.0]: nowhere https"),
            "1.2.0",
            None,
            "no link '[1.1.0]: …/v1.1.0'",
        ),
        ("## [1.2.0] - 2026-11-30\n", "1.2.0", None, "first section must be '## [Unreleased]'"),
    ],
)
def test_a_changelog_that_disagrees_is_named(
    text: str, version: str, tag: str | None, expected: str
) -> None:
    problems = rules.changelog_problems(text, version, tag=tag, today=TODAY)
    assert len(problems) == 1 and expected in problems[0], problems


def test_distributions_of_another_version_are_named(tmp_path: Path) -> None:
    (tmp_path / "celery_sqs_heartbeat-1.2.0.tar.gz").touch()
    (tmp_path / "celery_sqs_heartbeat-1.2.0-py3-none-any.whl").touch()
    assert rules.dist_problems(tmp_path, "1.2.0") == []
    assert rules.dist_problems(tmp_path, "1.2.1") == [
        "celery_sqs_heartbeat-1.2.0-py3-none-any.whl is not of version 1.2.1",
        "celery_sqs_heartbeat-1.2.0.tar.gz is not of version 1.2.1",
    ]


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    yaml = pytest.importorskip("yaml")
    loaded: dict[Any, Any] = yaml.safe_load((REPO / rules.WORKFLOW).read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def environments() -> list[str]:
    names: list[str] = rules.tox_environments((REPO / "tox.ini").read_text(encoding="utf-8"))
    return names


def test_the_release_workflow_tests_tox_matrix_and_publishes_only_on_tags(
    workflow: dict[Any, Any], environments: list[str]
) -> None:
    assert "py310-celery55" in environments and "lint" in environments
    assert rules.workflow_problems(workflow, environments) == []


def _without(workflow: dict[Any, Any], *path: str) -> dict[Any, Any]:
    changed = copy.deepcopy(workflow)
    node = changed
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return changed


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("jobs", "publish", "if"), "must run only for tags v*"),
        (("jobs", "publish", "environment"), "environment 'pypi'"),
        (("jobs", "publish", "permissions"), "id-token: write"),
        (("jobs", "publish", "needs"), "must need every other job"),
        (("jobs", "build", "steps"), "no step runs 'twine check --strict'"),
    ],
)
def test_a_workflow_without_a_guard_is_named(
    workflow: dict[Any, Any], environments: list[str], path: tuple[str, ...], expected: str
) -> None:
    problems = rules.workflow_problems(_without(workflow, *path), environments)
    assert any(expected in problem for problem in problems), problems


def test_a_matrix_that_drifted_from_tox_is_named(
    workflow: dict[Any, Any], environments: list[str]
) -> None:
    problems = rules.workflow_problems(workflow, [*environments, "py314-celery58"])
    assert len(problems) == 1 and "is not tox.ini's env_list" in problems[0], problems
