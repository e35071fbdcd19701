"""The run commands: `run`, `status`, `events`, `answer`, `send`, `steer`, `interrupt`, `cancel`,
`retry`, and `up` / `down` for the embedded Redis. Each is a thin adapter over `workers.client.sync.Client`.

Over shards: with `TOOLLOOP_REDIS_SHARDS="redis://a,redis://b"` set, every command that takes a run id
or lists runs (`run`, `status`, `events`, `answer`, `approve`, `reject`, `edit`, `decision`, `cancel`,
`retry`, `list`, `prune`, `accounts`) goes through one `workers.client.shards.ShardedClient`
(`connect_runs`): a run id to the shard it names (`s<k>-...`; none: shard 0), a new run to the next
shard in turn (or its idempotency key's), `list` merged newest first. A worker serves one shard:
`toolloop worker`, `up` and `demo` read REDIS_URL only (tests/integration/test_cli_shards.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from toolloop import defaults, redisurl
from toolloop.cli.errors import CliError, redact
from toolloop.cli.follow import Runs, decision_text, follow, print_status
from toolloop.cli.spec import build_spec
from toolloop.loop.approvals import ApprovalError
from workers.client import Client, ShardedClient
from workers.client.shards import parse_shards
from workers.config.settings import duration
from workers.protocol import keys


def connect(toolsets: list[str] | None = None) -> tuple[Client, defaults.RedisChoice]:
    """A client on REDIS_URL or on the embedded server (started when needed), after checking that
    Redis answers with the URL's credentials and TLS, exactly as the workers connect. `toolsets`:
    the registered toolset names (None: TOOLLOOP_TOOLSETS)."""
    try:
        choice = defaults.redis_url()
    except defaults.DefaultsError as error:
        raise CliError(str(error)) from None
    except OSError as error:  # the embedded server could not start
        raise CliError(
            f"Could not start the embedded Redis: {error}.\n  Set REDIS_URL to a running server."
        ) from None
    fix = "Start the server or fix REDIS_URL: user, password, rediss:// and ?ssl_ca_certs= for TLS "
    _check(choice.url, "Redis", fix + "(unset it to use the embedded server).")
    return Client(choice.url, toolsets=toolsets), choice


SHARDS_ENV = "TOOLLOOP_REDIS_SHARDS"


def connect_runs(
    toolsets: list[str] | None = None,
) -> tuple[Runs, defaults.RedisChoice | None]:
    """For the commands that take a run id or list runs: `connect`, or with TOOLLOOP_REDIS_SHARDS set a
    `ShardedClient` over its shards (each checked first as `connect` checks REDIS_URL) and no choice."""
    text = os.environ.get(SHARDS_ENV, "").strip()
    if not text:
        return connect(toolsets)
    try:
        urls = parse_shards(text)
        for url in urls:
            redisurl.parse(url)
    except ValueError as error:
        first, _, second = str(error).partition("\n")
        raise CliError(
            f"{SHARDS_ENV}: {first}\n{second or '  Write it as redis://a:6379/0,redis://b:6379/0.'}"
        ) from None
    for index, url in enumerate(urls):
        _check(
            url,
            f"shard {index} of {SHARDS_ENV}",
            f"Start it or fix {SHARDS_ENV} (every shard, in order).",
        )
    return ShardedClient(urls, toolsets=toolsets), None


def _check(url: str, what: str, fix: str) -> None:
    """CliError unless Redis at `url` answers with the URL's credentials and TLS."""
    problem = defaults.redis_problem(url)
    if problem is not None:
        raise CliError(
            f"Cannot reach {what} at {redact(url)}: {redact_text(problem, url).rstrip('.')}.\n  {fix}"
        )


def redact_text(text: str, url: str) -> str:
    """`text` with the URL's password replaced (an error may quote the URL)."""
    password = urlsplit(url).password
    return (
        text.replace(password, "***").replace(unquote(password), "***")
        if password
        else text
    )


def run_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN_ID")


