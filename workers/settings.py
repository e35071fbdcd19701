"""Worker settings, read from the environment once per process (small values in tests).

REDIS_URL                    redis://127.0.0.1:6379/0  journal, run state and broker (one fate)
TOOLLOOP_VISIBILITY_TIMEOUT  3600    s before kombu re-delivers an unacked task (> 2 x longest step)
TOOLLOOP_RESTORE_INTERVAL    5       s between kombu's unacked sweeps (throttle 1)
TOOLLOOP_LEASE_MS            120000  a step's lease, renewed while it runs (< visibility timeout)
TOOLLOOP_STEP_TIMEOUT        900     s a step may run before the run fails (threads: no time limit)
TOOLLOOP_MAX_DELIVERIES      5       deliveries of one task before the run fails
TOOLLOOP_SWEEP_INTERVAL      15      s between sweeps in each worker (0: off; beat toolloop.sweep)
TOOLLOOP_OUTBOX_AGE          30      s before the sweeper re-sends a recorded successor
TOOLLOOP_REDRIVE_AGE         300     s a queued/running run with no lease and no recorded successor
                                     may sit still before the sweeper sends its step again
TOOLLOOP_SHUTDOWN_GRACE      30      s a warm shutdown lets running steps finish before it puts them back
TOOLLOOP_PROMPT_GEN          unset   "pkg.mod:factory" returning a PromptGen or a generate;
                                     unset: toolloop.providers.from_env()
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


@dataclass(frozen=True)
class Settings:
    redis_url: str
    visibility_timeout: float
    restore_interval: float
    lease_ms: int
    step_timeout: float
    max_deliveries: int
    sweep_interval: float
    outbox_age: float
    redrive_age: float
    shutdown_grace: float
    prompt_gen: str | None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            redis_url=os.environ.get("REDIS_URL", "").strip() or "redis://127.0.0.1:6379/0",
            visibility_timeout=_float("TOOLLOOP_VISIBILITY_TIMEOUT", 3600),
            restore_interval=_float("TOOLLOOP_RESTORE_INTERVAL", 5),
            lease_ms=int(_float("TOOLLOOP_LEASE_MS", 120_000)),
            step_timeout=_float("TOOLLOOP_STEP_TIMEOUT", 900),
            max_deliveries=int(_float("TOOLLOOP_MAX_DELIVERIES", 5)),
            sweep_interval=_float("TOOLLOOP_SWEEP_INTERVAL", 15),
            outbox_age=_float("TOOLLOOP_OUTBOX_AGE", 30),
            redrive_age=_float("TOOLLOOP_REDRIVE_AGE", 300),
            shutdown_grace=_float("TOOLLOOP_SHUTDOWN_GRACE", 30),
            prompt_gen=os.environ.get("TOOLLOOP_PROMPT_GEN", "").strip() or None,
        )
