"""The HTTP clients a provider sends its model calls with: one object, handed to the provider
(`http_client=`), or the provider's own; no module global picks one. Nothing here knows a provider:
what an answer means (retries, errors, streams) is toolloop/providers/call.py and retry.py.

    client.py        `HttpClient`, what a provider needs of a client (`send`, `aclose`); `Answer`
    httpx_client.py  `HttpxClient`: a fresh httpx client per call, on any event loop (the default)
    keepalive.py     `KeepAliveClient`: keep-alive HTTP/1.1 for a long-lived loop (a worker's)
    pool.py          the keep-alive connections: asyncio.Protocol and httptools, one pool per loop
    network.py       `Network`: the proxy and the trusted certificates of a provider's calls
    env.py           `client_from_env()`: the keep-alive client unless TOOLLOOP_HTTP=httpx
"""

from toolloop.http.client import Answer, HttpClient
from toolloop.http.env import client_from_env
from toolloop.http.httpx_client import HttpxClient
from toolloop.http.keepalive import KeepAliveClient
from toolloop.http.network import Network

__all__ = [
    "Answer",
    "HttpClient",
    "HttpxClient",
    "KeepAliveClient",
    "Network",
    "client_from_env",
]
