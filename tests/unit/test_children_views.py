"""What a person sees of child runs (docs/children.md): the run viewer's children table, the question
of a waiting run's child, `toolloop status`'s tree, and `spawn` outside a durable worker."""

from __future__ import annotations

import asyncio

import pytest

from examples import viewer
from toolloop.cli.follow import print_tree
from toolloop.journal import keys as library_keys
from workers.client.shards import shard_of
from workers.protocol import keys
from workers.protocol.records import RunNode
from workers.runs.children import SpawnInput, options_of, spawn_tool

ROOT = "r1"
NODES = [
    RunNode(run_id=ROOT, parent=None, status="waiting", spent_usd=0.01, steps=1),
    RunNode(
        run_id=f"{ROOT}.ab12cd34-0",
        parent=ROOT,
        status="done",
        spent_usd=0.002,
        steps=1,
        budget_usd=0.3,
    ),
    RunNode(
        run_id=f"{ROOT}.ab12cd34-1",
        parent=ROOT,
        status="asked",
        spent_usd=0.001,
        steps=1,
        budget_usd=0.3,
        asked={"question": "Which take?"},
    ),
]


def test_the_viewer_lists_the_children_and_a_childs_question() -> None:
    status = {
        "status": "waiting",
        "spent_usd": 0.01,
        "asking": NODES[2].run_id,
        "asked": {"question": "Which take?"},
    }
    children = [n.model_dump(mode="json") for n in NODES[1:]]
    html = viewer.page(
        ROOT,
        status,
        [{"kind": "queued", "budget_usd": 1.0, "id": "1-0"}],
        [],
        children=children,
    )
    table = html.split('<section id="children" >', 1)[1].split("</section>", 1)[0]
    assert table.count("<tr><td>") == 2 and f'href="/runs/{NODES[1].run_id}"' in table
    assert "$0.3000" in table and "Which take?" in table
    # answered through this run's form
    assert '<section id="ask" ><h2>A child run asks</h2>' in html
    assert '<section id="children" hidden>' in viewer.page(
        ROOT, {"status": "done"}, [], []
    )


def test_status_prints_the_tree_and_how_to_answer_the_child_that_asks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_tree(NODES, ROOT)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "tree"
    assert lines[1].startswith(f"  {ROOT}  waiting")
    assert lines[2].startswith(f"    {NODES[1].run_id}  done     $0.0020 of $0.3000")
    assert 'asks: {"question": "Which take?"}' in lines[3]
    assert (
        lines[4]
        == f"answer with: toolloop answer {ROOT} 'TEXT'   (it goes to {NODES[2].run_id}, the first that asks)"
    )


def test_spawn_outside_a_durable_run_starts_nothing() -> None:
    tool = spawn_tool(max_depth=2)
    assert options_of(tool) is not None and options_of(tool).max_depth == 2  # type: ignore[union-attr]
    assert tool.start is not None and tool.wait is not None
    started = asyncio.run(tool.start(SpawnInput(children=[{"prompt": "x"}]), None))
    answer = asyncio.run(tool.wait(started.started, None))
    assert answer.is_error and "not one" in answer.content[0].text
    with pytest.raises(ValueError, match="max_depth"):
        spawn_tool(max_depth=0)


def test_a_child_lives_on_its_parents_shard_and_its_roots_slot() -> None:
    parent = "s2-0123456789abcdef0123456789abcdef"
    child = f"{parent}.ab12cd34-0.ff00ee11-3"
    assert shard_of(child, 3) == shard_of(parent, 3) == 2
    # the root's hash tag
    assert keys.state(child) == f"tl:{{{parent}}}.ab12cd34-0.ff00ee11-3:state"
    assert (
        keys.parent_of(child) == f"{parent}.ab12cd34-0"
        and keys.root_of(child) == parent
    )
    assert keys.parent_of(parent) is None


def test_the_librarys_journal_lease_and_fence_keys_of_a_child_carry_its_roots_tag() -> (
    None
):
    """The library's RedisJournal (toolloop/journal/keys.py) and the workers name a child's journal,
    lease and fence by one rule, so a script of the tree and the library touch the same keys."""
    root = "0123456789abcdef0123456789abcdef"
    child = f"{root}.ab12cd34-0"
    assert (
        library_keys.journal(child, "s0/")
        == keys.journal(child, "s0")
        == f"tl:{{{root}}}.ab12cd34-0:journal:s0"
    )
    assert library_keys.lease(child) == f"tl:{{{root}}}.ab12cd34-0:lease"
    assert library_keys.fence(child) == f"tl:{{{root}}}.ab12cd34-0:fence"
    assert (
        library_keys.run_key(root, "state")
        == keys.state(root)
        == f"tl:{{{root}}}:state"
    )
