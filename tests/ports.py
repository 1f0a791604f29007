"""A free TCP port on this machine, for a server a test starts itself."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now; the server a test starts takes it.

    The kernel picks it, so tests running side by side (``-n``) do not collide; the
    probe is closed before the server binds, which leaves a race no test here has lost.
    """
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])
