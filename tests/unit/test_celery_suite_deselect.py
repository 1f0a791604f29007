"""The deselection list of Celery's suite: every entry has its reason."""

from __future__ import annotations

import re

import pytest

from tests.celery_suite.deselect import DESELECTED_FILE, parse_deselected, read_deselected


def test_entries_keep_their_reasons_in_order() -> None:
    text = (
        "# comment\n"
        "t/integration/test_a.py::test_one\n"
        "    SQS has no priorities:\n"
        "    the order is not kept.\n"
        "\n"
        "t/integration/test_b.py::test_two[x]\n"
        "    fails the same way over kombu's stock SQS transport.\n"
    )
    assert parse_deselected(text) == {
        "t/integration/test_a.py::test_one": "SQS has no priorities: the order is not kept.",
        "t/integration/test_b.py::test_two[x]": (
            "fails the same way over kombu's stock SQS transport."
        ),
    }


def test_a_test_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("reason: t/integration/test_a.py::test_one")):
        parse_deselected("t/integration/test_a.py::test_one\nt/integration/test_b.py::x\n  why\n")


def test_the_projects_list_parses() -> None:
    for node in read_deselected(DESELECTED_FILE):
        assert node.startswith("t/integration/test_"), node
