"""Runs name registered toolsets, never code. Hostile names (`os:getpid`, `os:abort`, a module with an
import side effect) are refused by `Client.enqueue`, by `toolloop run` and by examples/web.py's
`POST /runs`, with the registered names in the error; nothing is imported (the side-effect file is
never written) and the worker and web processes stay up. A run that reaches the worker anyway
(written to Redis past the client) fails with the same error; a registered toolset whose import
raises `SystemExit`, or whose factory raises `KeyboardInterrupt`, fails its run, not the worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Worker, own_redis, worker_on
from tests.integration.runs_kit import spec
from tests.support.procs import end
from tests.support.web import AUTH, BIN, ROOT, WEB_TOKEN, start_web
from toolloop.embedded import EmbeddedServer, free_port
from workers.client import Client
from workers.protocol.errors import ToolsetError
from workers.protocol.spec import RunSpec
from workers.runs import lifecycle as runs

pytestmark = pytest.mark.integration

AGENT = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
HOSTILE = ["os:getpid", "os:abort", "hostile_side_effect:TOOLS", "sys:exit"]
REGISTRY = f"{os.environ['TOOLLOOP_TOOLSETS']},exits=hostile_exits:TOOLS,interrupts=hostile_interrupts:make"


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of hostile modules: one writes a file when imported, one raises SystemExit at
    import, one has a factory that raises KeyboardInterrupt."""
    directory = tmp_path_factory.mktemp("hostile")
    marker = directory / "imported.txt"
    (directory / "hostile_side_effect.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nTOOLS = []\n"
    )
    (directory / "hostile_exits.py").write_text("raise SystemExit(3)\n")
    (directory / "hostile_interrupts.py").write_text(
        "def make():\n    raise KeyboardInterrupt\n"
    )
    return directory


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "hostile-redis")


@pytest.fixture(scope="module")
def worker(
    server: EmbeddedServer, modules: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    env = {**AGENT, "TOOLLOOP_TOOLSETS": REGISTRY, "PYTHONPATH": str(modules)}
    yield from worker_on(server.url, tmp_path_factory.mktemp("hostile-worker"), env)


def _env(server: EmbeddedServer, modules: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "FAL_KEY")
    }
    env.update(REDIS_URL=server.url, PYTHONPATH=f"{ROOT}{os.pathsep}{modules}")
    return env


def _nothing_imported(modules: Path) -> None:
    assert not (modules / "imported.txt").exists(), "a hostile module was imported"
    assert "hostile_side_effect" not in sys.modules


def _good_run_finishes(client: Client) -> None:
    run_id = client.enqueue(spec("tools", "Add 2 and 3.", toolset="agents"))
    assert client.wait(run_id, timeout=60).status == "done"


def test_the_client_refuses_unregistered_toolsets_and_imports_nothing(
    server: EmbeddedServer, worker: Worker, modules: Path
) -> None:
    sys.path.insert(0, str(modules))  # were it imported, it could be
    client = Client(server.url)
    try:
        before = client.redis.dbsize()
        for name in HOSTILE:
            with pytest.raises(ToolsetError) as caught:
                client.enqueue(spec("tools", toolset=name))
            first, second = str(caught.value).splitlines()
            assert (
                f"{name!r} is not registered" in first
                and "'agents', 'faults', 'review'" in first
            )
            assert second.startswith("  ")
        assert client.redis.dbsize() == before
        _nothing_imported(modules)
        assert worker.process.poll() is None
        _good_run_finishes(client)
    finally:
        sys.path.remove(str(modules))
        client.close()


def test_the_cli_refuses_unregistered_toolsets_and_imports_nothing(
    server: EmbeddedServer, worker: Worker, modules: Path
) -> None:
    env = _env(server, modules)
    for name in HOSTILE:
        done = subprocess.run(
            [str(BIN / "toolloop"), "run", "Hi", "--model", "m", "--toolset", name],
            cwd=modules,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"The toolset {name!r} is not registered" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 2
    _nothing_imported(modules)
    assert worker.process.poll() is None


def test_the_web_example_refuses_unregistered_toolsets_and_stays_up(
    server: EmbeddedServer, worker: Worker, modules: Path, tmp_path: Path
) -> None:
    env = {
        **_env(server, modules),
        "PORT": str(free_port()),
        "TOOLLOOP_WEB_TOKEN": WEB_TOKEN,
    }
    web = start_web(env, tmp_path / "web.log")
    base = f"http://127.0.0.1:{env['PORT']}"
    try:
        with httpx.Client(base_url=base, timeout=30, headers=AUTH) as http:
            for name in HOSTILE:
                refused = http.post("/runs", json=spec("tools", toolset=name))
                assert refused.status_code == 422, refused.text
                assert f"{name!r} is not registered" in refused.json()["error"]
            many = {
                **spec("tools", toolset="agents"),
                "messages": [{"role": "user", "content": "hi"}] * 1001,
            }
            too_many = http.post("/runs", json=many)
            assert (
                too_many.status_code == 413
                and "TOOLLOOP_MAX_MESSAGES" in too_many.json()["error"]
            )
            huge = http.post("/runs", content=b"{" + b" " * 1_000_001 + b"}")
            assert (
                huge.status_code == 413
                and "TOOLLOOP_MAX_SPEC_BYTES" in huge.json()["error"]
            )
            keyed = [
                http.post(
                    "/runs",
                    json=spec("tools", toolset="agents"),
                    headers={"Idempotency-Key": "web-1"},
                )
                for _ in range(2)
            ]
            assert [r.status_code for r in keyed] == [201, 201]
            assert keyed[0].json()["run_id"] == keyed[1].json()["run_id"]
            assert web.poll() is None, "the web process died"
            created = http.post(
                "/runs", json=spec("tools", "Add 2 and 3.", toolset="agents")
            )
            assert created.status_code == 201
            run_id = created.json()["run_id"]
            deadline = time.monotonic() + 60
            while http.get(f"/runs/{run_id}").json()["status"] != "done":
                assert time.monotonic() < deadline
                time.sleep(0.1)
        _nothing_imported(modules)
        assert worker.process.poll() is None
    finally:
        end(web)


def test_the_worker_refuses_what_got_past_the_client_and_survives_raising_toolsets(
    server: EmbeddedServer, worker: Worker, modules: Path
) -> None:
    client = Client(server.url, toolsets=["agents", "exits", "interrupts"])
    try:
        for (
            name
        ) in HOSTILE:  # written to Redis directly, as an old or hostile client could
            run_id = runs.create(
                client.redis,
                client.celery,
                RunSpec.model_validate(spec("tools", toolset=name)),
            )
            status = client.wait(run_id, timeout=30)
            assert status.status == "failed" and status.error_class == "ToolsetError", (
                status
            )
            assert f"{name!r} is not registered" in (status.error_message or "")
        for name, raised in (
            ("exits", "SystemExit"),
            ("interrupts", "KeyboardInterrupt"),
        ):
            status = client.wait(
                client.enqueue(spec("tools", toolset=name)), timeout=30
            )
            assert status.status == "failed" and status.error_class == "ToolsetError", (
                status
            )
            assert raised in (status.error_message or ""), status
        _nothing_imported(modules)
        assert worker.process.poll() is None, "the worker exited"
        _good_run_finishes(client)
    finally:
        client.close()
