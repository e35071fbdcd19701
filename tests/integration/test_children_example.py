"""The README's child-runs block (the ```shell block of examples/children, the same as
docs/children.md's), run as written on a fresh copy of the repository: a worker on the simulator
playing examples/children/policy.py, a tree that finishes, a child's question answered through the
root, a tree cancelled from its root."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.test_readme import README, clean_env, fresh_copy

BLOCK = [
    b
    for b in re.findall(r"```shell\n(.*?)```", README, re.DOTALL)
    if "examples.children" in b
]
"""The README's child-runs block: its ```shell block that runs examples/children (the schedules' is
another, tests/integration/test_schedules.py)."""


def test_the_docs_and_the_readme_show_the_same_block() -> None:
    (block,) = BLOCK
    assert re.findall(
        r"```shell\n(.*?)```", (ROOT / "docs" / "children.md").read_text(), re.DOTALL
    ) == [block]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_readme_children_block_works_as_written(tmp_path: Path) -> None:
    (block,) = BLOCK
    copy = fresh_copy(tmp_path)
    env = clean_env(tmp_path)
    (tmp_path / "children.sh").write_text("set -euo pipefail\n" + block)
    shell = subprocess.Popen(
        ["bash", str(tmp_path / "children.sh")],
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
        pytest.fail(f"The README's children block did not end:\n{out}\n{err}"[-6000:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            # nothing of a failed block outlives the test
            os.killpg(shell.pid, signal.SIGKILL)
    assert shell.returncode == 0, (out + err)[-4000:]
    print(out)
    statuses = re.findall(r"^status\s+(\S+)", out, re.MULTILINE)
    assert statuses == ["done", "waiting", "waiting", "done", "cancel"], out
    # the 6 grandchildren
    assert len(re.findall(r"^      \S+\.\S+\.\S+  done", out, re.MULTILINE)) == 6
    assert out.count("answer with: toolloop answer") == 2
    cancelled = out.rsplit("tree", 1)[1]
    assert len(re.findall(r"  cancel ", cancelled)) == 7, cancelled
