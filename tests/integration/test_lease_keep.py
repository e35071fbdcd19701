"""LEASE_KEEP against a real Redis: a lapsed lease is taken again only when no other copy began the
step since (the fence is still the step's token, the run's commit not made); RUN_BEGIN is the real
script every copy of a step takes its lease with."""

from __future__ import annotations

import uuid
from typing import Any

import redis

from toolloop.journal import scripts
from workers.protocol import keys
from workers.protocol.scripts.begin import RUN_BEGIN, Refused, Started, parse_begin
from workers.protocol.scripts.lease import LEASE_KEEP, parse_keep

LEASE_MS = 60_000


def _run(client: redis.Redis) -> str:
    run = uuid.uuid4().hex
    client.hset(keys.state(run), mapping={"status": "queued", "n": 0, "segment": 0})
    return run


def _run_begin(client: redis.Redis, run: str, owner: str) -> Any:
    """RUN_BEGIN of task 1 of `run` in `owner`, parsed."""
    r = run
    reply = client.eval(
        RUN_BEGIN,
        9,
        keys.state(r),
        keys.spec(r),
        keys.lease(r),
        keys.fence(r),
        keys.attempts(r),
        keys.spend(r),
        keys.inputs(r),
        keys.answers(r),
        keys.outbox(r),
        owner,
        LEASE_MS,
        1,
        0,
        keys.journal(r, ""),
        "",
    )
    return parse_begin(reply)


def _begin(client: redis.Redis, run: str, owner: str) -> str:
    """Task 1 of `run` begins in `owner`: its lease value."""
    begun = _run_begin(client, run, owner)
    assert isinstance(begun, Started), begun
    return f"{owner}:{begun.token}"


def _keep(client: redis.Redis, run: str, value: str) -> str:
    reply = client.eval(
        LEASE_KEEP,
        3,
        keys.lease(run),
        keys.fence(run),
        keys.state(run),
        value,
        LEASE_MS,
        1,
    )
    return parse_keep(reply)


def _lapse(client: redis.Redis, run: str) -> None:
    # what the lease's expiry does while its holder is frozen
    client.delete(keys.lease(run))


def test_a_held_lease_is_renewed(redis_client: redis.Redis) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    redis_client.pexpire(keys.lease(run), 1000)
    assert _keep(redis_client, run, ours) == "renewed"
    assert redis_client.pttl(keys.lease(run)) > 1000


def test_a_lapsed_lease_nobody_took_is_taken_again(redis_client: redis.Redis) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    _lapse(redis_client, run)
    assert _keep(redis_client, run, ours) == "taken again"
    assert (
        redis_client.get(keys.lease(run)) == ours
        and redis_client.pttl(keys.lease(run)) > 1000
    )
    begun = _run_begin(redis_client, run, "b")
    # a redelivered copy is turned away now
    assert isinstance(begun, Refused) and begun.what == "busy"


def test_a_lease_another_copy_holds_is_not_taken(redis_client: redis.Redis) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    _lapse(redis_client, run)
    theirs = _begin(redis_client, run, "b")
    assert _keep(redis_client, run, ours) == "held elsewhere"
    assert redis_client.get(keys.lease(run)) == theirs


def test_a_copy_that_took_over_committed_and_released_while_we_were_frozen_keeps_us_out(
    redis_client: redis.Redis,
) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    _lapse(redis_client, run)
    theirs = _begin(redis_client, run, "b")
    # b's commit of task 1
    redis_client.hset(keys.state(run), mapping={"n": 1, "status": "queued"})
    assert redis_client.eval(scripts.LEASE_RELEASE, 1, keys.lease(run), theirs) == 1
    assert _keep(redis_client, run, ours) == "moved on"
    assert not redis_client.exists(keys.lease(run))


def test_a_copy_that_began_and_let_go_without_a_commit_keeps_us_out(
    redis_client: redis.Redis,
) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    _lapse(redis_client, run)
    # its own work began: ours must not go on beside a rerun
    theirs = _begin(redis_client, run, "b")
    assert redis_client.eval(scripts.LEASE_RELEASE, 1, keys.lease(run), theirs) == 1
    assert _keep(redis_client, run, ours) == "moved on"
    assert not redis_client.exists(keys.lease(run))


def test_a_step_whose_commit_is_made_does_not_take_its_lease_again(
    redis_client: redis.Redis,
) -> None:
    run = _run(redis_client)
    ours = _begin(redis_client, run, "a")
    # our own commit landed (it frees the lease)
    redis_client.hset(keys.state(run), "n", 1)
    _lapse(redis_client, run)
    assert _keep(redis_client, run, ours) == "moved on"
    redis_client.delete(keys.state(run))
    assert _keep(redis_client, run, ours) == "moved on"  # the run is gone
    assert not redis_client.exists(keys.lease(run))
