"""Supervised worker processes: real `celery -A workers.app worker -P threads` subprocesses.

Each worker runs in its own session (its own process group), so a kill point can SIGKILL the whole
group and nothing else. A supervisor thread notices a dead worker and starts a replacement at once,
as a process manager (systemd, Kubernetes) would, while the other workers keep going. Workers are
stopped by PID (SIGTERM, then SIGKILL of their group). Every incarnation logs to its own file, kept
for the secrets scan.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Small delivery timers, so that a killed worker's step comes back within seconds. The lease is
# shorter than the visibility timeout: a redelivered step finds the dead holder's lease lapsed. The
# sweeper re-drives a run whose step message is gone (acked by a copy that failed while Redis was
# down) after TOOLLOOP_REDRIVE_AGE instead of the default 300 s.
FAST = {
    "TOOLLOOP_VISIBILITY_TIMEOUT": "4",
    "TOOLLOOP_RESTORE_INTERVAL": "1",
    "TOOLLOOP_SWEEP_INTERVAL": "1",
    "TOOLLOOP_OUTBOX_AGE": "1",
    "TOOLLOOP_LEASE_MS": "3000",
    "TOOLLOOP_REDRIVE_AGE": "6",
}


@dataclass
class Incarnation:
    process: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)


class WorkerPool:
    """`size` workers running `concurrency` tasks at once each, restarted when they die (until `stop`).

    Every queue goes to the worker's step consumer (control tasks included), so `concurrency` bounds
    the steps in flight in a worker (control tasks run beside them, in slots of their own): a kill
    re-runs at most the steps that were in flight in the process it killed."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        env: dict[str, str],
        *,
        size: int = 2,
        concurrency: int = 1,
        queues: str = "llm,tools,control",
        step_queues: str | None = None,
        events: bool = True,
        loglevel: str = "INFO",
    ) -> None:
        self.loglevel = loglevel
        self.log_dir = log_dir
        self.size = size
        self.concurrency = concurrency
        self.queues = queues
        self.step_queues = queues if step_queues is None else step_queues
        """The queues of the step consumer; "none" runs every task in Celery's threads pool."""
        self.events = events
        pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
        self.env = {
            **os.environ,
            **FAST,
            **env,
            "REDIS_URL": redis_url,
            "PYTHONPATH": pythonpath,
        }
        self.workers: list[Incarnation] = []
        self.logs: list[Path] = []
        self.deaths: list[tuple[int, int]] = []
        """(pid, returncode) of every worker that died while the pool ran."""
        self._running = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _spawn(self) -> Incarnation:
        name = f"faults-{uuid.uuid4().hex[:8]}"
        log = self.log_dir / f"{name}.log"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            "-P",
            "threads",
            "-c",
            str(self.concurrency),
            "-Q",
            self.queues,
            "--step-queues",
            self.step_queues,
            "--steps-in-flight",
            str(self.concurrency),
            "-n",
            f"{name}@%h",
            "--without-mingle",
            "--without-gossip",
            "-l",
            self.loglevel,
        ]
        if self.events:
            args.append("-E")
        with log.open("wb") as out:
            process = subprocess.Popen(
                args,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.logs.append(log)
        return Incarnation(process, log)

    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> WorkerPool:
        with self._lock:
            self._running = True
            self.workers = [self._spawn() for _ in range(self.size)]
        if wait_ready:
            deadline = time.monotonic() + timeout
            for worker in self.workers:
                while " ready." not in worker.log.read_text(errors="replace"):
                    if worker.process.poll() is not None:
                        raise RuntimeError(
                            f"A worker exited at start:\n{worker.log.read_text()[-3000:]}"
                        )
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"A worker was not ready in {timeout} s:\n{worker.log.read_text()[-3000:]}"
                        )
                    time.sleep(0.1)
        self._thread = threading.Thread(
            target=self._supervise, name="faults-supervisor", daemon=True
        )
        self._thread.start()
        return self

    def _supervise(self) -> None:
        while True:
            with self._lock:
                if not self._running:
                    return
                for index, worker in enumerate(self.workers):
                    code = worker.process.poll()
                    if code is not None:
                        self.deaths.append((worker.process.pid, code))
                        self.workers[index] = self._spawn()
            time.sleep(0.1)

    def pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self.workers]

    def kill_all(self) -> None:
        """SIGKILL every worker's process group now (the supervisor restarts them)."""
        with self._lock:
            for worker in self.workers:
                _killpg(worker.process)

    def stop(self) -> None:
        with self._lock:
            self._running = False
            workers = list(self.workers)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                _killpg(worker.process)
                worker.process.wait(timeout=10)

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _killpg(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
