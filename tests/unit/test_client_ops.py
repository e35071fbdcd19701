"""The clients' pure request/reply layer (workers/client/ops.py, workers/client/enqueue.py), without Redis:
what an
enqueue request carries, that a client imports no Celery, and that the task names match the app's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from workers.client import enqueue, ops
from workers.config.settings import Settings
from workers.protocol import wire
from workers.protocol.errors import LimitError, ToolsetError

SPEC = {
    "model": "m",
    "toolset": "review",
    "messages": [{"role": "user", "content": "Go."}],
}


def preparer() -> enqueue.Preparer:
    return enqueue.Preparer(Settings.from_env(), ["review"], ops.Sender(3))


def test_a_client_module_imports_no_celery_and_no_worker_runtime() -> None:
    code = (
        "import sys, workers.client.sync, workers.client.aio; "
        "print(sorted(m for m in ('celery', 'workers.app', 'workers.worker.consumer', "
        "'workers.process.worker_process') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_an_enqueue_is_one_script_carrying_the_run_and_its_first_celery_message() -> (
    None
):
    made = preparer()(SPEC, "order-1")
    assert (
        made.run_id
        == preparer()(SPEC, "order-1").run_id
        != preparer()(SPEC, None).run_id
    )
    request = made.request
    assert request.script is enqueue.ENQUEUE and request.command()[:3] == (
        "EVALSHA",
        enqueue.ENQUEUE.sha,
        8,
    )
    raw, channel, event = request.args[6:9]
    delivery = wire.parse(raw)
    assert (delivery.name, delivery.args, delivery.task_id) == (
        "toolloop.advance",
        [made.run_id, 1],
        f"{made.run_id}:1",
    )
    assert (
        wire.task_problem(delivery) is None
        and delivery.kwargsrepr == "{'step': 'model 1'}"
    )
    assert channel == "/3.celeryev/task.sent"
    sent = json.loads(base64.b64decode(json.loads(event)["body"]))
    assert (sent["type"], sent["uuid"], sent["queue"]) == (
        "task-sent",
        f"{made.run_id}:1",
        "llm",
    )
    # ids only in the message and its event
    assert "Go." not in raw and "Go." not in event.decode()


def test_an_enqueue_is_checked_before_anything_is_built() -> None:
    with pytest.raises(ToolsetError, match="not registered"):
        preparer()({**SPEC, "toolset": "other"}, None)
    with pytest.raises(LimitError):
        preparer()(
            {**SPEC, "messages": [{"role": "user", "content": "x" * 1_000_001}]}, None
        )
    with pytest.raises(ValueError, match="1 to 256"):
        preparer()(SPEC, "")
    with pytest.raises(ValueError, match="one key"):
        enqueue.prepare_all(preparer(), [SPEC], ["a", "b"])


def test_an_event_id_is_a_stream_id_or_refused() -> None:
    assert ops.stream_id("1700000000000-3") == "1700000000000-3"
    assert ops.stream_id("1700000000000") == "1700000000000-0"
    for bad in ("abc", "1-2-3", "-1", "1-x", "", "9" * 60):
        with pytest.raises(ops.EventIdError, match="is not an event id"):
            ops.stream_id(bad)


def test_answers_and_decisions_are_refused_one_byte_over_their_limits() -> None:
    from toolloop.loop.types import Decision
    from workers.client.limits import IDENT_BYTES, check_answer, check_decision

    settings = Settings.from_env()
    # UTF-8 bytes, at the limit
    check_answer("é" * (settings.max_answer_bytes // 2), settings)
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_ANSWER_BYTES"):
        check_answer("a" * (settings.max_answer_bytes + 1), settings)
    check_decision(
        "c" * IDENT_BYTES,
        Decision(action="reject", reason="r" * settings.max_reason_bytes),
        settings,
    )
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_REASON_BYTES"):
        check_decision(
            "c",
            Decision(action="reject", reason="r" * (settings.max_reason_bytes + 1)),
            settings,
        )
    edit = {"a": "x" * (settings.max_edit_bytes - 8)}  # {"a":"..."} is 8 bytes more
    check_decision("c", Decision(action="edit", input=edit), settings)
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_EDIT_BYTES"):
        check_decision(
            "c", Decision(action="edit", input={"a": edit["a"] + "x"}), settings
        )
    with pytest.raises(LimitError, match="call id is 257 bytes"):
        check_decision("c" * (IDENT_BYTES + 1), Decision(action="approve"), settings)


def test_a_senders_ids_are_unique_and_a_forked_child_draws_its_own() -> None:
    sender = ops.Sender(0)
    ids = [sender.ids.new() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    other = ops.Sender(0).ids.new()
    assert other[:16] != ids[0][:16]  # another sender: another random prefix
    message = sender.commands("toolloop.advance", ["r", 1], "r:1", "llm")[0][2]
    tag = json.loads(message)["properties"]["delivery_tag"]
    # the message's delivery tag comes from it too
    assert len(tag) == 32 and tag not in ids
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child's next ids must not repeat the parent's
        os.write(write, sender.ids.new().encode())
        os._exit(0)
    os.waitpid(child, 0)
    from_child = os.read(read, 64).decode()
    assert from_child[:16] != ids[0][:16]
    assert from_child not in ids and from_child != sender.ids.new()
