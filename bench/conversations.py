"""Conversations (SPEC 6.1, docs/conversations.md): the two figures of issue #29's follow-ups and
steering, on real `workers.app` worker processes, a private Redis and the provider simulator over
HTTP (its prompt-cache accounting follows Anthropic's rules; bench/_chat.py is its policy).

1. `chat`: one run, then 20 follow-ups (`Client.send`), each waited for. Figures: the share of prompt
   tokens read from the cache for the model calls of the third message on (target >= 90 %), and
   whether `history` is the whole conversation (every message once, in order).
2. `steers`: 100 runs, each a chain of `slow` tool calls, get 1,000 steers (`Client.steer`) sent at
   random moments while a worker is SIGKILLed every few seconds (and restarted). Figures, counted
   at the simulator: steers each seen by exactly one model request (first seen after the last
   complete turn, in one model turn of its run: a model call a kill cut short and made again is
   the same request, also when its body carries a later steer beside; both counts printed), steers
   lost (absent from the run's history), duplicated, or placed between a tool call and its result
   (targets: all 1,000 seen once, 0 lost).

    .venv/bin/python bench/conversations.py                      # both, full size
    .venv/bin/python bench/conversations.py chat --messages 20
    .venv/bin/python bench/conversations.py steers --runs 20 --steers 200 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1]),
]

from _chat import Chat, has_text  # noqa: E402
from _procs import Worker, env_with, private_redis  # noqa: E402

from toolloop.sim import SimServer  # noqa: E402
from workers.client import Client  # noqa: E402
from workers.protocol.errors import RunStateError  # noqa: E402

MODEL = "claude-sonnet-5-5"
TOOLSETS = {"TOOLLOOP_TOOLSETS": "chat=_chat:TOOLS"}
SYSTEM = (
    "You are the assistant of a film editing team. Answer briefly and precisely. " * 120
)
"""~1,900 tokens: past the 1,024-token minimum cacheable prefix, as a real system prompt is."""
FAST = {
    "TOOLLOOP_VISIBILITY_TIMEOUT": "4",
    "TOOLLOOP_RESTORE_INTERVAL": "1",
    "TOOLLOOP_SWEEP_INTERVAL": "1",
    "TOOLLOOP_OUTBOX_AGE": "1",
    "TOOLLOOP_LEASE_MS": "3000",
    "TOOLLOOP_REDRIVE_AGE": "6",
}
"""Short delivery timers, so that a killed worker's step comes back within seconds (tests/faults)."""


def worker(url: str, sim: SimServer, log: Path, **extra: str) -> Worker:
    env = env_with(
        REDIS_URL=url,
        ANTHROPIC_BASE_URL=sim.base_url,
        ANTHROPIC_API_KEY="sim-key",
        TOOLLOOP_PROMPT_GEN="",
        **TOOLSETS,
        **extra,
    )
    return Worker(
        "workers.app",
        pool="threads",
        concurrency=8,
        queues=["llm", "tools", "control"],
        env=env,
        log=log,
    )


def spec(first: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "provider": "anthropic",
        "system": SYSTEM,
        "toolset": "chat",
        "messages": [{"role": "user", "content": first}],
        **fields,
    }


def said(k: int) -> str:
    return (
        f"Message {k}: check the cut of scene {k}, the pacing of the dialogue and the music cue. "
        * 3
    )


# -- 1. a chat session ----------------------------------------------------------------------------


def chat(messages: int, tmp: Path, url: str) -> dict[str, Any]:
    policy = Chat()
    with SimServer(policy) as sim:
        bench_worker = worker(url, sim, tmp / "chat-worker.log")
        client = Client(url, toolsets=["chat"])
        try:
            bench_worker.start(client.celery)
            run_id = client.enqueue(spec(said(0), max_steps=messages + 5))
            client.wait(run_id, timeout=120)
            began = time.monotonic()
            for k in range(1, messages + 1):
                client.send(run_id, said(k), idempotency_key=f"message-{k}")
                status = client.wait(run_id, timeout=120)
                if status.status != "done":
                    raise RuntimeError(
                        f"the chat run ended {status.status} at message {k}"
                    )
            elapsed = time.monotonic() - began
            events = [e for e in client.events(run_id) if e.kind == "model"]
            history = client.history(run_id)
        finally:
            bench_worker.stop()
            client.close()
    prompt = cached = 0
    per_message = []
    for event in events:
        usage = getattr(event, "usage", None) or {}
        share = usage.get("cached_tokens", 0) / max(1, usage.get("prompt_tokens", 0))
        per_message.append(round(share, 4))
        if event.segment >= 2:  # the third message (segment 2) on
            prompt += usage.get("prompt_tokens", 0)
            cached += usage.get("cached_tokens", 0)
    wanted = [
        text for k in range(messages + 1) for text in (said(k), f"echo: {said(k)}")
    ]
    whole = [getattr(m, "content", None) for m in history] == wanted
    return {
        "messages": messages + 1,
        "model_calls": len(events),
        "prompt_tokens_from_3": prompt,
        "cached_tokens_from_3": cached,
        "cached_share_from_3": cached / max(1, prompt),
        "per_message_share": per_message,
        "history_whole": whole,
        "history_messages": len(history),
        "seconds_per_follow_up": elapsed / messages,
    }


# -- 2. steers under kills ------------------------------------------------------------------------


