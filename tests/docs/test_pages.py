"""Every page's links, code blocks and commands, read without running anything.

The pages: README.md, CONTRIBUTING.md, SECURITY.md, docs/*.md, benchmarks/README.md and
examples/*/README.md. A link to a file that is not there, an ``#anchor`` that no heading
makes, a Python block that does not parse, or a shell command the docs test cannot check
fails here; the commands themselves run in ``test_commands.py``.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from tests.docs.checks import ACTIVATIONS, NEEDS_ACTIVATION, kind_of
from tests.docs.pages import REPO, Page, page_id, pages

PAGES = [pytest.param(page, id=page_id(page)) for page in pages()]
MARKERS = frozenset({"docs-test: run", "docs-test: output", "docs-test: tasks.py"})
POLICY_MARKER = "iam-policy: "
"""Marks an IAM policy that tests/integration/test_iam_policy.py proves as published."""


@pytest.mark.parametrize("path", PAGES)
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    page = Page(path)
    broken = []
    for line, target in page.links:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"line {line}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in Page(linked).anchors:
            broken.append(f"line {line}: {target} (no heading makes #{anchor})")
    assert not broken, f"{page_id(path)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", PAGES)
def test_python_and_json_blocks_parse(path: Path) -> None:
    for block in Page(path).blocks:
        if block.language == "python":
            ast.parse(block.text, filename=block.where())
        elif block.language == "json":
            json.loads(block.text)


@pytest.mark.parametrize("path", PAGES)
def test_every_command_is_one_the_docs_test_checks(path: Path) -> None:
    unknown = [f"{c.where()}: {c}" for c in Page(path).commands if kind_of(c) is None]
    assert not unknown, "no check for these commands (tests/docs/checks.py):\n" + "\n".join(unknown)


@pytest.mark.parametrize("path", PAGES)
def test_bare_commands_come_after_the_page_activates_its_virtualenv(path: Path) -> None:
    """In a fresh shell ``python benchmarks/...`` fails: there is no celery to import."""
    activated = False
    for command in Page(path).commands:
        activated = activated or command.words in ACTIVATIONS
        user_app = command.words[:3] == ("celery", "-A", "proj")
        if command.program in NEEDS_ACTIVATION and not user_app:
            assert activated, (
                f"{command.where()}: `{command}` needs the page to make and activate .venv "
                "first (or say .venv/bin/...)"
            )


@pytest.mark.parametrize("path", PAGES)
def test_markers_are_ones_the_docs_test_reads(path: Path) -> None:
    blocks = Page(path).blocks
    markers = {b.marker for b in blocks if b.marker and not b.marker.startswith(POLICY_MARKER)}
    assert markers <= MARKERS, f"{page_id(path)}: unknown markers {markers - MARKERS}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    """`.ci/run` runs the README's test command as the README gives it."""
    readme = Page(REPO / "README.md")
    section = readme.text.split("## Run the tests", 1)[1]
    first_block = next(b for b in readme.blocks if b.text.strip() and b.text in section)
    ci_run = (REPO / ".ci/run").read_text().strip().splitlines()
    assert shlex.split(first_block.text) == shlex.split(ci_run[-1])


def test_the_readme_quick_start_has_its_app_and_commands() -> None:
    readme = Page(REPO / "README.md")
    apps = [block for block in readme.blocks if block.marker == "docs-test: tasks.py"]
    kinds = [kind_of(command) for command in readme.commands]
    assert len(apps) == 1
    assert kinds.count("local server") == 1
    assert kinds.count("quick start worker") == kinds.count("quick start task") == 1
