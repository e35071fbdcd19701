"""Flow control end to end (docs/flow-control.md): real worker processes, a real Redis, the provider
simulator over real HTTP enforcing rate limits per key with Anthropic's headers and 429s."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import Worker, redis_in, sim_env
from tests.integration.runs_kit import eventually, spec
from toolloop import UserMessage
from toolloop.contract import PromptGenRequest
from toolloop.embedded import EmbeddedServer
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.sim import SimServer
from toolloop.sim.ratelimit import SimRateLimits
from toolloop.sim.script import SimFault, SimRequest, SimToolCall, SimTurn
from workers.client import Client, accounts
from workers.config import ratelimit
from workers.protocol import keys

TURNS = 5
NOTE = "Budget nearly spent: answer now."


def script(output_tokens: int = 0) -> list[dict[str, Any]]:
    usage = {"usage": {"output_tokens": output_tokens}} if output_tokens else {}
    calls = [
        {
            "text": f"Step {n}.",
            "tool_calls": [{"name": "add", "input": {"a": n, "b": 1}}],
            **usage,
        }
        for n in range(1, TURNS)
    ]
    return [*calls, {"text": "Done.", **usage}]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


def start_sim_worker(url: str, sim: SimServer, log_dir: Path, **env: str) -> Worker:
    log = log_dir / f"worker-{time.monotonic_ns()}.log"
    return Worker(url, log, sim_env(sim, **env), concurrency=4).wait_ready()


def run_spec(**fields: Any) -> dict[str, Any]:
    return spec(
        "You add.",
        **{
            "model": "claude-haiku-4-5",
            "provider": "anthropic",
            "max_steps": TURNS + 1,
            **fields,
        },
    )


def wait_all(client: Client, run_ids: list[str], timeout: float) -> list[Any]:
    def ended() -> list[Any] | None:
        statuses = [client.status(r) for r in run_ids]
        return statuses if all(s.finished for s in statuses) else None

    return list(eventually(ended, timeout=timeout))


def journal_total(client: Client, run_ids: list[str]) -> float:
    """The cost of every step stored in the runs' journals."""
    total = 0.0
    for run_id in run_ids:
        for raw in client.redis.hgetall(keys.journal(run_id, "s0")).values():
            total += float(json.loads(raw)["cost_usd"])
    return total


