"""docs/compatibility.md's table of kombu overrides names every hook the Channel overrides,
and no other: the table is how a kombu release's changes are checked against the code."""

from __future__ import annotations

import inspect
import re

from kombu.utils.objects import cached_property

from celery_sqs_heartbeat.transport import Channel
from tests.docs.pages import REPO

#: A row's first cell: the overrides it names, each ``Channel.x`` (or ``.x`` after one).
_ROW = re.compile(r"^\| `Channel\.(\w+)`((?:, `\.\w+`)*) \|", re.MULTILINE)


#: The Channel's own methods, which kombu never calls.
_HELPERS = frozenset({"_receive_steps", "_polling_interval"})


def _documented() -> set[str]:
    text = (REPO / "docs" / "compatibility.md").read_text()
    names = set()
    for first, more in _ROW.findall(text):
        names.add(first)
        names.update(re.findall(r"`\.(\w+)`", more))
    return names


def _overridden() -> set[str]:
    """What the Channel defines, less its own helpers: kombu's hooks (and ``__init__``)."""
    return {
        name
        for name, value in vars(Channel).items()
        if (inspect.isfunction(value) or isinstance(value, cached_property))
        and name not in _HELPERS
    }


def test_the_overrides_table_names_each_hook_the_channel_overrides() -> None:
    assert _documented() == _overridden()
