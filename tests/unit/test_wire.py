"""workers/protocol/wire.py: a task message the step consumer writes reads back as the same delivery, and
the unacked value it records is what kombu's restore parses ([message, exchange, routing key])."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.protocol import names, wire


def test_a_task_message_parses_back_to_the_delivery_it_was_made_as() -> None:
    made = wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "tools")
    assert wire.parse(made.raw) == made
    assert (made.name, made.task_id, made.args) == (
        "toolloop.advance",
        "run1:3",
        ["run1", 3],
    )
    assert (
        wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "tools").tag
        != made.tag
    )


def test_the_unacked_value_is_kombus_triple() -> None:
    made = wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "llm")
    message, exchange, routing_key = json.loads(wire.unacked_value(made.raw, "llm"))
    assert (message, exchange, routing_key) == (json.loads(made.raw), "", "llm")
    assert message["properties"]["delivery_info"] == {
        "exchange": "",
        "routing_key": "llm",
    }


def _received(channel: str, payload: bytes) -> list[dict[str, object]]:
    """What Celery's own EventReceiver (Flower's) hands its handlers for one PUBLISH of ours."""
    import base64

    from celery import Celery
    from celery.events import EventReceiver

    seen: list[dict[str, object]] = []
    app = Celery(broker="memory://")
    receiver = EventReceiver(
        app.connection_for_read(), handlers={"*": seen.append}, app=app
    )
    message = json.loads(payload)
    receiver._receive(json.loads(base64.b64decode(message["body"])), None)
    assert channel.startswith("/0.celeryev/")
    assert (
        channel.removeprefix("/0.celeryev/")
        == message["properties"]["delivery_info"]["routing_key"]
    )
    return seen


def test_a_lone_event_goes_out_as_itself_on_its_routing_key() -> None:
    events = wire.Events("worker@host", 0)
    assert events.add("task-started", {"uuid": "run1:1"}) is True
    ((channel, payload),) = events.drain()
    assert channel == "/0.celeryev/task.started"
    (event,) = _received(channel, payload)
    assert (event["type"], event["uuid"], event["hostname"]) == (
        "task-started",
        "run1:1",
        "worker@host",
    )
    assert events.drain() == []


def test_a_turns_events_go_out_as_task_multi_messages_that_celery_reads_as_each_event() -> (
    None
):
    events = wire.Events("worker@host", 0)
    count = wire.Events.MAX_PER_MESSAGE + 5
    firsts = [events.add("task-received", {"uuid": f"run{i}:1"}) for i in range(count)]
    assert firsts[0] is True and not any(firsts[1:])
    sent = events.drain()
    assert [channel for channel, _ in sent] == [
        "/0.celeryev/task.multi",
        "/0.celeryev/task.multi",
    ]
    seen = [event for channel, payload in sent for event in _received(channel, payload)]
    assert [event["uuid"] for event in seen] == [f"run{i}:1" for i in range(count)]
    assert [event["clock"] for event in seen] == sorted(
        {event["clock"] for event in seen}
    )


def test_celerys_own_task_message_passes_the_poison_check() -> None:
    """What `Client` sends through Celery (kombu's producer) is a valid task, on every toolloop task."""
    import base64

    from kombu import Connection

    from workers.config.celery import make_app
    from workers.protocol.names import ADVANCE, ANSWER, CANCEL, SWEEP

    app = make_app()
    sent: list[str] = []
    with Connection("memory://") as connection:
        for name, args in (
            (ADVANCE, ["r1", 1]),
            (ANSWER, ["r1", "a1"]),
            (CANCEL, ["r1"]),
            (SWEEP, []),
        ):
            app.send_task(name, args=args, queue="control", connection=connection)
        queue = connection.SimpleQueue("control")
        for _ in range(4):
            message = queue.get(timeout=1)
            sent.append(
                json.dumps(
                    {
                        "body": base64.b64encode(message.body).decode(),
                        "content-type": message.content_type,
                        "content-encoding": message.content_encoding,
                        "headers": message.headers,
                        "properties": {
                            **message.properties,
                            "body_encoding": "base64",
                            "delivery_tag": "t-1",
                        },
                    }
                )
            )
            message.ack()
        queue.close()
    assert [wire.problem(raw, 262_144) for raw in sent] == [None] * 4


def test_the_poison_check_names_what_is_wrong() -> None:
    good = json.loads(
        wire.task_message("toolloop.cancel", ["r1"], "r1:cancel", "control").raw
    )

    def shaped(**change: object) -> str:
        return json.dumps({**good, **change})

    cases = {
        "not JSON": "x",
        "a JSON list, not an object": "[1]",
        "no properties or headers object": shaped(headers=None),
        "delivery_tag 5 is not a string": shaped(
            properties={**good["properties"], "delivery_tag": 5}
        ),
        "body is not base64": shaped(body="!!"),
        "body is not JSON": shaped(body="bm90IGpzb24="),
        "unknown task 'os.system'": shaped(
            headers={**good["headers"], "task": "os.system"}
        ),
        "toolloop.cancel arguments are not str": shaped(
            body="W1sxXSwge30sIHt9XQ=="
        ),  # [[1], {}, {}]
        "over TOOLLOOP_MAX_TASK_BYTES": shaped(pad="x" * 300_000),
    }
    for says, raw in cases.items():
        problem = wire.problem(raw, 262_144)
        assert problem is not None and says in problem, (says, problem)
    assert wire.problem(shaped(), 262_144) is None


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
GOOD = json.loads(wire.task_message("toolloop.advance", ["r1", 1], "r1:1", "llm").raw)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(max_size=200),
    where=st.sampled_from(
        ["headers", "properties", "body", "content-type", "content-encoding", None]
    ),
    value=JSON,
)
def test_the_poison_check_never_raises(
    text: str, where: str | None, value: object
) -> None:
    """Whatever a message holds, the check answers (a reason or None) and never raises."""
    assert isinstance(wire.problem(text, 262_144), str | None)
    message = dict(GOOD)
    if where in ("headers", "properties") and isinstance(value, dict):
        message[where] = {**GOOD[where], **value}
    elif where is not None:
        message[where] = value
    raw = json.dumps(message)
    problem = wire.problem(raw, 262_144)
    if problem is None:  # accepted: then it parses into a task of the right shape
        delivery = wire.parse(raw)
        assert wire.task_problem(delivery) is None


