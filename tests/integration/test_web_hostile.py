"""examples/web.py against hostile requests, as a real process with a real worker (the scripted model
of tests/integration/agents.py) and a real headless Chromium: the image route serves only a run's own
images (never /etc/passwd, never HTML), a page on another port of the same host cannot cancel,
approve or enqueue through the viewer's cookie, every body and field is refused one byte over its
limit (a chunked body while it is read), a resume past the end of a stream ends, and a decision
goes through while 100 event streams are open."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.storyboard.frames_png import frame_path
from examples.web import COOKIE, csrf_token
from tests.integration.conftest import Worker, own_redis, redis_in, start_worker
from tests.integration.runs_kit import eventually, spec
from tests.support.chromium import running_chromium
from tests.support.web import AUTH, WEB_TOKEN, serve_app, serve_web, web_env
from toolloop import ApprovalError
from workers.client import Client
from workers.client.ops import EventIdError
from workers.protocol.errors import LimitError

pytestmark = pytest.mark.integration

LIMITS = {
    "TOOLLOOP_MAX_SPEC_BYTES": "20000",
    "TOOLLOOP_MAX_ANSWER_BYTES": "1000",
    "TOOLLOOP_MAX_REASON_BYTES": "500",
    "TOOLLOOP_MAX_EDIT_BYTES": "1000",
    "TOOLLOOP_MAX_EARLY_DECISIONS": "3",
}
JSON = {"content-type": "application/json"}
PAST = "99999999999999-0"


@dataclass
class Site:
    url: str
    client: Client
    root: Path
    worker: Worker


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The web app (small limits, TOOLLOOP_WEB_IMAGE_ROOT set) and a scripted worker on a Redis of
    their own."""
    directory = tmp_path_factory.mktemp("web-hostile")
    root = directory / "images"
    root.mkdir()
    for server in own_redis(tmp_path_factory, "web-hostile-redis"):
        scripted = {
            "TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate",
            **LIMITS,
        }
        worker = start_worker(server.url, directory, scripted)
        client = Client(server.url)
        env = {**web_env(server.url), **LIMITS, "TOOLLOOP_WEB_IMAGE_ROOT": str(root)}
        try:
            for url in serve_web(env, directory / "web.log"):
                yield Site(url, client, root, worker)
        finally:
            client.close()
            worker.stop()


def held(client: Client, run_id: str) -> dict[str, Any]:
    status = client.wait(run_id, timeout=30)
    assert status.status == "asked" and status.approvals, status
    first: dict[str, Any] = status.approvals[0]
    return first


def asked(client: Client, run_id: str) -> None:
    status = client.wait(run_id, timeout=30)
    assert status.status == "asked" and status.asked, status


def image_spec(
    images: dict[str, tuple[str, str]], role: str = "user"
) -> dict[str, Any]:
    """A run spec whose first message names `images` (hash -> (path, mime type))."""
    parts = [{"type": "text", "text": "Look."}] + [
        {"type": "image", "path": path, "mime_type": mime, "hash": digest}
        for digest, (path, mime) in images.items()
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": parts}]
    if (
        role == "tool"
    ):  # a tool result the spec itself supplies: still the spec's, not a tool's
        call = {"id": "toolu_given", "name": "add", "input": {"a": 1, "b": 1}}
        messages = [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "toolu_given", "content": parts},
        ]
    return spec("ask", messages=messages)


# -- images ---------------------------------------------------------------------------------------


