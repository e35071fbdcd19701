"""The README's commands, as written and in order, on a fresh copy of the repository (its tracked
files, with this checkout's .venv linked in, as `make setup` would have made it): `make demo`, the
quickstart, the durable-run commands with a worker in the background, the `Client` snippet (which
must terminate), and `kill %1 && wait` then `toolloop down`. Nothing of this checkout's environment
leaks in: no REDIS_URL, no TOOLLOOP_TOOLSETS, no provider key, and `toolloop` is on PATH only once
the README's `. .venv/bin/activate` ran. (`make test` is the suite this test is part of.)"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(sh|python)\n(.*?)```", README, re.DOTALL)


def fresh_copy(tmp_path: Path) -> Path:
    """The tracked files of this checkout (as a clone has them), and a link to its .venv."""
    copy = tmp_path / "toolloop"
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    # `make` sees the linked .venv as installed already
    os.utime(copy / "pyproject.toml", (0, 0))
    return copy


def clean_env(home: Path) -> dict[str, str]:
    drop = {
        "REDIS_URL",
        "TOOLLOOP_TOOLSETS",
        "TOOLLOOP_HOME",
        "ANTHROPIC_API_KEY",
        "FAL_KEY",
        "OPENAI_API_KEY",
        "VIRTUAL_ENV",
        "PYTHONPATH",
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith("TOOLLOOP_")
    }
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin
    )
    env["HOME"] = str(home)
    return env


def test_the_readme_blocks_are_the_ones_this_test_runs() -> None:
    assert [kind for kind, _ in BLOCKS] == [
        "sh",
        "python",
        "sh",
        "python",
        "sh",
        "sh",
        "sh",
    ]
    quickstart = BLOCKS[1][1]
    # past its docstring
    shipped = ast.parse((ROOT / "examples" / "quickstart.py").read_text()).body[1:]
    assert [ast.dump(node) for node in ast.parse(quickstart).body] == [
        ast.dump(node) for node in shipped
    ]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_every_readme_command_works_as_written_on_a_fresh_copy(tmp_path: Path) -> None:
    copy = fresh_copy(tmp_path)
    env = clean_env(tmp_path)
    (setup,), (cli, client, teardown, approvals, talk) = (
        [BLOCKS[0][1]],
        [b for _, b in BLOCKS[2:]],
    )
    # not on PATH yet
    assert "toolloop" not in (shutil.which("toolloop", path=env["PATH"]) or "")

    make = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert make == ["make demo", "make test-unit", "make test"]
    demo = subprocess.run(
        ["make", "demo"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "answer   Keep shot 3; trim shot 5 by a second." in demo.stdout
    assert "spent    $" in demo.stdout
    excerpt = re.search(r"```text\n(.*?)```", README, re.DOTALL)
    assert excerpt is not None
    printed = demo.stdout.splitlines()
    for line in excerpt.group(
        1
    ).splitlines():  # each line as the demo prints it (`…`: cut short there)
        if line != "…":
            assert any(p.startswith(line.removesuffix("…")) for p in printed), (
                line,
                demo.stdout,
            )

    quick = subprocess.run(
        [".venv/bin/python", "examples/quickstart.py"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.splitlines() == [
        "done 'Trim 2 s.' $0.01 ['model:1', 'tool:call_1', 'model:2']",
        "replayed: True model calls: 2",
    ]

    snippet = "python - <<'README_PYTHON'\n" + client + "README_PYTHON\n"
    # the Client snippet twice, as a reader runs it again: a fresh run each time, not the first one's end
    script = (
        "set -euo pipefail\n" + cli + snippet + snippet + teardown + approvals + talk
    )
    (tmp_path / "readme.sh").write_text(script)
    shell = subprocess.Popen(
        ["bash", "-x", str(tmp_path / "readme.sh")],
        cwd=copy,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stdout, stderr = shell.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        # the worker too, if the script left it behind
        os.killpg(shell.pid, signal.SIGKILL)
        stdout, stderr = shell.communicate()
        pytest.fail(f"The README's commands did not end:\n{stdout}\n{stderr}"[-6000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            # nothing of a failed script outlives the test
            os.killpg(shell.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "run      finished: done" in out  # toolloop events --follow, to the end
    assert "status" in out and "Keep shot 3." in out
    # the Client snippet followed the run to its end
    assert "parked {" in out and "finished {" in out
    assert out.splitlines().count("done True") == 2
    # the approvals: three held calls, each decided once, and the run ends on what each came to
    assert re.search(r"approve toolu_\w+: decided; other calls still wait\.", out)
    assert re.search(r"reject toolu_\w+: decided; other calls still wait\.", out)
    assert re.search(r"edit toolu_\w+: decided; the run goes on\.", out)
    assert (
        "Rejected by the person: not this cut." in out
        and out.count("run      finished: done") == 3
    )
    # the conversations: follow-ups on one run, a keyed repeat, a steer, an interrupt then a send
    assert re.search(r"Sent to \w+: it continues \(segment 1\)\.", out)
    # the keyed repeat
    assert len(re.findall(r"Sent to \w+: it continues \(segment 2\)\.", out)) == 2
    assert "final_text  You said: “Stop reading: sum up what you saw so far.”" in out
    assert re.search(r"status +interrupted", out)
    assert "final_text  You said: “Just tell me about shot 3.”" in out
    assert re.search(r"Stopped the embedded Redis \(pid \d+\)\.", out.splitlines()[-1])
    assert "Traceback" not in done.stderr, done.stderr
    leftover = subprocess.run(
        ["pgrep", "-f", str(copy)], capture_output=True, text=True
    )
    assert leftover.stdout == "", f"processes of the copy still run: {leftover.stdout}"
