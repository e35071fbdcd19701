"""The configuration of toolloop's Celery apps (CELERY-REDIS.md section 8, reasons inline), and how a
task is sent by name. Builds nothing at import: `workers.app` is the worker's app, and `Client`
makes its own the first time it sends.
"""

from __future__ import annotations

import ssl as ssl_lib
import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import click
from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from toolloop import redisurl
from workers.config.settings import Settings
from workers.protocol import names
from workers.protocol.names import ADVANCE, ANSWER, CANCEL, DECIDE, QUEUES, SWEEP


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    transport = {
        "visibility_timeout": settings.visibility_timeout,  # > 2 x the longest step; same everywhere
        "unacked_restore_interval": settings.restore_interval,  # kombu 5.7: sweep every few s ...
        "unacked_restore_throttle": 1,  # ... not every 100 s (default 10 x 10)
        "health_check_interval": 25,
    }
    broker_url, sentinel_options = redisurl.broker(settings.redis_url)
    # Sentinel: kombu's master_name and sentinel_kwargs
    transport.update(sentinel_options)
    app = Celery("toolloop", broker=broker_url, include=["workers.tasks"])
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
        task_default_queue=names.LLM,
        task_queues=[Queue(name) for name in QUEUES],  # type: ignore[no-untyped-call]
        task_routes={
            ADVANCE: {"queue": names.LLM},
            ANSWER: {"queue": names.CONTROL},
            CANCEL: {"queue": names.CONTROL},
            SWEEP: {"queue": names.CONTROL},
            DECIDE: {"queue": names.CONTROL},
        },
        task_create_missing_queues=True,  # a tool may name its own queue (ToolSpec.queue)
        worker_hijack_root_logger=False,
        toolloop_redis_url=settings.redis_url,  # the URL as given (a Sentinel URL is not kombu's form)
    )
    ssl = ssl_options(settings.redis_url)
    if (
        ssl
    ):  # for Flower and anything else that rebuilds the broker URL without its query
        app.conf.broker_use_ssl = ssl
    return app


def ssl_options(url: str) -> dict[str, Any]:
    """The TLS options of a `rediss://` URL's query (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`,
    `ssl_cert_reqs`), as Celery's `broker_use_ssl` takes them; {} for a plain URL."""
    target = redisurl.parse(url)
    if target.is_sentinel:
        options: dict[str, Any] = redisurl.broker_ssl(url)
        if not options and not target.tls:
            return {}
    else:
        parts = urlsplit(target.url)
        if parts.scheme != "rediss":
            return {}
        options = {k: v for k, v in parse_qsl(parts.query) if k.startswith("ssl_")}
    reqs = {
        "none": ssl_lib.CERT_NONE,
        "optional": ssl_lib.CERT_OPTIONAL,
        "required": ssl_lib.CERT_REQUIRED,
    }
    options["ssl_cert_reqs"] = reqs.get(
        str(options.get("ssl_cert_reqs", "required")).lower(), ssl_lib.CERT_REQUIRED
    )
    options.pop("ssl_check_hostname", None)
    return options


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
    celery.send_task(
        name,
        args=args,
        queue=queue,
        task_id=task_id,
        producer=producer,
        kwargsrepr=kwargsrepr,
        # as workers/protocol/wire.py's messages: the queue's age (workers/observe/queueage.py)
        headers={names.SENT_AT: time.time()},
    )


def worker_options(app: Celery) -> None:
    """Give `app`'s worker command the --step-queues and --steps-in-flight options."""
    app.user_options["worker"].add(
        click.Option(
            ["--step-queues"],
            default=None,
            help="Queues whose toolloop steps this worker runs as coroutines on its asyncio loop (env "
            "TOOLLOOP_STEP_QUEUES; default: llm,tools,control when -Q has them; none: every queue through "
            "Celery's pool).",
        )
    )
    app.user_options["worker"].add(
        click.Option(
            ["--steps-in-flight"],
            type=int,
            default=None,
            help="Most steps the step consumer runs at once (env TOOLLOOP_STEPS_IN_FLIGHT, default 500).",
        )
    )
