"""What a `REDIS_URL` names, and the redis-py clients and Celery broker settings made from it: the one
place every entry point (Client, AsyncClient, the CLI, the workers, Flower, the web example) turns a
URL into connections.

Accepted forms:
- `redis://[[user]:password@]host[:port][/db][?options]` and `rediss://...` (TLS; `ssl_ca_certs=`,
  `ssl_certfile=`, ... in the query, as redis-py reads them); `valkey://` and `valkeys://` mean the
  same (Valkey speaks the same protocol);
- `redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db][?options]` (TLS:
  `rediss+sentinel://`; also `valkey+sentinel://`, `valkeys+sentinel://`): the primary of
  `service_name` as the sentinels name it, found again after a failover. The credentials are the
  data nodes'; sentinels that need their own take `sentinel_username=` / `sentinel_password=` in the
  query. TLS applies to the sentinels and to the data nodes alike.

How a Sentinel client follows a failover (redis-py's `SentinelConnectionPool`): every new connection
asks the sentinels for the primary; a `READONLY` reply (the old primary, demoted) disconnects and is
raised as a `ConnectionError`, so a client with retries (the workers') reconnects to the new one.
Connections that still reach a demoted primary that accepts writes are dropped when the sentinels
announce `+switch-master` (`workers/failover.py`); `TOOLLOOP_COMMIT_WAIT` covers the moments before.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

from toolloop import sentinel as following

_ALIASES = {
    "redis": "redis",
    "rediss": "rediss",
    "valkey": "redis",
    "valkeys": "rediss",
    "unix": "unix",
    "redis+sentinel": "redis+sentinel",
    "rediss+sentinel": "rediss+sentinel",
    "valkey+sentinel": "redis+sentinel",
    "valkeys+sentinel": "rediss+sentinel",
}
_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")
SENTINEL_PORT = 26379


class RedisUrlError(ValueError):
    """A REDIS_URL that names no Redis we can connect to; the message says how to write one."""


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    """A parsed REDIS_URL. `sentinels` is empty for a direct URL (`url` is then what redis-py takes)."""

    url: str
    """For a direct URL, the URL in redis-py's own schemes (`valkey://` read as `redis://`)."""
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    tls: bool = False
    node_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The data nodes' connection options (credentials, db, TLS options) for a Sentinel URL."""
    sentinel_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)


def _refuse(url: str, why: str) -> RedisUrlError:
    shown = _redacted(url)
    return RedisUrlError(
        f"REDIS_URL {shown!r} {why}.\n"
        "  Write redis://[:password@]host:port/db (rediss:// for TLS), or "
        "redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db] for Sentinel."
    )


def _redacted(url: str) -> str:
    parts = urlsplit(url) if "://" in url else None
    if parts is None or "@" not in parts.netloc:
        return url
    return url.replace(parts.netloc.rsplit("@", 1)[0], "***", 1)


def parse(url: str) -> RedisTarget:
    """The target of `url`; `RedisUrlError` (two lines, the password hidden) when it names none."""
    scheme, sep, rest = url.partition("://")
    kind = _ALIASES.get(scheme.lower()) if sep else None
    if kind is None:
        raise _refuse(url, f"has the scheme {scheme!r}" if sep else "is not a URL")
    if "sentinel" not in kind:
        return RedisTarget(url=f"{kind}://{rest}")
    return _sentinel(url, tls=kind.startswith("rediss"), rest=rest)


def _sentinel(url: str, *, tls: bool, rest: str) -> RedisTarget:
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = tuple(
        _host_port(url, item) for item in hosts.split(",") if item.strip()
    )
    if not sentinels:
        raise _refuse(url, "names no sentinel (host:port)")
    service, _, db_text = path.strip("/").partition("/")
    if not service:
        raise _refuse(
            url, "names no service (the sentinels' master name) after the hosts"
        )
    try:
        db = int(db_text) if db_text else 0
    except ValueError:
        raise _refuse(url, f"has the database {db_text!r}, not a number") from None
    options = dict(parse_qsl(query))
    sentinel_auth = {
        key[len("sentinel_") :]: options.pop(key)
        for key in _SENTINEL_ONLY
        if key in options
    }
    # redis-py reads the credentials and the query's options (ssl_*, socket_timeout, ...) itself
    scheme = "rediss" if tls else "redis"
    node: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call]
        f"{scheme}://{userinfo + '@' if userinfo else ''}localhost/{db}?{urlencode(options)}"
    )
    node.pop("host", None)
    node.pop("connection_class", None)
    node["db"] = db
    ssl_options = {key: value for key, value in node.items() if key.startswith("ssl")}
    if tls:
        node["ssl"] = True
    on_sentinels: dict[str, Any] = {
        **ssl_options,
        **({"ssl": True} if tls else {}),
        **sentinel_auth,
    }
    return RedisTarget(
        url=url,
        sentinels=sentinels,
        service=unquote(service),
        db=db,
        tls=tls,
        node_kwargs=node,
        sentinel_kwargs=on_sentinels,
    )


