"""The run viewer's approvals section (examples/viewer.py) in a real headless Chromium: a page for a
run that waits for decisions on two held calls shows each call's tool and input with Approve / Reject /
Edit, hides the answer form, and each button sends the decision (bound to the call's digest) to the
web example's route. The page is served by a small app that records what the browser posts; the
routes' own behaviour against a real worker is tested in test_runs_approvals.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from examples import viewer
from tests.support.chromium import running_chromium
from toolloop.embedded import free_port

pytestmark = pytest.mark.integration

HELD = [
    {
        "call_id": "call_a",
        "name": "render_preview",
        "input": {"shots": [3, 5]},
        "input_digest": "sha256:aaa",
        "estimate_usd": 0.05,
        "deadline": None,
    },
    {
        "call_id": "call_b",
        "name": "publish",
        "input": {"channel": "main"},
        "input_digest": "sha256:bbb",
        "estimate_usd": 0.0,
        "deadline": None,
    },
]
STATUS = {
    "run_id": "r1",
    "status": "asked",
    "spent_usd": 0.01,
    "approvals": HELD,
    "asked": {},
}


@pytest.fixture
def site() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    posted: list[dict[str, Any]] = []

    def page(request: Request) -> Response:
        return HTMLResponse(
            viewer.page("r1", STATUS, [], []),
            headers={"content-security-policy": viewer.CSP},
        )

    async def decide(request: Request) -> Response:
        posted.append(
            {
                "call": request.path_params["call"],
                "action": request.path_params["action"],
                "body": await request.json(),
            }
        )
        return JSONResponse({"outcome": "recorded"})

    app = Starlette(
        routes=[
            Route("/runs/r1", page),
            Route("/runs/r1/events", lambda request: Response(status_code=204)),
            Route("/runs/r1/approvals/{call}/{action}", decide, methods=["POST"]),
        ]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", posted
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_viewer_shows_held_calls_and_sends_each_decision(
    site: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    base, posted = site
    html = httpx.get(f"{base}/runs/r1").text
    assert '<section id="approvals" >' in html and 'data-call="call_a"' in html
    with running_chromium(tmp_path) as page:
        page.navigate(f"{base}/runs/r1")
        assert page.evaluate("document.getElementById('ask').hidden") is True
        assert page.evaluate("document.getElementById('approvals').hidden") is False
        rows = page.evaluate(
            "[...document.querySelectorAll('#held .held')].map(r => r.innerText)"
        )
        assert (
            len(rows) == 2
            and "render_preview" in rows[0]
            and '{"shots":[3,5]}' in rows[0]
        )
        row = "document.querySelector('#held .held[data-call=\"call_a\"]')"
        # an edit that is not JSON is refused in the page; nothing is sent
        page.evaluate(
            f"{row}.querySelector('.edit').value = '{{shots: 3'; "
            f"{row}.querySelector('[data-action=edit]').click(); true"
        )
        assert "not JSON" in page.wait_for(
            f"{row}.querySelector('.decided').textContent", timeout=10
        )
        assert posted == []
        page.evaluate(
            f"{row}.querySelector('.edit').value = '{{\"shots\": [3]}}'; "
            f"{row}.querySelector('[data-action=edit]').click(); true"
        )
        page.wait_for(
            f"{row}.querySelector('.decided').textContent.startsWith('edit')",
            timeout=10,
        )
        other = "document.querySelector('#held .held[data-call=\"call_b\"]')"
        page.evaluate(
            f"{other}.querySelector('.reason').value = 'not today'; "
            f"{other}.querySelector('[data-action=reject]').click(); true"
        )
        page.wait_for(
            f"{other}.querySelector('.decided').textContent.startsWith('reject')",
            timeout=10,
        )
        # a decided call offers no more decisions: its buttons and fields are gone, the outcome stays
        assert (
            page.evaluate(f"{other}.querySelectorAll('button, input, textarea').length")
            == 0
        )
        assert page.evaluate(f"{row}.querySelectorAll('button').length") == 0
        page.screenshot(tmp_path / "viewer-approvals.png")
    assert posted == [
        {
            "call": "call_a",
            "action": "edit",
            "body": {"digest": "sha256:aaa", "input": {"shots": [3]}},
        },
        {
            "call": "call_b",
            "action": "reject",
            "body": {"digest": "sha256:bbb", "reason": "not today"},
        },
    ]
