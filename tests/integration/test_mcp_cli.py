"""`toolloop tools NAME` and `toolloop doctor` with MCP toolsets, through real subprocesses: the counting
MCP server of examples/mcp_counter.py over stdio, a URL where nothing answers, an unset `${VAR}`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_cli import env_for, toolloop
from toolloop.embedded import EmbeddedServer, free_port

ASKING = Path(__file__).resolve().parents[1] / "support" / "mcp_asking.py"


def _file(tmp_path: Path) -> str:
    toolsets = {
        "counter": {
            "python": "examples.storyboard.tools:REVIEW_TOOLS",
            "mcp": {
                "command": [sys.executable, "-m", "examples.mcp_counter", "stdio"],
                "needs_approval": ["remove"],
            },
        },
        "asking": {"mcp": {"command": [sys.executable, str(ASKING)]}},
        "nobody": {
            "mcp": {"url": f"http://127.0.0.1:{free_port()}/mcp", "timeout_s": 5}
        },
        "secret": {
            "mcp": {
                "url": "http://127.0.0.1:9/mcp",
                "headers": {"Authorization": "Bearer ${MCP_CLI_UNSET_TOKEN}"},
            }
        },
    }
    path = tmp_path / "toolsets.yaml"
    path.write_text(yaml.safe_dump(toolsets))
    return str(path)


@pytest.mark.slow
def test_tools_lists_python_tools_and_the_server_tools(tmp_path: Path) -> None:
    env = {
        **env_for(tmp_path, None),
        "TOOLLOOP_TOOLSETS_FILE": _file(tmp_path),
        "TOOLLOOP_TOOLSETS": "",
    }
    done = toolloop(env, "tools", "counter")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert {"read_frame", "add", "shout", "remove"} <= set(rows)
    assert "mcp:counter" in rows["add"] and "Add two integers." in rows["add"]
    assert rows["remove"].endswith("(needs approval)") and not rows["add"].endswith(
        "(needs approval)"
    )
    asking = {
        line.split()[0]: line
        for line in toolloop(env, "tools", "asking").stdout.splitlines()
    }
    # a two-phase MCP Tasks tool
    assert asking["confirm"].endswith("The confirm task. (task)")
    nobody = toolloop(env, "tools", "nobody")
    assert nobody.returncode == 1 and "error MCP server 'nobody'" in nobody.stdout
    assert "could not be reached" in nobody.stdout
    unknown = toolloop(env, "tools", "nope")
    assert unknown.returncode == 1 and "'nope' is not registered" in unknown.stderr


def test_doctor_checks_that_each_server_answers(
    tmp_path: Path, redis_server: EmbeddedServer
) -> None:
    env = {
        **env_for(tmp_path, redis_server.url),
        "TOOLLOOP_TOOLSETS_FILE": _file(tmp_path),
        "TOOLLOOP_TOOLSETS": "",
    }
    done = toolloop(env, "doctor", timeout=90)
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("ok") and "MCP server" in line and "9 tools: add" in line
        for line in lines
    ), done.stdout
    assert any(
        line.startswith("error") and "toolset 'nobody'" in line for line in lines
    )
    (secret,) = [line for line in lines if "toolset 'secret'" in line]
    assert (
        secret.startswith("error")
        and "${MCP_CLI_UNSET_TOKEN}, which is not set" in secret
    )
    assert done.returncode == 1