def add_spec_flags(run: argparse.ArgumentParser) -> None:
    """The flags of a run spec (`toolloop run`, `toolloop schedule add`): toolloop/cli/spec.py reads them."""
    run.add_argument("prompt", nargs="?", help="the user's first message")
    run.add_argument(
        "-f", "--file", type=Path, help="a run spec as JSON or YAML; flags override it"
    )
    run.add_argument("--model")
    run.add_argument(
        "--system", help="the system text, or @FILE to read it from a file"
    )
    run.add_argument(
        "--toolset",
        help="name of a registered toolset (TOOLLOOP_TOOLSETS), e.g. review",
    )
    run.add_argument(
        "--budget", dest="budget_usd", type=float, help="USD limit of the run"
    )
    run.add_argument(
        "--finish-at", type=float, help="share of the budget where finish mode starts"
    )
    run.add_argument("--max-steps", type=int)
    run.add_argument("--reasoning", choices=["off", "low", "medium", "high"])
    run.add_argument("--finish-note")
    run.add_argument("--keep-images", type=int)
    run.add_argument("--cache", choices=["off", "system", "conversation"])
    run.add_argument(
        "--cache-ttl", choices=["5m", "1h"], help="TTL of the cache marks (default 5m)"
    )
    run.add_argument("--provider")
    run.add_argument(
        "--fallback", help="comma-separated provider names to fall back to"
    )
    run.add_argument(
        "--ask-timeout",
        dest="ask_timeout_s",
        type=float,
        help="seconds a question waits",
    )
    run.add_argument(
        "--ask-default",
        help="the answer a question gets at its deadline (else: stop, expired)",
    )
    run.add_argument(
        "--approval-timeout",
        dest="approval_timeout_s",
        type=float,
        help="seconds a held tool call waits for a decision (then its default: reject)",
    )
    run.add_argument(
        "--account",
        help="a shared budget account (toolloop accounts; docs/flow-control.md)",
    )


def add_commands(sub: Any) -> None:
    run = sub.add_parser("run", help="enqueue a run (from flags or a JSON/YAML file)")
    add_spec_flags(run)
    run.add_argument(
        "--idempotency-key",
        help="enqueueing again with the same key returns the same run (no second run)",
    )
    run.add_argument(
        "--follow", action="store_true", help="print its events until it stops"
    )
    run.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="publish the model's text as it arrives (default: on with --follow)",
    )
    run.set_defaults(handler=cmd_run)

    status = sub.add_parser("status", help="show a run's state")
    run_id_arg(status)
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--wait",
        action="store_true",
        help="first wait (up to 60 s) until the run ends or waits for you",
    )
    status.add_argument(
        "--calls",
        action="store_true",
        help="print only the ids of the held calls that wait for a decision",
    )
    status.set_defaults(handler=cmd_status)

    events = sub.add_parser("events", help="print a run's events (a line per step)")
    run_id_arg(events)
    events.add_argument(
        "--follow", "-f", action="store_true", help="keep printing until the run stops"
    )
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.set_defaults(handler=cmd_events)

    answer = sub.add_parser("answer", help="answer the question a parked run asked")
    run_id_arg(answer)
    answer.add_argument("text")
    answer.set_defaults(handler=cmd_answer)

    send = sub.add_parser(
        "send",
        help="a follow-up: continue a run that ended done (or answer its question)",
    )
    run_id_arg(send)
    send.add_argument("text")
    send.add_argument(
        "--key",
        dest="idempotency_key",
        help="an idempotency key: a second send with it does nothing",
    )
    send.add_argument(
        "--add-budget",
        dest="add_budget_usd",
        type=float,
        default=0.0,
        metavar="USD",
        help="USD added to the run's budget (default 0)",
    )
    send.add_argument(
        "--add-steps",
        dest="add_max_steps",
        type=int,
        default=0,
        metavar="N",
        help="model steps added to the run's max_steps (default 0)",
    )
    send.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="print the run's events until it stops",
    )
    send.set_defaults(handler=cmd_send)

    steer = sub.add_parser(
        "steer", help="a message a running run reads at its next step"
    )
    run_id_arg(steer)
    steer.add_argument("text")
    steer.set_defaults(handler=cmd_steer)

    interrupt = sub.add_parser(
        "interrupt", help="stop a run's call in flight; it waits for `send`"
    )
    run_id_arg(interrupt)
    interrupt.set_defaults(handler=cmd_interrupt)

    approve = sub.add_parser(
        "approve", help="approve a held tool call (it runs with its input)"
    )
    reject = sub.add_parser(
        "reject", help="reject a held tool call (the model reads the reason)"
    )
    edit = sub.add_parser("edit", help="run a held tool call with another input (JSON)")
    for command in (approve, reject, edit):
        run_id_arg(command)
        command.add_argument(
            "call_id",
            metavar="CALL_ID",
            help="the call id `toolloop status RUN_ID` shows",
        )
    reject.add_argument(
        "reason", nargs="?", default="", help="what the model reads after the rejection"
    )
    edit.add_argument(
        "input", metavar="JSON", help="the new input, e.g. '{\"shot\": 4}'"
    )
    for command in (approve, reject, edit):
        command.add_argument("--actor", help="who decides (shown in the run's events)")
        command.add_argument(
            "--digest",
            help="the input digest you saw (default: the one the run holds now)",
        )
        command.set_defaults(handler=cmd_decide, action=command.prog.rsplit(" ", 1)[-1])

    decision = sub.add_parser(
        "decision", help="show where the decision on a held call stands"
    )
    run_id_arg(decision)
    decision.add_argument("call_id", metavar="CALL_ID")
    decision.add_argument("--json", action="store_true")
    decision.set_defaults(handler=cmd_decision)

    for name, text in (("cancel", "cancel a run"), ("retry", "retry a failed run")):
        command = sub.add_parser(name, help=text)
        run_id_arg(command)
        command.set_defaults(handler=cmd_cancel if name == "cancel" else cmd_retry)

    listing = sub.add_parser("list", help="list runs, newest first (a page at a time)")
    listing.add_argument(
        "--status",
        help="only runs in this status: queued, running, asked, done, failed, ...",
    )
    listing.add_argument(
        "-n", "--limit", type=int, default=20, help="runs per page (default 20)"
    )
    listing.add_argument(
        "--cursor", help="the page after this cursor (printed under a full page)"
    )
    listing.add_argument(
        "--json", action="store_true", help="one JSON object per run, then the cursor"
    )
    listing.set_defaults(handler=cmd_list)

    prune = sub.add_parser(
        "prune",
        help="delete finished runs older than the retention (TOOLLOOP_RETENTION)",
    )
    prune.add_argument(
        "--older-than", help="instead of the retention: 90s, 30m, 12h, 7d"
    )
    prune.set_defaults(handler=cmd_prune)

    up = sub.add_parser(
        "up", help="start the embedded Redis of this directory and print its URL"
    )
    up.set_defaults(handler=cmd_up)
    down = sub.add_parser("down", help="stop the embedded Redis of this directory")
    down.set_defaults(handler=cmd_down)