def test_images_are_only_the_runs_own_and_only_images(
    site: Site, tmp_path: Path
) -> None:
    png = frame_path(1).read_bytes()
    (site.root / "frame.png").write_bytes(png)
    (site.root / "page.html").write_text("<script>alert(document.cookie)</script>")
    (site.root / "page.png").write_text("<html><script>alert(1)</script></html>")
    (site.root / "passwd.png").symlink_to("/etc/passwd")
    os.mkfifo(site.root / "fifo.png")
    outside = tmp_path / "frame.png"
    outside.write_bytes(png)
    images = {
        "passwd": ("/etc/passwd", "image/png"),
        "html": (str(site.root / "page.html"), "text/html"),
        "html-as-png": (str(site.root / "page.png"), "image/png"),
        "link": (str(site.root / "passwd.png"), "image/png"),
        "dotdot": (f"{site.root}/../../../../../../etc/passwd", "image/png"),
        "fifo": (str(site.root / "fifo.png"), "image/png"),
        "outside": (str(outside), "image/png"),
        "frame": (
            str(site.root / "frame.png"),
            "text/html",
        ),  # a PNG the message calls HTML
    }
    run_id = site.client.enqueue(image_spec(images))
    given_as_tool = site.client.enqueue(
        image_spec({"frame": images["frame"], "outside": images["outside"]}, "tool")
    )
    with httpx.Client(base_url=site.url, headers=AUTH, timeout=10) as http:
        for digest in (
            "passwd",
            "html",
            "html-as-png",
            "link",
            "dotdot",
            "fifo",
            "outside",
        ):
            got = http.get(f"/runs/{run_id}/images/{digest}")
            assert got.status_code == 403, (digest, got.status_code, got.text)
            assert "not served" in got.json()["error"]
            assert got.headers["x-content-type-options"] == "nosniff"
        served = http.get(f"/runs/{run_id}/images/frame")
        assert served.status_code == 200 and served.content == png
        # what the bytes are, not what the message says
        assert served.headers["content-type"] == "image/png"
        assert served.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in served.headers["content-security-policy"]
        # under the root
        assert http.get(f"/runs/{given_as_tool}/images/frame").status_code == 200
        # a spec's "tool" image
        assert http.get(f"/runs/{given_as_tool}/images/outside").status_code == 403
        assert http.get(f"/runs/{run_id}/images/{'0' * 64}").status_code == 404
        # another run's
        assert http.get(f"/runs/{given_as_tool}/images/passwd").status_code == 404
    # without TOOLLOOP_WEB_IMAGE_ROOT no spec image is served at all
    from starlette.testclient import TestClient

    from examples.web import create_app
    from workers.client import AsyncClient

    app = create_app(
        AsyncClient(site.client.settings.redis_url), token=WEB_TOKEN, image_root=""
    )
    with TestClient(app, headers=AUTH) as http:
        off = http.get(f"/runs/{run_id}/images/frame")
        assert (
            off.status_code == 403 and "TOOLLOOP_WEB_IMAGE_ROOT" in off.json()["error"]
        )


# -- cross-site requests ---------------------------------------------------------------------------


def test_state_changes_need_a_header_token_or_the_cookies_csrf_token(
    site: Site,
) -> None:
    run_id = site.client.enqueue(spec("ask"))
    asked(site.client, run_id)
    cancel = f"{site.url}/runs/{run_id}/cancel"
    cookie = {COOKIE: WEB_TOKEN}
    with (
        httpx.Client(timeout=10) as http,
        httpx.Client(timeout=10, cookies=cookie) as browser,
    ):
        refused = browser.post(cancel, json={})
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"]
        wrong = browser.post(cancel, json={}, headers={"x-csrf-token": "0" * 64})
        assert wrong.status_code == 403
        other = {**AUTH, "origin": "http://127.0.0.1:1"}  # the same host, another port
        assert http.post(cancel, headers=other, json={}).status_code == 403
        assert (
            http.post(
                cancel, headers={**AUTH, "sec-fetch-site": "same-site"}, json={}
            ).status_code
            == 403
        )
        assert (
            http.post(cancel, headers={**AUTH, "origin": "null"}, json={}).status_code
            == 403
        )
        # ?token= opens pages only
        assert http.post(f"{cancel}?token={WEB_TOKEN}", json={}).status_code == 401
        plain = http.post(
            cancel, headers={**AUTH, "content-type": "text/plain"}, content=b"{}"
        )
        assert plain.status_code == 415 and "application/json" in plain.json()["error"]
        # a read through the cookie from another site's page (an <img>, a no-cors fetch): refused
        peek = {"sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors"}
        assert browser.get(f"{site.url}/runs/{run_id}", headers=peek).status_code == 403
        # nothing above cancelled it
        assert site.client.status(run_id).status == "asked"
        token = csrf_token(WEB_TOKEN, WEB_TOKEN)
        same = {
            "x-csrf-token": token,
            "origin": site.url,
            "sec-fetch-site": "same-origin",
        }
        assert browser.post(cancel, json={}, headers=same).status_code == 202
    assert site.client.wait(run_id, timeout=30).status == "cancel"


