"""A run stopped by its shared account's limit says so (docs/flow-control.md), with a real worker, the
provider simulator over HTTP and a real Redis: the `budget` event, the `finished` event, the status,
`toolloop events` / `toolloop status` and the run viewer name the account, its period and its limit,
not only the run's own budget; and moving an account's limit from `day` to `total` keeps its spend."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from examples.web import create_app
from tests.integration.conftest import Worker, redis_in, sim_env
from tests.integration.runs_kit import eventually, spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimServer
from toolloop.sim.script import SimRequest, SimToolCall, SimTurn
from workers.client import AsyncClient, Client

pytestmark = pytest.mark.integration


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


def policy(request: SimRequest) -> SimTurn:
    call = SimToolCall(name="add", input={"a": 1, "b": 2})
    # ~$0.02 a call
    return SimTurn(text="More.", tool_calls=[call], usage={"output_tokens": 4000})


def test_an_account_stop_names_the_account_its_period_and_limit_everywhere(
    own_redis: EmbeddedServer, tmp_path: Path
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TOOLLOOP_") and k != "REDIS_URL"
    }
    env |= {"REDIS_URL": own_redis.url, "TOOLLOOP_HOME": str(tmp_path / "state")}

    def toolloop(*args: str) -> subprocess.CompletedProcess[str]:
        tool = str(Path(sys.executable).parent / "toolloop")
        return subprocess.run(
            [tool, *args], env=env, capture_output=True, text=True, timeout=60
        )

    with SimServer(policy) as sim:
        worker = Worker(
            own_redis.url, tmp_path / "worker.log", sim_env(sim), concurrency=4
        ).wait_ready()
        client = Client(own_redis.url)
        try:
            client.set_account_limit("studio-a", 0.05, period="day", finish_at=1.0)
            run_id = client.enqueue(
                spec(
                    "You add.",
                    model="claude-haiku-4-5",
                    provider="anthropic",
                    max_steps=50,
                    budget_usd=1.0,
                    account="studio-a",
                )
            )
            status = eventually(
                lambda: (s := client.status(run_id)).finished and s, timeout=60
            )
            events = list(client.events(run_id))
            (row,) = client.accounts()
        finally:
            worker.stop()
            client.close()
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    assert status.status == "budget", status
    (stop,) = [e for e in events if e.kind == "budget"]
    account = stop.data["account"]
    assert (
        account["name"],
        account["period"],
        account["period_id"],
        account["limit_usd"],
    ) == (
        "studio-a",
        "day",
        today,
        0.05,
    )
    # the run's own budget and spend, beside the account's
    assert stop.data["limit_usd"] == 1.0
    assert (
        stop.data["spent_usd"] == pytest.approx(status.spent_usd)
        and status.spent_usd < account["spent_usd"] + 1e-9
    )
    assert events[-1].kind == "finished" and events[-1].data["account"] == account
    assert status.account_stop == account

    said = f"account studio-a reached its limit of $0.05 per day ({today}: $"
    shown = toolloop("events", run_id)
    assert f"budget   budget stop: {said}" in shown.stdout, shown.stdout
    assert f"run      finished: budget ({said}" in shown.stdout
    assert f"account_stop  {said}" in toolloop("status", run_id).stdout

    app = create_app(AsyncClient(own_redis.url), token="t0ken")
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as http:
        page = http.get(f"/runs/{run_id}", headers={"Accept": "text/html"}).text
    assert f'<span id="account-stop">{said}' in page

    # the limit moved to another period: what the account spent stays what it spent
    spent = row.spent_usd
    assert spent > 0
    moved = toolloop("accounts", "--set", "studio-a", "5", "--period", "total")
    assert moved.returncode == 0, moved.stderr
    line = next(x for x in moved.stdout.splitlines() if x.startswith("studio-a"))
    assert line.split()[1:3] == ["total", f"{spent:.4f}"], moved.stdout
