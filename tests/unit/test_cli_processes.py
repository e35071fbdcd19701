"""What `toolloop worker` starts: the threads pool on every queue workers.app defines, with the
environment that points it at Redis (and at the simulator), and a simulator policy found by path."""

from __future__ import annotations

import os

import pytest

from toolloop.cli.errors import CliError
from toolloop.cli.processes import QUEUES, load_policy, worker_argv, worker_env
from workers.protocol.names import QUEUES as APP_QUEUES


def test_the_worker_consumes_every_queue_with_a_threads_pool() -> None:
    assert QUEUES.split(",") == list(APP_QUEUES)
    argv = worker_argv(concurrency=8)
    assert argv[1:6] == ["-m", "celery", "-A", "workers.app", "worker"]
    assert argv[argv.index("-P") + 1] == "threads" and argv[argv.index("-c") + 1] == "8"
    # events on: Flower sees steps
    assert argv[argv.index("-Q") + 1] == QUEUES and "-E" in argv


def test_worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/extra")
    env = worker_env(
        "redis://127.0.0.1:7/0", {"ANTHROPIC_BASE_URL": "http://sim"}, ["/src"]
    )
    assert (
        env["REDIS_URL"] == "redis://127.0.0.1:7/0"
        and env["ANTHROPIC_BASE_URL"] == "http://sim"
    )
    assert env["PYTHONPATH"].split(os.pathsep) == ["/src", os.getcwd(), "/opt/extra"]


def test_load_policy() -> None:
    policy = load_policy("examples.storyboard.policy:review_policy")
    assert policy.__name__ == "review_policy"
    with pytest.raises(
        CliError, match=r"Cannot import the policy module 'examples\.nope'"
    ):
        load_policy("examples.nope:policy")
    with pytest.raises(CliError, match="is not a callable"):
        load_policy("examples.storyboard.policy:SHOT_LINE")
