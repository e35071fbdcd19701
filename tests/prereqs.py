"""The programs the test suite runs besides the Python packages of .venv, checked before it starts.

    python3 tests/prereqs.py            # names what is missing and the command that installs it (exit 1)
    python3 tests/prereqs.py --install  # installs what is missing (apt-get, npm), as .ci/run does

`make test`, `make test-integration`, `make faults` and `make faults-full` run the check first, before
`make setup`, so a machine without Chromium stops in its first second, not after 20 minutes with the
viewer tests red. `make test-unit` needs none of these. Standard library only: it runs before .venv
exists. This list is the one place that says what the suite needs (.ci/run installs from it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MCP_PREFIX = "tests/.mcp"
MCP_PACKAGE = "@modelcontextprotocol/server-everything@2026.8.31"
MCP_SERVER = (
    ROOT
    / MCP_PREFIX
    / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
NPM_INSTALL = [
    "npm",
    "install",
    "--prefix",
    MCP_PREFIX,
    "--no-audit",
    "--no-fund",
    MCP_PACKAGE,
]


@dataclass(frozen=True)
class Program:
    """One program on PATH (any of `names`), the Debian package that installs it and who needs it."""

    names: tuple[str, ...]
    package: str
    needed_by: str


PROGRAMS = (
    Program(
        ("redis-server",),
        "redis-server",
        "every integration and fault test starts its own Redis (TLS: test_tls_acl.py)",
    ),
    Program(
        ("openssl",),
        "openssl",
        "test_tls_acl.py and test_proxy_tls.py make their certificates",
    ),
    Program(
        ("chromium", "chromium-browser"),
        "chromium",
        "test_run_viewer.py, test_viewer_approvals.py, test_web_hostile.py drive headless Chromium",
    ),
    Program(
        ("tinyproxy",),
        "tinyproxy",
        "test_proxy_tls.py sends through a real forward proxy",
    ),
    Program(("curl",), "curl", "test_web_curl.py runs the web example's curl lines"),
    Program(("git",), "git", "test_readme.py copies the tracked files (git ls-files)"),
    Program(("node",), "nodejs", "the MCP tests run the MCP reference server"),
)


def found(program: Program) -> str | None:
    return next(filter(None, map(shutil.which, program.names)), None)


def redis_without_tls(binary: str) -> str | None:
    """Why `binary` cannot serve TLS (None when it can): it is asked to listen on a TLS port without a
    key; a TLS build refuses the missing key, a build without TLS refuses TLS itself."""
    with tempfile.TemporaryDirectory() as directory:
        try:
            args = [
                binary,
                "--port",
                "0",
                "--tls-port",
                "1",
                "--bind",
                "127.0.0.1",
                "--dir",
                directory,
            ]
            done = subprocess.run(
                args,
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=5,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{binary} did not answer: {error}"
    out = (done.stdout + done.stderr).lower()
    if "tls-key-file" in out or "tls-cert-file" in out:
        return None
    return (
        f"{binary} was built without TLS: {(done.stdout + done.stderr).strip()[-160:]}"
    )


def missing() -> tuple[list[tuple[str, str, str]], bool]:
    """(name, Debian package, why) for each missing program, and whether the MCP server's npm install
    is missing."""
    lacking = []
    for program in PROGRAMS:
        binary = found(program)
        if binary is None:
            lacking.append((program.names[0], program.package, program.needed_by))
        elif program.package == "redis-server" and (
            reason := redis_without_tls(binary)
        ):
            lacking.append(("redis-server with TLS", program.package, reason))
    npm = not MCP_SERVER.exists()
    if npm and shutil.which("npm") is None:
        lacking.append(
            ("npm", "npm", f"installs the MCP reference server into {MCP_PREFIX}")
        )
    return lacking, npm


def sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo"]


def commands(lacking: list[tuple[str, str, str]], npm: bool) -> list[list[str]]:
    """The commands that install what is missing, in order (apt-get first: npm may be among it)."""
    steps = []
    packages = sorted({package for _, package, _ in lacking})
    if packages:
        steps += [
            [*sudo(), "apt-get", "update", "-qq"],
            [*sudo(), "apt-get", "install", "-y", *packages],
        ]
    if npm:
        steps.append(NPM_INSTALL)
    return steps


def report(lacking: list[tuple[str, str, str]], npm: bool) -> str:
    lines = ["The test suite needs programs this machine lacks:"]
    lines += [f"  {name:<22} {why}" for name, _, why in lacking]
    if npm:
        lines.append(
            f"  {'MCP reference server':<22} the MCP tests run it from {MCP_PREFIX} (npm install)"
        )
    steps = commands(lacking, npm)
    lines.append("Install them (Debian, Ubuntu), from the repository root:")
    lines.append("  " + " && ".join(shlex.join(step) for step in steps))
    lines.append("(.ci/run installs them itself; make test-unit needs none of them.)")
    return "\n".join(lines)


def install(lacking: list[tuple[str, str, str]], npm: bool) -> bool:
    """Runs the install commands in order; False (having said which) when one fails."""
    for step in commands(lacking, npm):
        print("+", shlex.join(step), flush=True)
        if (code := subprocess.run(step, cwd=ROOT).returncode) != 0:
            print(f"{shlex.join(step)} failed (exit {code})", file=sys.stderr)
            return False
    return True


def main(argv: list[str]) -> int:
    lacking, npm = missing()
    if "--install" in argv and (lacking or npm):
        if not install(lacking, npm):
            return 1
        lacking, npm = missing()
    if lacking or npm:
        print(report(lacking, npm), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
