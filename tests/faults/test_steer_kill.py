"""Steers across SIGKILLed workers (SPEC 6.1, docs/conversations.md): each steer is seen by exactly one
model request at the simulator (a request made again after a kill is the same request: the
simulator's history hash), sits in the final history once, after the last complete turn, and none is
lost. The worker's process group is killed by the kill plan at the three places that matter for a
steer (just before its step's work, after its work and before its commit, right after its commit),
(with TOOLLOOP_FAULTS=full, once more at a random moment while every run is steered). The first
three steers are sent one at a time, each after the kill planned for the one before fired. A supervisor
restarts the workers.
The full figure (1,000 steers to 100 runs) is bench/conversations.py `steers`; TOOLLOOP_FAULTS=full
runs a larger version here."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from bench._chat import Chat, between_call_and_result, has_text
from faults.conftest import FULL
from faults.workerpool import WorkerPool
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from workers.client import Client
from workers.protocol import keys

pytestmark = pytest.mark.faults

RUNS = 12 if FULL else 3
STEERS = 6 if FULL else 2


def steer_ids(run: int) -> list[str]:
    return [f"r{run}s{k}" for k in range(STEERS)]


@pytest.mark.timeout(900 if FULL else 240)
def test_a_steer_is_seen_once_across_worker_kills(
    redis_server: EmbeddedServer, work_dir: Path
) -> None:
    work = work_dir / "steers"
    work.mkdir(parents=True, exist_ok=True)
    plan = work / "plan.json"
    plan.write_text(
        json.dumps(
            [
                {"point": "work:before", "key": "steer:r0s0"},
                {"point": "commit:before", "key": "s0/steer:r1s0"},
                {"point": "commit:after", "key": "s0/steer:r2s0"},
            ]
        )
    )
    policy = Chat()
    rng = random.Random(29)
    with SimServer(policy) as sim:
        env = {
            "ANTHROPIC_BASE_URL": sim.base_url,
            "ANTHROPIC_API_KEY": "sim-key",
            "TOOLLOOP_PROMPT_GEN": "",
            "TOOLLOOP_TOOLSETS": os.environ.get("TOOLLOOP_TOOLSETS", "")
            + ",chat=bench._chat:TOOLS",
            "TOOLLOOP_KILL_PLAN": str(plan),
        }
        client = Client(redis_server.url, toolsets=["chat"])
        with WorkerPool(redis_server.url, work, env, size=2, concurrency=2) as pool:
            runs = [
                client.enqueue(
                    {
                        "model": "claude-sonnet-5-5",
                        "provider": "anthropic",
                        "system": "You chat.",
                        "toolset": "chat",
                        "max_steps": 40,
                        "messages": [
                            {"role": "user", "content": f"slow 0.3 x{3 + STEERS}"}
                        ],
                    }
                )
                for _ in range(RUNS)
            ]
            sent: dict[str, tuple[str, str]] = {}

            def kills_fired() -> int:
                log = Path(f"{plan}.log")
                return len(log.read_text().splitlines()) if log.exists() else 0

            def steer_all() -> None:
                for k in range(STEERS):
                    for i, run_id in enumerate(runs):
                        steer_id = steer_ids(i)[k]
                        text = f"steer {steer_id}"
                        client.steer(run_id, text, steer_id=steer_id)
                        sent[steer_id] = (run_id, text)
                        if k == 0 and i < 3:
                            # the planned kill of this steer fires before the next run's steer is
                            # sent: one kill would otherwise end the process where another run's
                            # steer had committed and not reached its own kill point (CI saw it)
                            until = time.monotonic() + 60
                            while kills_fired() <= i and time.monotonic() < until:
                                time.sleep(0.02)
                    time.sleep(rng.uniform(0.2, 0.8))

            deadline = time.monotonic() + 60
            while (
                any(client.status(r).status != "running" for r in runs)
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            sender = threading.Thread(target=steer_all)
            sender.start()
            if FULL:  # after the planned kills, which it must not pre-empt
                until = time.monotonic() + 120
                while kills_fired() < 3 and time.monotonic() < until:
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.5, 1.5))
                pool.kill_all()  # a kill at a random moment, beside the planned ones
            sender.join()
            ended = [client.wait(run_id, timeout=180) for run_id in runs]
        fired = Path(f"{plan}.log").read_text().splitlines()
    assert [s.status for s in ended] == ["done"] * RUNS, ended
    assert len(fired) == 3, "\n".join(
        [
            "kills fired (index, point, run, key):",
            *(
                " ".join(
                    str(json.loads(line).get(k))
                    for k in ("index", "point", "run", "key")
                )
                for line in fired
            ),
            "journals (run: steps of s0):",
            *(
                f"{run_id}: {sorted(client.redis.hkeys(keys.journal(run_id, 's0/')))}"
                for run_id in runs
            ),
        ]
    )
    assert len(sent) == RUNS * STEERS
    for steer_id, (run_id, text) in sent.items():
        history = client.history(run_id)
        assert sum(has_text(m, text) for m in history) == 1, (steer_id, history)
        # one model request saw it first
        assert len(policy.first_seen(text)) == 1, steer_id
        assert not any(
            between_call_and_result(r.messages) for r in policy.carrying(text)
        )
    client.close()
    print(
        f"\nsteers across kills: {len(sent)} steers, {RUNS} runs, {len(fired) + FULL} kills, each seen once"
    )
