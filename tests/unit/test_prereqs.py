"""`make test` checks the programs the suite runs before anything else (tests/prereqs.py): on a
machine without one of them it stops in its first second, before `make setup`, and names the
command that installs what is missing.

Each test runs the real Makefile and script in a copy of the three files they read, on a PATH of
stand-ins: every program the suite runs is a script that exits 0 (redis-server answers as a TLS
build or not), beside the real `make` and `python3`; one is left out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import prereqs

ROOT = Path(__file__).resolve().parents[2]
SUDO = "" if os.geteuid() == 0 else "sudo "
PYTHON3 = subprocess.run(  # the interpreter itself: python3 on PATH may be a shim (pyenv) that needs PATH
    ["python3", "-c", "import sys; print(sys.executable)"],
    capture_output=True,
    text=True,
    check=True,
).stdout.strip()

TLS_BUILD = "# No tls-key-file configured!\n# Failed to configure TLS. Check logs for more info."
PLAIN_BUILD = "# Missing implement of connection type tls\n# Failed to configure TLS."


def checkout(
    tmp_path: Path, *, without: str = "", redis_says: str = TLS_BUILD, mcp: bool = True
) -> Path:
    """A copy of the Makefile and the check, and `bin/` holding every program but `without`."""
    copy = tmp_path / "toolloop"
    for name in ("Makefile", "pyproject.toml", "tests/prereqs.py"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    if mcp:
        server = copy / prereqs.MCP_SERVER.relative_to(ROOT)
        server.parent.mkdir(parents=True)
        server.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = shutil.which("make")
    assert make is not None
    (bin_dir / "make").symlink_to(make)
    (bin_dir / "python3").symlink_to(PYTHON3)
    for program in [p.names[0] for p in prereqs.PROGRAMS] + ["npm"]:
        if program != without:
            body = (
                f"echo '{redis_says}' >&2; exit 1"
                if program == "redis-server"
                else "exit 0"
            )
            (bin_dir / program).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / program).chmod(0o755)
    return copy


def run(copy: Path, *command: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PATH": str(copy.parent / "bin")}
    start = time.monotonic()
    done = subprocess.run(
        command, cwd=copy, env=env, capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - start


def test_make_test_without_chromium_stops_in_its_first_second_naming_the_install(
    tmp_path: Path,
) -> None:
    copy = checkout(tmp_path, without="chromium")
    done, took = run(copy, "make", "test")
    assert done.returncode != 0
    assert took < 1.0, took
    assert not (copy / ".venv").exists()  # stopped before make setup
    assert "chromium" in done.stderr and "test_run_viewer.py" in done.stderr, (
        done.stderr
    )
    assert (
        f"{SUDO}apt-get update -qq && {SUDO}apt-get install -y chromium\n"
        in done.stderr
    ), done.stderr
    assert "tinyproxy" not in done.stderr  # only what is missing


@pytest.mark.parametrize("target", ["test-integration", "faults", "faults-full"])
def test_every_target_that_runs_outside_programs_checks_first(
    tmp_path: Path, target: str
) -> None:
    done, _ = run(checkout(tmp_path, without="tinyproxy"), "make", target)
    assert done.returncode != 0
    assert "apt-get install -y tinyproxy" in done.stderr, done.stderr


def test_a_redis_server_built_without_tls_is_named(tmp_path: Path) -> None:
    done, _ = run(
        checkout(tmp_path, redis_says=PLAIN_BUILD), "python3", "tests/prereqs.py"
    )
    assert done.returncode == 1
    assert (
        "redis-server with TLS" in done.stderr and "built without TLS" in done.stderr
    ), done.stderr
    assert "apt-get install -y redis-server" in done.stderr


def test_the_mcp_server_not_installed_names_npm_and_the_npm_install(
    tmp_path: Path,
) -> None:
    done, _ = run(
        checkout(tmp_path, without="npm", mcp=False), "python3", "tests/prereqs.py"
    )
    assert done.returncode == 1
    assert "apt-get install -y npm && npm install --prefix tests/.mcp" in done.stderr, (
        done.stderr
    )
    assert prereqs.MCP_PACKAGE in done.stderr


def test_with_everything_present_the_check_passes_silently(tmp_path: Path) -> None:
    done, _ = run(checkout(tmp_path), "python3", "tests/prereqs.py")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_install_runs_apt_get_then_npm_and_then_the_check_passes(
    tmp_path: Path,
) -> None:
    """What .ci/run does on a clean machine: `--install` runs the commands the message names."""
    copy = checkout(tmp_path, without="chromium", mcp=False)
    bin_dir, log = tmp_path / "bin", tmp_path / "installs.log"
    server = prereqs.MCP_SERVER.relative_to(ROOT)
    chromium = (
        f"printf '#!/bin/sh\\n' > {bin_dir}/chromium && chmod +x {bin_dir}/chromium"
    )
    stand_ins = {  # each logs its command line and installs what it was asked for
        "apt-get": f'echo "apt-get $*" >> {log}; if [ "$1" = install ]; then {chromium}; fi',
        "sudo": '"$@"',
        "npm": f'echo "npm $*" >> {log}; mkdir -p {server.parent} && : > {server}',
    }
    for real in ("mkdir", "chmod"):
        (bin_dir / real).symlink_to(shutil.which(real) or f"/bin/{real}")
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done, _ = run(copy, "python3", "tests/prereqs.py", "--install")
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().splitlines() == [
        "apt-get update -qq",
        "apt-get install -y chromium",
        "npm " + " ".join(prereqs.NPM_INSTALL[1:]),
    ]
    again, _ = run(copy, "python3", "tests/prereqs.py")
    assert (again.returncode, again.stderr) == (0, "")
