"""The run viewer: the page `GET /runs/{id}` of examples/web.py shows in a browser.

Structure (one module: the page is server-rendered here, and the small vanilla script below keeps
it live; no framework, no build step):

    <header id="run">         run id, status badge (#status), model, the budget gauge (#budget:
                              a <meter> of spent / budget_usd, with #spent)
    <section id="steps">      a table, one row per step (#steps tbody): model rows with tokens in,
                              cache reads, tokens out and cost; tool rows with the tool, its cost
                              and its summary
    <section id="conversation">  the conversation as a person reads it (#messages): user text,
                              assistant text, tool calls with their inputs, tool results with their
                              images (served by GET /runs/{id}/images/{hash})
    <section id="ask">        the answer form (#answer-form), shown while the run asks (status
                              "asked"); it POSTs {"content": ...} to /runs/{id}/answer
    <section id="approvals">  the held tool calls while the run waits for decisions: per call its
                              tool, input and digest, and Approve / Reject (with a reason) / Edit
                              (the input as JSON) buttons; each POSTs {digest, reason | input} to
                              /runs/{id}/approvals/{call}/approve|reject|edit and shows the outcome
    <section id="outcome">    the final text or the error, once the run has ended

Data: the server renders the status, the events so far and the conversation (GET /runs/{id}/messages
is the same list as JSON). Then the script reads the event stream, GET /runs/{id}/events?after=<id of
the last rendered event> (server-sent events: `event:` the kind, `data:` the event as JSON with seq
and segment, `id:` the stream id, so a reconnect resumes after it). The kinds it handles:

    queued     {model, toolset, budget_usd}            the gauge's limit
    model      {step, text, tool_calls, cost_usd, usage}  a step row; the assistant's turn
    tool       {step, name, call_id, cost_usd, summary}   a step row; the tool's summary
    budget     {spent_usd, limit_usd, mode, account?}   the gauge; `account` (name, period, limit):
                                                      the shared account whose limit stopped the run
    compaction {step, covered_turns, cost_usd, input_tokens}  a step row: where requests start over
    parked     {asked: {question, ...}, spent_usd}     status "asked", the form, the conversation
                                                      reloaded (tool results with their images)
               {approvals: [{call_id, name, input, input_digest, ...}]}  the approvals section
    approval_decided / approval_expired {call_id, ...}  that call's row says what was decided
    answered / resumed                                 the form hides, status "running"
    finished   {stopped_by, final_text, spent_usd}     the outcome, the conversation reloaded
    failed     {error_class, error_message}            the outcome

To extend it (approvals, streamed text): add a section to `page()` and a handler to the script's
`handlers` table (`approval: (data) => {...}`): the stream subscribes to every kind the table names
when the page loads, and kinds it does not name are ignored. Requests carry the viewer's cookie (set from `?token=` by examples/web.py),
and its POSTs the page's CSRF token (X-CSRF-Token). The page runs under `CSP`: keep code in SCRIPT
(no inline handlers, no second inline script) and the page's data in the JSON block BOOT reads.
"""

# ruff: noqa: E501  (the page's HTML, style and script read better unwrapped)
from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
from typing import Any

from toolloop.cli.render import account_text
from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ImagePart,
    TextPart,
    ToolMessage,
    UserMessage,
)
from workers.protocol.records import FINAL


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def money(usd: float) -> str:
    return f"${usd:.4f}"


