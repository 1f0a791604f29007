"""Where the strict server listens and how it says so: the facts its process, its
command line and the object that starts it share.

They live here, below all three, so that none of them imports another for a constant.
"""

from __future__ import annotations

__all__ = [
    "ACCESS_KEY",
    "CONSOLE_SCRIPT",
    "DEFAULT_PORT",
    "ENTRY_MODULE",
    "HOST",
    "READY_PREFIX",
]

#: The only address the test bed binds: it takes orders from anyone who can reach it.
HOST = "127.0.0.1"
DEFAULT_PORT = 9324
"""A fixed port, so that an app's broker URL can name it; ``--port 0`` picks a free one."""
ENTRY_MODULE = "celery_sqs_heartbeat.testing.strict_sqs"
CONSOLE_SCRIPT = "celery-sqs-heartbeat-server"
#: The first line the process prints once it serves, followed by its URL.
READY_PREFIX = "STRICT_SQS_READY "
#: Any credentials are accepted; this one is what the test bed's own clients sign with.
ACCESS_KEY = "testing"
