"""`toolloop run` builds its spec from a file and flags, and refuses bad ones before enqueuing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from toolloop.cli import build_parser
from toolloop.cli.errors import CliError
from toolloop.cli.spec import build_spec

TOOLSET = "review"


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_flags_build_a_spec() -> None:
    spec = build_spec(
        parse("Review shot 3.", "--model", "m", "--toolset", TOOLSET, "--budget", "0.5")
    )
    assert spec.model == "m" and spec.budget_usd == 0.5 and spec.toolset == TOOLSET
    assert [m.content for m in spec.messages] == ["Review shot 3."]


def test_deadline_flags() -> None:
    spec = build_spec(
        parse(
            "Hi",
            "--model",
            "m",
            "--toolset",
            TOOLSET,
            "--ask-timeout",
            "30",
            "--ask-default",
            "Go on.",
            "--approval-timeout",
            "600",
        )
    )
    assert (spec.ask_timeout_s, spec.ask_default, spec.approval_timeout_s) == (
        30,
        "Go on.",
        600,
    )


def test_cache_ttl_comes_from_the_flag_or_the_file(tmp_path: Path) -> None:
    spec = build_spec(
        parse("Hi", "--model", "m", "--toolset", TOOLSET, "--cache-ttl", "1h")
    )
    assert spec.cache_ttl == "1h"
    path = tmp_path / "run.yaml"
    path.write_text(
        f"model: a\ntoolset: {TOOLSET}\ncache_ttl: 1h\nmessages: [{{role: user, content: Hi}}]\n"
    )
    assert build_spec(parse("-f", str(path))).cache_ttl == "1h"
    assert (
        build_spec(parse("Hi", "--model", "m", "--toolset", TOOLSET)).cache_ttl == "5m"
    )
    with pytest.raises(SystemExit):
        parse("Hi", "--cache-ttl", "2h")


def test_yaml_file_with_flags_overriding(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"model: a\ntoolset: {TOOLSET}\nmax_steps: 4\nfallback: [fal]\n"
        "messages:\n  - {role: user, content: Hi}\n"
    )
    spec = build_spec(parse("-f", str(path), "--model", "b", "And shot 5."))
    assert (spec.model, spec.max_steps, spec.fallback) == ("b", 4, ["fal"])
    assert [m.content for m in spec.messages] == ["Hi", "And shot 5."]


@pytest.mark.parametrize(
    ("text", "suffix", "first_line"),
    [
        ("{not json", ".json", "is not valid JSON or YAML"),
        ("model: [unclosed", ".yaml", "is not valid JSON or YAML"),
        ("- a list", ".yaml", "is a list, not a mapping"),
    ],
)
def test_malformed_files_are_two_line_errors(
    tmp_path: Path, text: str, suffix: str, first_line: str
) -> None:
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    with pytest.raises(CliError) as caught:
        build_spec(parse("-f", str(path)))
    lines = caught.value.message.splitlines()
    assert len(lines) == 2 and first_line in lines[0] and lines[1].startswith("  ")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="Cannot read the run spec"):
        build_spec(parse("-f", str(tmp_path / "nope.json")))


@pytest.mark.parametrize(
    ("toolset", "expected"),
    [
        (None, "The run has no toolset."),
        ("no_colon_here", "The toolset 'no_colon_here' is not registered"),
        ("examples.storyboard.tools:REVIEW_TOOLS", "'agents', 'faults', 'review'"),
        ("os:getpid", "is not registered"),
    ],
)
def test_bad_toolsets_are_refused(toolset: str | None, expected: str) -> None:
    argv = ["Hi", "--model", "m"] + (["--toolset", toolset] if toolset else [])
    with pytest.raises(CliError) as caught:
        build_spec(parse(*argv))
    assert expected in caught.value.message
    assert len(caught.value.message.splitlines()) == 2


def test_invalid_fields_name_the_field() -> None:
    with pytest.raises(CliError) as caught:
        build_spec(parse("Hi", "--model", "m", "--toolset", TOOLSET, "--budget", "-1"))
    assert "budget_usd" in caught.value.message.splitlines()[0]


def test_system_text_from_a_file(tmp_path: Path) -> None:
    brief = tmp_path / "brief.txt"
    brief.write_text("You review storyboards.\n")
    spec = build_spec(
        parse("Hi", "--model", "m", "--toolset", TOOLSET, "--system", f"@{brief}")
    )
    assert spec.system == "You review storyboards.\n"
    with pytest.raises(CliError, match="Cannot read the system text file"):
        build_spec(
            parse(
                "Hi",
                "--model",
                "m",
                "--toolset",
                TOOLSET,
                "--system",
                f"@{tmp_path / 'no'}",
            )
        )
