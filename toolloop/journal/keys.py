"""The Redis keys the library's `RedisJournal` (toolloop/journal/redis.py) writes: a run's journal
segment, its lease and its fence. The durable workers' keys, these three among them, are all in
workers/protocol/keys.py with the table of what each holds.

Every key of one run carries the hash tag `{<run_id>}`, so a run lives on one slot of a Redis
Cluster and each Lua script touches one slot.
"""

from __future__ import annotations

PREFIX = "tl:"


def run_key(run_id: str, name: str) -> str:
    """The key `name` of run `run_id`: `tl:{<run_id>}:<name>`."""
    return f"{PREFIX}{{{run_id}}}:{name}"


def journal(run_id: str, segment: str) -> str:
    """The hash of one segment's journal; `segment` is a key prefix like "s0/" or a name like "s0"."""
    return run_key(run_id, f"journal:{segment.rstrip('/')}")


def lease(run_id: str) -> str:
    return run_key(run_id, "lease")


def fence(run_id: str) -> str:
    return run_key(run_id, "fence")
