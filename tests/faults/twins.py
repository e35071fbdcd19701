"""Twin runs: each shape runs once without faults, then again under a fault; the twins must agree.

`run_twins` runs the "ref" phase (one worker unless `ref_pool` says otherwise, no fault) and the
"fault" phase (the pool and environment the test asks for, and an optional `during(client, runs,
pool)` callable run in a thread while the runs go: it kills Redis, sends duplicate tasks, ...).
`compare` lists every difference a user could see: a run that did not end like its twin (lost), a
different transcript or event stream, and every step that did its work more often than in the
fault-free twin (beyond what `allowed` permits).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from faults.policy import FaultPolicy
from faults.runs import OnFailed, Snapshot, drive, snapshot, spec_for
from faults.shapes import Shape
from faults.toolset import read_effects
from faults.workerpool import WorkerPool
from toolloop import redisurl
from workers.client import Client
from workers.protocol import keys, names

Units = Counter[tuple[str, str]]
During = Callable[[Client, dict[str, Shape], WorkerPool], None]


@dataclass
class Twins:
    shapes: list[Shape]
    refs: dict[str, Snapshot] = field(default_factory=dict)
    results: dict[str, Snapshot] = field(default_factory=dict)
    ref_units: Units = field(default_factory=Counter)
    units: Units = field(default_factory=Counter)
    pool: WorkerPool | None = None

    def compare(
        self,
        allowed: Units | None = None,
        what: str = "",
        retried: frozenset[str] = frozenset(),
        other_provider: bool = False,
    ) -> list[str]:
        """Differences from the fault-free twins. For the `retried` runs (tags), the failure and the
        retry's own events are left out of the event streams (and their numbering). With
        `other_provider` (the twins were served by different wires), tool-call ids are compared by
        their order of appearance and the providers' own figures (usage, costs, who answered,
        reasoning blocks) are left out."""
        allowed = allowed or Counter()
        problems: list[str] = []
        for shape in self.shapes:
            ref, got = self.refs[shape.tag], self.results[shape.tag]
            if got.status.status != ref.status.status:
                error = f"{got.status.error_class}: {got.status.error_message}"
                problems.append(
                    f"{what}run {shape.tag} ended {got.status.status!r}, not {ref.status.status!r} ({error})"
                )
            if other_provider:
                got, ref = _loose(got), _loose(ref)
            if got.history != ref.history:
                problems.append(f"{what}run {shape.tag} has a different transcript")
            if shape.tag in retried:
                same = _without_retries(got.events) == _without_retries(ref.events)
            else:
                same = got.events == ref.events
            if not same:
                problems.append(f"{what}run {shape.tag} has a different event stream")
        for unit, count in self.ref_units.items():
            if count != 1:
                problems.append(
                    f"{what}fault-free: {unit[0]} {unit[1]} ran {count} times"
                )
        for unit, count in self.units.items():
            extra = count - self.ref_units.get(unit, 0) - allowed.get(unit, 0)
            if extra > 0:
                problems.append(
                    f"{what}{unit[0]} {unit[1]} ran {count} times (fault-free: {self.ref_units[unit]})"
                )
        return problems

    def stalled(self, redis_url: str) -> str:
        """What Redis holds of every run that did not finish (its state, lease, outbox, attempts,
        its live-index entry, its messages on the queues and in kombu's `unacked`), and the queues'
        lengths: the failure message of a run left stalled."""
        client = redisurl.sync_client(redis_url, decode_responses=True)
        try:
            return "\n".join(
                _stalled_run(client, shape.tag, self.results[shape.tag].run_id)
                for shape in self.shapes
                if not self.results[shape.tag].status.finished
            ) + (f"\nqueues: {_queues(client)}")
        except redis.RedisError as error:
            return f"(Redis state not read: {error})"
        finally:
            client.close()

    def duplicates(self) -> int:
        return sum(
            max(0, count - self.ref_units.get(unit, 0))
            for unit, count in self.units.items()
        )


_CALL_ID = re.compile(r"\b(?:toolu|call)_[0-9a-f]{24}\b")
_FIGURES = ("usage", "cost_usd", "spent_usd", "limit_usd", "provider", "fallback_from")


def _loose(snap: Snapshot) -> Snapshot:
    """The snapshot with call ids numbered in order of appearance and providers' figures removed
    (usage, costs, who answered, and the reasoning blocks each wire returns in its own shape)."""
    text = json.dumps([snap.history, snap.events])
    order: dict[str, str] = {}
    text = _CALL_ID.sub(
        lambda m: order.setdefault(m.group(0), f"call#{len(order)}"), text
    )
    history, events = json.loads(text)
    # each wire's own
    history = [{k: v for k, v in m.items() if k != "reasoning"} for m in history]
    events = [
        (e[0], e[1], e[2], {k: v for k, v in e[3].items() if k not in _FIGURES})
        for e in events
    ]
    return Snapshot(
        snap.run_id, snap.status, history, [tuple(e) for e in events], snap.journal
    )


def _without_retries(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [
        (segment, kind, data)
        for _seq, segment, kind, data in events
        if kind != "failed" and not (kind == "queued" and data.get("retry"))
    ]


def _stalled_run(client: redis.Redis, tag: str, run_id: str) -> str:
    """One unfinished run as Redis holds it (ages in seconds before now; negative: dated ahead)."""
    now = time.time()
    state: dict[str, str] = client.hgetall(keys.state(run_id))  # type: ignore[assignment]
    outbox: list[tuple[str, float]] = client.zrange(
        keys.outbox(run_id), 0, -1, withscores=True
    )  # type: ignore[assignment]
    unacked: dict[str, str] = client.hgetall(names.UNACKED)  # type: ignore[assignment]
    queued = {}
    for queue in _queue_keys(client):
        raws: list[str] = client.lrange(queue, 0, -1)  # type: ignore[assignment]
        if found := [i for i, raw in enumerate(raws) if run_id in raw]:
            queued[queue] = found
    fields = {k: state.get(k) for k in ("status", "n", "segment", "queue", "cancel")}
    return (
        f"run {tag} ({run_id}): {fields}, touched {now - float(state.get('touched', now)):.1f} s ago; "
        f"lease {client.get(keys.lease(run_id))!r} (pttl {client.pttl(keys.lease(run_id))}); "
        f"outbox {[(m, round(now - score, 1)) for m, score in outbox]} (member, age); "
        f"attempts {client.hgetall(keys.attempts(run_id))}; "
        f"live index {client.zscore(keys.LIVE_RUNS, run_id)}; "
        f"unacked {[t for t, value in unacked.items() if run_id in value]}; on queues {queued}; "
        f"inbox {client.hlen(keys.inbox(run_id))}"
    )


def _queue_keys(client: redis.Redis) -> list[str]:
    return sorted(
        str(k) for queue in names.QUEUES for k in client.scan_iter(f"{queue}*")
    )


def _queues(client: redis.Redis) -> dict[str, int]:
    found: dict[str, int] = {k: int(client.llen(k)) for k in _queue_keys(client)}  # type: ignore[arg-type]
    found["unacked"] = int(client.hlen(names.UNACKED))  # type: ignore[arg-type]
    return found


def units(
    shapes: list[Shape], policy: FaultPolicy, phase: str, effects: list[dict[str, Any]]
) -> Units:
    """How often each step did its work: model calls as the simulator saw them (what a provider
    bills), tool effects (run, start, wait) as the tools logged them."""
    found: Units = Counter()
    for shape in shapes:
        for turn in range(shape.model_turns):
            tag = f"{shape.tag}#{turn}"
            found[("model", tag)] = policy.calls(phase, tag)
    prefixes = tuple(f"{shape.tag}." for shape in shapes)
    for effect in effects:
        if effect["kind"] != "model" and effect["tag"].startswith(prefixes):
            found[(effect["kind"], effect["tag"])] += 1
    return found


def base_env(sim_url: str, key: str = "sk-ant-FAKE-faults") -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": sim_url,
        "ANTHROPIC_API_KEY": key,
        "TOOLLOOP_PROVIDER": "anthropic",
        "TOOLLOOP_PROMPT_GEN": "faults.model:make",
        "TOOLLOOP_KILL_PLAN": "",
    }


def _phase(
    client: Client,
    redis_client: redis.Redis,
    shapes: list[Shape],
    pool: WorkerPool,
    timeout: float,
    during: During | None,
    spec: dict[str, Any],
    on_failed: OnFailed | None = None,
) -> dict[str, Snapshot]:
    runs = {client.enqueue(spec_for(shape, **spec)): shape for shape in shapes}
    with pool:
        thread = None
        if during is not None:
            thread = threading.Thread(
                target=during, args=(client, runs, pool), daemon=True
            )
            thread.start()
        last = drive(client, runs, timeout, on_failed)
        if thread is not None:
            thread.join(timeout=30)
    return {
        runs[run_id].tag: snapshot(client, redis_client, run_id, status)
        for run_id, status in last.items()
    }


def run_twins(
    redis_url: str,
    sim_url: str,
    policy: FaultPolicy,
    work: Path,
    shapes: list[Shape],
    *,
    fault_env: dict[str, str] | None = None,
    pool: dict[str, Any] | None = None,
    during: During | None = None,
    timeout: float = 120.0,
    ref_env: dict[str, str] | None = None,
    ref_pool: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    on_failed: OnFailed | None = None,
) -> Twins:
    for shape in shapes:
        policy.add(shape)
    twins = Twins(shapes)
    client = Client(redis_url)
    redis_client = redisurl.sync_client(redis_url, decode_responses=True)
    env = base_env(sim_url)
    try:
        for phase in ("ref", "fault"):
            directory = work / phase
            directory.mkdir(parents=True, exist_ok=True)
            policy.phase = phase
            extra = (ref_env or {}) if phase == "ref" else (fault_env or {})
            ref_kwargs = ref_pool or {"size": 1, "concurrency": 4}
            kwargs = ref_kwargs if phase == "ref" else (pool or {})
            workers = WorkerPool(
                redis_url,
                work,
                {**env, **extra, "TOOLLOOP_FAULTS_DIR": str(directory)},
                **kwargs,
            )
            faulty = phase == "fault"
            snaps = _phase(
                client,
                redis_client,
                shapes,
                workers,
                timeout,
                during if faulty else None,
                spec or {},
                on_failed if faulty else None,
            )
            counted = units(shapes, policy, phase, read_effects(directory))
            if phase == "ref":
                twins.refs, twins.ref_units = snaps, counted
            else:
                twins.results, twins.units, twins.pool = snaps, counted, workers
        return twins
    finally:
        client.close()
        redis_client.close()
