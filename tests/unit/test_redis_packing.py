"""workers/process/redisio.py: the hiredis-packed connection sends the bytes redis-py's own packer sends."""

from __future__ import annotations

import redis.asyncio as aredis
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.process.redisio import PackedConnection, packed_pool

COMMANDS: list[tuple[object, ...]] = [
    (
        "EVALSHA",
        "a" * 40,
        2,
        "tl:{r1}:state",
        "tl:{r1}:lease",
        '{"ünïcode": "✓"}',
        600000,
    ),
    ("LPUSH", "llm", b"\x00raw bytes\r\n" * 1000),
    ("CLIENT SETNAME", "toolloop"),
    ("ZREM", "unacked_index", "tag-1"),
]


def test_each_command_packs_to_the_same_bytes_as_redis_py() -> None:
    ours, theirs = PackedConnection(), aredis.Connection()
    for command in COMMANDS:
        assert b"".join(ours.pack_command(*command)) == b"".join(
            theirs.pack_command(*command)
        )
    assert b"".join(ours.pack_commands(COMMANDS)) == b"".join(
        theirs.pack_commands(COMMANDS)
    )


def test_a_float_packs_to_a_number_that_reads_back_the_same() -> None:
    now = 1796027595.0100725
    (packed,) = PackedConnection().pack_command("ZADD", "unacked_index", now, "tag-1")
    assert float(packed.split(b"\r\n")[-4]) == now


def test_only_plain_tcp_pools_are_switched() -> None:
    plain = packed_pool(aredis.ConnectionPool.from_url("redis://localhost/0"))
    assert plain.connection_class is PackedConnection
    tls = packed_pool(aredis.ConnectionPool.from_url("rediss://localhost/0"))
    assert tls.connection_class is not PackedConnection


# `pack_command` / `pack_commands` are not an extension point of redis-py's asyncio connection (its
# sync client takes a `command_packer`; the asyncio one does not): the override is pinned with
# redis-py (`redis<8.2` in pyproject.toml) and compared here with the original it replaces.

_ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.binary(
        min_size=6000, max_size=7000
    ),  # past redis-py's buffer cutoff: it chunks, we do not
)
_COMMAND = st.tuples(
    st.sampled_from(["SET", "HSET", "EVALSHA", "LPUSH"]), st.lists(_ARG, max_size=6)
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_COMMAND, min_size=1, max_size=5))
def test_any_command_redis_py_packs_packs_to_the_same_bytes(
    commands: list[tuple[str, list[object]]],
) -> None:
    ours, theirs = PackedConnection(), aredis.Connection()
    for name, args in commands:
        assert b"".join(ours.pack_command(name, *args)) == b"".join(
            theirs.pack_command(name, *args)
        )
    flat = [(name, *args) for name, args in commands]
    assert b"".join(ours.pack_commands(flat)) == b"".join(theirs.pack_commands(flat))


def test_the_methods_overridden_are_still_the_ones_redis_py_sends_through() -> None:
    import inspect

    from redis.asyncio import client as aclient
    from redis.asyncio import connection as aconnection

    for name in ("pack_command", "pack_commands"):
        original = getattr(aredis.Connection, name)
        assert original is not getattr(PackedConnection, name)
        assert list(inspect.signature(original).parameters) == list(
            inspect.signature(getattr(PackedConnection, name)).parameters
        )
    # where redis-py packs what it sends: a command (send_command) and a pipeline (_execute_pipeline)
    assert "self.pack_command(*args)" in inspect.getsource(
        aconnection.AbstractConnection.send_command
    )
    assert "connection.pack_commands(" in inspect.getsource(aclient.Pipeline)
