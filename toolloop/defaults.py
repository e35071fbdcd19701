"""Zero set-up defaults for the `toolloop` command: which Redis, and whether to simulate the model.

Redis: `REDIS_URL` when it is set, else an embedded server (toolloop.embedded) that lives in a state
directory (`$TOOLLOOP_HOME`, default `./.toolloop`). The first command that needs it starts it in
`<state>/redis/` (AOF on, its files there) and writes `<state>/redis/server.json` (pid, port); later
commands run from the same directory find it there and reuse it; `toolloop down` stops it. A server
that merely answers on 127.0.0.1:6379 is never used unasked: what you get does not depend on what
else runs on the machine.

Provider: when neither ANTHROPIC_API_KEY nor FAL_KEY is set, the command starts the provider
simulator (toolloop.sim) and points the worker at it (ANTHROPIC_BASE_URL and a placeholder key),
and says so in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

from toolloop import redisurl
from toolloop.embedded import EmbeddedServer, default_maxmemory, free_port, ping

PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "FAL_KEY")
SIMULATED_KEY = "sim-placeholder-key"
"""The key a worker sends to the simulator: the simulator accepts any key."""


class DefaultsError(RuntimeError):
    """A default could not be set up; the message has the usual two lines."""


def state_dir() -> Path:
    """Where embedded servers keep their files: `$TOOLLOOP_HOME`, else `./.toolloop`."""
    return Path(os.environ.get("TOOLLOOP_HOME") or ".toolloop").absolute()


@dataclass(frozen=True)
class RedisChoice:
    url: str
    embedded: bool
    started: bool = False
    """True when this call started the embedded server (False: REDIS_URL, or reused)."""
    pid: int | None = None


def _pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not reaped yet: the server a still-running
    `toolloop worker` started) counts as gone, so `toolloop down` does not wait for it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all there is
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialize starts and stops of one state directory across processes."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_record(record: Path) -> dict[str, int] | None:
    try:
        data = json.loads(record.read_text())
        return {"pid": int(data["pid"]), "port": int(data["port"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_embedded(state: Path | None = None) -> RedisChoice | None:
    """The embedded server of this state directory when it is running, else None."""
    record = _read_record((state or state_dir()) / "redis" / "server.json")
    if record and _pid_alive(record["pid"]) and ping("127.0.0.1", record["port"]):
        return RedisChoice(
            f"redis://127.0.0.1:{record['port']}/0", embedded=True, pid=record["pid"]
        )
    return None


NO_REDIS = "redis://127.0.0.1:6379/0"
"""The URL a Settings holds when neither REDIS_URL is set nor an embedded server runs (`redis_source`
is then ""): `Client()` and the worker (workers/config/settings.py) refuse it with `no_redis_message()`
rather than use it."""


def find_redis_url() -> tuple[str, str]:
    """Where Redis is, the one rule of every entry point: (url, where it came from). REDIS_URL when
    set; else the embedded server of the state directory ($TOOLLOOP_HOME, default ./.toolloop) when it
    runs; else (NO_REDIS, ""). Nothing is started here (the `toolloop` commands start the embedded
    server with the same rule: `redis_url`)."""
    from_env = os.environ.get("REDIS_URL", "").strip()
    if from_env:
        return from_env, "REDIS_URL"
    found = running_embedded()
    if found is not None:
        return found.url, f"the embedded server of {state_dir()}"
    return NO_REDIS, ""


def no_redis_message() -> str:
    return (
        f"REDIS_URL is not set and no embedded Redis runs in {state_dir()}.\n"
        "  Set REDIS_URL, or run `toolloop up` in this directory (TOOLLOOP_HOME moves it) first."
    )


def redis_url(state: Path | None = None, *, start: bool = True) -> RedisChoice:
    """`REDIS_URL` when set; else the state directory's embedded server, started when needed."""
    from_env = os.environ.get("REDIS_URL", "").strip()  # as find_redis_url reads it
    if from_env:
        return RedisChoice(from_env, embedded=False)
    directory = (state or state_dir()) / "redis"
    with _locked(directory):
        found = running_embedded(state)
        if found:
            return found
        if not start:
            raise DefaultsError(
                f"No embedded Redis is running for {directory.parent}.\n"
                "  Run `toolloop up` (or any command that needs it), or set REDIS_URL."
            )
        record = _read_record(directory / "server.json")
        port = record["port"] if record and _port_free(record["port"]) else free_port()
        server = EmbeddedServer(directory, port, maxmemory=default_maxmemory()).start()
        pid = server.pid
        assert pid is not None
        (directory / "server.json").write_text(json.dumps({"pid": pid, "port": port}))
        # The server outlives this process on purpose (later commands reuse it): forget the child
        # without waiting for it, and without the "still running" warning of a dropped Popen.
        assert server.process is not None
        server.process.returncode = 0
        return RedisChoice(server.url, embedded=True, started=True, pid=pid)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_embedded(state: Path | None = None, timeout: float = 10.0) -> int | None:
    """Stop this state directory's embedded server; its pid, or None when none was running."""
    directory = (state or state_dir()) / "redis"
    if not directory.exists():
        return None
    with _locked(directory):
        record = _read_record(directory / "server.json")
        if not record or not _pid_alive(record["pid"]):
            (directory / "server.json").unlink(missing_ok=True)
            return None
        pid = record["pid"]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            _reap(pid)
        (directory / "server.json").unlink(missing_ok=True)
        return pid


def _reap(pid: int) -> None:
    """Collect the exit status when the server is our own child (else it stays a zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def redis_problem(url: str, timeout: float = 2.0) -> str | None:
    """Why Redis at `url` cannot be used (None: it answered PING). It connects exactly as the
    workers and `Client` do: redis-py on the same URL, so a password, an ACL user and TLS
    (`rediss://...?ssl_ca_certs=/path/ca.pem`) are checked here as they will be used."""
    client = redisurl.sync_client(
        url, socket_connect_timeout=timeout, socket_timeout=timeout
    )
    try:
        client.ping()
    except redis.AuthenticationError as error:
        return f"it refused the credentials ({error})"
    except (
        redis.ResponseError
    ) as error:  # NOAUTH, NOPERM: an ACL user without the right
        return f"it refused the connection ({error})"
    except (redis.RedisError, OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        client.close()
    return None


def redis_reachable(url: str, timeout: float = 2.0) -> bool:
    """True when Redis at `url` answers PING with the URL's credentials and TLS (`redis_problem`)."""
    return redis_problem(url, timeout) is None


def has_provider_key(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return any(env.get(name) for name in PROVIDER_KEYS)


def simulated_provider_env(base_url: str) -> dict[str, str]:
    """The environment that points a worker's anthropic provider at the simulator at `base_url`."""
    return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": SIMULATED_KEY}
