"""The HTTP client a long-lived process (a worker) hands its providers, picked by TOOLLOOP_HTTP."""

from __future__ import annotations

import os

from toolloop.http.client import HttpClient
from toolloop.http.httpx_client import HttpxClient
from toolloop.http.keepalive import KeepAliveClient
from toolloop.http.network import Network


def client_from_env(network: Network | None = None) -> HttpClient:
    """A `KeepAliveClient` for a long-lived loop unless TOOLLOOP_HTTP is `httpx` (then an
    `HttpxClient`); `network` (default: the environment's proxy and certificates)."""
    if os.environ.get("TOOLLOOP_HTTP", "").strip() == "httpx":
        return HttpxClient(network=network)
    return KeepAliveClient(network=network)
