"""`Lua`: the one script value every runner takes, and `run`, the runner of a sync client.

A script is its source text and the SHA1 Redis names it by (EVALSHA). Every script of the workers
is a `Lua` in workers/protocol/scripts/ (its KEYS and ARGV documented at its top, its reply parsed
next to it), and every runner takes that value: a worker process's `Batch`
(workers/process/redisio.py, EVALSHA in the turn's pipeline, loaded again on NOSCRIPT), the clients'
drivers (workers/client/drive.py, an `Eval` request) and `run` below (sync clients: the sweeper, the
control tasks, remote control). `Lua` is a `str`, so a test may hand it to redis-py's own `eval`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis as redis_lib
from redis.exceptions import NoScriptError


class Lua(str):
    """A Lua script's source, with `sha`, the SHA1 of it that EVALSHA names."""

    sha: str

    def __new__(cls, source: str) -> Lua:
        script = super().__new__(cls, source)
        script.sha = hashlib.sha1(source.encode()).hexdigest()
        return script

    @property
    def source(self) -> str:
        return str(self)


def run(
    client: redis_lib.Redis, script: Lua, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """Run `script` on a sync client: EVALSHA, loaded and run again when Redis does not hold it (a
    restart, SCRIPT FLUSH)."""
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        return client.evalsha(script.sha, len(keys), *keys, *args)
