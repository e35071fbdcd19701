"""The Lua scripts a `Batch` (workers/process/redisio.py) runs by SHA, and how a batch keeps its order when
Redis has forgotten them (a NOSCRIPT reply: a restart, SCRIPT FLUSH, a failover behind a proxy).

Invariant: the effects of one batch land in the order its commands were queued, each once.

A batch is one pipelined write without MULTI, so Redis runs every command of it whatever the one
before replied. A command that replies NOSCRIPT did nothing; a command after it that succeeded has
run ahead of it, and running the failed one again afterwards would land it out of order (a delta
after its run's commit). Re-running everything from the failed one onwards is no cure either: a
command that succeeded already is not idempotent in general (XADD, LPUSH and PUBLISH would land
twice; HSETNX and SET NX would reply 0 to the caller that in fact set the key). So the batch is made
such that, once Redis has lost the scripts, every command from the first script onwards fails too:

- A plain command queued after a script in the same batch is sent as EVALSHA of `RUN_ONE` (a script
  that runs it), so it fails with NOSCRIPT together with the script before it.
- No script is loaded in the middle of a batch: a batch with a script not loaded yet (the first
  batch, a script seen for the first time) starts with SCRIPT LOAD of every known script, so a
  script cannot succeed after an earlier EVALSHA failed because it was loaded in between.

Then the commands from the first NOSCRIPT onwards that replied NOSCRIPT (nothing else is left) are
sent again in one pipeline, in their order, behind SCRIPT LOAD of every known script. Nothing ran
twice (a NOSCRIPT command did nothing), nothing is lost, and each caller gets its command's reply.
A batch that hits NOSCRIPT holds back the batches queued after it until its commands ran again, and
one that was already sent waits for the earlier batches to have run again before it does.

A turn's `WAIT` (TOOLLOOP_COMMIT_WAIT) is the one plain command that cannot run inside a script, so
it runs ahead of the commands sent again; the batch (workers/process/redisio.py) ends each pipeline
it sends again with a `WAIT` of its own (a WAIT counts its own connection's writes), and those
replies confirm them.

What is left: another connection loading the scripts while Redis runs a batch that hit NOSCRIPT (a
large batch is read in pieces, other clients' commands in between) lets that batch's later scripts
run ahead. They ran once; they are not run again (see above), and the batch logs them as an error.

Scripts are not loaded when a connection is made: after a restart, the first batch on the new
connection fails from its first script onwards and is sent again, one round trip more per restart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import NoScriptError

from workers.protocol.lua import Lua
from workers.protocol.scripts.batch import RUN_ONE

log = logging.getLogger("toolloop.workers")

Run = Callable[[list[tuple[Any, ...]]], Awaitable[list[Any]]]
"""Send commands in one pipeline -> their replies (an error reply, or the connection's, as a value)."""

AGAIN = 3
"""How many times a batch's NOSCRIPT commands are sent again (the cache flushed again meanwhile)."""


def name(args: tuple[Any, ...]) -> str:
    """The name of the command `args` runs (the plain command inside a `RUN_ONE`)."""
    if args[0] == "EVALSHA" and args[1] == RUN_ONE.sha:
        return str(args[3])
    return str(args[0])


def failed_from(replies: list[Any]) -> int | None:
    """The index of the first NOSCRIPT reply, None when there is none."""
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            return i
    return None


class ScriptCache:
    """The scripts a batch has run (source by SHA), to load them ahead of a batch and again after a
    NOSCRIPT, and the batch's commands put in the shape the module docstring describes."""

    def __init__(self, *scripts: Lua) -> None:
        self.sources: dict[str, str] = {}
        self.pending = True
        """A script is known that no batch has loaded yet."""
        for script in (RUN_ONE, *scripts):
            self.sha(script)

    def sha(self, script: Lua) -> str:
        """The SHA of `script` (a new script is loaded ahead of the next batch)."""
        sha = script.sha
        if sha not in self.sources:
            self.sources[sha] = script.source
            self.pending = True
        return sha

    def loads(self) -> list[tuple[Any, ...]]:
        """SCRIPT LOAD of every known script (none pending after it)."""
        self.pending = False
        return [("SCRIPT", "LOAD", source) for source in self.sources.values()]

    def in_order(
        self, commands: list[tuple[tuple[Any, ...], Any]]
    ) -> list[tuple[tuple[Any, ...], Any]]:
        """`commands`, each plain command after the first script run by `RUN_ONE`."""
        for i, (args, _) in enumerate(commands):
            if args[0] == "EVALSHA":
                return commands[: i + 1] + [
                    (
                        a
                        if a[0] in ("EVALSHA", "SCRIPT")
                        else ("EVALSHA", RUN_ONE.sha, 0, *a),
                        f,
                    )
                    for a, f in commands[i + 1 :]
                ]
        return commands

    async def again(
        self, run: Run, commands: list[tuple[Any, ...]], replies: list[Any]
    ) -> list[Any]:
        """`replies` of `commands`, those that are NOSCRIPT replaced by the replies of their commands
        sent again with `run`, in their order, behind SCRIPT LOAD of every known script."""
        first = failed_from(replies) or 0
        ahead = [
            name(a)
            for a, r in zip(commands[first:], replies[first:], strict=True)
            if not isinstance(r, Exception) and a[0] != "WAIT"
        ]  # a turn's WAIT cannot run in a script: the batch sends it again after these
        if ahead:  # the residual case of the module docstring: they ran, ahead of the failed one
            log.error(
                "redis: %s ran ahead of a command that failed (NOSCRIPT) before them in the batch: "
                "the scripts were loaded again while the batch ran",
                ", ".join(ahead),
            )
        replies = list(replies)
        for _ in range(AGAIN):  # the cache flushed again meanwhile: again
            again = [
                i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)
            ]
            if not again:
                break
            loads = self.loads()
            got = await run([*loads, *(commands[i] for i in again)])
            for i, reply in zip(again, got[len(loads) :], strict=True):
                replies[i] = reply
        return replies
