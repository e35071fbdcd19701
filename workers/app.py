"""The Celery app of toolloop and its configuration (CELERY-REDIS.md section 8, reasons inline).

Start a worker with `celery -A workers.app worker -P threads -c 8 -Q llm,tools,control -E`.
Its step consumer (workers/consumer.py, installed at the bottom of this module) runs the llm and
tools steps as coroutines on one long-lived asyncio loop per process (workers/runtime.py), so one
process keeps many slow model calls in flight, and the control queue's tasks in threads; the
threads pool runs what the step consumer does not take (every step with `--step-queues none`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from workers.settings import Settings

ADVANCE = "toolloop.advance"
ANSWER = "toolloop.answer"
CANCEL = "toolloop.cancel"
SWEEP = "toolloop.sweep"
DECIDE = "toolloop.decide"
QUEUES = ("llm", "tools", "control")


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    transport = {
        "visibility_timeout": settings.visibility_timeout,  # > 2 x the longest step; same everywhere
        "unacked_restore_interval": settings.restore_interval,  # kombu 5.7: sweep every few s ...
        "unacked_restore_throttle": 1,  # ... not every 100 s (default 10 x 10)
        "health_check_interval": 25,
    }
    app = Celery("toolloop", broker=settings.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_acks_late=True,  # ack after the commit: a crash mid-step redelivers it
        task_reject_on_worker_lost=True,  # a killed pool requeues (attempts are counted per step)
        worker_prefetch_multiplier=1,  # no step waits in a buffer while its visibility clock runs
        task_serializer="json",
        accept_content=["json"],  # no pickle on a shared broker
        result_serializer="json",
        task_ignore_result=True,  # the journal is the result store
        worker_send_task_events=True,  # Flower shows every step ...
        task_send_sent_event=True,  # ... from the moment it is queued
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # survive Redis restarts
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        worker_cancel_long_running_tasks_on_connection_loss=True,  # no two live copies after a blip
        worker_soft_shutdown_timeout=settings.shutdown_grace,
        worker_enable_soft_shutdown_on_idle=True,
        task_default_queue="llm",
        task_queues=[Queue(name) for name in QUEUES],  # type: ignore[no-untyped-call]
        task_routes={
            ADVANCE: {"queue": "llm"},
            ANSWER: {"queue": "control"},
            CANCEL: {"queue": "control"},
            SWEEP: {"queue": "control"},
            DECIDE: {"queue": "control"},
        },
        task_create_missing_queues=True,  # a tool may name its own queue (ToolSpec.queue)
        worker_hijack_root_logger=False,
    )
    ssl = ssl_options(settings.redis_url)
    if ssl:  # for Flower and anything else that rebuilds the broker URL without its query
        app.conf.broker_use_ssl = ssl
    return app


def ssl_options(url: str) -> dict[str, Any]:
    """The TLS options of a `rediss://` URL's query (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`,
    `ssl_cert_reqs`), as Celery's `broker_use_ssl` takes them; {} for a plain URL."""
    import ssl as ssl_lib
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return {}
    options: dict[str, Any] = {k: v for k, v in parse_qsl(parts.query) if k.startswith("ssl_")}
    reqs = {"none": ssl_lib.CERT_NONE, "optional": ssl_lib.CERT_OPTIONAL, "required": ssl_lib.CERT_REQUIRED}
    options["ssl_cert_reqs"] = reqs.get(
        str(options.get("ssl_cert_reqs", "required")).lower(), ssl_lib.CERT_REQUIRED
    )
    options.pop("ssl_check_hostname", None)
    return options


app = make_app()


def send(
    celery: Celery,
    name: str,
    args: list[Any],
    *,
    queue: str,
    task_id: str | None = None,
    producer: Any = None,
    label: str = "",
) -> None:
    """Send a task by name (ids only in `args`), to `queue`, with a readable id when given; through
    `producer` when given (a step sends its successor and its progress event in one batch). `label`
    says what the step is (`model 1`): its kwargsrepr, shown by Flower and `celery inspect`."""
    kwargsrepr = repr({"step": label[:200]}) if label else None
    celery.send_task(name, args=args, queue=queue, task_id=task_id, producer=producer, kwargsrepr=kwargsrepr)


# Worker-process resources (event loop thread, cancel listener, sweeper) start with the worker.
from workers import consumer, guard, runtime  # noqa: E402

runtime.connect_signals()
consumer.install(app)
guard.install(app)