def test_a_runs_traceparent_rides_in_the_message_headers_and_parses_back() -> None:
    """workers/observe/tracing.py: successors carry the run's W3C trace context; the fast parse of a
    `traceparent` gives the same span context as the propagator's, and a malformed one a new trace."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    from workers.observe.tracing import parent_context

    value = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = wire.task_message(
        "toolloop.advance", ["r", 2], "r:2", "llm", traceparent=value
    )
    assert json.loads(message.raw)["headers"]["traceparent"] == value
    assert wire.parse(message.raw).args == ["r", 2]
    assert (
        "traceparent"
        not in json.loads(wire.task_message("t", [], "i", "llm").raw)["headers"]
    )
    ours = trace.get_current_span(parent_context(value)).get_span_context()
    theirs = trace.get_current_span(
        TraceContextTextMapPropagator().extract({"traceparent": value})
    )
    assert ours == theirs.get_span_context()
    for bad in (
        "",
        "00-zz-b7ad6b7169203331-01",
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
    ):
        assert (
            not trace.get_current_span(parent_context(bad)).get_span_context().is_valid
        )


# -- our copy against the originals: Celery's as_task_v2, kombu's envelope and Redis layout ---------


def _celerys_message(
    name: str, args: list[object], task_id: str, queue: str, kwargsrepr: str
) -> dict:
    """The message Celery's own encoder (`app.amqp.as_task_v2`) makes for the task, as kombu's virtual
    transport puts it on the queue (`basic_publish`: the envelope kombu's Redis transport LPUSHes)."""
    from celery import Celery

    app = Celery("wire-test", broker="memory://", set_as_current=False)
    made = app.amqp.as_task_v2(
        task_id,
        name,
        args=args,
        kwargs={},
        root_id=task_id,
        ignore_result=True,
        argsrepr=repr(args),
        kwargsrepr=kwargsrepr,
        origin=wire._ORIGIN,
    )
    with app.connection_for_write() as connection:
        connection.Producer().publish(
            made.body,
            exchange="",
            routing_key=queue,
            serializer="json",
            headers=made.headers,
            delivery_mode=2,
            **made.properties,
        )
        message: dict = connection.default_channel._get(queue)
    return message


def _decoded_body(message: dict) -> object:
    import base64

    assert message["properties"]["body_encoding"] == "base64"
    return json.loads(base64.b64decode(message["body"]))


def test_a_task_message_is_celerys_own_encoding_of_the_same_task() -> None:
    ours = json.loads(
        wire.task_message(
            "toolloop.advance", ["run1", 3], "run1:3", "tools", "model 3"
        ).raw
    )
    theirs = _celerys_message(
        "toolloop.advance", ["run1", 3], "run1:3", "tools", "{'step': 'model 3'}"
    )
    # ours only: the time it was sent (workers/observe/queueage.py)
    sent = ours["headers"].pop("sent_at")
    assert abs(sent - time.time()) < 60
    assert ours["headers"] == theirs["headers"]
    # [args, kwargs, embed]; only the spacing differs
    assert _decoded_body(ours) == _decoded_body(theirs)
    tags = (
        ours["properties"].pop("delivery_tag"),
        theirs["properties"].pop("delivery_tag"),
    )
    assert all(isinstance(tag, str) and tag for tag in tags)
    assert ours["properties"] == theirs["properties"]
    assert {k: v for k, v in ours.items() if k != "body"} == {
        k: v for k, v in theirs.items() if k != "body"
    }


def test_the_queue_keys_are_kombus_in_kombus_consume_order() -> None:
    from kombu.transport.redis import Channel

    channel = Channel.__new__(Channel)  # no connection: the class's own layout
    queues = ["llm", "tools"]
    # _brpop_start
    kombus = [
        channel._q_for_pri(queue, pri)
        for pri in channel.priority_steps
        for queue in queues
    ]
    assert wire.queue_keys(queues) == kombus
    assert (Channel.unacked_key, Channel.unacked_index_key) == (
        names.UNACKED,
        names.UNACKED_INDEX,
    )


def test_events_go_to_the_channel_kombu_publishes_celeryev_on() -> None:
    from kombu.transport.redis import Channel

    channel = Channel.__new__(Channel)
    # as kombu sets it on connect
    channel.keyprefix_fanout = Channel.keyprefix_fanout.format(db=3)
    events = wire.Events("worker@host", 3)
    events.add("task-started", {"uuid": "run1:1"})
    ((sent_on, _),) = events.drain()
    assert sent_on == channel._get_publish_topic("celeryev", "task.started")


def test_the_unacked_value_is_what_kombus_restore_reads() -> None:
    from kombu.utils.json import loads

    made = wire.task_message("toolloop.advance", ["run1", 3], "run1:3", "llm")
    # kombu's QoS.restore_by_tag
    payload, exchange, routing_key = loads(wire.unacked_value(made.raw, "llm"))
    assert (payload, exchange, routing_key) == (json.loads(made.raw), "", "llm")