def _host_port(url: str, item: str) -> tuple[str, int]:
    host, _, port = (
        item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
    )
    host = host.strip("[]")
    try:
        number = int(port) if port else SENTINEL_PORT
    except ValueError:
        raise _refuse(
            url, f"has the sentinel {item!r}, whose port is not a number"
        ) from None
    if not host or not 0 < number < 65536:
        raise _refuse(url, f"has the sentinel {item!r}")
    return host, number


def _timeouts(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The socket timeouts a sentinel lookup should use: the client's, bounded (a sentinel that does not
    answer must not hold a step). The lookups are made without retries (the callers pass
    `Retry(NoBackoff(), 0)`): redis-py 8 retries a command 10 times with backoff by default, so a
    hung first sentinel held every new client's first command ~27 s before the next sentinel was
    asked (tests/integration/test_flower_sentinel.py); without retries, one timeout."""
    found = {
        k: kwargs[k]
        for k in ("socket_timeout", "socket_connect_timeout")
        if kwargs.get(k)
    }
    return {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, **found}


def watcher(url: str) -> following.SwitchWatcher | None:
    """For a Sentinel URL, a watcher of its `+switch-master` announcements to pass to the clients made
    on it (`sync_client(url, watcher=...)`); None for a direct URL. The caller closes it."""
    target = parse(url)
    if not target.is_sentinel:
        return None
    return following.SwitchWatcher(
        target.sentinels, target.service, target.sentinel_kwargs
    )


def sync_client(
    url: str, *, watcher: following.SwitchWatcher | None = None, **kwargs: Any
) -> redis.Redis:
    """A redis-py client on `url` (a Sentinel URL: its primary, followed across failovers, at once
    when `watcher` hears the sentinels announce one)."""
    target = parse(url)
    if not target.is_sentinel:
        return redis.Redis.from_url(target.url, **kwargs)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs={
            **_timeouts(kwargs),
            "retry": Retry(NoBackoff(), 0),
            **target.sentinel_kwargs,
        },
    )
    node = {**target.node_kwargs, **kwargs}
    tls = node.pop("ssl", False)
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service,
        connection_class=following.FollowingSSLConnection
        if tls
        else following.FollowingConnection,
        **node,
    )
    if watcher is not None:
        watcher.watch(client.connection_pool)
    return client


def async_client(
    url: str,
    *,
    watcher: following.SwitchWatcher | None = None,
    blocking_pool: int = 0,
    **kwargs: Any,
) -> aredis.Redis:
    """As `sync_client`, for asyncio. `blocking_pool`: at most that many connections, and a call past
    them waits for one (redis.asyncio's `BlockingConnectionPool`) instead of being refused."""
    target = parse(url)
    if blocking_pool:
        kwargs = {**kwargs, "max_connections": blocking_pool, "timeout": None}
    if not target.is_sentinel and blocking_pool:
        pool = aredis.BlockingConnectionPool.from_url(target.url, **kwargs)
        return aredis.Redis(connection_pool=pool)
    if not target.is_sentinel:
        return aredis.Redis.from_url(target.url, **kwargs)
    if blocking_pool:
        kwargs["connection_pool_class"] = following.AsyncBlockingSentinelPool
    sentinel = AsyncSentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs={
            **_timeouts(kwargs),
            "retry": AsyncRetry(NoBackoff(), 0),
            **target.sentinel_kwargs,
        },
    )
    node = {**target.node_kwargs, **kwargs}
    tls = node.pop("ssl", False)
    client: aredis.Redis = sentinel.master_for(
        target.service,
        connection_class=following.AsyncFollowingSSLConnection
        if tls
        else following.AsyncFollowingConnection,
        **node,
    )
    if watcher is not None:
        watcher.watch(client.connection_pool)
    return client


def broker(url: str) -> tuple[str, dict[str, Any]]:
    """Celery's `broker_url` and the transport options it needs for `url`: the URL itself (in
    redis-py's schemes) for a direct one; for Sentinel, kombu's `sentinel://host:port;...` form with
    `master_name` and `sentinel_kwargs` (kombu's Sentinel transport follows the failover itself)."""
    target = parse(url)
    if not target.is_sentinel:
        return target.url, {}
    node = target.node_kwargs
    auth = ""
    if node.get("password") or node.get("username"):
        auth = f"{node.get('username') or ''}:{node.get('password') or ''}@"
    hosts = ";".join(
        f"sentinel://{auth}{host}:{port}/{target.db}" for host, port in target.sentinels
    )
    options: dict[str, Any] = {"master_name": target.service}
    if target.sentinel_kwargs:
        options["sentinel_kwargs"] = dict(target.sentinel_kwargs)
    return hosts, options


def broker_ssl(url: str) -> dict[str, Any]:
    """The TLS options Celery's `broker_use_ssl` takes for a TLS Sentinel URL ({} otherwise)."""
    target = parse(url)
    if not (target.is_sentinel and target.tls):
        return {}
    return {
        key: value
        for key, value in target.node_kwargs.items()
        if key.startswith("ssl_")
    }
