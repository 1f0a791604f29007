"""The documentation pages, read as a reader's browser and shell would read them.

A page's fenced blocks, its headings' anchors (GitHub's rule), its relative links, and
the shell commands in its ``bash``/``sh`` blocks, one per command as a shell would run
it. Pure text handling: the tests in this folder decide what to check.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<marker>[\w.: -]+?)\s*-->\s*$")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def pages() -> list[Path]:
    """Every page whose commands and links the docs test keeps working."""
    found = [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "SECURITY.md",
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "benchmarks" / "README.md",
        *sorted((REPO / "examples").glob("*/README.md")),
    ]
    return [page for page in found if page.is_file()]


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Block:
    """A fenced block: its language, its text, where it starts, and the marker before it.

    The marker is an HTML comment on the line before the fence (``<!-- docs-test: run
    -->``), invisible to readers, which tells the tests what the block is for.
    """

    page: Path
    line: int
    last_line: int
    language: str
    text: str
    marker: str | None

    def where(self) -> str:
        return f"{page_id(self.page)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One shell command of a page: its words, the variables set before it, and where."""

    block: Block
    words: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def program(self) -> str:
        return self.words[0]

    def where(self) -> str:
        return self.block.where()

    def __str__(self) -> str:
        assignments = [f"{name}={value}" for name, value in self.env.items()]
        return shlex.join([*assignments, *self.words])


class Page:
    """One page's blocks, anchors, links and commands."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = path.read_text(encoding="utf-8")

    @cached_property
    def blocks(self) -> list[Block]:
        blocks: list[Block] = []
        lines = self.text.splitlines()
        index = 0
        while index < len(lines):
            opening = _FENCE.match(lines[index])
            if opening is None:
                index += 1
                continue
            fence, indent = opening["fence"], len(opening["indent"])
            start = index
            index += 1
            body: list[str] = []
            while index < len(lines) and not lines[index].strip().startswith(fence):
                body.append(lines[index][indent:])
                index += 1
            marker = _MARKER.match(lines[start - 1]) if start else None
            blocks.append(
                Block(
                    page=self.path,
                    line=start + 1,
                    last_line=index + 1,
                    language=opening["lang"].lower(),
                    text="\n".join(body) + "\n",
                    marker=marker["marker"] if marker else None,
                )
            )
            index += 1
        return blocks

    @cached_property
    def prose(self) -> list[tuple[int, str]]:
        """The lines outside fenced blocks, with their numbers, inline code removed."""
        inside: set[int] = set()
        for block in self.blocks:
            inside.update(range(block.line, block.last_line + 1))
        return [
            (number, _INLINE_CODE.sub("", line))
            for number, line in enumerate(self.text.splitlines(), start=1)
            if number not in inside
        ]

    @cached_property
    def anchors(self) -> set[str]:
        """The ``#anchors`` GitHub makes of the page's headings, repeats numbered."""
        made: set[str] = set()
        for _, line in self._heading_lines():
            base = slug(line)
            anchor, repeat = base, 0
            while anchor in made:
                repeat += 1
                anchor = f"{base}-{repeat}"
            made.add(anchor)
        return made

    def _heading_lines(self) -> list[tuple[int, str]]:
        lines = self.text.splitlines()
        prose_numbers = {number for number, _ in self.prose}
        return [
            (number, match["text"])
            for number, line in enumerate(lines, start=1)
            if number in prose_numbers and (match := _HEADING.match(line))
        ]

    @cached_property
    def links(self) -> list[tuple[int, str]]:
        """Relative link targets (``path``, ``path#anchor`` or ``#anchor``), with lines."""
        found = []
        for number, line in self.prose:
            for match in _LINK.finditer(line):
                target = match["target"]
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    found.append((number, target))
        return found

    @cached_property
    def commands(self) -> list[Command]:
        """Every command of the page's shell blocks, in order, ``&&`` chains split."""
        found: list[Command] = []
        for block in self.blocks:
            if block.language in SHELL_LANGUAGES:
                found.extend(_commands_of(block))
        return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _commands_of(block: Block) -> list[Command]:
    commands = []
    for line in _joined_lines(block.text):
        words = shlex.split(line, comments=True)
        while words:
            end = words.index("&&") if "&&" in words else len(words)
            commands.append(_command(block, words[:end]))
            words = words[end + 1 :]
    return commands


def _joined_lines(text: str) -> list[str]:
    """The block's lines, those ending in a backslash joined to the next."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    return joined


def _command(block: Block, words: list[str]) -> Command:
    env: dict[str, str] = {}
    while words and _ENV_ASSIGNMENT.match(words[0]) and len(words) > 1:
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    return Command(block=block, words=tuple(words), env=env)
