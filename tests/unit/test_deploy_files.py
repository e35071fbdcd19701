"""docker-compose.yml and the Procfile: they parse, and every command they run parses with the
installed Celery and Flower against the real `workers.app` (Docker is not available here, so this
is the check that `docker compose up` and `honcho start` would not die on a typo)."""

from __future__ import annotations

import copy
import importlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")
_REQUIRED = re.compile(r"\$\{(\w+):\?[^}]*\}|\$(\w+)")


def expand(text: str) -> str:
    """Shell/compose variable expansion with the defaults; required ones get a sample value."""
    text = _DEFAULT.sub(lambda m: m.group(2), text)
    return _REQUIRED.sub("user:secret", text)


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def procfile() -> dict[str, list[str]]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    entries = [
        line.split(":", 1)
        for line in lines
        if line.strip() and not line.startswith("#")
    ]
    return {name.strip(): shlex.split(expand(command)) for name, command in entries}


def check_celery_command(argv: list[str]) -> str:
    """Parse a `celery -A <app> <sub> ...` command the way the celery CLI would; returns <sub>."""
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    assert argv[:2] == ["celery", "-A"], argv
    module_name, _, attribute = argv[2].partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attribute or "app")
    sub, rest = argv[3], argv[4:]
    if sub == "worker":
        obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
        # the celery CLI adds the app's own worker options the same way
        command = copy.copy(worker)
        command.params = [*worker.params, *app.user_options.get("worker", [])]
        params = command.make_context("worker", list(rest), obj=obj).params
        assert params["steps_in_flight"], "the worker needs --steps-in-flight"
        queues = set(params["queues"] or [])
        routed = {route["queue"] for route in (app.conf.task_routes or {}).values()}
        assert routed <= queues, (
            f"tasks are routed to {routed - queues} but the worker does not consume them"
        )
        assert params["task_events"], "Flower needs -E"
    elif sub == "flower":
        from flower.options import options

        for arg in rest:
            name = arg.removeprefix("--").split("=", 1)[0].replace("_", "-")
            assert name in options._options, f"flower has no option --{name}"
        assert any(arg.startswith("--basic_auth=") for arg in rest), (
            "Flower must require auth"
        )
        assert any(arg.startswith("--address=") for arg in rest), (
            "Flower must not bind by default"
        )
        assert "--read_only=true" in rest, (
            "Flower must be read-only unless FLOWER_READ_ONLY=false"
        )
    else:
        pytest.fail(f"unexpected celery subcommand {sub!r}")
    return sub


def test_compose_redis_keeps_the_journal() -> None:
    redis = compose()["services"]["redis"]
    flags = " ".join(redis["command"])
    assert "--appendonly yes" in flags
    assert "--appendfsync everysec" in flags
    assert "--maxmemory-policy noeviction" in flags
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert redis["image"].startswith("redis:7")


def test_compose_celery_services_parse() -> None:
    services = compose()["services"]
    assert (
        check_celery_command([expand(a) for a in services["worker"]["command"]])
        == "worker"
    )
    assert (
        check_celery_command([expand(a) for a in services["flower"]["command"]])
        == "flower"
    )
    for name in ("worker", "flower"):
        assert services[name]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (
                f"{name} publishes {port} beyond loopback"
            )


def test_compose_simulator_command_exists() -> None:
    from toolloop.cli import main

    argv = compose()["services"]["sim"]["command"]
    assert argv[:2] == ["toolloop", "sim"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv[1:2], "--help"])
    assert exit_info.value.code == 0


def test_procfile_processes_parse() -> None:
    entries = procfile()
    assert set(entries) == {"worker", "flower", "web"}
    assert entries["web"] == compose()["services"]["web"]["command"]
    assert check_celery_command(entries["worker"]) == "worker"
    assert check_celery_command(entries["flower"]) == "flower"
    assert "--address=127.0.0.1" in entries["flower"]
    assert entries["web"][0] == "python"
    assert (ROOT / entries["web"][1]).is_file()


def test_compose_scales_the_worker_as_written() -> None:
    """`docker compose up --scale worker=N`, as the docs and the file's header write it: compose starts N
    copies of a service only if none of them claims something one container can hold (a host port,
    a container name, a hostname: N workers of one Celery node name would share its wake list); the
    whole file's `${VAR:?}` are checked whatever is scaled, so the command carries them; the compose
    stop grace covers the workers' own warm-shutdown grace (workers/config/settings.py)."""
    from workers.config.settings import Settings

    worker = compose()["services"]["worker"]
    assert not {"ports", "container_name", "hostname", "volumes"} & set(worker), worker
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    required = set(
        re.findall(r"\$\{(\w+):\?", (ROOT / "docker-compose.yml").read_text())
    )
    assert required == {"FLOWER_BASIC_AUTH", "TOOLLOOP_WEB_TOKEN"}
    texts = [
        (ROOT / "docker-compose.yml").read_text(),
        (ROOT / "docs" / "operations.md").read_text(),
    ]
    lines = [
        line
        for text in texts
        for line in text.splitlines()
        if "docker compose up --scale" in line
    ]
    assert lines, "no `docker compose up --scale` command written"
    for line in lines:
        assert all(f"{name}=" in line for name in required), line
    grace = float(worker["stop_grace_period"].removesuffix("s"))
    assert grace > Settings.from_env().shutdown_grace
