"""Poison messages on Celery's own consumer: a guard on kombu's Redis channel.

When a worker leaves a toolloop queue to Celery's consumer (`--step-queues none`, or a queue the
step consumer does not take), kombu reads it. kombu 5.7's Redis transport decodes each message it
pops (`Channel._brpop_read`: `loads(item)`, then `Message(payload)`, which base64-decodes the body and
reads `properties['delivery_tag']`) outside any error handler, so one message that is not JSON, or
whose body is not base64, raises out of the event loop: Celery logs "Unrecoverable error" and the
worker exits; every restarted worker takes the same message and dies again.

`guard_channel` (run by a consumer bootstep, workers/worker/bootsteps.py) replaces the channel's BRPOP
handler with the same read followed by `wire.problem`: a message that is not a valid toolloop task
goes to the rejected list (keys.REJECTED) with an error log line instead of reaching kombu's
decoder; a valid one is delivered exactly as kombu would. It runs again whenever the consumer
reconnects (a new channel).
"""

from __future__ import annotations

import logging
from typing import Any

import redis as redis_lib
from kombu.transport.virtual import Empty
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from workers.protocol import keys, wire

log = logging.getLogger("toolloop.workers")


def guard_channel(
    channel: Any, hostname: str, max_bytes: int, client: redis_lib.Redis
) -> bool:
    """Put the guarded BRPOP read on a kombu Redis channel; False when it has no BRPOP handler."""
    handlers = getattr(channel, "handlers", None)
    if not isinstance(handlers, dict) or "BRPOP" not in handlers:
        return False
    if getattr(handlers["BRPOP"], "toolloop_guard", False):
        return True

    def brpop_read(**options: Any) -> bool:  # kombu 5.7's Channel._brpop_read, checked
        try:
            try:
                dest_item = channel.client.parse_response(
                    channel.client.connection, "BRPOP", **options
                )
            except channel.connection_errors:
                channel.client.connection.disconnect()
                raise
            if not dest_item:
                raise Empty()
            dest, item = dest_item
            dest = bytes_to_str(dest).rsplit(channel.sep, 1)[0]  # type: ignore[no-untyped-call]
            channel._queue_cycle.rotate(dest)
            raw = (
                item.decode("utf-8", "replace")
                if isinstance(item, bytes)
                else str(item)
            )
            reason = wire.problem(raw, max_bytes)
            if reason is not None:
                reject(client, dest, raw, reason, hostname)
                return True
            channel.connection._deliver(loads(raw), dest)  # type: ignore[no-untyped-call]
            return True
        finally:
            channel._in_poll = None
            flush = getattr(channel, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    brpop_read.toolloop_guard = True  # type: ignore[attr-defined]
    handlers["BRPOP"] = brpop_read
    return True


def reject(
    client: redis_lib.Redis, queue: str, raw: str, reason: str, hostname: str
) -> None:
    log.error(
        "celery consumer: a message on queue %r is not a task (%s); moved to the list %r.\n"
        "  Only toolloop tasks belong on toolloop queues; inspect it with `redis-cli LRANGE %s 0 9`.",
        queue,
        reason,
        keys.REJECTED,
        keys.REJECTED,
    )
    try:
        pipe = client.pipeline(transaction=False)
        pipe.lpush(keys.REJECTED, wire.rejected_entry(queue, raw, reason, hostname))
        pipe.ltrim(keys.REJECTED, 0, wire.REJECTED_KEEP - 1)
        pipe.execute()
    except Exception as error:  # the message is gone from its queue either way: say so
        log.error(
            "celery consumer: could not store the rejected message (%s); it is dropped",
            error,
        )
