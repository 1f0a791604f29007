"""The botocore sessions of a process's clients, reading botocore's data through one loader.

kombu makes each channel's client in a boto3 session of its own, and each session parses
botocore's endpoints (6.7 MiB of Python objects) and the service's model anew and keeps
them while the connection lives: a worker holds one such parse per live connection (40
MiB in a gevent worker of the chaos soak, after five reconnects), and each reconnect
parses them again while the old connection's are still alive. The soak's gevent worker
grew 46 MiB in three reconnects 3 s apart, and kept it. A session made here reads
through one loader per process, which keeps each file parsed once.

The client is made the way kombu makes it (region, credentials, ``is_secure``, the
endpoint and the ``client-config`` transport option), by botocore directly: a boto3
session would add its own data path to the shared loader's search paths each time.
"""

from __future__ import annotations

import threading
from typing import Any

import botocore.loaders
import botocore.session
from botocore.client import BaseClient
from botocore.config import Config

__all__ = ["client_as_kombu_makes_it", "new_session"]

_loader: botocore.loaders.Loader | None = None
_loader_lock = threading.Lock()


def _shared_loader() -> botocore.loaders.Loader:
    """The process's loader, made on first use; a forked child keeps its parent's parses."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


def new_session() -> botocore.session.Session:
    """A botocore session of its own (credentials, region) on the process's loader."""
    session = botocore.session.Session()
    session.register_component("data_loader", _shared_loader())
    return session


def client_as_kombu_makes_it(
    service: str,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    session_token: str | None,
    *,
    is_secure: bool | None,
    endpoint_url: str | None,
    transport_options: dict[str, Any],
    config: Config | None = None,
) -> BaseClient:
    """kombu's client for ``service`` (``Channel.new_sqs_client``, 5.7's
    ``_new_boto_client``), made in a session of :func:`new_session`."""
    client_config = Config(**(transport_options.get("client-config") or {}))
    if config is not None:
        client_config = client_config.merge(config)
    return new_session().create_client(
        service,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        aws_session_token=session_token,
        use_ssl=True if is_secure is None else is_secure,
        endpoint_url=endpoint_url,
        config=client_config,
    )
