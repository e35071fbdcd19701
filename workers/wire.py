"""Celery's messages and events as they lie in Redis (kombu 5.7's Redis transport), for the step
consumer (workers/consumer.py), which reads and writes them without kombu.

What a stock Celery worker, Flower or `celery inspect` sees is unchanged: a step is a Celery task
message (protocol 2, JSON) on the queue's list; a delivered message waits in kombu's `unacked` hash
and `unacked_index` zset until it is acked, and any Celery worker on the same Redis restores it to
its queue once it is older than the visibility timeout; events go to the `celeryev` topic exchange as
PUBLISHes on `/<db>.celeryev/<type with dots>` (a batch of them on `/<db>.celeryev/task.multi`).

    queue "llm"       LPUSH by producers, RPOP/BRPOP by consumers (priority 3/6/9: "llm\\x06\\x163" ...)
    unacked           delivery_tag -> JSON [message, exchange, routing_key]
    unacked_index     delivery_tag -> time delivered
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
_SEP = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)
_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"


def queue_keys(queues: list[str]) -> list[str]:
    """The list keys of `queues`, in kombu's consume order (every queue's priority 0 first)."""
    return [q if pri == 0 else f"{q}{_SEP}{pri}" for pri in _PRIORITY_STEPS for q in queues]


def task_message(name: str, args: list[Any], task_id: str, queue: str) -> Delivery:
    """A Celery protocol-2 task message for `queue` (anonymous exchange, routing key = queue), as the
    `Delivery` it will be: `raw` is what goes on the queue."""
    body = orjson.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    argsrepr = repr(args)
    headers: dict[str, Any] = {
        "lang": "py", "task": name, "id": task_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
        "root_id": task_id, "parent_id": None, "argsrepr": argsrepr, "kwargsrepr": "{}",
        "origin": _ORIGIN, "ignore_result": True, "replaced_task_nesting": 0,
        "stamped_headers": None, "stamps": {},
    }  # fmt: skip
    tag = _tag()
    raw = orjson.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0, "body_encoding": "base64", "delivery_tag": tag,
        },
    }).decode()  # fmt: skip
    return Delivery(
        tag=tag, name=name, task_id=task_id, args=list(args), kwargs={}, argsrepr=argsrepr, raw=raw
    )


def _tag() -> str:
    """A unique delivery tag (uuid4 text, as kombu's; from one random base and a counter: cheaper)."""
    return f"{_BASE}-{next(_COUNTER):012x}"


_BASE = str(uuid.uuid4())[:23]
_COUNTER = itertools.count()


@dataclass(frozen=True)
class Delivery:
    """A task message taken from a queue: what it asks for and how to ack or restore it."""

    tag: str
    name: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    argsrepr: str
    raw: str


class BadMessage(ValueError):
    """A message on a step queue that is not a Celery protocol-2 JSON task message."""


def parse(raw: str) -> Delivery:
    try:
        message = orjson.loads(raw)
        properties, headers = message["properties"], message["headers"]
        if message.get("content-type") != "application/json":
            raise BadMessage(f"content type {message.get('content-type')!r}, not application/json")
        body = message["body"]
        if properties.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = orjson.loads(body)
        return Delivery(
            tag=properties["delivery_tag"],
            name=headers["task"],
            task_id=headers["id"],
            args=list(args),
            kwargs=dict(kwargs),
            argsrepr=headers.get("argsrepr") or repr(args),
            raw=raw,
        )
    except BadMessage:
        raise
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as error:
        raise BadMessage(f"not a Celery protocol-2 task message: {error}") from error


def tag_of(raw: str) -> str | None:
    """The delivery tag of a message that may not parse as a task (None when it has none)."""
    try:
        tag = orjson.loads(raw)["properties"]["delivery_tag"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return tag if isinstance(tag, str) else None


def unacked_value(raw: str, queue: str) -> str:
    """The `unacked` hash value kombu restores from: [message, exchange, routing_key]."""
    return f'[{raw}, "", {json.dumps(queue)}]'


class Events:
    """Celery task events as a worker with hostname `hostname` sends them (Flower reads these).

    Events are buffered (`add`) and sent by whoever drains the buffer (`drain`, once per loop turn:
    workers/runtime.py): the events of one turn go out as one `task.multi` message whose body is the
    list of events, as Celery's own worker batches them (its dispatcher's `buffer_group`); Celery's
    `EventReceiver`, and so Flower, takes a list body as that many events. A lone event goes out as
    itself, on its own routing key.
    """

    MAX_PER_MESSAGE = 100

    def __init__(self, hostname: str, db: int) -> None:
        self.hostname = hostname
        self.prefix = f"/{db}.celeryev/"
        self.pid = os.getpid()
        self.utcoffset = -time.timezone // 3600
        self.clock = 0
        self.buffer: list[dict[str, Any]] = []

    def add(self, type_: str, fields: dict[str, Any]) -> bool:
        """Buffer event `type_` with `fields`; True when the buffer was empty before (drain it)."""
        self.clock += 1
        self.buffer.append({
            "hostname": self.hostname, "utcoffset": self.utcoffset, "pid": self.pid, "clock": self.clock,
            **fields, "timestamp": time.time(), "type": type_,
        })  # fmt: skip
        return len(self.buffer) == 1

    def drain(self) -> list[tuple[str, bytes]]:
        """(channel, payload) of each PUBLISH that sends the buffered events; empties the buffer."""
        events, self.buffer = self.buffer, []
        step = self.MAX_PER_MESSAGE
        return [self._envelope(events[i : i + step]) for i in range(0, len(events), step)]

    def _envelope(self, events: list[dict[str, Any]]) -> tuple[str, bytes]:
        body: Any = events
        if len(events) == 1:
            body = events[0]
            routing_key = body["type"].replace("-", ".")
        else:
            routing_key = "task.multi"
        payload = orjson.dumps({
            "body": base64.b64encode(orjson.dumps(body)).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"hostname": self.hostname},
            "properties": {
                "delivery_mode": 1, "delivery_info": {"exchange": "celeryev", "routing_key": routing_key},
                "priority": 0, "body_encoding": "base64", "delivery_tag": _tag(),
            },
        })  # fmt: skip
        return self.prefix + routing_key, payload


CLAIM = """
-- KEYS[1]=unacked KEYS[2]=unacked_index KEYS[3..]=queue list keys in consume order
-- ARGV[1]=most messages to take ARGV[2]=now -> {queue key, message, ...}
-- Pops and records each message as delivered in one atomic call, so a consumer that dies at any
-- point leaves every message either on its queue or in `unacked` (restored after the visibility
-- timeout), never in neither.
local out = {}
local left = tonumber(ARGV[1])
for i = 3, #KEYS do
  while left > 0 do
    local raw = redis.call('RPOP', KEYS[i])
    if not raw then break end
    local ok, message = pcall(cjson.decode, raw)
    local tag = ok and type(message) == 'table' and message.properties
      and message.properties.delivery_tag
    if tag then
      local queue = string.match(KEYS[i], '^(.-)\\6\\22') or KEYS[i]
      redis.call('HSET', KEYS[1], tag, '[' .. raw .. ', "", ' .. cjson.encode(queue) .. ']')
      redis.call('ZADD', KEYS[2], ARGV[2], tag)
    end
    out[#out + 1] = KEYS[i]
    out[#out + 1] = raw
    left = left - 1
  end
end
return out
"""

RESTORE = """
-- KEYS[1]=unacked KEYS[2]=unacked_index KEYS[3]=queue; ARGV[1]=delivery tag ARGV[2]=the message
-- Puts a delivered message back at the consuming end of its queue (as kombu's restore does) unless
-- it was acked or restored already -> 1 when restored, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[2])
return 1
"""

RESTORE_VISIBLE = """
-- KEYS[1]=unacked KEYS[2]=unacked_index; ARGV[1]=delivered before this time ARGV[2]=most to restore
-- kombu's visibility timeout: messages delivered before ARGV[1] and never acked go back to the
-- consuming end of their queue (the routing key: toolloop's queues are direct) -> how many.
local tags = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local restored = 0
for _, tag in ipairs(tags) do
  local value = redis.call('HGET', KEYS[1], tag)
  redis.call('ZREM', KEYS[2], tag)
  redis.call('HDEL', KEYS[1], tag)
  if value then
    local message, _, queue = string.match(value, '^%[(.*),%s*"([^"]*)",%s*"([^"]*)"%]$')
    if message then
      redis.call('RPUSH', queue, message)
      restored = restored + 1
    end
  end
end
return restored
"""
