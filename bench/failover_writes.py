"""Writes acknowledged and then lost through one graceful Sentinel failover (docs/operations.md,
"Sentinel, failover and TOOLLOOP_COMMIT_WAIT").

A primary, a replica and three sentinels (tests/support/sentinel.py); one writer INCRs a counter about
100 times a second for 20 s while `SENTINEL FAILOVER` runs; the counter on the new primary after it,
against the writes the writer saw acknowledged, is what the failover lost. Two writers: a plain
redis-py Sentinel client (`master_for`), and toolloop's (`toolloop.redisurl.sync_client` with the
`+switch-master` watcher). The sentinels run without deploy/sentinel/demote-old-primary.sh (the
old primary stays writable until they convert it), as the figures in docs/operations.md were
measured; `--demote` runs them with it.

    .venv/bin/python bench/failover_writes.py [--demote]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import redis
from redis.sentinel import Sentinel

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from tests.support.sentinel import SERVICE, SentinelSet  # noqa: E402
from toolloop import redisurl  # noqa: E402


def lost_writes(following: bool, demote: bool = False) -> tuple[int, int]:
    """(acknowledged, lost) through one graceful failover."""
    deployment = SentinelSet(
        Path(tempfile.mkdtemp(prefix="bench-failover-")), demote=demote
    ).start()
    watcher = redisurl.watcher(deployment.url) if following else None
    try:
        if following:
            client = redisurl.sync_client(deployment.url, watcher=watcher)
        else:
            sentinels = [("127.0.0.1", node.port) for node in deployment.sentinels]
            client = Sentinel(sentinels).master_for(SERVICE)
        client.set("n", 0)
        time.sleep(1)
        redis.Redis(port=deployment.sentinels[0].port).execute_command(
            "SENTINEL", "FAILOVER", SERVICE
        )
        acked, until = 0, time.monotonic() + 20
        while time.monotonic() < until:
            try:
                client.incr("n")
                acked += 1
            except redis.RedisError:
                pass
            time.sleep(0.01)
        kept = int(redis.Redis(port=deployment.primary_port()).get("n") or 0)
        return acked, acked - kept
    finally:
        if watcher is not None:
            watcher.close()
        deployment.stop()


def main() -> None:
    print("| Writer | Acknowledged | Lost in the failover |\n| --- | ---: | ---: |")
    for following, name in (
        (False, "redis-py master_for"),
        (True, "toolloop.redisurl + watcher"),
    ):
        acked, lost = lost_writes(following, demote="--demote" in sys.argv[1:])
        print(f"| {name} | {acked:,} | {lost:,} |")


if __name__ == "__main__":
    main()
