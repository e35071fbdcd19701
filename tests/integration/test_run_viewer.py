"""The run viewer (GET /runs/{id} of examples/web.py, examples/viewer.py) in a real headless
Chromium: a durable run of the storyboard review on the simulator, opened before any worker runs,
shows its steps appear live over the event stream (under the app's Content-Security-Policy, with
nothing blocked), an image from a tool result, the question with
the answer form; the answer typed into the form resumes the run, and the page shows it finish.
The screenshot is saved as `viewer.png` in the test's tmp directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.test_web_example import SPEC
from tests.support.chromium import running_chromium
from tests.support.procs import end
from tests.support.web import AUTH, WEB_TOKEN, review_worker, serve_web, web_env
from toolloop.embedded import EmbeddedServer

pytestmark = pytest.mark.integration

ROWS = "document.querySelectorAll('#steps tbody tr').length"
VIOLATIONS = (  # what the Content-Security-Policy blocked on each page, from before the page's script
    "window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
    "(e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));"
)


@pytest.fixture
def env(redis_server: EmbeddedServer) -> dict[str, str]:
    return web_env(redis_server.url)


@pytest.fixture
def web(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    yield from serve_web(env, tmp_path / "web.log")


def test_the_viewer_shows_a_run_live_and_takes_its_answer(
    web: str, env: dict[str, str], tmp_path: Path
) -> None:
    run_id = httpx.post(f"{web}/runs", json=SPEC, headers=AUTH, timeout=30).json()[
        "run_id"
    ]
    page_html = httpx.get(
        f"{web}/runs/{run_id}", headers={**AUTH, "accept": "text/html"}, timeout=30
    )
    assert page_html.status_code == 200 and '<section id="steps">' in page_html.text
    # the script runs by its hash, nothing else
    policy = page_html.headers["content-security-policy"]
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy
    assert (
        httpx.get(
            f"{web}/runs/{run_id}", headers={"accept": "text/html"}, timeout=30
        ).status_code
        == 401
    )
    worker = None
    with running_chromium(tmp_path) as page:
        page.call("Page.addScriptToEvaluateOnNewDocument", source=VIOLATIONS)
        page.navigate(f"{web}/runs/{run_id}?token={WEB_TOKEN}")
        assert (
            page.evaluate("document.getElementById('status').textContent") == "queued"
        )
        assert page.evaluate(ROWS) == 0  # nothing ran yet: no worker
        worker = review_worker(env, tmp_path / "worker.log")
        try:
            # steps appear live, over the event stream
            page.wait_for(f"{ROWS} >= 1", timeout=60)
            page.wait_for("!document.getElementById('ask').hidden", timeout=60)
            question = page.evaluate("document.getElementById('question').textContent")
            assert "Shot 3 is the hero's entrance" in question
            # model, list_shots, model, 2 x read_frame, model, ...
            assert page.evaluate(ROWS) >= 6
            first_model = page.evaluate(
                "document.querySelector('#steps tr.model').innerText"
            )
            assert "model 1" in first_model and "$" in first_model
            # the frames read_frame returned, loaded from the web app (not broken images)
            images = "[...document.querySelectorAll('img.result')]"
            loaded = f"{images}.filter(i => i.complete && i.naturalWidth > 0).length"
            # wait_for returns the first truthy value
            page.wait_for(f"{loaded} >= 2", timeout=20)
            assert page.evaluate(loaded) >= 2
            assert page.evaluate("document.getElementById('budget').value") > 0
            page.evaluate(
                "document.getElementById('answer').value = 'Keep shot 3; trim shot 5 by a second.';"
                "document.getElementById('answer-form').requestSubmit(); true"
            )
            page.wait_for(
                "document.getElementById('status').textContent === 'done'", timeout=60
            )
            final = page.wait_for(
                "!document.getElementById('outcome').hidden && document.getElementById('final').textContent",
                timeout=20,
            )
            assert "Keep shot 3; trim shot 5 by a second." in final
            assert "from 6.0 s to 5.0 s" in final
            conversation = page.evaluate(
                "document.getElementById('messages').innerText"
            )
            # calls with inputs
            assert "read_frame" in conversation and '{"shot":3}' in conversation
            live_rows = page.evaluate(ROWS)
            models = (
                "[...document.querySelectorAll('#steps tr.model td:first-child')]"
                ".map(t => t.textContent)"
            )
            # across both segments
            assert page.evaluate(models) == [f"model {n}" for n in range(1, 6)]
            page.evaluate("window.scrollTo(0, 0); true")
            shot = page.screenshot(tmp_path / "viewer.png")
            assert shot.stat().st_size > 10_000
            # the server renders the same page (the cookie is set)
            page.navigate(f"{web}/runs/{run_id}")
            assert (
                page.evaluate(ROWS) == live_rows
                and page.evaluate(models)[-1] == "model 5"
            )
            assert (
                page.evaluate("document.getElementById('status').textContent") == "done"
            )
            # live under the policy, nothing blocked
            assert page.evaluate("window.cspViolations") == []
        finally:
            end(worker)
    status = httpx.get(f"{web}/runs/{run_id}", headers=AUTH, timeout=30).json()
    assert status["status"] == "done" and "Keep shot 3" in status["final_text"]