def test_the_follow_up_steer_and_interrupt_routes_are_guarded_as_the_others(
    site: Site,
) -> None:
    run_id = site.client.enqueue(spec("ask"))
    asked(site.client, run_id)
    cookie = {COOKIE: WEB_TOKEN}
    paths = [
        f"{site.url}/runs/{run_id}/{name}"
        for name in ("messages", "steer", "interrupt")
    ]
    with (
        httpx.Client(timeout=10) as http,
        httpx.Client(timeout=10, cookies=cookie) as browser,
    ):
        for path in paths:
            body = {"content": "the blue one"}
            # the cookie alone: no CSRF token
            assert browser.post(path, json=body).status_code == 403
            assert (
                http.post(
                    path, json=body, headers={**AUTH, "origin": "http://127.0.0.1:1"}
                ).status_code
                == 403
            )
            assert (
                http.post(
                    path, json=body, headers={**AUTH, "sec-fetch-site": "cross-site"}
                ).status_code
                == 403
            )
            plain = http.post(
                path, headers={**AUTH, "content-type": "text/plain"}, content=b"{}"
            )
            assert plain.status_code == 415
        # nothing above reached the run
        assert site.client.status(run_id).status == "asked"
        steer = http.post(paths[1], json={"content": "x"}, headers=AUTH)
        assert (
            steer.status_code == 409 and "waits for an answer" in steer.json()["error"]
        )
        sent = http.post(
            paths[0],
            json={"content": "the blue one"},
            headers={**AUTH, "idempotency-key": "m1"},
        )
        assert sent.status_code == 202 and sent.json() == {
            "what": "answered",
            "segment": 1,
        }
        again = http.post(
            paths[0],
            json={"content": "the blue one"},
            headers={**AUTH, "idempotency-key": "m1"},
        )
        # a keyed repeat: the first one's outcome, nothing sent
        assert again.json() == sent.json()


ATTACK = """(async () => {
  const post = async (path, body, type, mode) => {
    try {
      const r = await fetch(WEB + path, { method: "POST", mode, credentials: "include",
        headers: { "content-type": type }, body });
      return r.type + " " + r.status;
    } catch (e) { return "refused by the browser: " + e.message; }
  };
  return {
    cancel: await post(`/runs/${CANCEL_RUN}/cancel`, "{}", "text/plain", "no-cors"),
    approve: await post(`/runs/${HELD_RUN}/approvals/${CALL}/approve`, "{}", "text/plain", "no-cors"),
    enqueue: await post("/runs", JSON.stringify(SPEC), "text/plain", "no-cors"),
    json: await post(`/runs/${CANCEL_RUN}/cancel`, "{}", "application/json", "cors"),
  };
})()"""


