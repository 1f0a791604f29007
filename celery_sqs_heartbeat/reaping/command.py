"""``celery -A proj sqs-reap``: what killed monitors and workers left on SQS and SNS, removed.

A Celery sub-command (entry point ``celery.commands``), so it reads the app's broker URL,
``broker_transport_options`` (``queue_name_prefix``, region, ``supports_fanout``),
credentials and remote control exactly as the app's workers do, and pings through the
same mailbox. A dry run by default: each line says what would go and why.

Output, one line each, tab separated: ``would-delete`` or ``deleted`` (``kept`` with
``--show-kept``, ``still-there`` for a subscription whose queue exists after all,
``failed`` if a delete was refused), the kind (``event-queue``, ``mailbox``,
``reply-queue``, ``subscription``), the queue name or subscription ARN, and why.
Exit status: 0 if nothing is (left) to reap, 1 if the dry run found something to reap,
3 if a delete failed, 4 if a call needed to judge was refused (nothing is deleted then);
Celery's usage errors are 2.
"""

from __future__ import annotations

from typing import Any

import click
from botocore.exceptions import ClientError
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options

from ..compat import KOMBU_BROADCASTS_THROUGH_SNS
from .observations import Observer
from .survey import Settings, Survey
from .verdicts import MAILBOX, Verdict, check_stale, parse_duration

__all__ = ["sqs_reap"]

FOUND_SOMETHING = 1
A_DELETE_FAILED = 3
SURVEY_REFUSED = 4


def _duration(ctx: Any, param: Any, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


def _option(name: str, **attributes: Any) -> Any:
    """One of the command's options: ``celery sqs-reap --help`` lists them in a group."""
    return click.option(name, cls=CeleryOption, help_group="Reaping Options", **attributes)


@click.command(cls=CeleryCommand, name="sqs-reap")
@_option("--delete", is_flag=True, help="Delete what the dry run lists (default: only list it).")
@_option(
    "--older-than",
    default="1h",
    callback=_duration,
    show_default=True,
    help="Leave queues created less than this long ago (90s, 30m, 1h, 2d).",
)
@_option(
    "--stale",
    default="30s",
    callback=_duration,
    show_default=True,
    help="An event unread this long shows no monitor reads its queue.",
)
@_option(
    "--ping-tries",
    default=3,
    type=click.IntRange(1),
    show_default=True,
    help="Pings a worker may miss before its mailbox is judged gone.",
)
@_option(
    "--ping-timeout",
    default=2.0,
    type=click.FloatRange(0.5),
    show_default=True,
    help="Seconds each ping waits for answers.",
)
@_option("--show-kept", is_flag=True, help="Also list what is kept, and why.")
@click.pass_context
@handle_preload_options
def sqs_reap(
    ctx: Any,
    delete: bool,
    older_than: float,
    stale: float,
    ping_tries: int,
    ping_timeout: float,
    show_kept: bool,
    **kwargs: Any,
) -> None:
    """Remove what killed monitors and workers left on SQS: event queues, mailboxes, subscriptions.

    Never a task queue, a live worker's mailbox or a reply queue. A dry run unless --delete.
    """
    if not KOMBU_BROADCASTS_THROUGH_SNS:
        raise click.UsageError(
            "sqs-reap needs kombu 5.7 or later: before it, SQS has no SNS fanout, and no "
            "monitor or mailbox queue is subscribed to anything"
        )
    app = ctx.obj.app
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        if not hasattr(channel, "canonical_queue_name"):
            raise click.UsageError(f"sqs-reap needs an SQS broker, not {connection.transport_cls}")
        try:
            check_stale(stale, channel.wait_time_seconds, connection.transport.polling_interval)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--stale") from error
        settings = Settings(
            older_than,
            stale,
            ping_tries,
            ping_timeout,
            bool(channel.supports_fanout),
            app.control.mailbox.exchange.name,
        )
        survey = Survey(Observer(app, channel), settings)
        try:
            verdicts = survey.verdicts()
        except ClientError as error:
            click.echo(f"sqs-reap: nothing judged, a call was refused: {error}", err=True)
            ctx.exit(SURVEY_REFUSED)
        if not settings.remote_control and any(v.kind == MAILBOX for v in verdicts):
            click.echo(
                "Remote control is off (supports_fanout): mailboxes cannot be judged, and are "
                "left; --show-kept lists them",
                err=True,
            )
        ctx.exit(_report(survey, verdicts, delete, show_kept))


def _report(survey: Survey, verdicts: list[Verdict], delete: bool, show_kept: bool) -> int:
    """Print a line a verdict (acting on it if ``delete``); the exit status."""
    status = 0
    for verdict in verdicts:
        if not verdict.reap:
            if show_kept:
                _line("kept", verdict)
            continue
        if not delete:
            _line("would-delete", verdict)
            status = FOUND_SOMETHING
            continue
        try:
            if survey.reap(verdict):
                _line("deleted", verdict)
            else:
                _line("still-there", verdict, "its queue exists: kept")
        except Exception as error:
            _line("failed", verdict, f"{verdict.reason}; {error}")
            status = A_DELETE_FAILED
    return status


def _line(action: str, verdict: Verdict, reason: str | None = None) -> None:
    click.echo("\t".join([action, verdict.kind, verdict.name, reason or verdict.reason]))
