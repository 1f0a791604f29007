"""How each shell command on a page is checked, and the checks that need no SQS server.

Every command a page gives must be one of the kinds below, or the docs test fails: a new
kind of command needs a check before it can be published. ``kind_of`` names a command's
kind (pure, for the unit test); ``CHECKS`` runs it (for the integration test). Commands
that start the local server (the server's command lines, ``curl`` against it, the
README's Quick start) are run by ``test_commands.py`` itself.

Where a page says ``.venv/bin/python``, or ``python`` after it activated ``.venv``, the
test's own interpreter stands in: the page's virtualenv holds the package and the extra
the page installs, as the test's environment does.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import os
import re
import subprocess
import sys
from collections.abc import Callable

from celery_sqs_heartbeat import __version__
from tests.docs.pages import REPO, Command

SCRIPTS = frozenset(
    {
        ".ci/test",
        ".ci/run",
        ".ci/release-check",
        ".ci/busy-machine",
        "examples/spark_pipeline/run-demo.sh",
    }
)
PYPI_TOOLS = frozenset({"build"})
"""Packages a page installs from PyPI by name: tools, not this project."""
_TOX_PYTHON = re.compile(r"^\.tox/(?P<env>[\w.-]+)/bin/python$")
ACTIVATIONS = frozenset({(".", ".venv/bin/activate"), ("source", ".venv/bin/activate")})
NEEDS_ACTIVATION = frozenset({"python", "pip", "pytest", "celery", "celery-sqs-heartbeat-server"})
"""Bare commands that fail in a fresh shell: the page must activate ``.venv`` first."""


def python_args(command: Command) -> tuple[str, ...] | None:
    """The interpreter's arguments, if the command runs the page's Python."""
    program = command.program
    if program in ("python", ".venv/bin/python") or _TOX_PYTHON.match(program):
        return command.words[1:]
    return None


def kind_of(command: Command) -> str | None:
    """What kind of command this is, or None if the docs test cannot check it."""
    words, args = command.words, python_args(command)
    for kind, matches in _KINDS:
        if matches(words, args):
            return kind
    return None


_KINDS: list[tuple[str, Callable[[tuple[str, ...], tuple[str, ...] | None], bool]]] = [
    ("makes the virtualenv", lambda w, a: w == ("python3", "-m", "venv", ".venv")),
    ("activates the virtualenv", lambda w, a: w in ACTIVATIONS),
    ("pip install", lambda w, a: w[0] in ("pip", ".venv/bin/pip") and w[1:2] == ("install",)),
    ("builds the wheel", lambda w, a: a is not None and a[:2] == ("-m", "build")),
    ("script", lambda w, a: w[0] in SCRIPTS),
    ("local server", lambda w, a: w[0] == "celery-sqs-heartbeat-server"),
    ("local server control", lambda w, a: w[0] == "curl"),
    ("quick start worker", lambda w, a: w[:4] == ("celery", "-A", "tasks", "worker")),
    ("quick start task", lambda w, a: a is not None and a[:1] == ("-c",) and "tasks" in a[1]),
    ("celery inspect", lambda w, a: w[:4] == ("celery", "-A", "proj", "inspect")),
    ("example worker", lambda w, a: w[:3] == ("celery", "-A", "examples.spark_pipeline.app")),
    ("export", lambda w, a: w[0] == "export"),
    ("benchmark", lambda w, a: a is not None and a[:1] != () and a[0].startswith("benchmarks/")),
    ("pytest", lambda w, a: a is not None and a[:2] == ("-m", "pytest")),
    ("celery suite", lambda w, a: a is not None and a[:2] == ("-m", "tests.celery_suite.run")),
]


def run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run ``args`` from the repository root; its output, or a failure that shows it."""
    process = subprocess.run(
        args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = process.stdout + process.stderr
    assert process.returncode == 0, f"{' '.join(args)} exited {process.returncode}:\n{output}"
    return output


def flags(words: tuple[str, ...]) -> list[str]:
    """The ``--options`` among a command's words (``--name=value`` as ``--name``)."""
    return [word.split("=", 1)[0] for word in words if word.startswith("-") and word != "--"]


def assert_flags_in(command: Command, words: tuple[str, ...], accepted: str) -> None:
    for flag in flags(words):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", accepted), (
            f"{command.where()}: {flag} of `{command}` is not an option it takes"
        )


def tox_environments() -> set[str]:
    """Every environment tox.ini defines: its env_list, braces expanded, and its sections."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "tox.ini")
    names = {name for line in config["tox"]["env_list"].split() for name in _expand(line)}
    names.update(s.split(":", 1)[1] for s in config.sections() if s.startswith("testenv:"))
    return names


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for part in match[1].split(",") for name in _expand(head + part + tail)]


def check_script(command: Command) -> None:
    script = REPO / command.program
    assert script.is_file() and os.access(script, os.X_OK), f"{script} is not an executable"
    run(["bash", "-n", str(script)])
    words = command.words[1:]
    if "--" in words:
        words = words[: words.index("--")]
    if command.program == ".ci/test":
        for name in _selected_environments(words):
            assert name in tox_environments(), f"{command.where()}: no tox environment {name}"
    elif command.program == "examples/spark_pipeline/run-demo.sh":
        demo = (REPO / "examples/spark_pipeline/demo.py").read_text()
        assert_flags_in(command, words, " ".join(_argparse_flags(demo)))
    elif command.program == ".ci/busy-machine":
        assert len(words) == 1, f"{command.where()}: .ci/busy-machine takes its WORKDIR"
    else:
        assert not words, f"{command.where()}: {command.program} takes no arguments"


def _selected_environments(words: tuple[str, ...]) -> list[str]:
    names = []
    for index, word in enumerate(words):
        if word == "-e":
            names.extend(words[index + 1].split(","))
        elif word.startswith("-e"):
            names.extend(word[2:].split(","))
    return names


def _argparse_flags(source: str) -> list[str]:
    """The option strings a module's ``add_argument`` calls declare."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found += [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
    return [flag for flag in found if isinstance(flag, str) and flag.startswith("-")]


