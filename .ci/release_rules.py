"""What a release must agree on, checked without building or installing anything.

`.ci/release-check` runs both commands on every CI run; the release workflow's publish job
runs ``versions --tag`` before it uploads, so that a tag only publishes what it names.

    python .ci/release_rules.py versions [--tag vX.Y.Z] [--dist DIR]
    python .ci/release_rules.py workflows          (needs PyYAML)

``versions``: the version lives in one place, ``celery_sqs_heartbeat/__init__.py``
(``__version__``, which setup.cfg reads); no other file may state another. CHANGELOG.md
starts with ``## [Unreleased]``, and its newest version section is that version, dated
``YYYY-MM-DD`` or ``unreleased`` until the release (older ones are dated), each with its
link. With ``--tag`` (a release): the tag is ``v`` + the version, the section is dated no
later than today (the date is set in the commit the tag names), and ``[Unreleased]`` is
empty (its entries moved into the release's section). With ``--dist``: every file there
is of that version.

``workflows``: the release workflow mirrors tox.ini's environments, checks the
distributions and runs ``.ci/release-check``, and publishes only on a ``v*`` tag, after
every other job, through PyPI's trusted publishing.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import datetime
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ".github/workflows/release.yml"
PUBLISH_ACTION = "pypa/gh-action-pypi-publish@"
_SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\S+))?\s*$", re.MULTILINE)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def source_version(root: Path = ROOT) -> str:
    """``__version__`` as the package states it, read without importing the package."""
    tree = ast.parse((root / "celery_sqs_heartbeat/__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise SystemExit("celery_sqs_heartbeat/__init__.py states no __version__")


def changelog_problems(
    text: str, version: str, *, tag: str | None, today: datetime.date
) -> list[str]:
    """Why CHANGELOG.md is not right for ``version`` (released as ``tag``, if given)."""
    sections = list(_SECTION.finditer(text))
    if not sections or sections[0]["name"] != "Unreleased":
        return ["CHANGELOG.md: the first section must be '## [Unreleased]'"]
    released = sections[1:]
    if not released or released[0]["name"] != version:
        newest = released[0]["name"] if released else "none"
        return [f"CHANGELOG.md: the newest version section is {newest}, not {version}"]
    problems = []
    for section in released:
        name, date = section["name"], section["date"] or ""
        first = section is released[0]
        if not (_DATE.match(date) or (first and date == "unreleased")):
            problems.append(f"CHANGELOG.md: '## [{name}]' needs ' - YYYY-MM-DD', not {date!r}")
        if not re.search(rf"^\[{re.escape(name)}\]: \S+/v{re.escape(name)}\s*$", text, re.M):
            problems.append(f"CHANGELOG.md: no link '[{name}]: …/v{name}' for its section")
    if tag is not None:
        problems += _release_problems(text, sections, version, tag, today)
    return problems


def _release_problems(
    text: str, sections: list[re.Match[str]], version: str, tag: str, today: datetime.date
) -> list[str]:
    problems = []
    if tag != f"v{version}":
        problems.append(f"the tag {tag} is not v{version}, the version the package states")
    date = sections[1]["date"] or ""
    if not _DATE.match(date):
        problems.append(f"CHANGELOG.md: date the section of {version} (not {date!r})")
    elif datetime.date.fromisoformat(date) > today:
        problems.append(f"CHANGELOG.md: {version} is dated {date}, after today ({today})")
    unreleased = text[sections[0].end() : sections[1].start()]
    if unreleased.strip():
        problems.append(f"CHANGELOG.md: move the [Unreleased] entries into [{version}]")
    return problems


def statement_problems(root: Path, version: str) -> list[str]:
    """Other places a version could be written: only setup.cfg's pointer to the package."""
    problems = []
    setup = configparser.ConfigParser(interpolation=None)
    setup.read(root / "setup.cfg")
    if setup.get("metadata", "version", fallback="") != "attr: celery_sqs_heartbeat.__version__":
        problems.append("setup.cfg: [metadata] version must be attr: ...__version__")
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    if re.search(r"^\[project\]", pyproject, re.M):
        problems.append("pyproject.toml: a [project] table would state the metadata twice")
    return problems


