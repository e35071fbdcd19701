"""The README's MCP block (its only ```bash block), run as written on a fresh copy of the repository:
the counting MCP server over stdio, a worker on the simulator whose policy calls its tools, a run that
finishes done. Its block is not one test_readme.py runs (that one runs the sh blocks, in order)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_readme import README, clean_env, fresh_copy

BLOCK = re.findall(r"```bash\n(.*?)```", README, re.DOTALL)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_readme_mcp_block_works_as_written(tmp_path: Path) -> None:
    tmp = tmp_path
    (block,) = BLOCK
    copy = fresh_copy(tmp)
    env = clean_env(tmp)
    (tmp / "mcp.sh").write_text("set -euo pipefail\n" + block)
    shell = subprocess.Popen(
        ["bash", str(tmp / "mcp.sh")],
        cwd=copy,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = shell.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        out, err = shell.communicate()
        pytest.fail(f"The README's MCP block did not end:\n{out}\n{err}"[-6000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            # nothing of a failed block outlives the test
            os.killpg(shell.pid, signal.SIGKILL)
    assert shell.returncode == 0, (out + err)[-4000:]
    assert "add                          mcp:counter" in out
    assert "toolsets: counter, everything." in out
    assert "tool   add              $0.0000  42" in out
    assert "tool   shout            $0.0000  THE SUM IS 42" in out
    assert "run      finished: done" in out