def check_pip_install(command: Command) -> None:
    """What is installed exists: this project (the checkout, or its name on PyPI) with its
    extras, its wheel's name, or a known tool."""
    extras = _extras()
    for requirement in (w for w in command.words[2:] if not w.startswith("-")):
        project = rf"\.|{re.escape(_setup_cfg()['metadata']['name'])}"
        local = re.fullmatch(rf"(?:{project})(?:\[(?P<extras>[\w,-]+)\])?", requirement)
        if local:
            wanted = set(filter(None, (local["extras"] or "").split(",")))
            assert wanted <= extras, f"{command.where()}: no extra {wanted - extras} in setup.cfg"
        elif requirement.endswith(".whl"):
            wheel = f"dist/celery_sqs_heartbeat-{__version__}-py3-none-any.whl"
            assert fnmatch.fnmatch(wheel, requirement), f"{requirement} does not name {wheel}"
        else:
            assert requirement in PYPI_TOOLS, f"{command.where()}: installs {requirement}"


def _extras() -> set[str]:
    return set(_setup_cfg()["options.extras_require"])


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "setup.cfg")
    return config


def check_build(command: Command) -> None:
    """The wheel is built as the release check builds (and checks) it in CI."""
    release_check = (REPO / ".ci/release-check").read_text()
    assert "-m build" in release_check and "--wheel" in release_check
    assert python_args(command) == ("-m", "build", "--wheel"), f"{command.where()}: {command}"


def check_benchmark(command: Command) -> None:
    """The script is there and takes the page's flags and scenario.

    A full run takes minutes; each benchmark's ``--smoke`` run is tests/benchmarks' job.
    """
    args = python_args(command)
    assert args is not None
    script = REPO / args[0]
    assert script.is_file(), f"{command.where()}: no {args[0]}"
    usage = run([sys.executable, str(script), "--help"])
    assert_flags_in(command, args[1:], usage)
    scenario = args[args.index("--scenario") + 1] if "--scenario" in args else None
    assert scenario is None or scenario in usage, f"{command.where()}: no scenario {scenario}"


def check_pytest(command: Command) -> None:
    """pytest takes the command line and collects tests from it (nothing is run)."""
    args = python_args(command)
    assert args is not None
    output = run(
        [sys.executable, *args, "--collect-only", "-q", "-p", "no:cacheprovider"],
        env=command.env,
        timeout=180,
    )
    assert re.search(r"\b[1-9]\d* tests? collected|^\S+::\S+", output, re.MULTILINE), output


def check_celery_suite(command: Command) -> None:
    """The suite's runner takes the flags, in the tox environment the page names."""
    tox_python = _TOX_PYTHON.match(command.program)
    assert tox_python, f"{command.where()}: run it in its tox environment, which has its needs"
    assert tox_python["env"] in tox_environments(), f"no tox environment {tox_python['env']}"
    args = python_args(command)
    assert args is not None
    own = args[2:]
    if "--" in own:
        own = own[: own.index("--")]
    usage = run([sys.executable, "-m", "tests.celery_suite.run", "--help"])
    assert_flags_in(command, own, usage)


def check_inspect(command: Command) -> None:
    """The inspect command is one the package registers with Celery."""
    from celery.worker.control import Panel

    import celery_sqs_heartbeat.monitoring.control  # noqa: F401  (registers the commands)

    assert command.words[4] in Panel.data, f"{command.where()}: no inspect {command.words[4]}"


def check_example_worker(command: Command) -> None:
    module = REPO / (command.words[2].replace(".", "/") + ".py")
    assert module.is_file(), f"{command.where()}: no module {command.words[2]}"


def check_export(command: Command) -> None:
    """Every variable the page sets is one the example reads."""
    sources = "\n".join(p.read_text() for p in command.block.page.parent.glob("*.py"))
    for assignment in command.words[1:]:
        name = assignment.split("=", 1)[0]
        suffix = name.removeprefix("SPARK_PIPELINE_")
        assert name in sources or f'"{suffix}"' in sources, f"{command.where()}: {name} unread"


def nothing_to_run(command: Command) -> None:
    """The page's own set-up (a virtualenv, its activation): the test's environment is it."""


CHECKS: dict[str, Callable[[Command], None]] = {
    "makes the virtualenv": nothing_to_run,
    "activates the virtualenv": nothing_to_run,
    "pip install": check_pip_install,
    "builds the wheel": check_build,
    "script": check_script,
    "celery inspect": check_inspect,
    "example worker": check_example_worker,
    "export": check_export,
    "benchmark": check_benchmark,
    "pytest": check_pytest,
    "celery suite": check_celery_suite,
}
"""The kinds checked one command at a time; the others are run in their page's order."""
