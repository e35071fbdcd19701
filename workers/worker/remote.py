"""The worker's remote-control commands (`celery -A workers.app control|inspect ...`).

Celery's own `active`, `active_queues` and `revoke` know only Celery's consumer and pool: these
replace them (same names, same replies) and add what the step consumer holds; `add_step_queue` and
`cancel_step_queue` change the step consumer's queues. Registered when `workers.app` is imported,
so the worker answers them and the `celery control` command line knows them. A worker's step
consumer is found on its process (`names.PROCESS_ATTR` of the Celery app: workers/process/worker_process.py).
"""

from __future__ import annotations

import ast
import logging
import os
from typing import Any

from celery.worker.control import Panel, control_command, inspect_command
from kombu import Queue  # type: ignore[attr-defined]

from toolloop import redisurl
from workers.config.celery import send
from workers.protocol import keys, lua, names
from workers.protocol.records import FINAL
from workers.protocol.scripts.children import CANCEL_TREE, parse_cancel_tree

log = logging.getLogger("toolloop.workers")


def _consumer(state: Any) -> Any:
    """The step consumer of the worker answering (None when it runs none)."""
    process = getattr(state.app, names.PROCESS_ATTR, None)
    return getattr(process, "consumer", None)


@control_command(args=[("queue", str)], signature="<queue>")  # type: ignore[untyped-decorator]
def add_step_queue(state: Any, queue: str) -> dict[str, str]:
    """Remote control: the step consumer takes tasks from `queue` too (`celery control add_step_queue`)."""
    return _change_queue(state, queue, "added")


@control_command(args=[("queue", str)], signature="<queue>")  # type: ignore[untyped-decorator]
def cancel_step_queue(state: Any, queue: str) -> dict[str, str]:
    """Remote control: the step consumer stops taking tasks from `queue`."""
    return _change_queue(state, queue, "cancelled")


# Celery's own `active`, `active_queues` and `revoke` know only Celery's consumer and pool: these
# replace them (same names, same replies) and add what the step consumer holds.
_celery_active = Panel.data["active"]
_celery_active_queues = Panel.data["active_queues"]
_celery_revoke = Panel.data["revoke"]


@inspect_command(alias="dump_active")  # type: ignore[untyped-decorator]
def active(state: Any, safe: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """List of tasks currently being executed: Celery's pool's and the step consumer's steps."""
    found: list[dict[str, Any]] = list(_celery_active(state, safe=safe, **kwargs))
    steps = _consumer(state)
    if steps is None:
        return found
    for queue, delivery, started in dict(steps.in_flight).values():
        found.append(
            {
                "id": delivery.task_id,
                "name": delivery.name,
                "args": delivery.argsrepr if safe else delivery.args,
                "kwargs": delivery.kwargsrepr
                if safe
                else _literal(delivery.kwargsrepr),
                "type": delivery.name,
                "hostname": steps.hostname,
                "time_start": started,
                "acknowledged": False,
                "delivery_info": {
                    "exchange": "",
                    "routing_key": queue,
                    "priority": 0,
                    "redelivered": None,
                },
                "worker_pid": os.getpid(),
            }
        )
    return found


@inspect_command()  # type: ignore[untyped-decorator]
def active_queues(state: Any) -> list[dict[str, Any]]:
    """List the task queues a worker is currently consuming from: Celery's consumer's and the step
    consumer's (`llm`, `tools`, `control` by default), so Flower's broker page lists their lengths."""
    found: list[dict[str, Any]] = list(_celery_active_queues(state))
    steps = _consumer(state)
    if steps is None:
        return found
    known = {q.get("name") for q in found}
    declared = state.app.amqp.queues
    for name in list(steps.queues):
        if name not in known:
            queue = declared[name] if name in declared else Queue(name)  # type: ignore[no-untyped-call]
            found.append(dict(queue.as_dict(recurse=True)))
    return found


@control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")  # type: ignore[untyped-decorator]
def revoke(
    state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any
) -> Any:
    """Revoke task by task id (or list of ids). A toolloop step's id (`<run_id>:<n>`) cancels its run
    (as `toolloop cancel`: the step consumer never consults Celery's revoked set, so that is what a
    revoke of a step can honour); any other id goes to Celery's own revoke."""
    ids = [task_id] if isinstance(task_id, str) else list(task_id or [])
    others = [one for one in ids if not names.step_run(one)]
    cancelled = [
        run for one in ids if (run := names.step_run(one)) and _cancel_run(state, run)
    ]
    reply: Any = {
        "ok": f"cancelled runs {', '.join(cancelled) or 'none'} (a revoked step cancels its run)"
    }
    if others:
        reply = _celery_revoke(
            state, others, terminate=terminate, signal=signal, **kwargs
        )
    return reply


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _cancel_run(state: Any, run_id: str) -> bool:
    """Cancel a run as `Client.cancel` does (idempotent: every worker gets a broadcast revoke)."""
    client = redisurl.sync_client(
        state.app.conf.toolloop_redis_url, decode_responses=True
    )
    try:  # the run and every run it spawned (docs/children.md)
        found = parse_cancel_tree(
            lua.run(
                client,
                CANCEL_TREE,
                [keys.state(run_id)],
                [keys.CANCEL_CHANNEL, run_id, keys.PREFIX],
            )
        )
    finally:
        client.close()
    if found is None or found[0] in FINAL:
        return False
    for one, was in found[1]:
        if one == run_id or was == "asked":
            send(
                state.app,
                names.CANCEL,
                [one],
                queue=names.CONTROL,
                task_id=names.cancel_task_id(one),
            )
    log.warning(
        "run %s cancelled: a step of it was revoked (celery control revoke)", run_id
    )
    return True


def _change_queue(state: Any, queue: str, change: str) -> dict[str, str]:
    steps = _consumer(state)
    if steps is None:
        return {
            "error": "this worker has no step consumer (start it with --step-queues)"
        }
    (steps.add_queue if change == "added" else steps.cancel_queue)(queue)
    return {"ok": f"step queue {queue!r} {change}"}
