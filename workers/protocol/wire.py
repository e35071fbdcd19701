"""Celery's messages and events as they lie in Redis (kombu 5.7's Redis transport), for the step
consumer (workers/worker/consumer.py), which reads and writes them without kombu.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from kombu.transport.redis import Channel

from workers.protocol.names import PRIORITY_SEP, PRIORITY_STEPS, SENT_AT

_FANOUT_PREFIX = str(Channel.keyprefix_fanout)
"""kombu's prefix of a fanout exchange's PUB/SUB channels ('/{db}.'); events go to `celeryev`."""
_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"


def queue_keys(queues: list[str]) -> list[str]:
    """The list keys of `queues`, in kombu's consume order (every queue's priority 0 first)."""
    return [
        q if pri == 0 else f"{q}{PRIORITY_SEP}{pri}"
        for pri in PRIORITY_STEPS
        for q in queues
    ]


def task_message(
    name: str,
    args: list[Any],
    task_id: str,
    queue: str,
    label: str = "",
    traceparent: str | None = None,
    tag: str | None = None,
) -> Delivery:
    """A Celery protocol-2 task message for `queue` (anonymous exchange, routing key = queue), as the
    `Delivery` it will be: `raw` is what goes on the queue. `label` says what the step is (`model 3`,
    `tool read_frame`): it shows in Flower and `celery inspect` as the task's kwargsrepr
    (`{'step': 'model 3'}`) while the arguments stay ids only. `traceparent`: the run's W3C trace
    context, carried as a message header (workers/observe/tracing.py). `tag`: its delivery tag, unique (a
    worker passes `WorkerProcess.new_owner()`: no `os.urandom` per message); default a uuid4."""
    body = orjson.dumps(
        [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    argsrepr = repr(args)
    kwargsrepr = step_kwargsrepr(label)
    headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": argsrepr,
        "kwargsrepr": kwargsrepr,
        "origin": _ORIGIN,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    # not Celery's: the oldest waiting step's age (workers/observe/queueage.py)
    headers[SENT_AT] = time.time()
    if traceparent:
        headers["traceparent"] = traceparent
    tag = tag or _tag()
    raw = orjson.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": tag,
            },
        }
    ).decode()
    return Delivery(
        tag=tag,
        name=name,
        task_id=task_id,
        args=list(args),
        kwargs={},
        argsrepr=argsrepr,
        raw=raw,
        kwargsrepr=kwargsrepr,
    )


def step_kwargsrepr(label: str) -> str:
    """The kwargsrepr that names a step (`{'step': 'tool read_frame'}`); `{}` without a label."""
    return repr({"step": label[:200]}) if label else "{}"


@dataclass
class Ids:
    """Unique ids without `os.urandom` per id: a random prefix (16 hex digits, drawn again in a
    forked child) and a counter (16 hex digits), 32 hex digits as `uuid4().hex`. `os.urandom` lets
    go of the GIL, and a thread that wants it back waits behind a busy one: the sweeper firing
    1,000 follow-ups a round spent ~9 % of its wall time in two `uuid4` a follow-up (py-spy
    `--idle` on a worker during bench/schedules.py). One per owner (a worker process, a client's
    `Sender`)."""

    _pid: int = -1
    _prefix: str = ""
    _count: Iterator[int] = field(default_factory=itertools.count)

    def new(self) -> str:
        pid = os.getpid()
        if pid != self._pid:
            self._pid, self._prefix = pid, os.urandom(8).hex()
        return f"{self._prefix}{next(self._count):016x}"


def _tag() -> str:
    """A unique delivery tag: uuid4 text, as kombu's (no per-process counter: nothing in a module
    global changes, and a forked process cannot repeat its parent's tags)."""
    return str(uuid.uuid4())


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
    kwargsrepr: str = "{}"


class BadMessage(ValueError):
    """A message on a step queue that is not a Celery protocol-2 JSON task message."""


_MAX_TAG = 200


