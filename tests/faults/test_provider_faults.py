"""Provider faults from the simulator, through real workers (DESIGN.md 8, SPEC 3.3).

- 429 (short retry-after), 500, 529 and timeouts are retried within bounds: the run ends like its
  fault-free twin, and the faulted turn was asked exactly once more per fault served.
- A dropped connection is a network error (SPEC 3.3): the run either rides it out or fails
  retryable; `client.retry` then finishes it without running a finished step again.
- A 500 that never ends: the provider gives up after its bounded attempts and the run fails with a
  clear error, its journal intact.
- Tool arguments that are not JSON: the run fails with `ToolArgumentsError` and its two-line
  message, every step before it still journaled; `client.retry` finishes it like its twin, and only
  the bad model turn is asked again.
- 401 and 403 from the first provider fall back to the next one (fal here).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from faults.policy import FaultPolicy
from faults.shapes import Shape, make_shape
from faults.twins import run_twins
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.records import RunStatus

pytestmark = pytest.mark.faults

ATTEMPTS = 4  # RetryPolicy().attempts: the bound on HTTP attempts of one model call


def _shape(tag: str, rng: random.Random, **extra: Any) -> Shape:
    while True:  # at least two tool turns, so a fault on the last one has journaled steps before it
        shape = make_shape(tag, rng, need="note", max_turns=3)
        if len(shape.turns) >= 2 and not shape.asks:
            return dataclasses.replace(shape, extra=extra)


def _turn0_steps(history: list[dict[str, Any]]) -> set[str]:
    """The journal keys of model turn 0 and of its tool calls, from a run's history."""
    first = next(m for m in history if m["role"] == "assistant")
    steps = {"model:1"}
    for call in first["tool_calls"] or []:
        steps |= (
            {f"tool:{call['id']}:start", f"tool:{call['id']}:wait"}
            if call["name"] == "render"
            else {f"tool:{call['id']}"}
        )
    return steps


def _fault(kind: str = "error", **fields: Any) -> dict[str, Any]:
    return {"kind": kind, **fields}


@pytest.mark.timeout(300)
def test_provider_faults_are_retried_within_bounds_or_fail_cleanly(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    rng = random.Random(41)
    shapes = {
        "pf429": _shape(
            "pf429", rng, faults={0: _fault(status=429, retry_after=0.2, times=1)}
        ),
        "pf500": _shape("pf500", rng, faults={1: _fault(status=500, times=2)}),
        "pf529": _shape("pf529", rng, faults={0: _fault(status=529, times=2)}),
        "pftimeout": _shape(
            "pftimeout", rng, faults={1: _fault("timeout", seconds=3.0, times=1)}
        ),
        "pfdrop": _shape("pfdrop", rng, faults={1: _fault("drop", times=1)}),
        "pfraw": _shape("pfraw", rng, raw_once=[1]),
        "pfhard": _shape("pfhard", rng, faults={1: _fault(status=500, times=None)}),
    }
    # Extra asks of a turn that the faults explain (each fault served is one more request).
    allowed = Counter(
        {
            ("model", "pf429#0"): 1,
            ("model", "pf500#1"): 2,
            ("model", "pf529#0"): 2,
            ("model", "pftimeout#1"): 1,
            ("model", "pfdrop#1"): 2,
            ("model", "pfraw#1"): 1,
            ("model", "pfhard#1"): ATTEMPTS - 1,
        }
    )
    failures: dict[str, RunStatus] = {}
    journal_at_failure: dict[str, list[str]] = {}

    def on_failed(client: Client, run_id: str, shape: Shape, status: RunStatus) -> bool:
        if shape.tag in failures:
            return False
        failures[shape.tag] = status
        journal_at_failure[shape.tag] = sorted(
            client.redis.hkeys(keys.journal(run_id, "s0"))
        )  # type: ignore[arg-type]
        if shape.tag == "pfhard":
            return False
        client.retry(run_id)
        return True

    policy = FaultPolicy(work_dir)
    with SimServer(policy) as sim:
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work_dir,
            list(shapes.values()),
            fault_env={"TOOLLOOP_FAULTS_TIMEOUT": "1.0"},
            pool={"size": 1, "concurrency": 8},
            on_failed=on_failed,
            timeout=180,
        )

    # Transient faults never reach the run.
    for tag in ("pf429", "pf500", "pf529", "pftimeout"):
        assert tag not in failures, f"{tag} failed: {failures[tag]}"
    # Not JSON: a clear failure, the journal intact, a retry finishes it.
    raw = failures["pfraw"]
    assert raw.error_class == "ToolArgumentsError"
    lines = (raw.error_message or "").splitlines()
    assert lines[0] == 'Tool call "note" has arguments that are not JSON.', lines
    assert lines[1].startswith("  The model sent: "), lines
    assert _turn0_steps(twins.refs["pfraw"].history) <= set(journal_at_failure["pfraw"])
    assert "model:2" not in journal_at_failure["pfraw"], "the bad answer was journaled"
    # A 500 that never ends: bounded attempts, a clear error, the journal intact.
    hard = twins.results["pfhard"].status
    assert hard.status == "failed" and hard.error_class == "PromptGenError", hard
    assert policy.calls("fault", "pfhard#1") == ATTEMPTS
    assert len((hard.error_message or "").splitlines()) == 2, hard.error_message
    assert _turn0_steps(twins.refs["pfhard"].history) <= set(
        journal_at_failure["pfhard"]
    )
    # Everything else ends like its twin, and no step beyond the faulted turns ran twice.
    twins.shapes = [shape for shape in twins.shapes if shape.tag != "pfhard"]
    retried = frozenset(failures) - {"pfhard"}
    problems = twins.compare(allowed=allowed, what="provider faults: ", retried=retried)
    assert not problems, "\n".join(problems)
    print(f"\nprovider faults: failed then retried: {sorted(retried)}")


