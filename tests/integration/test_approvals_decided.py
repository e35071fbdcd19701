"""What a person sees of a decision, with real workers and a real Redis: a decided call leaves the
pending list at once everywhere (`Client.status`, `toolloop status` and its hint, the web example's
`GET /runs/ID/approvals` and the run viewer's page); a second decision on a call is refused (Client
`AlreadyDecidedError`, CLI exit 1, web 409); a decision sent while no worker runs returns "queued" at
once, and its outcome is readable later (Client, AsyncClient, CLI, web)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from examples.web import create_app
from tests.integration.conftest import redis_in, start_worker
from tests.integration.runs_kit import client_on, eventually, spec
from toolloop import AlreadyDecidedError, ApprovalError
from toolloop.embedded import EmbeddedServer
from workers.client import AsyncClient, Client

pytestmark = pytest.mark.integration

WORKER_ENV = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test only: its worker comes and goes as the test says."""
    yield from redis_in(tmp_path / "redis")


@pytest.fixture
def client(redis_server: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(redis_server)


def cli(url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLOOP_")}
    env |= {"REDIS_URL": url, "TOOLLOOP_HOME": str(home)}
    tool = str(Path(sys.executable).parent / "toolloop")
    return subprocess.run(
        [tool, *args], env=env, capture_output=True, text=True, timeout=60
    )


def two_held(client: Client) -> tuple[str, str, str]:
    run_id = client.enqueue(spec("approve2"))
    status = client.wait(run_id, timeout=30)
    assert (
        status.status == "asked" and status.approvals and len(status.approvals) == 2
    ), status
    first, second = (held["call_id"] for held in status.approvals)
    return run_id, first, second


def test_a_decided_call_leaves_the_pending_list_everywhere_and_a_second_decision_is_refused(
    redis_server: EmbeddedServer, client: Client, tmp_path: Path
) -> None:
    worker = start_worker(redis_server.url, tmp_path, WORKER_ENV)
    try:
        run_id, first, second = two_held(client)
        assert client.reject(run_id, first, "not this one", actor="ana") == "recorded"
        [left] = client.status(run_id).approvals or []
        assert left["call_id"] == second  # at once: no wait, no worker turn

        shown = cli(redis_server.url, tmp_path, "status", run_id)
        assert shown.returncode == 0, shown.stderr
        assert (
            f"approval  {first}" not in shown.stdout
            and f"approval  {second}" in shown.stdout
        )
        assert f"decide with: toolloop approve {run_id} {second} |" in shown.stdout
        calls = cli(redis_server.url, tmp_path, "status", run_id, "--calls")
        assert calls.stdout.split() == [second]

        app = create_app(AsyncClient(redis_server.url), token="t0ken")
        with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as http:
            assert [
                a["call_id"]
                for a in http.get(f"/runs/{run_id}/approvals").json()["approvals"]
            ] == [second]
            page = http.get(f"/runs/{run_id}", headers={"Accept": "text/html"}).text
            assert (
                f'data-call="{first}"' not in page and f'data-call="{second}"' in page
            )
            again = http.post(f"/runs/{run_id}/approvals/{first}/approve", json={})
            assert (
                again.status_code == 409
                and "decided already (reject by ana)" in again.json()["error"]
            )
            state = http.get(f"/runs/{run_id}/approvals/{first}").json()
            assert (state["state"], state["action"], state["actor"]) == (
                "decided",
                "reject",
                "ana",
            )

        with pytest.raises(
            AlreadyDecidedError,
            match=r"decided already \(reject by ana\); the first decision",
        ):
            client.approve(run_id, first)
        repeated = cli(redis_server.url, tmp_path, "approve", run_id, first)
        assert repeated.returncode == 1 and "Refused:" in repeated.stderr, repeated
        assert (
            "decided already (reject by ana)" in repeated.stderr
            and repeated.stdout == ""
        )
        assert client.status(run_id).approvals == [left]  # the refusals changed nothing

        # a refused edit is readable later as the call's state; the call still waits
        with pytest.raises(ApprovalError, match="valid number"):
            client.edit(run_id, second, {"a": "x", "b": 1})
        refused = client.decision(run_id, second)
        assert refused.state == "refused" and "valid number" in (refused.why or "")
        assert client.approve(run_id, second) == "resumed"
        status = client.wait(run_id, timeout=30)
        assert (
            status.status == "done" and status.final_text == "Model read: published 3+4"
        ), status
    finally:
        worker.stop()


def test_a_decision_with_no_worker_is_queued_at_once_and_its_outcome_is_readable_later(
    redis_server: EmbeddedServer, client: Client, tmp_path: Path
) -> None:
    worker = start_worker(redis_server.url, tmp_path, WORKER_ENV)
    run_id, first, second = two_held(client)
    other, other_call, _ = two_held(client)
    worker.stop()  # nothing applies decisions now

    app = create_app(AsyncClient(redis_server.url), token="t0ken")
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as http:
        sent = http.post(
            f"/runs/{other}/approvals/{other_call}/approve", json={"actor": "web"}
        )
        assert sent.status_code == 202 and sent.json()["outcome"] == "queued", sent.text
        again = http.post(
            f"/runs/{other}/approvals/{other_call}/reject", json={"reason": "no"}
        )
        assert (
            again.status_code == 409
            and "queued already (approve by web)" in again.json()["error"]
        )
        assert (
            http.get(f"/runs/{other}/approvals/{other_call}").json()["state"]
            == "queued"
        )

    started = time.monotonic()
    assert client.approve(run_id, first, actor="ana") == "queued"
    # not the 10 s wait for a worker that is not there
    assert time.monotonic() - started < 3
    queued = client.decision(run_id, first)
    assert (queued.state, queued.action, queued.actor) == ("queued", "approve", "ana")
    assert asyncio.run(_async_decision(redis_server.url, run_id, first)) == "queued"
    with pytest.raises(AlreadyDecidedError, match="queued already"):
        client.reject(run_id, first, "changed my mind")

    sent = cli(redis_server.url, tmp_path, "reject", run_id, second, "one is enough")
    assert sent.returncode == 0, sent.stderr
    assert "queued, applied when a worker runs" in sent.stdout
    read = cli(redis_server.url, tmp_path, "decision", run_id, second)
    assert (
        read.returncode == 0
        and "reject (one is enough): queued, applied when a worker runs" in read.stdout
    )
    shown = cli(redis_server.url, tmp_path, "status", run_id)
    assert "decision approve by ana: queued, applied when a worker runs" in shown.stdout
    # every held call has its decision on the way
    assert "decide with" not in shown.stdout

    again = start_worker(redis_server.url, tmp_path, WORKER_ENV)
    try:
        status = client.wait(run_id, timeout=30)
        assert (
            status.status == "done"
            and status.final_text
            == "Model read: Rejected by the person: one is enough."
        )
        decided = eventually(
            lambda: (d := client.decision(run_id, first)).state == "decided" and d
        )
        assert (decided.action, decided.actor) == ("approve", "ana")
        read = cli(redis_server.url, tmp_path, "decision", run_id, second)
        assert (
            read.returncode == 0
            and "decision reject (one is enough): decided" in read.stdout
        ), read
    finally:
        again.stop()


async def _async_decision(url: str, run_id: str, call_id: str) -> Any:
    async with AsyncClient(url) as client:
        return (await client.decision(run_id, call_id)).state