def parse(raw: str) -> Delivery:
    """The task a Celery protocol-2 JSON message asks for; `BadMessage` (with the reason) for anything
    else: not JSON, not an object, a body that is not base64 or not JSON, missing or mistyped
    headers, properties or arguments. Never raises anything but `BadMessage`."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise BadMessage(f"not JSON ({error})") from None
    try:
        return _delivery(message, raw)
    except BadMessage:
        raise
    except (
        Exception
    ) as error:  # binascii.Error, RecursionError, ...: the content is the problem
        raise BadMessage(
            f"not a Celery protocol-2 task message ({type(error).__name__}: {error})"
        ) from None


def _delivery(message: Any, raw: str) -> Delivery:
    properties, headers, tag = _envelope(message)
    args, kwargs = _arguments(message, properties)
    name, task_id = headers.get("task"), headers.get("id")
    if not isinstance(name, str) or not isinstance(task_id, str):
        raise BadMessage("headers task and id are not strings")
    argsrepr, kwargsrepr = headers.get("argsrepr"), headers.get("kwargsrepr")
    return Delivery(
        tag=tag,
        name=name,
        task_id=task_id,
        args=args,
        kwargs=kwargs,
        argsrepr=argsrepr if isinstance(argsrepr, str) else repr(args),
        raw=raw,
        kwargsrepr=kwargsrepr if isinstance(kwargsrepr, str) else repr(kwargs),
    )


def _envelope(message: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(properties, headers, delivery tag) of a message whose envelope is kombu's, else BadMessage."""
    if not isinstance(message, dict):
        raise BadMessage(f"a JSON {type(message).__name__}, not an object")
    properties, headers = message.get("properties"), message.get("headers")
    if not isinstance(properties, dict) or not isinstance(headers, dict):
        raise BadMessage("no properties or headers object")
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not 0 < len(tag) <= _MAX_TAG:
        raise BadMessage(
            f"delivery_tag {_short(tag)} is not a string of 1-{_MAX_TAG} characters"
        )
    if message.get("content-type") != "application/json":
        raise BadMessage(
            f"content type {_short(message.get('content-type'))}, not application/json"
        )
    if message.get("content-encoding", "utf-8") != "utf-8":
        raise BadMessage(
            f"content encoding {_short(message.get('content-encoding'))}, not utf-8"
        )
    _check_fields(headers, properties)
    return properties, headers, tag


