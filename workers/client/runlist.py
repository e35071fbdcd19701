"""Listing runs, their retention and pruning.

The index: `tl:runs:all` (every run id, score = enqueue time: newest first) and `tl:runs:ended`
(finished run ids, score = when they ended). Retention (TOOLLOOP_RETENTION, default 7 days): the
commit that ends a run (done, budget, steps, cancel, failed) sets the expiry of each of its keys;
a parked (`asked`) or running run never expires, and a retried run's keys are made persistent
again. The index entries of expired runs go away when a listing reads them (their state key is
gone) or at `toolloop prune`, so the index expires with the runs. `prune` also deletes the finished
runs older than the retention whose keys have no expiry (runs that ended before retention was set,
or whose expiry was lost in a crash between the commit and its EXPIRE).

A page is one ZREVRANGEBYSCORE of the index plus one pipelined HMGET per chunk of ids: paging
through 10,000 runs costs within 3x of the same reads done bare (tests/integration/test_run_list.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib

from workers.client.ops import Call, Op, Pipeline
from workers.protocol import keys
from workers.protocol.records import FINAL

_FIELDS = ("status", "created", "touched", "steps", "spent_usd", "segment")
_CHUNK = 500


@dataclass(frozen=True)
class RunSummary:
    """One row of a listing: what `toolloop list` prints."""

    run_id: str
    status: str
    created_at: float
    updated_at: float | None
    steps: int
    spent_usd: float


@dataclass(frozen=True)
class RunPage:
    """A page of runs, newest first; `next` is the cursor of the following page (None: the last)."""

    runs: list[RunSummary] = field(default_factory=list)
    next: str | None = None


def cursor_at(score: float, member: str) -> str:
    """The cursor of a page that ends at the run `member` created at `score` (any shard's)."""
    return _cursor(score, member)


def _cursor(score: float, member: str) -> str:
    return f"{score!r}|{member}"


def _parse_cursor(cursor: str) -> tuple[float, str]:
    score, _, member = cursor.partition("|")
    try:
        return float(score), member
    except ValueError:
        raise ValueError(
            f"{cursor!r} is not a page cursor.\n  Pass the `next` value of the previous page."
        ) from None


def page(
    *, status: str | None = None, limit: int = 50, cursor: str | None = None
) -> Op[RunPage]:
    """`list_runs` as an operation of workers/client/ops.py (both clients run it)."""
    if limit < 1:
        raise ValueError(f"limit is {limit}; ask for at least 1 run.")
    top: Any = "+inf"
    after: tuple[float, str] | None = None
    if cursor:
        after = _parse_cursor(cursor)
        top = after[0]
    found: list[RunSummary] = []
    last: tuple[float, str] | None = None
    offset = 0
    # A page and one more (is there a next page?), and the cursor's own entry, which the read from
    # its score returns first; more per read while filtering.
    size = limit + 1 + (after is not None)
    while True:
        flat = yield Call(
            "ZREVRANGEBYSCORE",
            keys.ALL_RUNS,
            top,
            "-inf",
            "WITHSCORES",
            "LIMIT",
            offset,
            size,
        )
        chunk = _pairs(flat)
        size = min(size * 2, _CHUNK)
        if not chunk:
            return RunPage(found, None)
        offset += len(chunk)
        if (
            after is not None
        ):  # equal scores come in descending member order: skip those seen
            chunk = [(m, s) for m, s in chunk if not (s == after[0] and m >= after[1])]
        states = yield Pipeline(
            [("HMGET", keys.state(member), *_FIELDS) for member, _ in chunk]
        )
        gone: list[str] = []
        for (member, score), values in zip(chunk, states, strict=True):
            state = dict(zip(_FIELDS, values, strict=True))
            if state["status"] is None:
                gone.append(member)  # expired: the index follows its run
                continue
            if status is not None and state["status"] != status:
                continue
            if (
                len(found) == limit and last is not None
            ):  # one more matches: there is a next page
                yield from _dropped(gone)
                return RunPage(found, _cursor(*last))
            found.append(_summary(member, score, state))
            last = (score, member)
        yield from _dropped(gone)


def _pairs(reply: list[Any]) -> list[tuple[str, float]]:
    """(member, score) of a WITHSCORES reply, flat (RESP2) or as pairs (RESP3)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(str(member), float(score)) for member, score in reply]
    return [(str(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


def _dropped(members: list[str]) -> Op[None]:
    if members:
        yield Pipeline(
            [("ZREM", keys.ALL_RUNS, *members), ("ZREM", keys.ENDED_RUNS, *members)]
        )


def _drop(client: redis_lib.Redis, members: list[str]) -> None:
    if members:
        client.zrem(keys.ALL_RUNS, *members)
        client.zrem(keys.ENDED_RUNS, *members)


def _summary(run_id: str, score: float, state: dict[str, Any]) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        status=str(state["status"]),
        created_at=float(state["created"] or score),
        updated_at=float(state["touched"]) if state["touched"] else None,
        steps=int(state["steps"] or 0),
        spent_usd=float(state["spent_usd"] or 0),
    )


def expire_commands(
    run_id: str, segments: int, retention: float
) -> list[tuple[Any, ...]]:
    """The commands that start a finished run's retention: EXPIRE of each key, and its entry in the
    index of ended runs (nothing expires with retention 0)."""
    commands: list[tuple[Any, ...]] = [("ZADD", keys.ENDED_RUNS, time.time(), run_id)]
    if retention > 0:
        ttl = max(1, int(retention))
        commands += [("EXPIRE", key, ttl) for key in keys.run_keys(run_id, segments)]
    return commands


@dataclass(frozen=True)
class Pruned:
    deleted: int
    """Finished runs older than the retention deleted now (their keys had no expiry)."""
    forgotten: int
    """Index entries of runs whose keys had expired already."""


def prune(
    client: redis_lib.Redis, older_than: float, *, now: float | None = None
) -> Pruned:
    """Delete the finished runs that ended more than `older_than` s ago, and drop from the index
    every run whose keys are gone. Parked and running runs are never touched."""
    now = time.time() if now is None else now
    deleted = forgotten = 0
    ended: list[str] = client.zrangebyscore(keys.ENDED_RUNS, "-inf", now - older_than)  # type: ignore[assignment]
    for start in range(0, len(ended), _CHUNK):
        ids = ended[start : start + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(keys.state(run_id), "status", "segment")
        for run_id, (status, segment) in zip(ids, pipe.execute(), strict=True):
            if status is None:
                forgotten += 1
            elif status in FINAL:
                client.delete(*keys.run_keys(run_id, int(segment or 0)))
                deleted += 1
            else:  # retried since: it is live again
                client.zrem(keys.ENDED_RUNS, run_id)
                continue
            client.zrem(keys.ALL_RUNS, run_id)
            client.zrem(keys.ENDED_RUNS, run_id)
    cursor = 0
    while (
        True
    ):  # the index of all runs: drop what expired (one pipelined EXISTS per chunk)
        members: list[str] = client.zrange(keys.ALL_RUNS, cursor, cursor + _CHUNK - 1)  # type: ignore[assignment]
        if not members:
            break
        pipe = client.pipeline(transaction=False)
        for run_id in members:
            pipe.exists(keys.state(run_id))
        gone = [
            run_id
            for run_id, alive in zip(members, pipe.execute(), strict=True)
            if not alive
        ]
        _drop(client, gone)
        forgotten += len(gone)
        cursor += len(members) - len(gone)
    return Pruned(deleted, forgotten)