def cmd_run(args: argparse.Namespace) -> int:
    if args.stream is None and args.follow:
        args.stream = True  # a person watches: show the text as it comes
    spec = build_spec(args)
    client, choice = connect_runs()
    run_id = client.enqueue(spec, idempotency_key=args.idempotency_key)
    print(run_id)
    if args.follow:
        return follow(
            client,
            run_id,
            answerer=terminal_answerer if sys.stdin.isatty() else not_a_terminal,
        )
    if choice is not None and choice.started:
        # a note for the person, on stderr: stdout is the run id alone (RUN_ID=$(toolloop run ...))
        print(
            "Started the embedded Redis; start a worker here with `toolloop worker` to run it.",
            file=sys.stderr,
        )
    return 0


def terminal_answerer(held: dict[str, Any]) -> str | None:
    """Ask the person at the terminal; an empty line leaves the run parked."""
    try:
        return input("your answer (empty: leave it parked)> ").strip() or None
    except EOFError:
        return None


def not_a_terminal(held: dict[str, Any]) -> None:
    """No one at this stdin can answer: say so and stop following (the run stays parked)."""
    print(
        "stdin is not a terminal, so no answer can be typed here: stopped following (the run stays "
        "parked).\n  Answer it with `toolloop answer RUN_ID 'TEXT'`, then watch it with "
        "`toolloop events RUN_ID --follow`.",
        file=sys.stderr,
    )
    return None


