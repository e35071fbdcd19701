"""`toolloop demo`: the storyboard-review agent run durably, end to end, on the embedded defaults.

It starts (or reuses) Redis, starts the provider simulator playing the storyboard policy and a
Celery worker subprocess pointed at both, enqueues the run, prints each step as it lands, answers
the agent's question from the terminal (or `--answer`), and ends with the final answer, the spend and
what the prompt cache saved. Whatever happens, it stops the processes it started.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from toolloop import defaults
from toolloop.cli.commands import connect
from toolloop.cli.errors import CliError, redact
from toolloop.cli.follow import follow
from toolloop.cli.processes import start_simulator, start_worker, stop
from toolloop.cli.render import Totals, field
from workers.protocol.spec import RunSpec

SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The checkout toolloop runs from: the demo's toolset, frames and policy live in its examples/."""


def add_command(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="run the storyboard-review agent durably, end to end"
    )
    demo.add_argument(
        "--answer",
        help="answer the agent's question with this text (else: ask on the terminal)",
    )
    demo.add_argument(
        "--latency", type=float, default=0.05, help="simulated model latency, seconds"
    )
    demo.add_argument(
        "--timeout", type=float, default=120.0, help="give up after this many seconds"
    )
    demo.set_defaults(handler=cmd_demo)


def _answerer(preset: str | None) -> Any:
    def answer(held: dict[str, Any]) -> str:
        if preset is not None:
            return preset
        if not sys.stdin.isatty():
            raise CliError(
                "The agent asked a question and stdin is not a terminal.\n"
                '  Pass the answer with --answer "TEXT".'
            )
        try:
            return input("your answer> ").strip() or "Go with your recommendation."
        except EOFError:
            raise CliError(
                "No answer was given (end of input).\n  Run the demo again and answer, or pass --answer TEXT."
            ) from None

    return answer


def cmd_demo(args: argparse.Namespace) -> int:
    if not (SOURCE_ROOT / "examples" / "storyboard" / "tools.py").exists():
        raise CliError(
            f"The demo's example files are missing under {SOURCE_ROOT / 'examples'}.\n"
            "  Run the demo from a source checkout (git clone, then `make demo`)."
        )
    if str(SOURCE_ROOT) not in sys.path:
        sys.path.insert(0, str(SOURCE_ROOT))
    # the checkout's,
    from examples.storyboard.brief import (
        MODEL,
        PROMPT,
        SYSTEM,
        TOOLSET,
        TOOLSET_PATH,
    )

    # on sys.path only from the line above
    from examples.storyboard.policy import (
        review_policy,
    )

    client, choice = connect(toolsets=[TOOLSET])
    state = defaults.state_dir()
    started: list[Any] = []
    try:
        how = "started" if choice.started else "reused"
        print(
            f"redis    embedded server {how} at {choice.url} (AOF in {state / 'redis'})"
            if choice.embedded
            else f"redis    REDIS_URL {redact(choice.url)}"
        )
        sim = start_simulator(review_policy, latency_s=args.latency)
        started.append(sim)
        print(
            f"model    the provider simulator at {sim.base_url}, playing a storyboard review (no real API)"
        )
        state.mkdir(parents=True, exist_ok=True)
        log_path = state / "demo-worker.log"
        with log_path.open("wb") as log:
            worker = start_worker(
                choice.url,
                extra_env={
                    **defaults.simulated_provider_env(sim.base_url),
                    "TOOLLOOP_TOOLSETS": f"{TOOLSET}={TOOLSET_PATH}",
                },
                pythonpath=[str(SOURCE_ROOT)],
                log=log,
                concurrency=4,
                loglevel="WARNING",
            )
            started.append(worker)
            print(
                f"worker   celery worker pid {worker.pid} (steps on its asyncio loop; log {log_path})"
            )
            spec = RunSpec(
                model=MODEL,
                system=SYSTEM,
                messages=[{"role": "user", "content": PROMPT}],
                toolset=TOOLSET,
                budget_usd=1.0,
                max_steps=12,
                keep_images=None,  # the frames are small: keep them, so the whole history is cacheable
                provider="anthropic",
            )
            run_id = client.enqueue(spec)
            print(f"run      {run_id}: {PROMPT}\n")
            totals = Totals()
            deadline = time.monotonic() + args.timeout

            def alive() -> None:
                if worker.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-400:].strip()
                    raise CliError(
                        f"The worker exited with code {worker.returncode}.\n  Its log ends: {tail!r}"
                    )
                if time.monotonic() > deadline:
                    raise CliError(
                        f"The run did not finish within {args.timeout:.0f} s.\n"
                        f"  See {log_path}, and `toolloop status {run_id}`."
                    )

            code = follow(
                client,
                run_id,
                answerer=_answerer(args.answer),
                totals=totals,
                check=alive,
            )
            summary(client.status(run_id), totals, MODEL)
            return code
    finally:
        for process in reversed(started):
            if hasattr(process, "poll"):
                stop(process)
            else:
                process.stop()
        if choice.started:
            defaults.stop_embedded()


def summary(status: Any, totals: Totals, model: str) -> None:
    state = field(status, "status")
    print()
    if field(status, "final_text"):
        print(f"final    {field(status, 'final_text')}")
    if state == "failed":
        print(
            f"failed   {field(status, 'error_class')}: {field(status, 'error_message')}"
        )
    spent = float(field(status, "spent_usd", 0) or 0)
    print(f"spent    ${spent:.4f} in {totals.steps} model calls ({state})")
    saved = totals.cache_savings_usd(model)
    share = totals.cache_read / totals.prompt_tokens if totals.prompt_tokens else 0.0
    money = f", saving ${saved:.4f} vs no cache" if saved is not None else ""
    read = f"{totals.cache_read:,} of {totals.prompt_tokens:,} prompt tokens"
    print(f"cache    {read} read from cache ({share:.0%}){money}")
