"""A real Sentinel deployment on loopback for tests: a primary, replicas and three sentinels, each a
redis-server process of its own (Debian's `redis-sentinel` is the same binary run with `--sentinel`),
on free ports in a temporary directory, stopped by their PIDs.

`failover()` asks a sentinel for a graceful `SENTINEL FAILOVER` and waits until every sentinel names
the new primary and it takes writes; `kill_primary()` SIGKILLs the primary (the sentinels then elect
a replica after `down-after-milliseconds`).

With `demote` (the default) the sentinels run deploy/sentinel/demote-old-primary.sh as their
`client-reconfig-script`, as docs/operations.md advises: the leader of a failover makes the old
primary a replica of the new one at once (without it, a demoted primary stays writable about 10-20 s,
and `WAIT` has no replica to count meanwhile). The data nodes run with `repl-diskless-sync-delay 0`,
so the full resync of a demoted primary starts at once rather than after Redis's default 5 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from toolloop.embedded import free_port, ping, server_binary

SERVICE = "toolloop-primary"
DEMOTE_SCRIPT = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "sentinel"
    / "demote-old-primary.sh"
)


@dataclass
class _Node:
    port: int
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class SentinelSet:
    directory: Path
    replicas: int = 1
    demote: bool = True
    nodes: list[_Node] = field(default_factory=list)
    sentinels: list[_Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelSet:
        self.directory.mkdir(parents=True, exist_ok=True)
        primary = self._server("node-0", [])
        self.nodes.append(primary)
        for n in range(1, self.replicas + 1):
            self.nodes.append(
                self._server(
                    f"node-{n}", ["--replicaof", "127.0.0.1", str(primary.port)]
                )
            )
        for n in range(3):
            self.sentinels.append(self._sentinel(f"sentinel-{n}", primary.port))
        self._wait(
            lambda: all(
                len(self._sentinel_replicas(s)) == self.replicas for s in self.sentinels
            ),
            30,
        )
        self.replicas_in_sync()  # the first full sync done: a WAIT from now on counts the replicas
        return self

    def _server(self, name: str, extra: list[str]) -> _Node:
        port = free_port()
        home = self.directory / name
        home.mkdir()
        log = home / "server.log"
        args = [*_server_args(port, home, log), *extra]
        process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait(lambda: ping("127.0.0.1", port), 10)
        return _Node(port, process, log)

    def _sentinel(self, name: str, primary_port: int) -> _Node:
        port = free_port()
        home = self.directory / name
        home.mkdir()
        conf = home / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {home}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 4000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
            # a script is taken from the config file only (deny-scripts-reconfig: no SENTINEL SET)
            + (
                f"sentinel client-reconfig-script {SERVICE} {DEMOTE_SCRIPT}\n"
                if self.demote
                else ""
            )
        )
        log = home / "sentinel.log"
        args = [server_binary(), str(conf), "--sentinel", "--logfile", str(log)]
        process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait(lambda: ping("127.0.0.1", port), 10)
        return _Node(port, process, log)

    def _client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, decode_responses=True)

    def _sentinel_replicas(self, sentinel: _Node) -> list[object]:
        with contextlib.suppress(redis.RedisError):
            replicas: list[object] = self._client(sentinel.port).sentinel_slaves(
                SERVICE
            )
            return [r for r in replicas if "s_down" not in str(r.get("flags", ""))]  # type: ignore[attr-defined]
        return []

    def primary_port(self) -> int:
        """The port every sentinel names as the primary (waits until they agree)."""
        found: set[int] = set()

        def agreed() -> bool:
            found.clear()
            for sentinel in self.sentinels:
                with contextlib.suppress(redis.RedisError):
                    _host, port = self._client(
                        sentinel.port
                    ).sentinel_get_master_addr_by_name(SERVICE)
                    found.add(int(port))
            return len(found) == 1

        self._wait(agreed, 30)
        return found.pop()

    def failover(self, timeout: float = 30) -> int:
        """A graceful failover; returns the new primary's port once it takes writes."""
        before = self.primary_port()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._client(self.sentinels[0].port).execute_command(
                    "SENTINEL", "FAILOVER", SERVICE
                )
                break
            except redis.ResponseError as error:
                # right after a failover the sentinels may not have read the demoted primary's
                # INFO as a replica yet ("NOGOODSLAVE No suitable replica to promote")
                if "NOGOODSLAVE" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return self._moved_from(before, timeout)

    def kill_primary(self, timeout: float = 30) -> int:
        """SIGKILL the primary; returns the new primary's port once it takes writes. The killed node is
        started again as a replica of the new one (the sentinels reconfigure it)."""
        before = self.primary_port()
        node = next(n for n in self.nodes if n.port == before)
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        after = self._moved_from(before, timeout)
        home = node.log.parent
        args = [
            *_server_args(node.port, home, node.log),
            "--replicaof",
            "127.0.0.1",
            str(after),
        ]
        node.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait(lambda: ping("127.0.0.1", node.port), 10)
        return after

    def _moved_from(self, before: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                port = self.primary_port()
                if (
                    port != before
                    and self._client(port).info("replication").get("role") == "master"
                ):
                    return port
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels named no new primary within {timeout} s")

    def rejoined(self, port: int, timeout: float = 30) -> None:
        """Wait until the node on `port` (a demoted primary) replicates the primary again."""

        def replica() -> bool:
            with contextlib.suppress(redis.RedisError):
                info = self._client(port).info("replication")
                return (
                    info.get("role") == "slave"
                    and info.get("master_link_status") == "up"
                )
            return False

        self._wait(replica, timeout)

    def replicas_in_sync(self, timeout: float = 30) -> None:
        """Wait until every replica has caught up with the primary (and is connected)."""
        primary = self._client(self.primary_port())

        def synced() -> bool:
            info = primary.info("replication")
            return (
                int(info.get("connected_slaves", 0)) >= self.replicas
                and int(primary.wait(self.replicas, 500)) >= self.replicas
            )

        self._wait(synced, timeout)

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            if node.process.poll() is None:
                node.process.terminate()
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(node.process.pid, signal.SIGKILL)
                    node.process.wait(10)

    @staticmethod
    def _wait(predicate: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise RuntimeError(f"not reached within {timeout} s")


def _server_args(port: int, home: Path, log: Path) -> list[str]:
    return [
        server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(home),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--maxmemory-policy",
        "noeviction",
        # a demoted primary's full resync starts at once (Redis waits 5 s by default)
        "--repl-diskless-sync-delay",
        "0",
        "--logfile",
        str(log),
    ]
