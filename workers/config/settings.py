"""Worker settings, read from the environment once per process (small values in tests).

REDIS_URL                    unset   journal, run state and broker (one fate); unset: the embedded
                                     server of $TOOLLOOP_HOME (default ./.toolloop) when it runs
                                     (`toolloop up` starts it): the same rule for the CLI, `Client`,
                                     the web example, the worker and Flower
                                     (`toolloop.defaults.find_redis_url`)
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
TOOLLOOP_METRICS_PORT        0       serve Prometheus metrics on this port (0: off; docs/operations.md)
TOOLLOOP_METRICS_HOST        127.0.0.1 the address the metrics port binds to (0.0.0.0: every interface)
TOOLLOOP_TOOLSETS            unset   the toolsets served, "name=pkg.mod:NAME,..."
                                     (workers/config/toolsets.py);
                                     "name=mcp:<url>" an MCP server; clients read the names only, and
                                     refuse any other
TOOLLOOP_IMAGE_DIR           <tmp>/toolloop-images  where MCP tool images are written (shared by workers)
TOOLLOOP_TOOLSETS_FILE       unset   a YAML file of toolsets: MCP servers (stdio or HTTP), Python tools,
                                     or both (workers/config/mcp.py, docs/mcp.md)
TOOLLOOP_KEPT_LOOPS          4096    run loops a worker process keeps paused between their steps (the
                                     oldest is dropped past it: its run's next step replays; 0: none)
TOOLLOOP_DELTA_INTERVAL_MS   50      ms between two delta writes of a streaming run (docs/streaming.md);
                                     its model call reads the stream that often once text flows
TOOLLOOP_KILL_PLAN           unset   tests only: a kill plan (workers/testing/killpoints.py) installs its
                                     hooks
TOOLLOOP_COMMIT_WAIT         0       replicas a step's commit (and an enqueue, answer, decision) waits for
                                     (WAIT) before it counts: survives a failover (docs/operations.md)
TOOLLOOP_COMMIT_WAIT_MS      1000    ms that wait may take; past it the write counts as not made
TOOLLOOP_FLOW_REDIS_URL      unset   where budget accounts and provider rate limits live (their scripts
                                     touch no run key); unset: REDIS_URL. One URL for every shard of
                                     TOOLLOOP_REDIS_SHARDS makes them global (docs/operations.md)
TOOLLOOP_RETENTION           7d      how long a finished run's keys stay (s, or 30m, 12h, 7d; 0: for
                                     ever); parked and running runs never expire (`toolloop prune`)
Limits (docs/workers.md, "What is refused"):
TOOLLOOP_MAX_SPEC_BYTES      1000000 a run spec's JSON (enqueue refuses a larger one)
TOOLLOOP_MAX_MESSAGES        1000    messages of a run spec (enqueue refuses more)
TOOLLOOP_MAX_IMAGE_BYTES     5000000 an image file of a spec's messages (enqueue) or of a tool result
                                     (the model is answered an error instead)
TOOLLOOP_MAX_TOOL_RESULT_BYTES 1000000 a tool result's content as JSON (the model is answered an error)
TOOLLOOP_MAX_TASK_BYTES      262144  a task message on a queue (a larger one goes to toolloop:rejected)
TOOLLOOP_MAX_ANSWER_BYTES    100000  an answer's text, UTF-8 (`answer` refuses a longer one)
TOOLLOOP_MAX_REASON_BYTES    10000   a reject reason, UTF-8 (`reject` refuses a longer one)
TOOLLOOP_MAX_EDIT_BYTES      100000  an edited input as JSON (`edit` refuses a larger one)
TOOLLOOP_MAX_EARLY_DECISIONS 100     decisions a run keeps for calls it has not made yet (per segment,
                                     read by the workers), and decisions waiting for a worker (clients)
Flow control (docs/flow-control.md):
TOOLLOOP_RATE_LIMITS         unset   provider -> model -> limits, inline JSON or a JSON/YAML file
TOOLLOOP_MAX_RETRY_AFTER     300     s: the longest wait a provider's header (retry-after,
                                     retry-after-ms, anthropic-ratelimit-*-reset) may set on the
                                     shared rate-limit key; a longer ask is logged and capped
Every number is checked: not a number, NaN, infinite or out of range is a two-line error naming the
variable, when the worker (or client) loads.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from toolloop.defaults import find_redis_url
from toolloop.providers.retry import MAX_RETRY_AFTER_S
from workers.config.ratelimit import ENV as RATE_LIMITS_ENV
from workers.config.ratelimit import Limits
from workers.config.ratelimit import parse as parse_rate_limits
from workers.config.toolsets import ENV as TOOLSETS_ENV
from workers.config.toolsets import parse as parse_toolsets
from workers.config.toolsets import registered

TOOLSETS_FILE_ENV = "TOOLLOOP_TOOLSETS_FILE"


def duration(text: str) -> float:
    """Seconds of "90", "90s", "30m", "12h" or "7d"; ValueError (saying what is accepted) otherwise."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    scale = units.get(raw[-1:], 1) if raw else 1
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = float(number) * scale
    except ValueError:
        value = -1
    if not value >= 0:
        raise ValueError(
            f"{text!r} is not a duration.\n  Write seconds, or a number with s, m, h or d (7d, 12h, 30m)."
        )
    return value