def cmd_status(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    if args.wait:
        try:
            client.wait(args.run_id, timeout=60)
        except TimeoutError as error:
            raise CliError(str(error)) from None
    if args.calls:
        for held in client.status(args.run_id).approvals or []:
            print(held["call_id"])
        return 0
    print_status(client, args.run_id, as_json=args.json)
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    return follow(client, args.run_id, keep_following=args.follow, as_json=args.json)


def cmd_answer(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    client.answer(args.run_id, args.text)
    print(f"Answered {args.run_id}.")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    """A follow-up (docs/conversations.md); with --follow, the run's events from the follow-up on."""
    client, _ = connect()
    after = None
    if args.follow:  # the events from here on: the last id before the send
        last = client.redis.xrevrange(keys.events(args.run_id), count=1)
        after = str(last[0][0]) if last else None  # the client decodes replies
    try:
        sent = client.send(
            args.run_id,
            args.text,
            idempotency_key=args.idempotency_key,
            add_budget_usd=args.add_budget_usd,
            add_max_steps=args.add_max_steps,
        )
    except ValueError as error:
        raise CliError(str(error)) from None
    what = "answered its question" if sent.what == "answered" else "continues"
    print(f"Sent to {args.run_id}: it {what} (segment {sent.segment}).")
    if args.follow:
        return follow(client, args.run_id, keep_following=True, after=after)
    return 0


def cmd_steer(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    try:
        steer_id = client.steer(args.run_id, args.text)
    except ValueError as error:
        raise CliError(str(error)) from None
    print(f"Steer {steer_id} sent to {args.run_id}: it reads it at its next step.")
    return 0


def cmd_interrupt(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    client.interrupt(args.run_id)
    print(
        f"Interrupt sent to {args.run_id}: it stops its call in flight and waits for `toolloop send`."
    )
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    """approve | reject | edit: the outcome, or the reason it was refused (exit code 1)."""
    client, _ = connect_runs()
    options: dict[str, Any] = {"digest": args.digest, "actor": args.actor}
    try:
        if args.action == "approve":
            outcome = client.approve(args.run_id, args.call_id, **options)
        elif args.action == "reject":
            outcome = client.reject(args.run_id, args.call_id, args.reason, **options)
        else:
            try:
                value = json.loads(args.input)
            except json.JSONDecodeError as error:
                raise CliError(
                    f"The input is not JSON ({error}).\n  Quote it: '{{\"shot\": 4}}'."
                ) from None
            if not isinstance(value, dict):
                raise CliError("The input must be a JSON object, e.g. '{\"shot\": 4}'.")
            outcome = client.edit(args.run_id, args.call_id, value, **options)
    except ApprovalError as error:
        print(f"Refused: {error}", file=sys.stderr)
        return 1
    said = {
        "resumed": "decided; the run goes on",
        "recorded": "decided; other calls still wait",
        "kept": "kept; it applies when the run reaches that call",
        "queued": "queued, applied when a worker runs (no worker applied it yet; "
        f"`toolloop decision {args.run_id} {args.call_id}` shows its outcome)",
    }
    print(f"{args.action} {args.call_id}: {said.get(outcome, outcome)}.")
    return 0


def cmd_decision(args: argparse.Namespace) -> int:
    """Where the decision on one call stands (queued, decided, expired, refused, pending)."""
    client, _ = connect_runs()
    try:
        found = client.decision(args.run_id, args.call_id)
    except ApprovalError as error:
        raise CliError(str(error)) from None
    if args.json:
        print(json.dumps(found.model_dump(mode="json")))
        return 0
    print(decision_text(found.model_dump(mode="json")))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    client.cancel(args.run_id)
    print(f"Cancel requested for {args.run_id}.")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    client, _ = connect_runs()
    client.retry(args.run_id)
    print(f"Retrying {args.run_id}.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError(f"--limit is {args.limit}.\n  Ask for at least 1 run per page.")
    client, _ = connect_runs()
    try:
        page = client.list_runs(
            status=args.status, limit=args.limit, cursor=args.cursor
        )
    except ValueError as error:
        raise CliError(str(error)) from None
    for run in page.runs:
        if args.json:
            print(json.dumps(vars(run)))
            continue
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.created_at))
        print(
            f"{run.run_id}  {run.status:<8} {created}  {run.steps:>3} steps  ${run.spent_usd:.4f}"
        )
    if args.json:
        print(json.dumps({"next": page.next}))
    elif page.next:
        print(
            f"more: toolloop list --cursor '{page.next}'"
            + (f" --status {args.status}" if args.status else "")
        )
    elif not page.runs:
        print("No runs." if not args.status else f"No runs are {args.status}.")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    older_than = None
    if args.older_than is not None:
        try:
            older_than = duration(args.older_than)
        except ValueError as error:
            raise CliError(
                str(error).replace(
                    "is not a duration", "is not a duration for --older-than"
                )
            ) from None
    client, _ = connect_runs()
    found = client.prune(older_than)
    for index, pruned in enumerate(found if isinstance(found, list) else [found]):
        shard = f"Shard {index}: " if isinstance(found, list) else ""
        counts = f"Deleted {pruned.deleted} finished runs; dropped {pruned.forgotten} expired runs"
        print(f"{shard}{counts} from the index.")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    _, choice = connect()
    where = (
        "embedded, started"
        if choice.started
        else "embedded"
        if choice.embedded
        else "REDIS_URL"
    )
    print(json.dumps({"url": redact(choice.url), "source": where, "pid": choice.pid}))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    pid = defaults.stop_embedded()
    print(
        f"Stopped the embedded Redis (pid {pid})."
        if pid
        else "No embedded Redis was running here."
    )
    return 0