def test_runs_under_a_rate_limit_meet_no_429_and_go_at_the_limit(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    rpm, runs = 600, 12  # 10 calls a second, at most 10 at once; 60 model calls
    limits = json.dumps({"anthropic": {"*": {"requests_per_minute": rpm}}})
    with SimServer(script(), rate_limits=SimRateLimits(rpm=rpm)) as sim:
        worker = start_sim_worker(
            own_redis.url, sim, tmp_path, TOOLLOOP_RATE_LIMITS=limits
        )
        client = Client(own_redis.url)
        try:
            started = time.monotonic()
            run_ids = [client.enqueue(run_spec()) for _ in range(runs)]
            statuses = wait_all(client, run_ids, timeout=60)
            took = time.monotonic() - started
        finally:
            worker.stop()
            client.close()
        stats = sim.stats()
    assert [s.status for s in statuses] == ["done"] * runs
    assert stats["requests"] == runs * TURNS
    # no call was refused, so none was retried
    assert stats["statuses"].get("429", 0) == 0
    # paced: beyond the burst, 10 a second
    assert took >= (runs * TURNS - 10) / 10 * 0.9


def test_200_runs_on_one_account_never_spend_past_its_limit(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    runs, limit = 200, 1.0
    # Each call bills ~2,000 output tokens of claude-haiku-4-5 (~$0.01): 1,000 calls would cost ~$10.
    with SimServer(script(output_tokens=2000)) as sim:
        worker = start_sim_worker(own_redis.url, sim, tmp_path)
        client = Client(own_redis.url)
        try:
            client.set_account_limit("tenant-1", limit, period="day", finish_at=0.8)
            run_ids = [
                client.enqueue(run_spec(account="tenant-1", finish_note=NOTE))
                for _ in range(runs)
            ]
            statuses = wait_all(client, run_ids, timeout=180)
            total = journal_total(client, run_ids)
            (row,) = client.accounts()
        finally:
            worker.stop()
            client.close()
    # Above the largest single estimate: the provider's own estimate of a 5,000-token prompt (every
    # request here is smaller) with the default max_tokens.
    padded = PromptGenRequest(
        model="claude-haiku-4-5", messages=[UserMessage(content="word " * 4000)]
    )
    largest_estimate = AnthropicHandler("k").estimate(padded)
    assert 0.01 < largest_estimate < 0.2
    assert total <= limit + largest_estimate, total
    assert total > 0.8 * limit  # the account was spent, not refused from the start
    stops = [s.status for s in statuses]
    assert stops.count("budget") > 0 and set(stops) <= {"done", "budget"}, set(stops)
    # `toolloop accounts` says what the journals say
    assert row.spent_usd == pytest.approx(total, abs=1e-6)
    assert row.reserved_usd == 0.0


def held(client: redis.Redis, name: str) -> float:
    return next(
        (a.reserved_usd for a in accounts.spend(client, time.time()) if a.name == name),
        0.0,
    )


def test_a_killed_worker_and_a_redis_restart_leak_no_reservation_past_a_lease(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    lease_ms = 4000
    timers = {"TOOLLOOP_LEASE_MS": str(lease_ms), "TOOLLOOP_VISIBILITY_TIMEOUT": "8"}
    plain = redis.Redis.from_url(own_redis.url, decode_responses=True)
    with SimServer(script(), latency_s=30) as slow, SimServer(script()) as fast:
        worker = start_sim_worker(own_redis.url, slow, tmp_path, **timers)
        client = Client(own_redis.url)
        try:
            client.set_account_limit("tenant-2", 5.0, period="total")
            run_ids = [client.enqueue(run_spec(account="tenant-2")) for _ in range(5)]
            # the calls hang at the simulator
            eventually(lambda: held(plain, "tenant-2") > 0, timeout=20)
            time.sleep(1.2)  # the AOF (fsync every second) has the reservations
            worker.kill()
            killed = time.monotonic()
            own_redis.restart()
            # kept across the restart: nobody settled them
            assert held(plain, "tenant-2") > 0
            eventually(
                lambda: held(plain, "tenant-2") == 0, timeout=lease_ms / 1000 + 2
            )
            assert time.monotonic() - killed <= lease_ms / 1000 + 2
            again = start_sim_worker(own_redis.url, fast, tmp_path, **timers)
            try:
                statuses = wait_all(client, run_ids, timeout=90)
            finally:
                again.stop()
            total = journal_total(client, run_ids)
            (row,) = client.accounts()
        finally:
            worker.kill()
            client.close()
            plain.close()
    assert [s.status for s in statuses] == ["done"] * 5
    assert row.reserved_usd == 0.0
    # the killed calls were never answered, nor billed
    assert row.spent_usd == pytest.approx(total, abs=1e-6)


def test_a_run_of_an_account_near_its_limit_sends_its_finish_note_then_stops_budget(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    seen: list[SimRequest] = []

    def policy(request: SimRequest) -> SimTurn:
        seen.append(request)
        call = SimToolCall(name="add", input={"a": 1, "b": 2})
        # ~$0.02 a call
        return SimTurn(text="More.", tool_calls=[call], usage={"output_tokens": 4000})

    with SimServer(policy) as sim:
        worker = start_sim_worker(own_redis.url, sim, tmp_path)
        client = Client(own_redis.url)
        try:
            client.set_account_limit("tenant-3", 0.1, period="month", finish_at=0.5)
            run_id = client.enqueue(
                run_spec(account="tenant-3", finish_note=NOTE, max_steps=50)
            )
            (status,) = wait_all(client, [run_id], timeout=60)
            (row,) = client.accounts()
        finally:
            worker.stop()
            client.close()
    assert status.status == "budget"
    notes = [
        NOTE in repr(r.messages[-1]) and isinstance(r.messages[-1], UserMessage)
        for r in seen
    ]
    # finish mode once the account neared its limit
    assert notes[0] is False and notes[-1] is True
    assert row.spent_usd <= 0.1 and row.period == "month"


def test_a_step_waiting_for_room_lends_its_slot_to_other_runs(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    # claude-haiku-4-5 is limited to one call every 2 s; claude-sonnet-5-5 is not limited at all.
    limits = json.dumps(
        {"anthropic": {"claude-haiku-4-5": {"requests_per_minute": 30}}}
    )
    with SimServer(script()) as sim:
        worker = start_sim_worker(
            own_redis.url,
            sim,
            tmp_path,
            TOOLLOOP_RATE_LIMITS=limits,
            TOOLLOOP_STEPS_IN_FLIGHT="2",
        )
        client = Client(own_redis.url)
        try:
            # 20 calls: 40 s at the limit
            waiting = [client.enqueue(run_spec()) for _ in range(4)]
            time.sleep(1.0)  # they hold both slots of the worker, waiting their turn
            started = time.monotonic()
            free = client.enqueue(run_spec(model="claude-sonnet-5-5"))
            (status,) = wait_all(client, [free], timeout=30)
            took = time.monotonic() - started
            assert sum(client.status(r).finished for r in waiting) == 0
        finally:
            worker.kill()
            client.close()
    assert status.status == "done"
    # not stuck behind the waiting steps (2 slots, 4 runs waiting 2 s a call)
    assert took < 10, took


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.slow
def test_runs_failing_over_to_fal_are_booked_against_fals_own_limit(
    own_redis: EmbeddedServer, tmp_path: Path, stream: bool
) -> None:
    # falls over at once
    overloaded = SimFault(status=529, times=None, headers={"x-should-retry": "false"})

    def policy(request: SimRequest) -> SimTurn:
        if request.wire == "anthropic":
            return SimTurn(fault=overloaded)
        n = request.assistant_turns + 1
        if n >= TURNS:
            return SimTurn(text="Done.")
        return SimTurn(
            text=f"Step {n}.",
            tool_calls=[SimToolCall(name="add", input={"a": n, "b": 1})],
        )

    # 100 model calls, each refused by Anthropic, then sent to fal: 5 a second
    runs, fal_rpm = (
        20,
        300,
    )
    limits = json.dumps(
        {
            "anthropic": {
                "*": {"requests_per_minute": 6000, "output_tokens_per_minute": 60000}
            },
            "fal": {"*": {"requests_per_minute": fal_rpm}},
        }
    )
    # fal's own side holds 4 s of its limit (20 calls): unpaced, 100 calls in a few seconds meet 429s.
    with SimServer(
        policy, fal_rate_limits=SimRateLimits(rpm=fal_rpm, burst_s=4)
    ) as sim:
        env = {
            "TOOLLOOP_RATE_LIMITS": limits,
            "FAL_KEY": "fal-sim-key",
            "FAL_RUN_URL": sim.base_url,
        }
        worker = start_sim_worker(own_redis.url, sim, tmp_path, **env)
        client = Client(own_redis.url)
        try:
            started = time.monotonic()
            run_ids = [
                client.enqueue(run_spec(fallback=["fal"], stream=stream))
                for _ in range(runs)
            ]
            statuses = wait_all(client, run_ids, timeout=90)
            took = time.monotonic() - started
            plain = redis.Redis.from_url(own_redis.url, decode_responses=True)
            anthropic = plain.hgetall(
                bucket_of("anthropic", "ANTHROPIC_API_KEY", "sim-key")
            )
            fal = plain.hgetall(bucket_of("fal", "FAL_KEY", "fal-sim-key"))
            plain.close()
        finally:
            worker.stop()
            client.close()
        stats = sim.stats()
    # fal was never sent past its limit
    assert stats["statuses"].get("429", 0) == 0, stats["statuses"]
    assert [s.status for s in statuses] == ["done"] * runs
    assert stats["endpoints"] == {"anthropic": runs * TURNS, "fal": runs * TURNS}
    # paced at fal's limit, beyond its 1 s burst
    assert took >= (runs * TURNS - 5) / 5 * 0.9
    assert fal  # fal's calls were booked in fal's own bucket ...
    # ... and not in Anthropic's: no output tokens were settled there (its 529s have none), nor a
    # fal 429 learned
    assert float(anthropic["o"]) == 60000 / 60 and "blocked" not in anthropic, anthropic


def bucket_of(provider: str, env: str, key: str) -> str:
    """The Redis hash of (key, claude-haiku-4-5) under flow control (docs/flow-control.md)."""
    hashed = ratelimit.key_hash(provider, ratelimit.Limits(), env={env: key})
    return ratelimit.bucket_key(hashed, "claude-haiku-4-5")


def test_a_fallback_dearer_than_the_account_allows_stops_budget_before_it_is_sent(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    overloaded = SimFault(status=529, times=None, headers={"x-should-retry": "false"})

    def policy(request: SimRequest) -> SimTurn:
        return (
            SimTurn(fault=overloaded)
            if request.wire == "anthropic"
            else SimTurn(text="Done.")
        )

    # The call's estimate: ~$0.04 at Anthropic, ~$0.16 at fal (default max_tokens 32,000, not 8,192).
    with SimServer(policy) as sim:
        env = {"FAL_KEY": "fal-sim-key", "FAL_RUN_URL": sim.base_url}
        worker = start_sim_worker(own_redis.url, sim, tmp_path, **env)
        client = Client(own_redis.url)
        try:
            # room for Anthropic's only
            client.set_account_limit("narrow", 0.10, period="total")
            # fal's fits, not beside its own $0.04
            client.set_account_limit("wide", 0.18, period="total")
            narrow = client.enqueue(run_spec(account="narrow", fallback=["fal"]))
            wide = client.enqueue(run_spec(account="wide", fallback=["fal"]))
            # less than a lease (20 s): the dearer estimate does not wait for the call's own reservation
            statuses = wait_all(client, [narrow, wide], timeout=15)
            rows = {row.name: row for row in client.accounts()}
        finally:
            worker.stop()
            client.close()
        stats = sim.stats()
    assert [s.status for s in statuses] == ["budget", "done"]
    # the narrow run's call never went to fal
    assert stats["endpoints"] == {
        "anthropic": 2,
        "fal": 1,
    }
    assert rows["narrow"].spent_usd == 0.0 and rows["wide"].spent_usd > 0
    assert rows["narrow"].reserved_usd == rows["wide"].reserved_usd == 0.0


@pytest.mark.slow
def test_a_call_longer_than_a_lease_keeps_its_reservation_and_concurrent_place(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    lease_ms, latency = 3000, 8.0
    starts: list[float] = []

    def policy(request: SimRequest) -> SimTurn:
        starts.append(time.monotonic())
        # one call, over two leases long
        return SimTurn(text="Done.", latency_s=latency)

    limits = json.dumps({"anthropic": {"*": {"concurrent": 1}}})
    plain = redis.Redis.from_url(own_redis.url, decode_responses=True)
    with SimServer(policy) as sim:
        env = {"TOOLLOOP_RATE_LIMITS": limits, "TOOLLOOP_LEASE_MS": str(lease_ms)}
        worker = start_sim_worker(own_redis.url, sim, tmp_path, **env)
        client = Client(own_redis.url)
        try:
            client.set_account_limit("long", 5.0, period="total")
            first = client.enqueue(run_spec(account="long"))
            eventually(lambda: starts or None, timeout=20)
            time.sleep(lease_ms / 1000 * 1.7)  # past a lease into the first call
            reserved_late = held(plain, "long")
            # it waits for the place
            run_ids = [
                first,
                client.enqueue(run_spec(account="long")),
            ]
            statuses = wait_all(client, run_ids, timeout=60)
            (row,) = client.accounts()
        finally:
            worker.stop()
            client.close()
            plain.close()
    assert [s.status for s in statuses] == ["done", "done"]
    # the first call's reservation did not lapse a lease after it was made
    assert reserved_late > 0
    # one call at a time
    assert len(starts) == 2 and starts[1] - starts[0] >= latency * 0.95, starts
    assert row.reserved_usd == 0.0 and row.spent_usd > 0


def test_two_workers_that_learn_the_limit_from_the_headers_hold_it_in_a_burst_of_short_runs(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    # No TOOLLOOP_RATE_LIMITS: the workers know the key's limit only from the simulator's
    # `anthropic-ratelimit-requests-*` headers (240 a minute, 4 a second; its bucket holds 2 s of
    # it, 8 requests). 30 one-call runs sent at once meet 22 429s unless the first call's answer
    # teaches the limit before the others go (fails before: 429s, the calls past 8 refused).
    rpm, runs = 240, 30

    def policy(request: SimRequest) -> SimTurn:
        return SimTurn(text="Done.")

    with SimServer(policy, rate_limits=SimRateLimits(rpm=rpm, burst_s=2)) as sim:
        workers = [start_sim_worker(own_redis.url, sim, tmp_path) for _ in range(2)]
        client = Client(own_redis.url)
        try:
            started = time.monotonic()
            run_ids = [client.enqueue(run_spec(max_steps=2)) for _ in range(runs)]
            statuses = wait_all(client, run_ids, timeout=60)
            took = time.monotonic() - started
        finally:
            for worker in workers:
                worker.stop()
            client.close()
        stats = sim.stats()
    assert [s.status for s in statuses] == ["done"] * runs
    # none refused, so none retried
    assert stats["statuses"].get("429", 0) == 0, stats["statuses"]
    assert stats["requests"] == runs
    # paced at the learned limit beyond the burst
    assert took >= (runs - 8) / 4 * 0.8, took


def test_a_provider_retry_is_booked_against_the_limit_as_one_more_request(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    # 30 a minute, a bucket of 2 s (one request): the call goes at once and takes the bucket; the
    # simulator answers it 500, which the provider retries after ~1 s of backoff. Booked, the retry
    # waits for the bucket to hold a request again (2 s after the first); not booked, it goes after
    # the backoff alone (fails before: ~1 s).
    arrivals: list[float] = []

    def policy(request: SimRequest) -> SimTurn:
        arrivals.append(time.monotonic())
        return (
            SimTurn(fault=SimFault(status=500))
            if len(arrivals) == 1
            else SimTurn(text="Done.")
        )

    limits = json.dumps({"anthropic": {"*": {"requests_per_minute": 30, "burst_s": 2}}})
    with SimServer(policy) as sim:
        worker = start_sim_worker(
            own_redis.url, sim, tmp_path, TOOLLOOP_RATE_LIMITS=limits
        )
        client = Client(own_redis.url)
        try:
            (status,) = wait_all(
                client, [client.enqueue(run_spec(max_steps=2))], timeout=30
            )
        finally:
            worker.stop()
            client.close()
    assert status.status == "done"
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 1.8, arrivals


def test_a_two_phase_tool_is_reserved_and_charged_against_the_account(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    # Each turn calls `transcode` (tests/integration/agents.py: two-phase, estimated $0.15, billed
    # $0.10 by its wait). On a $0.5 account the run stops `budget` once the jobs took the room, and
    # the account's spend is what the journal holds, tools included (fails before: the tool was not
    # reserved nor charged, so the run went on to max_steps with the account all but unspent).
    def policy(request: SimRequest) -> SimTurn:
        n = request.assistant_turns + 1
        return SimTurn(
            text=f"Job {n}.",
            tool_calls=[SimToolCall(name="transcode", input={"a": n, "b": 0})],
        )

    tool_log = tmp_path / "tools.log"
    with SimServer(policy) as sim:
        worker = Worker(
            own_redis.url,
            tmp_path / "worker.log",
            sim_env(sim, tool_log),
            concurrency=4,
        )
        worker.wait_ready()
        client = Client(own_redis.url)
        try:
            client.set_account_limit("jobs", 0.5, period="total")
            run_id = client.enqueue(run_spec(account="jobs", max_steps=30))
            (status,) = wait_all(client, [run_id], timeout=60)
            total = journal_total(client, [run_id])
            (row,) = client.accounts()
        finally:
            worker.stop()
            client.close()
    starts = [
        line for line in tool_log.read_text().splitlines() if '"transcode"' in line
    ]
    assert status.status == "budget", status.status
    # $0.10 each on $0.5, each start reserving its $0.15 first
    assert 3 <= len(starts) <= 5, starts
    assert row.spent_usd == pytest.approx(total, abs=1e-6) and total > 0.3, (row, total)
    assert row.spent_usd <= 0.5 and row.reserved_usd == 0.0


def test_a_learned_limit_holds_for_a_fallback_named_by_the_worker_not_the_run(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    # The runs go to fal, which is overloaded; the worker's TOOLLOOP_FALLBACK sends each call on to
    # Anthropic, whose key allows 240 a minute (its bucket: 8 requests). No limit is configured: the
    # Anthropic attempts are booked against what its headers teach (fails before: the runs' chain
    # was read from the run alone, nothing was booked, and 30 calls at once met 429s).
    overloaded = SimFault(status=529, times=None, headers={"x-should-retry": "false"})

    def policy(request: SimRequest) -> SimTurn:
        return (
            SimTurn(fault=overloaded)
            if request.wire != "anthropic"
            else SimTurn(text="Done.")
        )

    runs = 30
    with SimServer(policy, rate_limits=SimRateLimits(rpm=240, burst_s=2)) as sim:
        env = {
            "FAL_KEY": "fal-sim-key",
            "FAL_RUN_URL": sim.base_url,
            "TOOLLOOP_FALLBACK": "anthropic",
        }
        workers = [
            start_sim_worker(own_redis.url, sim, tmp_path, **env) for _ in range(2)
        ]
        client = Client(own_redis.url)
        try:
            run_ids = [
                client.enqueue(run_spec(provider="fal", max_steps=2))
                for _ in range(runs)
            ]
            statuses = wait_all(client, run_ids, timeout=60)
        finally:
            for worker in workers:
                worker.stop()
            client.close()
        stats = sim.stats()
    assert [s.status for s in statuses] == ["done"] * runs
    assert stats["statuses"].get("429", 0) == 0, stats["statuses"]
    assert stats["endpoints"] == {"fal": runs, "anthropic": runs}, stats["endpoints"]