def step_row(data: dict[str, Any], number: int = 0) -> str:
    """One row of the steps table (the script builds the same markup: `stepRow`). Model steps are
    numbered across the run's segments (`number`), as `toolloop events` numbers them."""
    if data.get("kind") == "model":
        usage = data.get("usage") or {}
        calls = ", ".join(
            call.get("name", "?") for call in data.get("tool_calls") or []
        )
        return (
            f'<tr class="model"><td>model {number or esc(data.get("step", ""))}</td>'
            f'<td class="n">{int(usage.get("prompt_tokens", 0)):,}</td>'
            f'<td class="n">{int(usage.get("cached_tokens", 0)):,}</td>'
            f'<td class="n">{int(usage.get("completion_tokens", 0)):,}</td>'
            f'<td class="n">{money(float(data.get("cost_usd", 0)))}</td>'
            f"<td>{esc('→ ' + calls if calls else (data.get('text') or '')[:80])}</td></tr>"
        )
    if (
        data.get("kind") == "compaction"
    ):  # docs/context.md: where the requests start over
        return (
            f'<tr class="compaction"><td>compaction</td>'
            f'<td class="n">{int(data.get("input_tokens", 0)):,}</td><td></td><td></td>'
            f'<td class="n">{money(float(data.get("cost_usd", 0)))}</td>'
            f"<td>turns 1-{int(data.get('covered_turns', 0))} summarized</td></tr>"
        )
    return (
        f'<tr class="tool"><td>tool {esc(data.get("name", ""))}</td><td></td><td></td><td></td>'
        f'<td class="n">{money(float(data.get("cost_usd", 0)))}</td>'
        f"<td>{esc((data.get('summary') or '')[:120])}</td></tr>"
    )


def _parts(run_id: str, content: str | list[Any]) -> str:
    if isinstance(content, str):
        return f'<p class="text">{esc(content)}</p>'
    out = []
    for part in content:
        if isinstance(part, TextPart):
            out.append(f'<p class="text">{esc(part.text)}</p>')
        elif isinstance(part, ImagePart):
            out.append(
                f'<img class="result" alt="tool result image" src="/runs/{esc(run_id)}/images/{esc(part.hash)}">'
            )
    return "".join(out)


def messages_html(run_id: str, messages: list[ChatMessage]) -> str:
    """The conversation as a person reads it (the script renders the same from /messages JSON)."""
    out = []
    for message in messages:
        if isinstance(message, UserMessage):
            out.append(
                f'<div class="msg user"><b>user</b>{_parts(run_id, message.content)}</div>'
            )
        elif isinstance(message, AssistantMessage):
            calls = "".join(
                f'<div class="call"><code>{esc(call.name)}</code> <code>{esc(json.dumps(call.input, separators=(",", ":")))}</code></div>'
                for call in message.tool_calls or []
            )
            text = (
                f'<p class="text">{esc(message.content)}</p>' if message.content else ""
            )
            out.append(
                f'<div class="msg assistant"><b>assistant</b>{text}{calls}</div>'
            )
        elif isinstance(message, ToolMessage):
            out.append(
                f'<div class="msg tool"><b>tool result</b>{_parts(run_id, message.content)}</div>'
            )
    return "".join(out)


def approval_html(call: dict[str, Any]) -> str:
    """One held call: its tool and input, and the three decisions (the script sends them)."""
    text = json.dumps(call.get("input"), separators=(",", ":"))
    return f"""<div class="held" data-call="{esc(call.get("call_id"))}" data-digest="{esc(call.get("input_digest"))}">
<p><code>{esc(call.get("name"))}</code> <code class="input">{esc(text)}</code>
<small>call {esc(call.get("call_id"))} · {money(float(call.get("estimate_usd") or 0))} estimated</small></p>
<button type="button" data-action="approve">Approve</button>
<input class="reason" placeholder="reason to reject" size="30"> <button type="button" data-action="reject">Reject</button>
<textarea class="edit" rows="2" cols="50">{esc(text)}</textarea> <button type="button" data-action="edit">Edit and run</button>
<p class="decided"></p></div>"""


def child_row(node: dict[str, Any]) -> str:
    """One run below the page's run: a link to its own page, its status, spend and budget slice."""
    run_id = str(node.get("run_id", ""))
    budget = node.get("budget_usd")
    asked = node.get("asked") or {}
    return (
        f'<tr><td><a href="/runs/{esc(run_id)}"><code>{esc(run_id)}</code></a></td>'
        f'<td><span class="badge {esc(node.get("status"))}">{esc(node.get("status"))}</span></td>'
        f"<td>{money(float(node.get('spent_usd') or 0))}</td>"
        f"<td>{money(float(budget)) if budget is not None else ''}</td>"
        f"<td>{esc(asked.get('question', '')) if isinstance(asked, dict) else ''}</td></tr>"
    )


