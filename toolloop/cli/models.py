"""`toolloop models [MODEL] [--json]`: the model catalogue in force (the built-in rows with the operator
file TOOLLOOP_MODELS laid over them), as the workers, clients and simulator of this environment read
it: each model's status, prices (with the long-context tier) and where every value comes from.

A value is marked (d) derived by a rule, (u) unconfirmed (a third party only), (o) given by the
operator file, ? unknown; unmarked it is read from the source it names. The `from` column says
which rows the operator file touched; `sources` lists the numbers of the sources printed below the
table. With MODEL, every field of that model with its value and source; `--json` prints it all.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from toolloop.cli.errors import CliError


def add_command(sub: Any) -> None:
    models = sub.add_parser(
        "models",
        help="print the model catalogue in force: statuses, prices and their sources",
    )
    models.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="one model: every field and its source",
    )
    models.add_argument(
        "--json", action="store_true", help="print the catalogue (or MODEL) as JSON"
    )
    models.set_defaults(handler=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from toolloop.providers.models_file import ENV, catalog_from_env

    try:
        catalog = catalog_from_env()
    except ValueError as error:
        raise CliError(str(error)) from None
    rows = catalog.models()
    if args.model:
        found = catalog.find(args.model)
        if found is None:
            raise CliError(
                f"{args.model!r} is not in the model catalogue.\n"
                f"  Run `toolloop models` for the list, or add it in the file {ENV} names."
            )
        rows = [found]
    if args.json:
        print(json.dumps([as_json(info) for info in rows], indent=2))
    elif args.model:
        print_model(rows[0])
    else:
        path = os.environ.get(ENV, "").strip()
        touched = sum(1 for info in rows if from_operator(info))
        origin = (
            f"{ENV}={path}: {touched} rows from it"
            if path
            else f"{ENV} unset: the built-in rows only"
        )
        print(f"Model catalogue in force ({len(rows)} models; {origin}).")
        print_table(rows)
    return 0


def from_operator(info: Any) -> bool:
    return any(source.kind == "operator" for source in info.sources.values())


def as_json(info: Any) -> dict[str, Any]:
    price = asdict(info.price) if info.price is not None else None
    return {
        "id": info.id,
        "status": info.status,
        "status_date": info.status_date,
        "replacement": info.replacement,
        "price": price,
        "aliases": list(info.aliases),
        "fal_slug": info.fal_slug,
        "thinking": sorted(info.thinking),
        "forced_tool_choice": info.forced_tool_choice,
        "temperature": info.temperature,
        "min_cache_tokens": info.min_cache_tokens,
        "max_output_tokens": info.max_output_tokens,
        "context_window": info.context_window,
        "from_operator_file": from_operator(info),
        "sources": {
            name: {"kind": s.kind, "name": s.name}
            for name, s in sorted(info.sources.items())
        },
    }


def print_table(rows: list[Any]) -> None:
    from toolloop.providers.models import price_cells, status_cell

    numbers: dict[tuple[str, str], int] = {}
    lines = [
        [
            "model",
            "status",
            "$/MTok in / out",
            "read",
            "5m write",
            "1h write",
            "long context",
            "from",
            "sources",
        ]
    ]
    for info in rows:
        status = status_cell(info)
        cells = ["", "", "", "", "-"] if info.price is None else price_cells(info)
        used = sorted(
            {
                numbers.setdefault((s.kind, s.name), len(numbers) + 1)
                for s in info.sources.values()
            }
        )
        origin = "file" if from_operator(info) else "built-in"
        lines.append([info.id, status, *cells, origin, ",".join(map(str, used))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print(
            "  ".join(
                cell.ljust(width) for cell, width in zip(line, widths, strict=True)
            ).rstrip()
        )
    print(
        "\n(d) derived by a rule, (u) unconfirmed: a third party only, (o) the operator file, ? unknown;"
    )
    print(
        "unmarked: read from the named source. `toolloop models MODEL` shows each field's source."
    )
    print("\nSources:")
    for (kind, name), number in numbers.items():
        print(f"  [{number}] {kind}: {name}")


def print_model(info: Any) -> None:
    data = as_json(info)
    sources = data.pop("sources")
    price = data.pop("price") or {}
    above = price.pop("above", None) or {}
    fields = {**{k: v for k, v in data.items() if k != "id"}}
    fields.update({f"price.{k}": v for k, v in price.items()})
    if above:
        fields["price.above.tokens"] = above["tokens"]
        fields.update(
            {f"price.above.{k}": v for k, v in above["price"].items() if k != "above"}
        )
    print(
        f"{info.id}"
        + ("  (from the operator file)" if data["from_operator_file"] else "")
    )
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        source = sources.get(name)
        where = f"{source['kind']}: {source['name']}" if source else ""
        shown = "-" if value is None or value == [] else str(value)
        print(f"  {name.ljust(width)}  {shown:<24}  {where}".rstrip())