def _fallback_twins(
    redis_server: EmbeddedServer, work: Path, prompt_gen: str, seed: int
) -> tuple[Any, dict[str, Any]]:
    rng = random.Random(seed)
    shapes = [
        _shape(f"fb401x{seed}", rng, refuse={"anthropic": 401}),
        _shape(f"fb403x{seed}", rng, refuse={"anthropic": 403}),
    ]
    policy = FaultPolicy(work)
    with SimServer(policy) as sim:
        env = {
            "TOOLLOOP_PROMPT_GEN": prompt_gen,
            "FAL_KEY": "fal-FAKE-key",
            "FAL_RUN_URL": sim.base_url,
        }
        twins = run_twins(
            redis_server.url,
            sim.base_url,
            policy,
            work,
            shapes,
            ref_env=env,
            fault_env=env,
            spec={"fallback": ["fal"]},
            pool={"size": 1, "concurrency": 4},
            timeout=120,
        )
        stats = sim.stats()
    assert stats["endpoints"].get("fal", 0) >= sum(
        shape.model_turns for shape in shapes
    ), stats
    assert (
        stats["statuses"].get("401", 0) >= 1 and stats["statuses"].get("403", 0) >= 1
    ), stats
    allowed = Counter(
        {("model", f"{s.tag}#{t}"): 1 for s in shapes for t in range(s.model_turns)}
    )
    problems = twins.compare(allowed=allowed, what="fallback: ", other_provider=True)
    assert not problems, "\n".join(problems)
    for shape, status in (
        (shapes[0], 401),
        (shapes[1], 403),
    ):  # the switch shows on every model event
        model = [
            data
            for _seq, _segment, kind, data in twins.results[shape.tag].events
            if kind == "model"
        ]
        assert model and all(data["provider"] == "fal" for data in model), model
        switch = [{"provider": "anthropic", "reason": f"auth (HTTP {status})"}]
        assert all(data["fallback_from"] == switch for data in model), model
    return twins, stats


@pytest.mark.timeout(300)
def test_auth_refusals_fall_back_to_the_next_provider(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    """401/403 from anthropic: every turn is served by fal (a durable run with `fallback: ["fal"]`)."""
    _fallback_twins(
        redis_server, work_dir / "fallback", "faults.model:make_fallback", 43
    )


@pytest.mark.timeout(300)
def test_auth_refusals_fall_back_with_the_default_providers(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    """The same with `providers.from_env()` (TOOLLOOP_PROMPT_GEN unset), as a deployment would run."""
    _fallback_twins(redis_server, work_dir / "fallback-env", "", 47)
