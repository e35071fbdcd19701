"""Processes the durable benchmarks start: a private Redis-compatible server and Celery workers.

Every process is started in its own session and stopped by its process group id, never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from toolloop.embedded import start_server

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


@contextlib.contextmanager
def private_redis(prefix: str) -> Iterator[tuple[Path, str]]:
    """A temporary directory (named `prefix`...) and a Redis server of its own in it, never the shared
    one: yields (directory, url) with the url also in BENCH_REDIS_URL for the bench apps; the server is
    stopped and the directory removed at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp_dir:
        tmp = Path(tmp_dir)
        server = start_server(tmp / "redis")
        os.environ["BENCH_REDIS_URL"] = server.url
        try:
            yield tmp, server.url
        finally:
            server.stop()


def env_with(**extra: str) -> dict[str, str]:
    """The current environment, bench/ and the project root on PYTHONPATH, plus `extra`."""
    env = dict(os.environ)
    paths = [str(BENCH), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


class Worker:
    """`celery -A <app> worker ...` as a child process group."""

    def __init__(
        self,
        app_path: str,
        *,
        pool: str,
        concurrency: int,
        queues: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log: Path | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.name = f"bench-{uuid.uuid4().hex[:8]}@localhost"
        self.args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app_path,
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            self.name,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-E",
            "-l",
            "WARNING",
            *(["-Q", ",".join(queues)] if queues else []),
            *extra,
        ]
        self.env = env or env_with()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, app: Any, timeout: float = 60.0) -> Worker:
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.args,
            env=self.env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if self.log:
            out.close()  # type: ignore[union-attr]  # the child holds its own copy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"The bench worker exited at start with code {self.process.returncode}.\n"
                    f"  See its log: {self.log}."
                )
            if app.control.ping(destination=[self.name], timeout=0.5):
                return self
        self.stop()
        raise RuntimeError(
            f"The bench worker did not answer a ping within {timeout:.0f} s.\n  See {self.log}."
        )

    def _group_files(self, name: str) -> Iterator[str]:
        """The /proc/<pid>/<name> text of every live process in the worker's process group."""
        assert self.process
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(entry.name)) == self.process.pid:
                    yield (entry / name).read_text()

    def pid_rss_mb(self) -> float:
        """Resident memory of the worker's whole process group, in MB (Linux /proc)."""
        total = 0
        for status in self._group_files("status"):
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024

    def cpu_seconds(self) -> float:
        """User+system CPU of the worker's main process and its children (prefork), from /proc."""
        total = 0
        for stat in self._group_files("stat"):
            fields = stat.rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def spy(self, seconds: float) -> subprocess.Popen[bytes] | None:
        """With BENCH_PYSPY=<file>, sample this worker with py-spy for `seconds` (raw collapsed stacks
        per thread, busy samples only) in the background; None without it."""
        out = os.environ.get("BENCH_PYSPY")
        if not out or not self.process:
            return None
        py_spy = Path(sys.executable).with_name("py-spy")
        args = [
            str(py_spy),
            "record",
            "-p",
            str(self.process.pid),
            "-d",
            str(int(seconds)),
            "-f",
            "raw",
            "-o",
            out,
            "--nonblocking",
            "--threads",
            "--subprocesses",
            "--rate",
            "250",
        ]
        return subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self, grace: float = 10.0) -> None:
        if not self.process or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running(worker: Worker, app: Any) -> Iterator[Worker]:
    worker.start(app)
    try:
        yield worker
    finally:
        worker.stop()
