"""docker-compose.yml's offline path, run the way compose would run it (there is no Docker engine
here): the offline command line at the top of the file gives the host variables; the `sim` and
`worker` services' commands run with exactly their compose environment (`x-app` merged, `${VAR:-}`
filled from those variables), the service names `redis` and `sim` resolved to this machine as
compose's network would, against a real Redis. The storyboard run then ends `done` with the review's
notes: not "no API key", and not `(The simulator's script has ended.)`."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import redis_in
from tests.integration.runs_kit import eventually
from toolloop.embedded import EmbeddedServer, free_port
from workers.client import Client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
BIN = Path(sys.executable).parent
_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*)|:\?[^}]*)?\}")


def offline_line() -> dict[str, str]:
    """The host variables of the offline command written in the file's header comment (its lines
    joined where they end with a backslash)."""
    header = [
        line.removeprefix("#").strip()
        for line in COMPOSE.read_text().splitlines()
        if line.startswith("#")
    ]
    last = next(i for i, line in enumerate(header) if "--profile offline up" in line)
    first = last
    while first > 0 and header[first - 1].endswith("\\"):
        first -= 1
    words = shlex.split(
        " ".join(line.removesuffix("\\") for line in header[first : last + 1])
    )
    return dict(word.split("=", 1) for word in words[: words.index("docker")])


def interpolate(value: Any, host: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` with the host's variables."""

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in host and host[name] != "":
            return host[name]
        if default is None and ":?" in match.group(0):
            raise AssertionError(
                f"compose refuses to start: {name} is not set ({match.group(0)})"
            )
        return default or ""

    return _VARIABLE.sub(one, str(value))


def service(
    name: str, host: dict[str, str], names: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A service's command and environment as compose would run them, service names resolved."""
    # (`<<: *app` merges x-app as compose does)
    data = yaml.safe_load(COMPOSE.read_text())
    spec = data["services"][name]

    def resolved(text: str) -> str:
        for service_name, where in names.items():
            text = text.replace(f"//{service_name}:", f"//{where}:")
        return text

    env = {
        key: resolved(interpolate(value, host))
        for key, value in (spec.get("environment") or {}).items()
    }
    command = [interpolate(word, host) for word in spec["command"]]
    return command, env


def started(
    command: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """The service's process: its program from this install, the image's WORKDIR /app being ROOT."""
    full = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    full["PYTHONPATH"] = (
        str(ROOT) if env.get("PYTHONPATH") == "/app" else full.get("PYTHONPATH", "")
    )
    program = [str(BIN / command[0]), *command[1:]]
    with log.open("wb") as out:
        return subprocess.Popen(
            program,
            cwd=ROOT,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


def test_the_compose_offline_path_runs_the_storyboard_review_to_done(
    redis_server: EmbeddedServer, tmp_path: Path
) -> None:
    host = offline_line()
    assert host.get("ANTHROPIC_BASE_URL", "").startswith("http://sim:"), host
    sim_port = free_port()
    redis_port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    names = {"sim": "127.0.0.1", "redis": "127.0.0.1"}
    host = {**host, "STEPS_IN_FLIGHT": "50"}

    sim_command, sim_env = service("sim", host, names)
    assert sim_command[:2] == ["toolloop", "sim"]
    port_at = sim_command.index("--port") + 1
    compose_sim_port = sim_command[port_at]
    # compose publishes it on its own network; here a free port
    sim_command[port_at] = str(sim_port)
    sim_command[sim_command.index("--host") + 1] = "127.0.0.1"
    worker_command, worker_env = service("worker", host, names)
    assert worker_command[:3] == ["celery", "-A", "workers.app"]
    worker_env["REDIS_URL"] = worker_env["REDIS_URL"].replace(
        ":6379/", f":{redis_port}/"
    )
    worker_env["ANTHROPIC_BASE_URL"] = worker_env["ANTHROPIC_BASE_URL"].replace(
        f":{compose_sim_port}", f":{sim_port}"
    )
    assert worker_env["ANTHROPIC_API_KEY"], (
        "the offline line gives the worker no key: it reports no API key"
    )

    sim = started(sim_command, sim_env, tmp_path / "sim.log")
    worker = started(worker_command, worker_env, tmp_path / "worker.log")
    client = Client(redis_server.url, toolsets=["review"])
    try:
        eventually(
            lambda: " ready." in (tmp_path / "worker.log").read_text(errors="replace"),
            timeout=60,
        )
        run = yaml.safe_load(
            (ROOT / "examples" / "storyboard" / "run.yaml").read_text()
        )
        run_id = client.enqueue(run)
        asked = client.wait(run_id, timeout=90)
        assert asked.status == "asked", (
            asked,
            (tmp_path / "worker.log").read_text()[-3000:],
        )
        assert "Shot 3" in str(asked.asked)
        client.answer(run_id, "Keep shot 3; trim shot 5 by a second.")
        done = eventually(
            lambda: (s := client.status(run_id)).finished and s, timeout=90
        )
    finally:
        client.close()
        for process in (worker, sim):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    assert done.status == "done", (done, (tmp_path / "worker.log").read_text()[-3000:])
    assert "script has ended" not in (done.final_text or "")
    assert (done.final_text or "").startswith(
        'You said: "Keep shot 3; trim shot 5 by a second."'
    ), done
