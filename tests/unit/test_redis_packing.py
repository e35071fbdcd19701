"""workers/redisio.py: the hiredis-packed connection sends the bytes redis-py's own packer sends."""

from __future__ import annotations

import redis.asyncio as aredis

from workers.redisio import PackedConnection, packed_pool

COMMANDS: list[tuple[object, ...]] = [
    ("EVALSHA", "a" * 40, 2, "tl:{r1}:state", "tl:{r1}:lease", '{"ünïcode": "✓"}', 600000),
    ("LPUSH", "llm", b"\x00raw bytes\r\n" * 1000),
    ("CLIENT SETNAME", "toolloop"),
    ("ZREM", "unacked_index", "tag-1"),
]


def test_each_command_packs_to_the_same_bytes_as_redis_py() -> None:
    ours, theirs = PackedConnection(), aredis.Connection()
    for command in COMMANDS:
        assert b"".join(ours.pack_command(*command)) == b"".join(theirs.pack_command(*command))
    assert b"".join(ours.pack_commands(COMMANDS)) == b"".join(theirs.pack_commands(COMMANDS))


def test_a_float_packs_to_a_number_that_reads_back_the_same() -> None:
    now = 1796027595.0100725
    (packed,) = PackedConnection().pack_command("ZADD", "unacked_index", now, "tag-1")
    assert float(packed.split(b"\r\n")[-4]) == now


def test_only_plain_tcp_pools_are_switched() -> None:
    plain = packed_pool(aredis.ConnectionPool.from_url("redis://localhost/0"))
    assert plain.connection_class is PackedConnection
    tls = packed_pool(aredis.ConnectionPool.from_url("rediss://localhost/0"))
    assert tls.connection_class is not PackedConnection