def _float(name: str, default: float, most: float = 1e15) -> float:
    """The number setting `name` (`default` when unset): a finite number from 0 to `most`, else a
    two-line ValueError naming it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= most:
        raise ValueError(
            f"{name} is {raw[:40]!r}; it must be a number from 0 to {most:g}.\n"
            f"  Set {name} to such a number, or unset it for the default ({default:g}); docs/workers.md."
        )
    return value


def _wait_cap() -> float:
    value = _float("TOOLLOOP_MAX_RETRY_AFTER", MAX_RETRY_AFTER_S, 86400)
    if value <= 0:
        raise ValueError(
            "TOOLLOOP_MAX_RETRY_AFTER is 0; it must be more than 0 s (a provider's wait is capped at it).\n"
            f"  Set TOOLLOOP_MAX_RETRY_AFTER to seconds up to 86400, or unset it for {MAX_RETRY_AFTER_S:g}."
        )
    return value


def _count(name: str, default: int, *, most: int, least: int = 0) -> int:
    """A whole number from the environment within [least, most]; ValueError saying so otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not least <= int(raw) <= most:
        raise ValueError(
            f"{name}={raw!r} is not a whole number from {least} to {most}.\n  Set {name} to one, or unset it."
        )
    return int(raw)


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
    toolsets: dict[str, str] = field(default_factory=dict)
    """Registered toolsets, name -> import path or "mcp:<url>" (TOOLLOOP_TOOLSETS)."""
    toolsets_file: str = ""
    """A YAML file of more toolsets, MCP servers among them (TOOLLOOP_TOOLSETS_FILE,
    workers/config/mcp.py)."""
    max_spec_bytes: int = 1_000_000
    max_messages: int = 1000
    max_image_bytes: int = 5_000_000
    max_tool_result_bytes: int = 1_000_000
    max_task_bytes: int = 262_144
    max_answer_bytes: int = 100_000
    max_reason_bytes: int = 10_000
    max_edit_bytes: int = 100_000
    max_early_decisions: int = 100
    rate_limits: dict[str, dict[str, Limits]] = field(default_factory=dict)
    """Provider rate limits per key and model (TOOLLOOP_RATE_LIMITS, workers/config/ratelimit.py)."""
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    """The address the metrics port binds to (TOOLLOOP_METRICS_HOST; 0.0.0.0: every interface)."""
    max_retry_after: float = MAX_RETRY_AFTER_S
    """The longest wait a provider's header may set on the shared rate-limit key
    (TOOLLOOP_MAX_RETRY_AFTER, seconds; a longer ask is logged and capped)."""
    retention: float = 7 * 86400
    """Seconds a finished run's keys stay (TOOLLOOP_RETENTION; 0: for ever)."""
    redis_source: str = "REDIS_URL"
    flow_redis_url: str = ""
    """TOOLLOOP_FLOW_REDIS_URL: the Redis of accounts and rate limits ("": `redis_url`'s)."""
    kept_loops: int = 4096
    """Run loops kept paused between their steps per process (TOOLLOOP_KEPT_LOOPS)."""
    delta_interval: float = 0.05
    """Seconds between two delta writes of a streaming run (TOOLLOOP_DELTA_INTERVAL_MS)."""
    commit_wait: int = 0
    """Replicas a commit waits for (TOOLLOOP_COMMIT_WAIT; 0: none)."""
    commit_wait_ms: int = 1000
    image_dir: str = ""
    """Where MCP tool images are written, by content (TOOLLOOP_IMAGE_DIR; "": <tmp>/toolloop-images)."""
    kill_plan: str = ""
    """The fault suite's kill plan (TOOLLOOP_KILL_PLAN): its hooks are installed (tests only)."""
    """Where `redis_url` came from (`find_redis_url`); "" when nothing was found."""

    def toolset_names(self) -> list[str]:
        """The names of every registered toolset (TOOLLOOP_TOOLSETS and TOOLLOOP_TOOLSETS_FILE), read
        without importing or connecting anything; `ToolsetError` when the file is unusable."""
        return sorted(registered(self.toolsets, self.toolsets_file))

    @property
    def flow_url(self) -> str:
        """The Redis of budget accounts and rate limits: TOOLLOOP_FLOW_REDIS_URL, else REDIS_URL's."""
        return self.flow_redis_url or self.redis_url

    @classmethod
    def from_env(cls) -> Settings:
        redis_url, redis_source = find_redis_url()
        return cls(
            redis_url=redis_url,
            redis_source=redis_source,
            flow_redis_url=os.environ.get("TOOLLOOP_FLOW_REDIS_URL", "").strip(),
            retention=duration(os.environ.get("TOOLLOOP_RETENTION", "") or "7d"),
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
            toolsets=parse_toolsets(os.environ.get(TOOLSETS_ENV, "")),
            toolsets_file=os.environ.get(TOOLSETS_FILE_ENV, "").strip(),
            max_spec_bytes=int(_float("TOOLLOOP_MAX_SPEC_BYTES", 1_000_000)),
            max_messages=int(_float("TOOLLOOP_MAX_MESSAGES", 1000)),
            max_image_bytes=int(_float("TOOLLOOP_MAX_IMAGE_BYTES", 5_000_000)),
            max_tool_result_bytes=int(
                _float("TOOLLOOP_MAX_TOOL_RESULT_BYTES", 1_000_000)
            ),
            max_task_bytes=int(_float("TOOLLOOP_MAX_TASK_BYTES", 262_144)),
            max_answer_bytes=int(_float("TOOLLOOP_MAX_ANSWER_BYTES", 100_000)),
            max_reason_bytes=int(_float("TOOLLOOP_MAX_REASON_BYTES", 10_000)),
            max_edit_bytes=int(_float("TOOLLOOP_MAX_EDIT_BYTES", 100_000)),
            max_early_decisions=int(_float("TOOLLOOP_MAX_EARLY_DECISIONS", 100)),
            rate_limits=parse_rate_limits(os.environ.get(RATE_LIMITS_ENV, "")),
            metrics_port=int(_float("TOOLLOOP_METRICS_PORT", 0, 65535)),
            metrics_host=os.environ.get("TOOLLOOP_METRICS_HOST", "").strip()
            or "127.0.0.1",
            max_retry_after=_wait_cap(),
            kept_loops=int(_float("TOOLLOOP_KEPT_LOOPS", 4096)),
            delta_interval=_float("TOOLLOOP_DELTA_INTERVAL_MS", 50) / 1000,
            kill_plan=os.environ.get("TOOLLOOP_KILL_PLAN", "").strip(),
            commit_wait=_count("TOOLLOOP_COMMIT_WAIT", 0, most=64),
            commit_wait_ms=_count(
                "TOOLLOOP_COMMIT_WAIT_MS", 1000, most=600_000, least=1
            ),
            image_dir=os.environ.get("TOOLLOOP_IMAGE_DIR", "").strip(),
        )
