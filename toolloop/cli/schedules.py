"""`toolloop schedule add | list | show | remove`: schedules that enqueue runs (docs/schedules.md).

    toolloop schedule add "Summarize today's errors." --toolset review --model claude-sonnet-5-5 \\
        --cron "0 18 * * 1-5" --tz Europe/Paris --name "daily summary"
    toolloop schedule list
    toolloop schedule show SCHEDULE_ID
    toolloop schedule remove SCHEDULE_ID

`add` takes the flags of `toolloop run` for the spec (checked as `run` checks it: nothing is stored
for a bad one), or `--send-to RUN_ID --message TEXT` for a follow-up, and one trigger: --cron (with
--tz), --every (with --start), --at or --in. It prints
the schedule's id on stdout, and when it first fires on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from toolloop.cli.commands import add_spec_flags, connect
from toolloop.cli.errors import CliError
from toolloop.cli.spec import build_spec
from workers.config.settings import duration
from workers.protocol import schedules

AT_HINT = "  Give an ISO 8601 time with its zone (2026-12-24T18:00:00Z, 2026-12-24T18:00+01:00), or --in 90s."


def add_command(sub: Any) -> None:
    schedule = sub.add_parser(
        "schedule",
        help="add, list, show or remove schedules (cron, interval, one time)",
    )
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser(
        "add",
        help="add a schedule that enqueues a run (the flags of `toolloop run`) or sends a follow-up",
    )
    add_spec_flags(add)
    add.add_argument(
        "--send-to",
        metavar="RUN_ID",
        help="instead of a new run: a follow-up to this run",
    )
    add.add_argument("--message", help="with --send-to: the text each tick sends")
    add.add_argument(
        "--add-budget",
        type=float,
        default=0.0,
        help="with --send-to: USD each tick adds",
    )
    add.add_argument(
        "--add-steps", type=int, default=0, help="with --send-to: steps each tick adds"
    )
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--cron",
        help="5 fields (minute hour day month weekday), or 6 with seconds first",
    )
    when.add_argument(
        "--every", help="an interval: 90, 90s, 30m, 12h, 7d (at least 1 s)"
    )
    when.add_argument(
        "--at", help="one time, ISO 8601 with a zone: 2026-12-24T18:00:00Z"
    )
    when.add_argument(
        "--in",
        dest="in_",
        metavar="DURATION",
        help="one time, this long from now: 90s, 2h",
    )
    add.add_argument(
        "--tz", default="UTC", help="the IANA time zone of --cron (default UTC)"
    )
    add.add_argument(
        "--start",
        help="the first tick of --every (ISO 8601; default: now + the interval)",
    )
    add.add_argument(
        "--if-busy",
        choices=["skip", "queue", "steer"],
        default="skip",
        help="a tick while its target is busy: skip it (default), queue it until it is free, or steer "
        "the running run (--send-to only)",
    )
    add.add_argument(
        "--catch-up",
        choices=["latest", "skip"],
        default="latest",
        help="missed ticks: fire once for the latest (default), or skip it when older than --grace",
    )
    add.add_argument(
        "--grace",
        default="60s",
        help="how late a tick may fire with --catch-up skip (default 60s)",
    )
    add.add_argument("--name", default="", help="a label shown by list and show")
    add.add_argument(
        "--key", help="an idempotency key: adding again with it changes nothing"
    )
    add.set_defaults(handler=cmd_add)

    listing = actions.add_parser("list", help="list schedules, newest first")
    listing.add_argument(
        "--json", action="store_true", help="one JSON object per schedule"
    )
    listing.set_defaults(handler=cmd_list)

    show = actions.add_parser(
        "show", help="show a schedule: its next ticks, counts and last fire"
    )
    show.add_argument("schedule_id", metavar="SCHEDULE_ID")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_show)

    remove = actions.add_parser(
        "remove", help="remove a schedule (the runs it made stay)"
    )
    remove.add_argument("schedule_id", metavar="SCHEDULE_ID")
    remove.set_defaults(handler=cmd_remove)


def _duration(text: str, what: str) -> float:
    try:
        return float(duration(text))
    except ValueError:
        raise CliError(
            f"The {what} {text[:40]!r} is not a duration.\n  Write seconds, or a number with s, m, h or d."
        ) from None


def _time(text: str, what: str) -> float:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(
            f"The {what} {text[:60]!r} is not an ISO 8601 time.\n{AT_HINT}"
        ) from None
    if when.tzinfo is None:
        raise CliError(f"The {what} {text[:60]!r} has no time zone.\n{AT_HINT}")
    return when.timestamp()


def cmd_add(args: argparse.Namespace) -> int:
    target: dict[str, Any] = {}
    if args.send_to:
        if args.prompt or args.file:
            raise CliError(
                "--send-to sends a follow-up; a prompt or spec file is for a new run.\n"
                "  Give the text with --message, or drop --send-to."
            )
        target = {
            "send_to": args.send_to,
            "content": args.message,
            "add_budget_usd": args.add_budget,
            "add_max_steps": args.add_steps,
        }
    else:
        target = {"spec": build_spec(args)}
    trigger: dict[str, Any] = {}
    if args.cron is not None:
        trigger = {"cron": args.cron, "timezone": args.tz}
    elif args.every is not None:
        trigger = {"every_s": _duration(args.every, "interval")}
        if args.start:
            trigger["start"] = _time(args.start, "start time")
    elif args.at is not None:
        trigger = {"at": _time(args.at, "time")}
    else:
        trigger = {"at": time.time() + _duration(args.in_, "delay")}
    if args.cron is None and args.tz != "UTC":
        raise CliError(
            "--tz applies to --cron only.\n  Drop it, or give the time with its zone."
        )
    client, _ = connect()
    schedule_id = client.schedule(
        **target,
        **trigger,
        if_busy=args.if_busy,
        catch_up=args.catch_up,
        grace_s=_duration(args.grace, "grace"),
        name=args.name,
        idempotency_key=args.key,
    )
    print(schedule_id)
    info = client.get_schedule(schedule_id)
    when = schedules.iso(info.next_at)
    print(
        f"{info.trigger}: first fires at {when} (a worker's sweeper fires it).",
        file=sys.stderr,
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    client, _ = connect()
    found = client.list_schedules()
    if args.json:
        for info in found:
            print(json.dumps(info.as_json()))
        return 0
    if not found:
        print("No schedules (add one: toolloop schedule add --help).")
        return 0
    iso = schedules.iso
    print(
        f"{'SCHEDULE':35} {'STATUS':6} {'NEXT':20} {'FIRED':>5} {'SKIP':>4} {'MISS':>4}  TRIGGER / NAME"
    )
    for info in found:
        label = info.trigger + (f"  {info.name}" if info.name else "")
        print(
            f"{info.id:35} {info.status:6} {iso(info.next_at):20} {info.fired:5} {info.skipped:4} "
            f"{info.missed:4}  {label}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    client, _ = connect()
    info = client.get_schedule(args.schedule_id)
    if args.json:
        print(json.dumps(info.as_json()))
        return 0
    iso = schedules.iso
    ahead = (
        schedules.upcoming(info.schedule.trigger, time.time(), 3)
        if info.status == "active"
        else []
    )
    rows = [
        ("schedule", info.id + (f"  ({info.name})" if info.name else "")),
        ("trigger", info.trigger),
        ("target", info.target),
        (
            "policy",
            f"if busy: {info.if_busy}; catch up: {info.catch_up} (grace {info.schedule.grace_s:g} s)",
        ),
        ("status", info.status),
        ("next", ", ".join(schedules.iso(t) for t in ahead) or "-"),
        ("held", schedules.iso(info.held)),
        (
            "counts",
            f"fired {info.fired}, skipped {info.skipped}, missed {info.missed}, failed {info.failed}",
        ),
        (
            "last",
            f"{info.last_outcome or '-'} tick {iso(info.last_tick)} at {iso(info.last_at)}",
        ),
        ("last run", info.last_run or "-"),
    ]
    if info.last_error:
        rows.append(("last error", info.last_error))
    for name, value in rows:
        print(f"{name:10}  {value}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    client, _ = connect()
    client.remove_schedule(args.schedule_id)
    print(
        f"Removed {args.schedule_id}: no tick fires from now on (the runs it made stay)."
    )
    return 0
