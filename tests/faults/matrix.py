"""The crash matrix: SIGKILL a worker at every kill point, in many runs, and compare with fault-free runs.

For each kill point, `runs` runs of random shapes (seeded) are run twice through real workers:
1. fault-free ("ref" phase): the transcript, events and journal every crashed run must reproduce;
2. with a kill plan ("fault" phase): each run has one plan entry, so its worker is SIGKILLed (whole
   process group) once, at that point, at a step drawn from the run's reference journal. A supervisor
   restarts dead workers; the step comes back through redelivery, the lease and the sweeper.
Then, per run: is it finished like its reference (else *lost*), same history (else *transcript
differs*), same event stream, and did any step run twice? Model calls are counted by the simulator
policy (what a provider bills), tool effects from the tools' effect log. A step may run twice only if
a kill interrupted it: it was in flight in the killed process (any of its `slots` step slots, or
its own step) and its commit had not landed (the kill's log line, `allowed_reruns`): that re-run is
*allowed* (at-least-once for unfinished work, docs/faults.md), once per kill. Any other second run is
a *duplicate finished step*; a second `start` is also counted as a *duplicate start*.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from faults.policy import FaultPolicy, clear_arrivals
from faults.runs import Snapshot, drive, model_keys, snapshot, spec_for
from faults.shapes import Need, Shape, make_shape
from faults.table import format_table
from faults.toolset import read_effects
from faults.workerpool import WorkerPool
from workers.client import Client
from workers.testing.killpoints import PLAN_ENV

POINTS: dict[str, Need] = {
    "advance:begin": None,
    "model:request": None,
    "model:answered": None,
    "tool:before": "note",
    "tool:after": "note",
    "start:after": "render",
    "wait:inside": "render",
    "commit:before": None,
    "commit:after": None,
    "enqueue:after": None,
    "answer:after": "ask",
}
MANY_SLOT_DELIVERIES = 100
"""TOOLLOOP_MAX_DELIVERIES in the many-slot matrix (5 by default). A crash charges a delivery only to
the redelivered step that has its turn in the process then (workers/process/suspects.py), but every kill of
this matrix is planned, about one every 2 s, many in first deliveries, and each of those charges the
suspect whose turn it is: that is not the crash loop the limit stops. See docs/faults.md."""
HEADERS = [
    "kill point",
    "runs",
    "kills",
    "in flight",
    "lost",
    "dup steps",
    "dup starts",
    "transcript diff",
    "events diff",
    "re-run in flight",
]
"""`in flight`: the steps its kills interrupted (listed `in_flight` in their log lines, the killed
run's own step among them); `re-run in flight`: the re-runs of those the matrix allowed and saw."""


@dataclass
class Case:
    point: str
    shape: Shape
    ref: Snapshot | None = None
    run_id: str = ""
    target: dict[str, Any] = field(default_factory=dict)
    result: Snapshot | None = None


@dataclass
class Report:
    rows: list[list[Any]]
    problems: list[str]
    deaths: int
    kills: int
    slots: int = 1

    @property
    def table(self) -> str:
        title = f"Crash matrix (SIGKILL of a worker's process group; {self.slots} step slots per worker)"
        return format_table(HEADERS, self.rows, title=title)

    @property
    def interrupted(self) -> int:
        """The steps the kills interrupted, in all (the `in flight` column's total)."""
        return int(self.rows[-1][HEADERS.index("in flight")])


def make_cases(points: list[str], runs: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    return [
        Case(point, make_shape(f"p{index}r{j}s{seed}", rng, POINTS[point]))
        for index, point in enumerate(points)
        for j in range(runs)
    ]


def choose_target(case: Case, rng: random.Random) -> dict[str, Any]:
    shape, point = case.shape, case.point
    assert case.ref is not None
    if point in ("model:request", "model:answered"):
        return {"tag": f"{shape.tag}#{rng.randrange(shape.model_turns)}"}
    if point in ("tool:before", "tool:after"):
        return {"tag": rng.choice(shape.calls("note")).tag}
    if point in ("start:after", "wait:inside"):
        return {"tag": rng.choice(shape.calls("render")).tag}
    if (
        point == "advance:begin"
    ):  # task n makes commit n; every journal field is one commit
        return {"run": case.run_id, "n": rng.randint(1, len(case.ref.journal))}
    if point == "answer:after":
        return {"run": case.run_id}
    keys = case.ref.journal
    if (
        point == "enqueue:after"
    ):  # only a commit with a successor to send reaches this point
        turns = model_keys(shape)
        keys = [
            k for k in keys if k.endswith(":start")
        ] + [  # a wait may be followed by a park
            k
            for k, t in turns.items()
            if t < len(shape.turns) and any(c.tool != "ask" for c in shape.turns[t])
        ]
    return {"run": case.run_id, "key": rng.choice(sorted(keys))}


def run_phase(
    client: Client,
    redis_client: redis.Redis,
    cases: list[Case],
    pool: WorkerPool,
    timeout: float,
) -> dict[str, Snapshot]:
    runs = {case.run_id: case.shape for case in cases}
    with pool:
        last = drive(client, runs, timeout)
    return {
        run_id: snapshot(client, redis_client, run_id, status)
        for run_id, status in last.items()
    }


def run_matrix(
    redis_url: str,
    sim_url: str,
    policy: FaultPolicy,
    work: Path,
    points: list[str],
    runs: int,
    seed: int,
    *,
    workers: int = 2,
    slots: int = 1,
    timeout: float = 240.0,
) -> Report:
    """`workers` supervised workers of `slots` step slots each (`--steps-in-flight`) run the fault
    phase, every run at once: with more than one slot, a kill interrupts every step its worker had
    in flight."""
    cases = make_cases(points, runs, seed)
    for case in cases:
        policy.add(case.shape)
    client = Client(redis_url)
    redis_client = redis.Redis.from_url(redis_url, decode_responses=True)
    env = {
        "ANTHROPIC_BASE_URL": sim_url,
        "ANTHROPIC_API_KEY": "sk-ant-FAKE-faults-matrix",
        "TOOLLOOP_PROVIDER": "anthropic",
        "TOOLLOOP_PROMPT_GEN": "faults.model:make",
        PLAN_ENV: "",
    }
    try:
        # 1. Fault-free reference runs.
        (work / "ref").mkdir(parents=True, exist_ok=True)
        policy.phase = "ref"
        for case in cases:
            case.run_id = client.enqueue(spec_for(case.shape))
        pool = WorkerPool(
            redis_url,
            work,
            {**env, "TOOLLOOP_FAULTS_DIR": str(work / "ref")},
            size=1,
            concurrency=4,
        )
        refs = run_phase(client, redis_client, cases, pool, timeout)
        for case in cases:
            case.ref = refs[case.run_id]
        # 2. The same shapes again, each run killed once at its point.
        (work / "fault").mkdir(parents=True, exist_ok=True)
        clear_arrivals(work)
        policy.phase = "fault"
        rng = random.Random(seed + 1)
        for case in cases:
            case.run_id = client.enqueue(spec_for(case.shape))
            case.target = choose_target(case, rng)
        plan = work / "plan.json"
        plan.write_text(
            json.dumps([{"point": case.point, **case.target} for case in cases])
        )
        (work / "runs.json").write_text(
            json.dumps({case.run_id: case.shape.tag for case in cases})
        )
        policy.hold = {
            case.target["tag"] for case in cases if case.point == "model:request"
        }
        fault_env = {
            **env,
            "TOOLLOOP_FAULTS_DIR": str(work / "fault"),
            PLAN_ENV: str(plan),
        }
        if slots > 1:  # see MANY_SLOT_DELIVERIES
            fault_env["TOOLLOOP_MAX_DELIVERIES"] = str(MANY_SLOT_DELIVERIES)
        pool = WorkerPool(redis_url, work, fault_env, size=workers, concurrency=slots)
        results = run_phase(client, redis_client, cases, pool, timeout)
        for case in cases:
            case.result = results[case.run_id]
        return analyse(cases, policy, work, plan, pool, slots)
    finally:
        client.close()
        redis_client.close()


def analyse(
    cases: list[Case],
    policy: FaultPolicy,
    work: Path,
    plan: Path,
    pool: WorkerPool,
    slots: int = 1,
) -> Report:
    log_path = Path(f"{plan}.log")
    kills = (
        [json.loads(line) for line in log_path.read_text().splitlines()]
        if log_path.exists()
        else []
    )
    effects = read_effects(work / "fault")
    ref_effects = read_effects(work / "ref")
    tags = {case.run_id: case.shape.tag for case in cases}
    allowed = allowed_reruns(kills, effects, tags)
    done = Counter(k["index"] for k in kills)
    hit = Counter({k["index"]: len(k.get("in_flight") or {}) for k in kills})
    # With many slots a planned kill may find its moment taken: another kill ended the process
    # between the commit and `commit:after` (or `enqueue:after`), and no process reaches that point
    # of that commit again. Each point must still have fired at least once.
    fired = {cases[k["index"]].point for k in kills}
    problems: list[str] = []
    per_point: dict[str, Counter[str]] = {}
    for index, case in enumerate(cases):
        row = per_point.setdefault(case.point, Counter())
        row["runs"] += 1
        row["kills"] += done[index]
        row["in flight"] += hit[index]
        if not done[index] and (slots == 1 or case.point not in fired):
            problems.append(
                f"{case.point}: the kill planned for run {case.shape.tag} never fired ({case.target})"
            )
        ref, got = case.ref, case.result
        assert ref is not None and got is not None
        if got.status.status != ref.status.status:
            row["lost"] += 1
            error = f"{got.status.error_class}: {got.status.error_message}"
            problems.append(
                f"{case.point}: run {case.shape.tag} ended {got.status.status!r}, "
                f"not {ref.status.status!r} ({error})"
            )
        if got.history != ref.history:
            row["transcript diff"] += 1
            problems.append(
                f"{case.point}: run {case.shape.tag} has a different transcript"
            )
        if got.events != ref.events:
            row["events diff"] += 1
            problems.append(
                f"{case.point}: run {case.shape.tag} has a different event stream"
            )
        units = _units(case.shape, policy, "fault", effects)
        ref_units = _units(case.shape, policy, "ref", ref_effects)
        for unit, count in ref_units.items():
            if count != 1:
                problems.append(
                    f"{case.point}: fault-free run: {unit[0]} {unit[1]} ran {count} times"
                )
        for unit, count in units.items():
            extra = count - ref_units.get(unit, 0)
            free = min(max(extra, 0), allowed[unit])
            row["re-run in flight"] += free
            if extra - free > 0:
                row["dup steps"] += extra - free
                if unit[0] == "start":
                    row["dup starts"] += extra - free
                problems.append(
                    f"{case.point}: {unit[0]} {unit[1]} ran {count} times "
                    f"(reference: {ref_units.get(unit, 0)}; kill allowed {allowed[unit]} re-run)"
                )
    rows = []
    for point in dict.fromkeys(case.point for case in cases):
        counts = per_point[point]
        rows.append([point, *(counts[name] for name in HEADERS[1:])])
    rows.append(["total", *(sum(r[i] for r in rows) for i in range(1, len(HEADERS)))])
    unplanned = len(pool.deaths) - len(kills)
    if unplanned > 0:
        problems.append(
            f"{unplanned} worker deaths were not planned kills: {pool.deaths}"
        )
    return Report(rows, problems, len(pool.deaths), len(kills), slots)


def allowed_reruns(
    kills: list[dict[str, Any]], effects: list[dict[str, Any]], tags: dict[str, str]
) -> Counter[tuple[str, str]]:
    """The units each kill may re-run: one per step it interrupted, known by its last effect.

    A kill ends every step in flight in the process it kills: its own, the others in the worker's
    step slots, the one beside a control task. The kill's log line lists them (`in_flight`: begun in
    that process at `advance:begin`, their commit not in Redis when the process died:
    workers/testing/killpoints.py `KillPlan`, `interrupted`); each may run again once, and its unit is the
    last effect of its run that process logged since the step began. A step whose commit landed
    (listed under `landed`, or gone from the list at `commit:after`) gets nothing, nor does a step
    with no effect yet. Anything else that runs twice is a duplicate finished step."""
    allowed: Counter[tuple[str, str]] = Counter()
    for kill in kills:
        mine = [e for e in effects if e["pid"] == kill["pid"] and e["at"] <= kill["at"]]
        for run_id, since in (kill.get("in_flight") or {}).items():
            tag = tags.get(run_id, "")
            its = [
                e
                for e in mine
                if e["at"] >= since and e["tag"].startswith((f"{tag}.", f"{tag}#"))
            ]
            if tag and its:
                allowed[(its[-1]["kind"], its[-1]["tag"])] += 1
    return allowed


def _units(
    shape: Shape, policy: FaultPolicy, phase: str, effects: list[dict[str, Any]]
) -> Counter[tuple[str, str]]:
    """How many times each step of a run did its work: model calls as the simulator saw them, tool
    effects as the tools logged them."""
    units: Counter[tuple[str, str]] = Counter()
    for turn in range(shape.model_turns):
        tag = f"{shape.tag}#{turn}"
        units[("model", tag)] = policy.calls(phase, tag)
    for effect in effects:
        if effect["kind"] != "model" and effect["tag"].startswith(f"{shape.tag}."):
            units[(effect["kind"], effect["tag"])] += 1
    return units