def _arguments(
    message: dict[str, Any], properties: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) of a protocol-2 body ([args, kwargs, embed], base64 when the properties say)."""
    body = message.get("body")
    if not isinstance(body, str):
        raise BadMessage(f"body is a {type(body).__name__}, not a string")
    if properties.get("body_encoding") == "base64":
        try:
            body = base64.b64decode(body, validate=True)
        except ValueError:
            raise BadMessage("body is not base64") from None
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadMessage("body is not JSON") from None
    if not isinstance(decoded, list) or len(decoded) != 3:
        raise BadMessage("body is not [args, kwargs, embed]")
    args, kwargs, embed = decoded
    if (
        not isinstance(args, list)
        or not isinstance(kwargs, dict)
        or not isinstance(embed, dict | None)
    ):
        raise BadMessage("args is not a list, or kwargs or embed not an object")
    return args, kwargs


_HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "lang": (str,),
    "shadow": (str,),
    "root_id": (str,),
    "parent_id": (str,),
    "group": (str,),
    "group_index": (int,),
    "retries": (int,),
    "argsrepr": (str,),
    "kwargsrepr": (str,),
    "origin": (str,),
    "ignore_result": (bool,),
    "replaced_task_nesting": (int,),
    "stamped_headers": (list,),
    "stamps": (dict,),
    "eta": (str,),
    "expires": (str,),
    "timelimit": (list,),
}
_PROPERTY_TYPES: dict[str, tuple[type, ...]] = {
    "delivery_info": (dict,),
    "priority": (int,),
    "correlation_id": (str,),
    "reply_to": (str,),
    "delivery_mode": (int,),
    "body_encoding": (str,),
}


def _check_fields(headers: dict[str, Any], properties: dict[str, Any]) -> None:
    """The headers and properties Celery's own consumer reads have the types Celery writes (None
    allowed): a message Celery would choke on is refused by every consumer alike."""
    for where, fields, types in (
        ("header", headers, _HEADER_TYPES),
        ("property", properties, _PROPERTY_TYPES),
    ):
        for name, allowed in types.items():
            value = fields.get(name)
            if value is not None and (
                not isinstance(value, allowed)
                or (isinstance(value, bool) and bool not in allowed)
            ):
                raise BadMessage(
                    f"{where} {name} is {_short(value)}, not {' or '.join(t.__name__ for t in allowed)}"
                )
    for name in ("eta", "expires"):
        if headers.get(name) is not None:
            try:
                datetime.fromisoformat(headers[name])
            except ValueError:
                raise BadMessage(
                    f"header {name} {_short(headers[name])} is not an ISO 8601 time"
                ) from None
    limits = headers.get("timelimit")
    if limits is not None and (
        len(limits) != 2
        or not all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in limits
        )
    ):
        raise BadMessage(
            f"header timelimit {_short(limits)} is not [soft, hard] seconds"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


TASK_ARGS: dict[str, tuple[type, ...]] = {
    "toolloop.advance": (str, int),
    "toolloop.answer": (str, str),
    "toolloop.cancel": (str,),
    "toolloop.decide": (str, str),
    "toolloop.sweep": (),
}
"""The argument types of each toolloop task (workers/tasks.py): any other message is rejected."""
REJECTED_KEEP = 10_000
"""Entries the rejected list keeps (the oldest go first); each keeps up to REJECTED_RAW of the raw."""
REJECTED_RAW = 65_536


def task_problem(delivery: Delivery) -> str | None:
    """Why a parsed message is not a toolloop task this consumer can run (None: it is one)."""
    types = TASK_ARGS.get(delivery.name)
    if types is None:
        return f"unknown task {delivery.name[:80]!r}"
    args = delivery.args
    if delivery.kwargs or len(args) != len(types):
        return f"{delivery.name} takes {len(types)} positional arguments"
    for value, kind in zip(args, types, strict=True):
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or len(str(value)) > 200
        ):
            return f"{delivery.name} arguments are not {', '.join(t.__name__ for t in types)}"
    return None


def problem(raw: str, max_bytes: int) -> str | None:
    """Why `raw` is not a toolloop task message a worker may run (None: it is one)."""
    if len(raw) > max_bytes:
        return f"{len(raw):,} bytes, over TOOLLOOP_MAX_TASK_BYTES ({max_bytes:,})"
    try:
        return task_problem(parse(raw))
    except BadMessage as error:
        return str(error)


def rejected_entry(queue: str, raw: str, reason: str, worker: str) -> str:
    """One entry of the rejected list (keys.REJECTED): JSON with the reason and the raw message."""
    return orjson.dumps(
        {
            "at": time.time(),
            "queue": queue,
            "reason": reason,
            "worker": worker,
            "size": len(raw),
            "truncated": len(raw) > REJECTED_RAW,
            "raw": raw[:REJECTED_RAW],
        }
    ).decode()


def unacked_value(raw: str, queue: str) -> str:
    """The `unacked` hash value kombu restores from: [message, exchange, routing_key]."""
    return f'[{raw}, "", {json.dumps(queue)}]'


class Events:
    """Celery task events as a worker with hostname `hostname` sends them (Flower reads these).

    Events are buffered (`add`) and sent by whoever drains the buffer (`drain`, once per loop turn:
    workers/process/worker_process.py): the events of one turn go out as one `task.multi` message whose
    body is the
    list of events, as Celery's own worker batches them (its dispatcher's `buffer_group`); Celery's
    `EventReceiver`, and so Flower, takes a list body as that many events. A lone event goes out as
    itself, on its own routing key.
    """

    MAX_PER_MESSAGE = 100

    def __init__(self, hostname: str, db: int) -> None:
        self.hostname = hostname
        self.prefix = f"{_FANOUT_PREFIX.format(db=db)}celeryev/"
        self.pid = os.getpid()
        self.utcoffset = -time.timezone // 3600
        self.clock = 0
        self.buffer: list[dict[str, Any]] = []

    def add(self, type_: str, fields: dict[str, Any]) -> bool:
        """Buffer event `type_` with `fields`; True when the buffer was empty before (drain it)."""
        self.clock += 1
        self.buffer.append(
            {
                "hostname": self.hostname,
                "utcoffset": self.utcoffset,
                "pid": self.pid,
                "clock": self.clock,
                **fields,
                "timestamp": time.time(),
                "type": type_,
            }
        )
        return len(self.buffer) == 1

    def drain(self) -> list[tuple[str, bytes]]:
        """(channel, payload) of each PUBLISH that sends the buffered events; empties the buffer."""
        events, self.buffer = self.buffer, []
        step = self.MAX_PER_MESSAGE
        return [
            self._envelope(events[i : i + step]) for i in range(0, len(events), step)
        ]

    def _envelope(self, events: list[dict[str, Any]]) -> tuple[str, bytes]:
        body: Any = events
        if len(events) == 1:
            body = events[0]
            routing_key = body["type"].replace("-", ".")
        else:
            routing_key = "task.multi"
        payload = orjson.dumps(
            {
                "body": base64.b64encode(orjson.dumps(body)).decode(),
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": {"hostname": self.hostname},
                "properties": {
                    "delivery_mode": 1,
                    "delivery_info": {
                        "exchange": "celeryev",
                        "routing_key": routing_key,
                    },
                    "priority": 0,
                    "body_encoding": "base64",
                    "delivery_tag": _tag(),
                },
            }
        )
        return self.prefix + routing_key, payload
