"""The Redis keys the library's `RedisJournal` (toolloop/journal/redis.py) writes: a run's journal
segment, its lease and its fence. The durable workers' keys, these three among them, are all in
workers/protocol/keys.py with the table of what each holds.

Every key of one run carries the hash tag `{<run_id>}`, so a run lives on one slot of a Redis
Cluster and each Lua script touches one slot. A child run (workers/step/children.py) has the id
`<parent id>.<derived>`, and its keys carry the ROOT run's tag: `tl:{<root>}.<rest>:state`, so a
whole tree of runs lives on one slot (its journal, lease and fence here too: `run_key` is the one
rule for the library's keys and the workers').
"""

from __future__ import annotations

PREFIX = "tl:"


CHILD_SEP = "."
"""What separates a child run's id from its parent's (`<parent id>.<derived>`)."""


def run_key(run_id: str, name: str) -> str:
    """The key `name` of run `run_id`: `tl:{<run_id>}:<name>`; for a child run `<root>.<rest>`,
    `tl:{<root>}.<rest>:<name>` (the root's tag: a tree on one slot)."""
    root, sep, rest = run_id.partition(CHILD_SEP)
    return f"{PREFIX}{{{root}}}{sep}{rest}:{name}"


def journal(run_id: str, segment: str) -> str:
    """The hash of one segment's journal; `segment` is a key prefix like "s0/" or a name like "s0"."""
    return run_key(run_id, f"journal:{segment.rstrip('/')}")


def lease(run_id: str) -> str:
    return run_key(run_id, "lease")


def fence(run_id: str) -> str:
    return run_key(run_id, "fence")
