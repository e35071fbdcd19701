"""The worker's start-up check of its Redis (workers/worker/bootsteps.py `check_redis`): a server older
than the
commands the workers send is named in a warning, before the sweeper fails on it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from workers.worker.bootsteps import check_redis, too_old

SAFE = {"appendonly": "yes", "maxmemory-policy": "noeviction", "maxmemory": "1000000"}


class _Server:
    """What `check_redis` reads of a server: INFO server and CONFIG GET (a safe configuration)."""

    def __init__(self, version: str) -> None:
        self.version = version

    def info(self, section: str) -> dict[str, Any]:
        return {"redis_version": self.version}

    def config_get(self, name: str) -> dict[str, str]:
        return {name: SAFE[name]}


@pytest.mark.parametrize(
    ("version", "old"),
    [
        ("6.0.16", True),
        ("5.0.7", True),
        ("6.2.0", False),
        ("7.2.4", False),
        ("10.0.1", False),
        ("", False),
    ],
)
def test_versions_older_than_6_2_are_too_old(version: str, old: bool) -> None:
    assert too_old(version) is old


def test_a_redis_older_than_6_2_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="toolloop.workers"):
        check_redis(_Server("6.0.16"))  # type: ignore[arg-type]
    (record,) = caplog.records
    assert "Redis 6.0.16 is older than 6.2" in record.getMessage()


def test_a_current_redis_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="toolloop.workers"):
        check_redis(_Server("7.0.15"))  # type: ignore[arg-type]
    assert caplog.records == []
