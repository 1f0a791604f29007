"""Receipt handles kept out of Celery's log lines about messages it cannot run.

Celery reports a message it cannot run (not a task at all, an unregistered task, an
invalid one) with the message's whole ``delivery_info`` (``Consumer._message_report``),
and kombu's SQS channel keeps the raw SQS message there, receipt handle included. Anyone
who can send to the queue can make a worker write such a line; anyone who then reads the
log holds a handle that deletes or re-hides that message until its next receive. The
filter below replaces the handle's value in those lines and changes nothing else.
"""

from __future__ import annotations

import logging
import re

__all__ = ["CELERY_CONSUMER_LOGGER", "RedactReceiptHandles", "redact_celery_reports"]

#: Where Celery writes its reports of unknown, unregistered and invalid messages.
CELERY_CONSUMER_LOGGER = "celery.worker.consumer.consumer"

_HANDLE = re.compile(r"""(['"]ReceiptHandle['"]\s*:\s*)(['"])[^'"]*\2""")
REDACTED = "'<redacted>'"


class RedactReceiptHandles(logging.Filter):
    """Rewrites a record whose text shows a receipt handle; every record still passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:
            # A record that cannot be formatted fails in its handler as it would anyway.
            return True
        redacted = _HANDLE.sub(rf"\g<1>{REDACTED}", text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


def redact_celery_reports() -> None:
    """Install the filter on Celery's consumer logger, once per process."""
    logger = logging.getLogger(CELERY_CONSUMER_LOGGER)
    if not any(isinstance(existing, RedactReceiptHandles) for existing in logger.filters):
        logger.addFilter(RedactReceiptHandles())
