"""Build a run spec from `toolloop run`'s flags and file, and check its toolset (a registered name)
before enqueuing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pydantic
import yaml

from toolloop.cli.errors import CliError, validation_lines
from workers.config.settings import Settings
from workers.config.toolsets import check_name
from workers.protocol.spec import RunSpec

FLAG_FIELDS = (
    "model",
    "stream",
    "system",
    "toolset",
    "budget_usd",
    "finish_at",
    "max_steps",
    "reasoning",
    "finish_note",
    "keep_images",
    "cache",
    "cache_ttl",
    "provider",
    "ask_timeout_s",
    "ask_default",
    "approval_timeout_s",
    "account",
)
SPEC_HINT = (
    "  Give a mapping with model, system, messages (or a prompt) and toolset;"
    " see `toolloop run --help`."
)


def load_file(path: Path) -> dict[str, Any]:
    """A run spec file: JSON, or YAML (a superset), as a mapping."""
    try:
        text = path.read_text()
    except OSError as error:
        raise CliError(
            f"Cannot read the run spec {str(path)!r}: {error.strerror}.\n{SPEC_HINT}"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0]
        raise CliError(
            f"The run spec {str(path)!r} is not valid JSON or YAML: {first}.\n{SPEC_HINT}"
        ) from None
    if not isinstance(data, dict):
        raise CliError(
            f"The run spec {str(path)!r} is a {type(data).__name__}, not a mapping.\n{SPEC_HINT}"
        )
    return data


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise CliError(
            f"Cannot read the {what} file {str(path)!r}: {error.strerror}.\n{SPEC_HINT}"
        ) from None


def spec_data(args: argparse.Namespace) -> dict[str, Any]:
    """The spec as a dict: the file's, then every flag that was given, then the prompt."""
    data = load_file(args.file) if args.file else {}
    for name in FLAG_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            data[name] = value
    if getattr(args, "fallback", None):
        data["fallback"] = [
            name.strip() for name in args.fallback.split(",") if name.strip()
        ]
    system = data.get("system")
    if isinstance(system, str) and system.startswith("@"):  # --system @brief.txt
        data["system"] = read_text(Path(system[1:]), "system text")
    if args.prompt:
        data["messages"] = [
            *data.get("messages", []),
            {"role": "user", "content": args.prompt},
        ]
    return data


def check_toolset(name: Any) -> None:
    """Refuse a toolset the workers do not register (TOOLLOOP_TOOLSETS), importing nothing, so a bad
    name fails here and nothing is enqueued."""
    if not name:
        raise CliError(
            "The run has no toolset.\n"
            "  Pass --toolset NAME (one registered in TOOLLOOP_TOOLSETS), or set toolset in the spec file."
        )
    try:
        registered = Settings.from_env().toolset_names()
        check_name(str(name), registered)
    except (
        ValueError
    ) as error:  # workers.protocol.errors.ToolsetError: two lines already
        raise CliError(str(error)) from None


def build_spec(args: argparse.Namespace) -> RunSpec:
    """A validated `RunSpec`; a bad field or toolset is a CliError, nothing enqueued."""
    data = spec_data(args)
    check_toolset(data.get("toolset"))
    try:
        return RunSpec.model_validate(data)
    except pydantic.ValidationError as error:
        where = f"in {str(args.file)!r}" if args.file else "from the flags"
        raise CliError(
            f"The run spec {where} is invalid: {validation_lines(error)}.\n{SPEC_HINT}"
        ) from None