def page(
    run_id: str,
    status: dict[str, Any],
    events: list[dict[str, Any]],
    messages: list[ChatMessage],
    *,
    csrf: str = "",
    children: list[dict[str, Any]] | None = None,
) -> str:
    """The whole page: the run as it is now, and the script that keeps it live. `csrf`: the token its
    POSTs send as X-CSRF-Token (examples/web.py). The data the script boots from is a JSON block, not
    code, so the script is the same on every page and `CSP` allows it by its hash. `children`: the
    runs below this one (`Client.tree` past its first row, docs/children.md), each a link to its page."""
    queued = next((e for e in events if e.get("kind") == "queued"), {})
    limit = float(queued.get("budget_usd") or 0)
    spent = float(status.get("spent_usd") or 0)
    state = str(status.get("status", ""))
    shown = [e for e in events if e.get("kind") in ("model", "tool", "compaction")]
    numbers = itertools.accumulate(1 if e.get("kind") == "model" else 0 for e in shown)
    rows = "".join(step_row(e, n) for e, n in zip(shown, numbers, strict=True))
    asked = status.get("asked") or {}
    question = (
        asked.get("question", json.dumps(asked))
        if isinstance(asked, dict)
        else str(asked)
    )
    held = status.get("approvals") or [] if state == "asked" else []
    # its own question, or a child's
    asks = (state == "asked" and not held) or bool(status.get("asking"))
    outcome = ""
    if state == "failed":
        outcome = (
            f"{esc(status.get('error_class'))}: {esc(status.get('error_message'))}"
        )
    elif state in FINAL:
        outcome = esc(status.get("final_text") or f"stopped: {state}")
        if status.get(
            "account_stop"
        ):  # the shared account's limit stopped it: say which and how
            outcome = f'{outcome}<br><span id="account-stop">{esc(account_text(status["account_stop"]))}</span>'
    boot = {
        "runId": run_id,
        "after": events[-1]["id"] if events else "",
        "limit": limit,
        "status": state,
        "final": sorted(FINAL),
        "csrf": csrf,
    }
    data = (
        json.dumps(boot)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>run {esc(run_id[:12])} · toolloop</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{STYLE}</style></head>
<body>
<header id="run">
  <h1>run <code>{esc(run_id)}</code> <span id="status" class="badge {esc(state)}">{esc(state)}</span></h1>
  <p>model <code>{esc(queued.get("model", ""))}</code> · toolset <code>{esc(queued.get("toolset", ""))}</code></p>
  <p class="gauge">budget <meter id="budget" min="0" max="{limit or 1}" value="{min(spent, limit or 1)}"></meter>
    <span id="spent">{money(spent)}</span> of <span id="limit">{money(limit)}</span></p>
</header>
<section id="steps"><h2>Steps</h2>
<table><thead><tr><th>step</th><th>in</th><th>cache reads</th><th>out</th><th>cost</th><th></th></tr></thead>
<tbody>{rows}</tbody></table></section>
<section id="children" {"" if children else "hidden"}><h2>Child runs</h2>
<table><thead><tr><th>run</th><th>status</th><th>spent</th><th>budget</th><th></th></tr></thead>
<tbody>{"".join(child_row(c) for c in children or [])}</tbody></table></section>
<section id="ask" {"" if asks else "hidden"}><h2>{"A child run asks" if status.get("asking") else "The run asks"}</h2>
<p id="question">{esc(question)}</p>
<form id="answer-form"><input id="answer" name="content" autocomplete="off" size="60" required>
<button type="submit">Answer</button></form></section>
<section id="approvals" {"" if held else "hidden"}><h2>Waiting for your decision</h2>
<div id="held">{"".join(approval_html(call) for call in held)}</div></section>
<section id="outcome" {"" if outcome else "hidden"}><h2>Outcome</h2><p id="final">{outcome}</p></section>
<section id="conversation"><h2>Conversation</h2><div id="messages">{messages_html(run_id, messages)}</div></section>
<script type="application/json" id="boot">{data}</script>
<script>{SCRIPT}</script>
</body></html>"""


STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5rem auto; max-width: 60rem; color: #1d2330; }
h1 { font-size: 1.25rem; } h2 { font-size: 1.05rem; margin-top: 1.5rem; }
code { font-size: 0.9em; }
.badge { padding: 0.1rem 0.5rem; border-radius: 0.6rem; background: #dde3ee; font-size: 0.85rem; }
.badge.done { background: #c8ecd0; } .badge.failed { background: #f6c9c9; }
.badge.asked { background: #fde7a9; } .badge.running { background: #cfe0fb; }
meter { width: 16rem; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 0.2rem 0.5rem; border-bottom: 1px solid #e4e7ee; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.tool td:first-child { color: #6a4c00; }
.msg { border-left: 3px solid #c5cbd8; padding: 0.2rem 0.8rem; margin: 0.6rem 0; }
.msg.user { border-color: #6b8fd6; } .msg.assistant { border-color: #54a36b; }
.msg.tool { border-color: #c99a2e; }
.msg p { margin: 0.2rem 0; white-space: pre-wrap; }
.call code { background: #f1f3f7; padding: 0 0.25rem; }
img.result { max-width: 18rem; border: 1px solid #ccd; margin: 0.3rem 0.3rem 0 0; }
#approvals .held { background: #eef4ff; padding: 0.4rem 1rem; border-radius: 0.4rem; margin: 0.5rem 0; }
#ask { background: #fff8e1; padding: 0.5rem 1rem; border-radius: 0.4rem; }
"""

SCRIPT = r"""
"use strict";
const BOOT = JSON.parse(document.getElementById("boot").textContent);
const SEND = { "content-type": "application/json", "x-csrf-token": BOOT.csrf };
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
const money = (x) => "$" + Number(x || 0).toFixed(4);
const num = (x) => Number(x || 0).toLocaleString("en-US");
let spent = 0, limit = BOOT.limit, accountStop = "";
function accountText(a) {  // as toolloop.cli.render.account_text says it
  const per = a.period === "total" ? "in total" : "per " + a.period;
  const when = a.period === "total" ? "" : a.period_id + ": ";
  return `account ${a.name} reached its limit of $${Number(a.limit_usd || 0).toFixed(2)} ${per} (${when}${money(a.spent_usd)} spent)`;
}

let holding = document.querySelectorAll("#held .held").length > 0;
function setStatus(state) {
  const badge = $("status"); badge.textContent = state; badge.className = "badge " + state;
  $("ask").hidden = state !== "asked" || holding;
  if (state !== "asked") { holding = false; $("approvals").hidden = true; }
}
function heldRow(a) {
  const text = esc(JSON.stringify(a.input));
  return `<div class="held" data-call="${esc(a.call_id)}" data-digest="${esc(a.input_digest)}">` +
    `<p><code>${esc(a.name)}</code> <code class="input">${text}</code> <small>call ${esc(a.call_id)} · ` +
    `${money(a.estimate_usd)} estimated</small></p>` +
    `<button type="button" data-action="approve">Approve</button> ` +
    `<input class="reason" placeholder="reason to reject" size="30"> <button type="button" data-action="reject">Reject</button> ` +
    `<textarea class="edit" rows="2" cols="50">${text}</textarea> <button type="button" data-action="edit">Edit and run</button>` +
    `<p class="decided"></p></div>`;
}
function decided(callId, text, event = false) {
  // a decided (or queued) call offers no more decisions: its controls go, what was decided stays;
  // the `event` of a decision this page sent leaves the line to its reply (which says more:
  // "approve: resumed"), whichever of the two comes first
  const row = document.querySelector(`#held .held[data-call="${CSS.escape(callId)}"]`);
  if (row) {
    if (!(event && row.dataset.deciding)) row.querySelector(".decided").textContent = text;
    row.querySelectorAll("button, input, textarea").forEach((control) => control.remove());
  }
}
function gauge(total) {
  spent = Math.max(spent, total);
  $("spent").textContent = money(spent); $("limit").textContent = money(limit);
  const meter = $("budget"); meter.max = limit || 1; meter.value = Math.min(spent, limit || 1);
}
let models = document.querySelectorAll("#steps tr.model").length;
function stepRow(d) {
  if (d.kind === "model") {
    const u = d.usage || {}, calls = (d.tool_calls || []).map((c) => c.name).join(", ");
    models += 1;
    return `<tr class="model"><td>model ${models}</td><td class="n">${num(u.prompt_tokens)}</td>` +
      `<td class="n">${num(u.cached_tokens)}</td><td class="n">${num(u.completion_tokens)}</td>` +
      `<td class="n">${money(d.cost_usd)}</td><td>${esc(calls ? "→ " + calls : (d.text || "").slice(0, 80))}</td></tr>`;
  }
  if (d.kind === "compaction") {
    return `<tr class="compaction"><td>compaction</td><td class="n">${num(d.input_tokens)}</td><td></td><td></td>` +
      `<td class="n">${money(d.cost_usd)}</td><td>turns 1-${num(d.covered_turns)} summarized</td></tr>`;
  }
  return `<tr class="tool"><td>tool ${esc(d.name)}</td><td></td><td></td><td></td>` +
    `<td class="n">${money(d.cost_usd)}</td><td>${esc((d.summary || "").slice(0, 120))}</td></tr>`;
}
function parts(content) {
  if (typeof content === "string") return `<p class="text">${esc(content)}</p>`;
  return content.map((p) => p.type === "image"
    ? `<img class="result" alt="tool result image" src="/runs/${esc(BOOT.runId)}/images/${esc(p.hash)}">`
    : `<p class="text">${esc(p.text)}</p>`).join("");
}
function message(m) {
  if (m.role === "user") return `<div class="msg user"><b>user</b>${parts(m.content)}</div>`;
  if (m.role === "tool") return `<div class="msg tool"><b>tool result</b>${parts(m.content)}</div>`;
  const calls = (m.tool_calls || []).map((c) =>
    `<div class="call"><code>${esc(c.name)}</code> <code>${esc(JSON.stringify(c.input))}</code></div>`).join("");
  return `<div class="msg assistant"><b>assistant</b>${m.content ? `<p class="text">${esc(m.content)}</p>` : ""}${calls}</div>`;
}
async function reloadConversation() {
  const r = await fetch(`/runs/${BOOT.runId}/messages`, { credentials: "same-origin" });
  if (r.ok) $("messages").innerHTML = (await r.json()).map(message).join("");
}
function appendLive(m) { $("messages").insertAdjacentHTML("beforeend", message(m)); }

const handlers = {
  queued: (d) => { if (d.budget_usd) { limit = d.budget_usd; gauge(spent); } if (d.retry) setStatus("queued"); },
  model: (d) => {
    $("steps").querySelector("tbody").insertAdjacentHTML("beforeend", stepRow(d));
    appendLive({ role: "assistant", content: d.text, tool_calls: d.tool_calls });
    gauge(spent + Number(d.cost_usd || 0)); setStatus("running");
  },
  tool: (d) => {
    $("steps").querySelector("tbody").insertAdjacentHTML("beforeend", stepRow(d));
    appendLive({ role: "tool", content: d.summary || "" });
    gauge(spent + Number(d.cost_usd || 0));
  },
  budget: (d) => { limit = d.limit_usd || limit; gauge(d.spent_usd); if (d.account) accountStop = accountText(d.account); },
  compaction: (d) => {
    $("steps").querySelector("tbody").insertAdjacentHTML("beforeend", stepRow(d));
    gauge(spent + Number(d.cost_usd || 0));
  },
  parked: (d) => {
    if (d.approvals) {
      holding = true; $("held").innerHTML = d.approvals.map(heldRow).join(""); $("approvals").hidden = false;
    } else {
      holding = false; const a = d.asked || {}; $("question").textContent = a.question || JSON.stringify(a);
    }
    gauge(d.spent_usd || spent); setStatus("asked"); reloadConversation();
  },
  approval_decided: (d) => decided(d.call_id, `decided: ${d.decision || d.action || "done"}${d.actor ? " by " + d.actor : ""}`, true),
  approval_expired: (d) => decided(d.call_id, "no decision before the deadline"),
  answered: () => { $("ask").hidden = true; },
  resumed: () => setStatus("running"),
  finished: (d) => {
    setStatus(d.stopped_by || "done"); gauge(d.spent_usd || spent);
    $("final").textContent = d.final_text || "stopped: " + d.stopped_by; $("outcome").hidden = false;
    const stop = d.account ? accountText(d.account) : accountStop;
    if (stop) { const why = document.createElement("span"); why.id = "account-stop"; why.textContent = stop;
      $("final").append(document.createElement("br"), why); }
    reloadConversation();
  },
  failed: (d) => {
    setStatus("failed"); $("final").textContent = `${d.error_class}: ${d.error_message}`;
    $("outcome").hidden = false;
  },
};

$("answer-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const content = $("answer").value.trim(); if (!content) return;
  const r = await fetch(`/runs/${BOOT.runId}/answer`, {
    method: "POST", credentials: "same-origin", headers: SEND,
    body: JSON.stringify({ content }),
  });
  if (r.ok) { $("answer").value = ""; $("ask").hidden = true; }
  else { $("question").textContent = (await r.json()).error || "The answer was refused."; }
});

$("held").addEventListener("click", async (ev) => {
  const button = ev.target.closest("button[data-action]"); if (!button) return;
  const row = button.closest(".held"), action = button.dataset.action;
  const body = { digest: row.dataset.digest };
  if (action === "reject") body.reason = row.querySelector(".reason").value.trim();
  if (action === "edit") {
    try { body.input = JSON.parse(row.querySelector(".edit").value); }
    catch (e) { row.querySelector(".decided").textContent = "The edited input is not JSON: " + e.message; return; }
  }
  row.dataset.deciding = action;
  const r = await fetch(`/runs/${BOOT.runId}/approvals/${encodeURIComponent(row.dataset.call)}/${action}`, {
    method: "POST", credentials: "same-origin", headers: SEND,
    body: JSON.stringify(body),
  });
  const reply = await r.json();
  if (r.ok) decided(row.dataset.call, reply.outcome === "queued" ? `${action}: queued, applied when a worker runs` : `${action}: ${reply.outcome}`);
  else { delete row.dataset.deciding; row.querySelector(".decided").textContent = reply.error || "The decision was refused."; }
});

gauge(Number($("spent").textContent.slice(1)));
if (!BOOT.final.includes(BOOT.status)) {
  const source = new EventSource(`/runs/${BOOT.runId}/events` + (BOOT.after ? `?after=${BOOT.after}` : ""));
  for (const kind of Object.keys(handlers)) {
    source.addEventListener(kind, (e) => {
      handlers[kind](JSON.parse(e.data));
      if (kind === "finished" || kind === "failed") source.close();
    });
  }
}
"""


def _sha256(text: str) -> str:
    return (
        "'sha256-"
        + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        + "'"
    )


CSP = (
    f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(STYLE)}; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The Content-Security-Policy of every response of examples/web.py: the page's one script and
style by their hashes (no other inline code runs, no attribute handler), images, the event stream
and fetches from its own origin only, no frames, no form posts, no <base>."""
