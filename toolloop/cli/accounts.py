"""`toolloop accounts`: spend per budget account; `--set NAME USD` sets an account's limit (a finite
amount above 0 and at most 1e9 USD, workers/client/accounts.py `check_usd`; else two lines, exit 1)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from toolloop.cli.commands import connect_runs
from toolloop.cli.errors import CliError
from workers.client import ShardedClient
from workers.client.accounts import AccountSpend


def add_command(sub: Any) -> None:
    accounts = sub.add_parser(
        "accounts", help="show spend per budget account (RunSpec.account)"
    )
    accounts.add_argument(
        "--set", nargs=2, metavar=("NAME", "USD"), help="set an account's limit in USD"
    )
    accounts.add_argument(
        "--period",
        choices=["day", "month", "total"],
        default="day",
        help="the limit's period with --set (default day)",
    )
    accounts.add_argument(
        "--finish-at",
        type=float,
        default=0.9,
        help="share of the limit where runs go into finish mode (default 0.9)",
    )
    accounts.add_argument(
        "--json", action="store_true", help="one JSON object per account"
    )
    accounts.set_defaults(handler=cmd_accounts)


def cmd_accounts(args: argparse.Namespace) -> int:
    amount = None if not args.set else _usd(*args.set)
    client, _ = connect_runs()
    if args.set and amount is not None:
        client.set_account_limit(
            args.set[0], amount, period=args.period, finish_at=args.finish_at
        )
    # over shards (TOOLLOOP_REDIS_SHARDS): each shard keeps its own accounts, listed with its index
    # (once, index None, when TOOLLOOP_FLOW_REDIS_URL makes them global)
    rows: list[tuple[int | None, AccountSpend]] = (
        client.accounts()
        if isinstance(client, ShardedClient)
        else [(None, row) for row in client.accounts()]
    )
    if args.json:
        for shard, row in rows:
            print(
                json.dumps(
                    row.__dict__ if shard is None else {"shard": shard, **row.__dict__}
                )
            )
        return 0
    if not rows:
        print("No accounts have a limit (set one: toolloop accounts --set NAME USD).")
        return 0
    column = "" if all(shard is None for shard, _ in rows) else f"{'SHARD':>5} "
    print(
        f"{column}{'ACCOUNT':24} {'PERIOD':6} {'SPENT':>12} {'RESERVED':>12} {'LIMIT':>12}  USED"
    )
    for shard, row in rows:
        used = (row.spent_usd + row.reserved_usd) / row.limit_usd
        where = "" if not column else f"{shard:>5} "
        print(
            f"{where}{row.name:24} {row.period:6} {row.spent_usd:12.4f} {row.reserved_usd:12.4f} "
            f"{row.limit_usd:12.4f}  {used:.0%}"
        )
    return 0


def _usd(name: str, usd: str) -> float:
    try:
        return float(usd)
    except ValueError:
        raise CliError(
            f"The limit {usd[:40]!r} of account {name!r} is not a number of USD.\n"
            "  Give it as a number, e.g. toolloop accounts --set NAME 25."
        ) from None
