"""Ending a process a test started (in its own session, so its PID is its process group's id)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def end(
    process: subprocess.Popen[Any], grace: float = 30, *, group: bool = False
) -> None:
    """SIGTERM to `process` (with `group`, to its whole process group, even once it has exited itself,
    so that the children it left end too), `grace` seconds to exit, then SIGKILL to its group."""
    if group:
        with contextlib.suppress(ProcessLookupError):  # the group is already empty
            os.killpg(process.pid, signal.SIGTERM)
    elif process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
    else:
        return
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
