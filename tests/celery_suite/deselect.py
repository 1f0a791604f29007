"""The list of Celery's integration tests left out over SQS, each with its reason.

``deselected.txt`` holds one entry per test: its node id on a line of its own, then its
reason on the indented lines below it. A test listed without a reason is refused: the
list exists to say why.
"""

from __future__ import annotations

from pathlib import Path

DESELECTED_FILE = Path(__file__).with_name("deselected.txt")


def parse_deselected(text: str) -> dict[str, str]:
    """Node id to reason, in the file's order; ``#`` lines are comments."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            if current is None:
                raise ValueError(f"line {number}: a reason before any test: {line.strip()!r}")
            current.append(line.strip())
            continue
        current = entries.setdefault(line.strip(), [])
    missing = [node for node, reason in entries.items() if not reason]
    if missing:
        raise ValueError(f"listed without a reason: {', '.join(missing)}")
    return {node: " ".join(reason) for node, reason in entries.items()}


def read_deselected(path: Path) -> dict[str, str]:
    return parse_deselected(path.read_text())