def test_a_page_on_another_port_cannot_cancel_approve_or_enqueue(
    site: Site, tmp_path: Path
) -> None:
    held_run = site.client.enqueue(spec("approve"))
    call = held(site.client, held_run)
    cancel_run = site.client.enqueue(spec("ask"))
    asked(site.client, cancel_run)
    before = len(site.client.list_runs(limit=500).runs)
    with serve_app(
        "<!doctype html><title>elsewhere</title><p>a page of another app"
    ) as attacker:
        # the same host, another port
        assert attacker.split(":")[-1] != site.url.split(":")[-1]
        with running_chromium(tmp_path) as page:
            # the viewer: its cookie is set
            page.navigate(f"{site.url}/runs/{held_run}?token={WEB_TOKEN}")
            assert page.evaluate("document.querySelectorAll('#held .held').length") == 1
            page.navigate(attacker)
            values = {
                "WEB": site.url,
                "CANCEL_RUN": cancel_run,
                "HELD_RUN": held_run,
                "CALL": call["call_id"],
                "SPEC": spec("tools", "1 2"),
            }
            prelude = "".join(
                f"const {name} = {json.dumps(value)};\n"
                for name, value in values.items()
            )
            tried = page.evaluate(prelude + ATTACK)
            # no CORS: the preflight fails
            assert tried["json"].startswith("refused by the browser")
            page.evaluate(  # and a plain form post, the oldest way
                "const f = document.createElement('form'); f.method = 'POST'; f.enctype = 'text/plain';"
                f"f.action = {json.dumps(site.url + '/runs/' + cancel_run + '/cancel')};"
                "const i = document.createElement('input'); i.name = '{\"a'; i.value = '\":1}';"
                "f.appendChild(i); document.body.appendChild(f); f.submit(); true"
            )
            shown = settled(
                page,
                f"location.href.startsWith({json.dumps(site.url)}) && document.body.innerText",
            )
            assert "another origin" in shown
            time.sleep(1)  # a decision or cancel that got through would show by now
            assert site.client.status(cancel_run).status == "asked", tried
            assert site.client.status(held_run).approvals == [call], tried
            assert len(site.client.list_runs(limit=500).runs) == before, tried
            # the viewer itself (its own origin, its CSRF token) still decides
            page.navigate(f"{site.url}/runs/{held_run}")
            row = "document.querySelector('#held .held')"
            page.evaluate(f"{row}.querySelector('[data-action=approve]').click(); true")
            # its reply's line, also when the decision's event reached the page first
            line = f"{row}.querySelector('.decided').textContent"
            decided = page.wait_for(
                f"{line} === 'approve: resumed' && {line}", timeout=20
            )
            assert decided == "approve: resumed", page.evaluate(line)
    assert site.client.wait(held_run, timeout=30).status == "done"


