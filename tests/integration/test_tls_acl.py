"""Redis with TLS and an ACL user on every path: a private redis-server that speaks only TLS (its
certificate signed by a CA made here with openssl) and has no default user, only `toolloop` with a
password. A durable run finishes on both step paths (the step consumer, and every step a Celery
task read by Celery's own consumer); every `toolloop` command works against it; a wrong password or
a missing CA is a two-line error from the CLI, not a hang or a traceback.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis

from tests.integration.conftest import start_worker
from tests.integration.runs_kit import spec
from toolloop.embedded import free_port
from workers.client import AsyncClient, Client

pytestmark = pytest.mark.integration

AGENT = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
PASSWORD = "s3cret-Pass"
TOOLLOOP = str(Path(sys.executable).with_name("toolloop"))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(directory: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=toolloop test CA",
        cwd=directory,
    )
    _openssl(
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=directory,
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        cwd=directory,
    )


@pytest.fixture(scope="module")
def tls_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None or shutil.which("openssl") is None:
        pytest.fail(
            "redis-server or openssl is not installed: apt-get install -y redis-server openssl (.ci/run does)"
        )
    directory = tmp_path_factory.mktemp("tls-redis")
    _certificates(directory)
    (directory / "users.acl").write_text(
        f"user default off\nuser toolloop on >{PASSWORD} ~* &* +@all\n"
    )
    port = free_port()
    log = (directory / "redis.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.pem",
            "--tls-auth-clients",
            "no",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--maxmemory",
            "200mb",
            "--maxmemory-policy",
            "noeviction",
            "--aclfile",
            str(directory / "users.acl"),
        ],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = (
        f"rediss://toolloop:{quote(PASSWORD)}@127.0.0.1:{port}/0"
        f"?ssl_cert_reqs=required&ssl_ca_certs={directory / 'ca.pem'}"
    )
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            log.close()
            out = (directory / "redis.log").read_text(errors="replace")
            lowered = out.lower()
            if "tls" in lowered and any(
                s in lowered
                for s in ("not supported", "not built", "missing implement")
            ):
                pytest.skip(
                    f"this redis-server was built without TLS: {out.strip()[-200:]}"
                )
            raise RuntimeError(f"the TLS redis-server exited: {out[-2000:]}")
        try:
            redis.Redis.from_url(url, socket_timeout=1).ping()
            break
        except (redis.RedisError, OSError):
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=10)
    log.close()


def test_the_server_refuses_plain_text_and_the_default_user(tls_url: str) -> None:
    port = tls_url.split("@127.0.0.1:")[1].split("/")[0]
    with pytest.raises((redis.ConnectionError, OSError)):
        redis.Redis(port=int(port), socket_timeout=2).ping()
    no_user = tls_url.replace(f"toolloop:{PASSWORD}@", "")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(no_user, socket_timeout=2).ping()


@pytest.mark.parametrize("steps", ["step consumer", "Celery pool"])
def test_a_durable_run_finishes_over_tls_with_an_acl_user(
    steps: str, tls_url: str, tmp_path: Path
) -> None:
    env = {
        **AGENT,
        **({"TOOLLOOP_STEP_QUEUES": "none"} if steps == "Celery pool" else {}),
    }
    worker = start_worker(tls_url, tmp_path, env)
    client = Client(tls_url)
    try:
        run_id = client.enqueue(spec("tools", "Add 2 and 3.", toolset="agents"))
        status = client.wait(run_id, timeout=60)
        assert (status.status, status.final_text) == ("done", "The sum is 5."), status
        again = client.enqueue(
            spec("tools", "Add 2 and 3.", toolset="agents"), idempotency_key="tls-1"
        )
        assert (
            client.enqueue(
                spec("tools", "Add 2 and 3.", toolset="agents"), idempotency_key="tls-1"
            )
            == again
        )
        assert client.wait(again, timeout=60).status == "done"

        async def through_the_async_client() -> list[str]:
            async with AsyncClient(tls_url) as aclient:
                [run] = await aclient.enqueue_many(
                    [spec("tools", "Add 2 and 3.", toolset="agents")]
                )
                return [event.kind async for event in aclient.events(run, follow=True)]

        assert asyncio.run(through_the_async_client()) == [
            "queued",
            "model",
            "tool",
            "model",
            "finished",
        ]
        assert worker.process.poll() is None
    finally:
        client.close()
        worker.stop()


def _toolloop(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOLLOOP, *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_every_cli_command_works_over_tls_with_an_acl_user(
    tls_url: str, tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    # doctor imports the toolsets
    env = {
        **os.environ,
        **AGENT,
        "REDIS_URL": tls_url,
        "TOOLLOOP_HOME": str(tmp_path / "state"),
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")]),
    }
    env.pop("ANTHROPIC_API_KEY", None)
    log = (tmp_path / "worker.log").open("wb")
    worker = (
        subprocess.Popen(  # `toolloop worker` itself: its start check speaks TLS too
            [
                TOOLLOOP,
                "worker",
                "-c",
                "2",
                "--toolsets",
                "agents=tests.integration.agents:TOOLS",
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    )
    try:
        queued = _toolloop(
            env,
            "run",
            "Add 2 and 3.",
            "--model",
            "scripted",
            "--system",
            "tools",
            "--toolset",
            "agents",
            "--idempotency-key",
            "cli-1",
        )
        assert queued.returncode == 0, queued.stderr
        run_id = queued.stdout.split()[0]
        repeat = _toolloop(
            env,
            "run",
            "Add 2 and 3.",
            "--model",
            "scripted",
            "--system",
            "tools",
            "--toolset",
            "agents",
            "--idempotency-key",
            "cli-1",
        )
        assert repeat.stdout.split()[0] == run_id
        followed = _toolloop(env, "events", run_id, "--follow")
        assert followed.returncode == 0 and "finished" in followed.stdout, (
            followed.stdout + followed.stderr
        )
        status = _toolloop(env, "status", run_id, "--json")
        assert status.returncode == 0 and '"done"' in status.stdout, status.stderr
        asked = _toolloop(
            env,
            "run",
            "Which shot?",
            "--model",
            "scripted",
            "--system",
            "ask",
            "--toolset",
            "agents",
        )
        assert asked.returncode == 0, asked.stderr
        parked = asked.stdout.split()[0]
        answered = _toolloop(env, "answer", parked, "Shot 3.")
        assert answered.returncode == 0 and "Answered" in answered.stdout, (
            answered.stderr
        )
        waiting = (
            _toolloop(  # a second question, left unanswered: cancel finds it not ended
                env,
                "run",
                "Which shot?",
                "--model",
                "scripted",
                "--system",
                "ask",
                "--toolset",
                "agents",
            ).stdout.split()[0]
        )
        cancelled = _toolloop(env, "cancel", waiting)
        assert cancelled.returncode == 0 and "Cancel requested" in cancelled.stdout, (
            cancelled.stderr
        )
        # a done run: refused, after reaching Redis
        retried = _toolloop(env, "retry", run_id)
        assert (
            retried.returncode == 1
            and "only a failed run can be retried" in retried.stderr
        )
        up = _toolloop(env, "up")
        assert (
            up.returncode == 0
            and '"source": "REDIS_URL"' in up.stdout
            and PASSWORD not in up.stdout
        )
        doctor = _toolloop(env, "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "answers (with the URL's credentials and TLS)" in doctor.stdout
        assert (
            "AOF on" in doctor.stdout and "maxmemory-policy noeviction" in doctor.stdout
        )
        assert "toolset 'agents'" in doctor.stdout
        assert worker.poll() is None
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        log.close()
    assert "toolsets: agents." in (tmp_path / "worker.log").read_text()
    wrong = _toolloop(
        {**env, "REDIS_URL": tls_url.replace(quote(PASSWORD), "wrong")}, "status", "x"
    )
    assert (
        wrong.returncode == 1
        and "refused the credentials" in wrong.stderr
        and "wrong" not in wrong.stderr
    )
    no_ca = _toolloop({**env, "REDIS_URL": tls_url.split("?")[0]}, "status", "x")
    assert (
        no_ca.returncode == 1
        and len(no_ca.stderr.splitlines()) == 2
        and "Traceback" not in no_ca.stderr
    )


def test_flower_reads_tasks_and_queues_over_tls(tls_url: str, tmp_path: Path) -> None:
    from tests.support.flower import running_flower

    auth = ("admin", "flower-pass")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "REDIS_URL": tls_url, "PYTHONPATH": str(root)}
    with running_flower(env, tmp_path / "flower.log", auth, timeout_s=60) as flower:
        # after Flower: it lists the events it heard
        worker = start_worker(tls_url, tmp_path, AGENT)
        client = Client(tls_url)
        try:
            run_id = client.enqueue(spec("tools", "Add 2 and 3.", toolset="agents"))
            assert client.wait(run_id, timeout=60).status == "done"

            def listed() -> bool:
                tasks = httpx.get(f"{flower}/api/tasks", auth=auth, timeout=10).json()
                return f"{run_id}:1" in tasks

            deadline = time.monotonic() + 30
            while not listed():
                assert time.monotonic() < deadline, (
                    "Flower never listed the run's first step"
                )
                time.sleep(0.5)
            queues = httpx.get(f"{flower}/api/queues/length", auth=auth, timeout=10)
            # Flower's own Redis client, over TLS
            assert queues.status_code == 200, queues.text
            names = {queue["name"] for queue in queues.json()["active_queues"]}
            assert {"llm", "tools", "control"} <= names, queues.json()
        finally:
            client.close()
            worker.stop()
