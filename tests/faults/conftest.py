"""Fixtures of the reliability suite: private Redis servers, the simulator, supervised workers.

Nothing here touches the shared Redis on 127.0.0.1:6379: every server is started by
`toolloop.embedded.start_server` on a free port in a temporary directory and stopped by its handle;
every worker is a `celery -A workers.app worker -P threads` subprocess in its own session, stopped by
its PID (faults.workerpool). `TOOLLOOP_FAULTS=full` selects the full crash matrix (make faults-full).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import own_redis
from tests.integration.runs_kit import redis_on
from toolloop.embedded import EmbeddedServer

FULL = os.environ.get("TOOLLOOP_FAULTS") == "full"


@pytest.fixture(scope="session")
def faults_full() -> bool:
    return FULL


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "redis")


@pytest.fixture(scope="module")
def redis_client(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from redis_on(redis_server)


@pytest.fixture
def run_prefix() -> str:
    """A fresh id prefix, so tests sharing a module-scoped server never see each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")