def settled(page: Any, expression: str, timeout: float = 20) -> Any:
    """`page.wait_for`, through a navigation (an evaluation in the page that goes away fails)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = page.evaluate(expression)
        except (
            AssertionError
        ):  # the old page's context is gone, the new one not there yet
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, (
            f"not true in the page within {timeout:g} s: {expression}"
        )
        time.sleep(0.1)


# -- limits -----------------------------------------------------------------------------------------


def chunked_post(url: str, path: str, size: int, timeout: float = 10) -> str:
    """POST `size` bytes of a chunked JSON body to `path` and, without sending its last chunk, the
    status line the server answers with (it must answer before the body ends)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {AUTH['Authorization']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        conn.sendall(head.encode())
        sent = 0
        while sent < size:
            chunk = b"[" * min(65536, size - sent)
            conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        # times out if the server waits for the end
        reply = conn.recv(65536).decode(errors="replace")
    return reply.splitlines()[0] if reply else ""


def test_each_body_and_field_is_refused_one_byte_over_its_limit(site: Site) -> None:
    spec_limit, answer_limit, reason_limit, edit_limit = 20000, 1000, 500, 1000
    ask_run = site.client.enqueue(spec("ask"))
    asked(site.client, ask_run)
    approve_run = site.client.enqueue(spec("approve"))
    call = held(site.client, approve_run)
    decide = f"/runs/{approve_run}/approvals/{call['call_id']}"
    with httpx.Client(base_url=site.url, headers=AUTH, timeout=30) as http:
        # the run spec: declared, and chunked (refused while it is read, before it ends)
        at_limit = http.post(
            "/runs", content=b'"' + b"a" * (spec_limit - 2) + b'"', headers=JSON
        )
        # read whole, then refused as a spec: not a size
        assert at_limit.status_code == 422
        over = http.post("/runs", content=b" " * (spec_limit + 1), headers=JSON)
        assert (
            over.status_code == 413
            and "TOOLLOOP_MAX_SPEC_BYTES" in over.json()["error"]
        )
        assert (
            chunked_post(site.url, "/runs", spec_limit + 1)
            == "HTTP/1.1 413 Request Entity Too Large"
        )
        assert chunked_post(site.url, "/runs", 300_000_000, timeout=20).startswith(
            "HTTP/1.1 413"
        )
        # an answer: the field, then the body
        big = http.post(
            f"/runs/{ask_run}/answer", json={"content": "a" * (answer_limit + 1)}
        )
        assert (
            big.status_code == 413
            and "TOOLLOOP_MAX_ANSWER_BYTES" in big.json()["error"]
        )
        body_limit = 2 * answer_limit + 4096
        padded = b'{"content": "a", "pad": "' + b"x" * (body_limit - 26) + b'"}'
        assert len(padded) == body_limit + 1
        assert (
            http.post(
                f"/runs/{ask_run}/answer", content=padded, headers=JSON
            ).status_code
            == 413
        )
        assert (
            http.post(
                f"/runs/{ask_run}/answer",
                json={"content": "é" * (answer_limit // 2 + 1)},
            ).status_code
            == 413
        )
        # a reason, an edit, an actor, the decision's body, cancel's body
        reason = http.post(
            f"{decide}/reject", json={"reason": "r" * (reason_limit + 1)}
        )
        assert (
            reason.status_code == 413
            and "TOOLLOOP_MAX_REASON_BYTES" in reason.json()["error"]
        )
        edit = http.post(
            f"{decide}/edit", json={"input": {"a": "x" * (edit_limit - 8 + 1)}}
        )
        assert (
            edit.status_code == 413
            and "TOOLLOOP_MAX_EDIT_BYTES" in edit.json()["error"]
        )
        actor = http.post(f"{decide}/approve", json={"actor": "x" * 257})
        assert actor.status_code == 413 and "actor" in actor.json()["error"]
        decision_limit = 2 * max(edit_limit, reason_limit) + 4096
        assert (
            http.post(
                f"{decide}/approve", content=b" " * (decision_limit + 1), headers=JSON
            ).status_code
            == 413
        )
        assert (
            http.post(
                f"/runs/{ask_run}/cancel", content=b" " * 4097, headers=JSON
            ).status_code
            == 413
        )
        # none of it reached the run
        assert site.client.status(approve_run).approvals == [call]
        assert site.client.status(ask_run).status == "asked"
        # at the limits, each goes through
        exact = http.post(
            f"/runs/{ask_run}/answer", json={"content": "a" * answer_limit}
        )
        assert exact.status_code == 202, exact.text
        done = http.post(f"{decide}/reject", json={"reason": "r" * reason_limit})
        assert done.status_code == 200 and done.json() == {"outcome": "resumed"}
    assert (
        site.client.wait(ask_run, timeout=30).final_text
        == "You said: " + "a" * answer_limit
    )
    assert site.client.wait(approve_run, timeout=30).status == "done"
    # the same limits hold for Client users (this process has the defaults)
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_ANSWER_BYTES"):
        site.client.answer(ask_run, "a" * (100_000 + 1))
    with pytest.raises(LimitError, match="TOOLLOOP_MAX_REASON_BYTES"):
        site.client.reject(approve_run, call["call_id"], "r" * (10_000 + 1))


def test_decisions_for_calls_a_run_has_not_made_are_bounded(
    site: Site, tmp_path: Path
) -> None:
    # the run holds at its gate, running, until the test opens it
    gate = tmp_path / "open"
    run_id = site.client.enqueue(spec("approve_gated", str(gate)))
    eventually(lambda: [e for e in site.client.events(run_id) if e.kind == "model"])
    with httpx.Client(base_url=site.url, headers=AUTH, timeout=30) as http:
        for n in range(3):
            kept = http.post(f"/runs/{run_id}/approvals/nope-{n}/approve", json={})
            assert kept.status_code == 200 and kept.json() == {"outcome": "kept"}, (
                kept.text
            )
        again = http.post(f"/runs/{run_id}/approvals/nope-0/approve", json={})
        # not one more
        assert again.status_code == 409 and "decided already" in again.json()["error"]
        fourth = http.post(f"/runs/{run_id}/approvals/nope-3/approve", json={})
        assert (
            fourth.status_code == 409
            and "TOOLLOOP_MAX_EARLY_DECISIONS" in fourth.json()["error"]
        )
    with pytest.raises(ApprovalError, match="TOOLLOOP_MAX_EARLY_DECISIONS"):
        # the workers' limit: Client users get it too
        site.client.approve(run_id, "nope-4")
    gate.touch()
    call = held(site.client, run_id)
    # the run's own call still decides
    assert site.client.approve(run_id, call["call_id"]) == "resumed"
    assert site.client.wait(run_id, timeout=30).status == "done"


def test_decisions_waiting_for_a_worker_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLLOOP_MAX_EARLY_DECISIONS", "2")
    for server in redis_in(tmp_path):  # no worker: decisions stay in the run's inbox
        client = Client(server.url)
        try:
            run_id = client.enqueue(spec("approve"))
            for n in range(2):
                assert client.approve(run_id, f"call-{n}", wait_s=0) == "queued"
            with pytest.raises(
                LimitError, match=r"2 decisions on run .* wait for a worker already"
            ):
                client.approve(run_id, "call-2", wait_s=0)
        finally:
            client.close()


# -- streams ----------------------------------------------------------------------------------------


def test_a_resume_past_the_end_ends_with_a_clear_error(site: Site) -> None:
    run_id = site.client.enqueue(spec("ask"))
    # not ended: a follow would wait for entries that never come
    asked(site.client, run_id)
    last = list(site.client.events(run_id))[-1].id
    with httpx.Client(base_url=site.url, headers=AUTH, timeout=10) as http:
        past = http.get(f"/runs/{run_id}/events", headers={"last-event-id": PAST})
        assert (
            past.status_code == 400
            and f"past the end of run {run_id!r}'s events" in past.json()["error"]
        )
        assert last in past.json()["error"]
        assert (
            http.get(f"/runs/{run_id}/events", params={"after": PAST}).status_code
            == 400
        )
        bad = http.get(f"/runs/{run_id}/events", headers={"last-event-id": "abc"})
        assert bad.status_code == 400 and "is not an event id" in bad.json()["error"]
        with http.stream(
            "GET", f"/runs/{run_id}/events", headers={"last-event-id": last}
        ) as live:
            # the last id itself: a stream that waits for more
            assert live.status_code == 200
        site.client.answer(run_id, "Shot 3.")
        assert site.client.wait(run_id, timeout=30).status == "done"
        ended = http.get(f"/runs/{run_id}/events", headers={"last-event-id": PAST})
        assert ended.status_code == 400
    with pytest.raises(EventIdError, match="past the end"):
        list(site.client.events(run_id, after=PAST, follow=True))


def test_a_decision_goes_through_with_100_event_streams_open(site: Site) -> None:
    held_run = site.client.enqueue(spec("approve"))
    call = held(site.client, held_run)
    watched = site.client.enqueue(spec("ask"))
    asked(site.client, watched)

    async def main() -> httpx.Response:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=site.url, headers=AUTH, timeout=60, limits=limits
        ) as http:
            opened = asyncio.Event()
            reading = 0

            async def follow() -> None:
                nonlocal reading
                async with http.stream("GET", f"/runs/{watched}/events") as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith(
                            "event: parked"
                        ):  # read to the end: blocked in XREAD now
                            reading += 1
                            if reading == 100:
                                opened.set()

            streams = [asyncio.create_task(follow()) for _ in range(100)]
            await asyncio.wait_for(opened.wait(), 60)
            await asyncio.sleep(1.5)  # every stream in its blocking read
            try:
                return await http.post(
                    f"/runs/{held_run}/approvals/{call['call_id']}/approve",
                    json={"digest": call["input_digest"]},
                )
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)

    decided = asyncio.run(main())
    assert decided.status_code == 200 and decided.json() == {"outcome": "resumed"}, (
        decided.text
    )
    assert site.client.wait(held_run, timeout=30).status == "done"