class Pool:
    """`size` workers; `kill_one` SIGKILLs one worker's process group and starts a new one."""

    def __init__(self, url: str, sim: SimServer, tmp: Path, size: int) -> None:
        self.make = lambda i: worker(url, sim, tmp / f"steer-worker-{i}.log", **FAST)
        self.workers = [self.make(i) for i in range(size)]
        self.kills = 0

    def start(self, app: Any) -> None:
        self.app = app
        for one in self.workers:
            one.start(app)

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.workers))
        process = self.workers[index].process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.kills += 1
        self.workers[index] = self.make(f"{index}-{self.kills}")
        self.workers[index].start(self.app)

    def stop(self) -> None:
        for one in self.workers:
            one.stop()


def steers(
    runs: int, total: int, kill_every: float, tmp: Path, url: str, seed: int = 29
) -> dict[str, Any]:
    policy = Chat()
    rng = random.Random(seed)
    sent: dict[str, str] = {}  # steer text -> run id
    refused = 0
    with SimServer(policy, latency_s=0.05) as sim:
        pool = Pool(url, sim, tmp, size=2)
        client = Client(url, toolsets=["chat"])
        try:
            pool.start(client.celery)
            chain = 30  # ~30 s of tool calls per run: longer than the ~15 s the steers are sent over
            ids = [
                client.enqueue(spec(f"slow 1 x{chain}", max_steps=3 * chain))
                for _ in range(runs)
            ]
            stop = threading.Event()

            def killer() -> None:
                while not stop.wait(kill_every):
                    pool.kill_one(rng)

            killing = threading.Thread(target=killer, daemon=True)
            killing.start()
            began = time.monotonic()
            while len(sent) < total and time.monotonic() - began < 600:
                run_id = rng.choice(ids)
                text = f"steer {len(sent)}: look at reel {rng.randrange(1000)} instead"
                try:
                    client.steer(run_id, text)
                except (
                    RunStateError
                ):  # the run ended already: refused, said so (not lost)
                    refused += 1
                    if refused > 20 * total:
                        break
                    continue
                sent[text] = run_id
                # the steers spread over ~15 s
                time.sleep(rng.expovariate(total / 15.0))
            # kills go on meanwhile
            ended = [client.wait(run_id, timeout=600) for run_id in ids]
            stop.set()
            killing.join()
            histories = {run_id: client.history(run_id) for run_id in ids}
        finally:
            pool.stop()
            client.close()
    index = policy.index()
    once = lost = duplicated = misplaced = remade = 0
    for text, run_id in sent.items():
        first, turns, _carried, wrong = index.get(text, (set(), set(), 0, 0))
        copies = sum(has_text(m, text) for m in histories[run_id])
        lost += copies == 0
        duplicated += copies > 1
        misplaced += wrong > 0
        once += len(turns) == 1 and copies == 1
        # its model call was killed and made again, with a later steer beside
        remade += len(first) > 1
    return {
        "runs": runs,
        "steers_sent": len(sent),
        "refused_after_end": refused,
        "kills": pool.kills,
        "seen_once": once,
        "remade_with_a_later_steer": remade,
        "lost": lost,
        "duplicated": duplicated,
        "misplaced": misplaced,
        "runs_done": sum(s.status == "done" for s in ended),
        "model_requests": len(policy.requests),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", nargs="*", help="chat, steers (default: both)")
    parser.add_argument(
        "--messages", type=int, default=20, help="follow-ups of the chat session"
    )
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steers", type=int, default=1000)
    parser.add_argument(
        "--kill-every", type=float, default=4.0, help="seconds between worker kills"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    which = args.which or ["chat", "steers"]
    if not set(which) <= {"chat", "steers"}:
        parser.error(
            f"unknown figure(s) {sorted(set(which) - {'chat', 'steers'})}: pick chat, steers"
        )
    results: dict[str, Any] = {}
    ok = True
    with private_redis("conversations-") as (tmp, url):
        if "chat" in which:
            row = results["chat"] = chat(args.messages, tmp, url)
            met = row["cached_share_from_3"] >= 0.9 and row["history_whole"]
            ok &= met
            print(
                f"chat session: {row['messages']} messages on one run, {row['model_calls']} model calls, "
                f"{row['seconds_per_follow_up']:.2f} s per follow-up"
            )
            print(
                f"  cached share of prompt tokens from the third message: {row['cached_share_from_3']:.1%} "
                f"(target >= 90%: {'met' if row['cached_share_from_3'] >= 0.9 else 'MISSED'})"
            )
            print(
                f"  history is the whole conversation: {row['history_whole']} "
                f"({row['history_messages']} messages; target: True)"
            )
        if "steers" in which:
            row = results["steers"] = steers(
                args.runs, args.steers, args.kill_every, tmp, url
            )
            met = (
                row["seen_once"] == row["steers_sent"] == args.steers
                and row["lost"] == 0
            )
            ok &= met
            print(
                f"steers: {row['steers_sent']} sent to {row['runs']} running runs, {row['kills']} worker "
                f"kills, {row['model_requests']} model requests ({row['refused_after_end']} refused: "
                "the run had ended)"
            )
            print(
                f"  seen by exactly one model request: {row['seen_once']} of {row['steers_sent']} "
                f"(target {args.steers}); lost {row['lost']} (target 0), duplicated {row['duplicated']}, "
                f"between a call and its result {row['misplaced']}: {'met' if met else 'MISSED'}"
            )
            print(
                f"  (of those, {row['remade_with_a_later_steer']} were in a model call a kill cut short, "
                "made again with a later steer beside: the same model step, another request body)"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