def dist_problems(dist: Path, version: str) -> list[str]:
    names = sorted(p.name for p in dist.iterdir() if p.suffix in (".whl", ".gz"))
    if not names:
        return [f"{dist}: no distributions"]
    prefix = f"celery_sqs_heartbeat-{version}"
    return [f"{name} is not of version {version}" for name in names if not _of(name, prefix)]


def _of(name: str, prefix: str) -> bool:
    return name in (f"{prefix}.tar.gz", f"{prefix}-py3-none-any.whl")


def tox_environments(tox_ini: str) -> list[str]:
    """tox.ini's env_list, braces expanded, in its order."""
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(tox_ini)
    return [name for line in config["tox"]["env_list"].split() for name in _expand(line)]


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for part in match[1].split(",") for name in _expand(head + part + tail)]


def workflow_problems(workflow: dict[Any, Any], environments: list[str]) -> list[str]:
    """Why the release workflow does not test, check and publish as a release must."""
    jobs: dict[str, dict[str, Any]] = workflow.get("jobs", {})
    problems = []
    matrix = jobs.get("test", {}).get("strategy", {}).get("matrix", {}).get("env", [])
    if sorted(matrix) != sorted(environments):
        problems.append(f"job test: its matrix {matrix} is not tox.ini's env_list {environments}")
    runs = {
        name: " ".join(str(step.get("run", "")) for step in job.get("steps", []))
        for name, job in jobs.items()
    }
    for job, needed in (
        ("build", ("-m build", "twine check --strict", "check-wheel-contents")),
        ("release-check", (".ci/release-check",)),
        ("publish", ("release_rules.py versions --tag",)),
    ):
        problems += [f"job {job}: no step runs {n!r}" for n in needed if n not in runs.get(job, "")]
    trigger = workflow.get("on", workflow.get(True, {}))
    if "v*" not in trigger.get("push", {}).get("tags", []):
        problems.append("the workflow does not run on pushed tags v*")
    return problems + _publish_problems(jobs)


def _publish_problems(jobs: dict[str, dict[str, Any]]) -> list[str]:
    publish = jobs.get("publish", {})
    problems = []
    if "startsWith(github.ref, 'refs/tags/v')" not in str(publish.get("if", "")):
        problems.append("job publish: must run only for tags v* (if: startsWith(...))")
    if set(publish.get("needs", [])) != set(jobs) - {"publish"}:
        problems.append("job publish: must need every other job")
    environment = publish.get("environment", {})
    if (environment.get("name") if isinstance(environment, dict) else environment) != "pypi":
        problems.append("job publish: must run in the environment 'pypi'")
    if publish.get("permissions", {}).get("id-token") != "write":
        problems.append("job publish: trusted publishing needs permissions id-token: write")
    uses = [str(step.get("uses", "")) for step in publish.get("steps", [])]
    if not any(u.startswith(PUBLISH_ACTION) for u in uses):
        problems.append(f"job publish: no step uses {PUBLISH_ACTION}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    versions = commands.add_parser("versions")
    versions.add_argument("--tag")
    versions.add_argument("--dist", type=Path)
    commands.add_parser("workflows")
    args = parser.parse_args(argv)
    if args.command == "versions":
        version = source_version()
        changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
        today = datetime.datetime.now(datetime.timezone.utc).date()
        problems = changelog_problems(changelog, version, tag=args.tag, today=today)
        problems += statement_problems(ROOT, version)
        problems += dist_problems(args.dist, version) if args.dist else []
        done = f"version {version} stated once; CHANGELOG.md agrees"
    else:
        import yaml

        workflow = yaml.safe_load((ROOT / WORKFLOW).read_text(encoding="utf-8"))
        environments = tox_environments((ROOT / "tox.ini").read_text(encoding="utf-8"))
        problems = workflow_problems(workflow, environments)
        done = f"{WORKFLOW}: tests tox's {len(environments)} environments, publishes on tags"
    for problem in problems:
        print(problem, file=sys.stderr)
    print(done if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
