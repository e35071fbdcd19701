"""Every Redis key of toolloop's durable runs, built here and nowhere else (the library's own
RedisJournal builds its three, `journal`, `lease` and `fence`, in toolloop/journal/keys.py: they are
re-exported here, so the workers name every key through this module).

Every key of one run carries the hash tag `{<run_id>}`, so a run lives on one slot of a Redis
Cluster and each Lua script touches one slot. (One script reads a key it does not declare:
RUN_BEGIN builds the current segment's journal name from the run's state; it has the run's tag, so
the same slot.) A child run (workers/step/children.py) has the id `<parent id>.<derived>`, and its
keys carry the ROOT run's tag: `tl:{<root>}.<rest>:state` (toolloop/journal/keys.py run_key). So a
whole tree of runs lives on one slot, and the scripts that spawn children, end a child and wake its
parent, or cancel a tree touch that one slot.
The one key outside a run is the index of live runs
that the sweeper scans; it is only ever written on its own (never inside a run's script), so it is
a superset of the live runs, never the source of truth.

    tl:{<run>}:spec            string  the RunSpec (JSON), written once at enqueue
    tl:{<run>}:state           hash    status, segment, n (commits so far), spent_usd, steps,
                                       final_text, asked, ask_call_id, error_class, error_message,
                                       spend_base, cancel, events:<seg>, seq
    tl:{<run>}:journal:<seg>   hash    the journal of one segment (`s0`, `s1`, ...):
                                       field = step key (`model:1`, `tool:<id>`), value = JSON
                                       {"value": ..., "cost_usd": ...}; written with HSETNX only
    tl:{<run>}:input           hash    field = segment, value = the segment's input messages (JSON);
                                       field c<segment>: the compaction it starts from (JSON)
    tl:{<run>}:history         string  the last segment's result.messages (JSON), set at park/stop
    tl:{<run>}:answers         hash    field = segment, value = the answer to its ask (HSETNX)
    tl:{<run>}:inbox           hash    field = answer id, value = {"segment", "content"} (client side)
    tl:{<run>}:events          stream  one entry per run event, each once, in order
    tl:{<run>}:lease           string  "<owner>:<token>" of the task running the live step (PX)
    tl:{<run>}:fence           string  INCR counter: the fencing token of every lease
    tl:{<run>}:outbox          zset    member "<n>|<queue>" = a successor task to send,
                                       score = when it was recorded (unix seconds)
    tl:{<run>}:attempts        hash    field = n, value = deliveries of task n; field = "<n>:alone",
                                       value = deliveries of task n that ran alone among the
                                       redelivered steps of their process (workers/process/suspects.py)
    tl:{<run>}:spend           string  outside spend in USD (INCRBYFLOAT), read by budget.spent()
    tl:{<run>}:decisions       hash    the decisions on held calls (field "s<seg>:<call id>")
    tl:{<run>}:decide          hash    decisions sent, not applied yet (field = decision id)
    tl:{<run>}:decide:outcomes hash    what workers made of the decisions they applied
    tl:{<run>}:mcptools        hash    field = MCP server label, value = the tools it listed when the
                                       run first needed them (JSON list), written with HSETNX only
    tl:{<run>}:children        hash    the child runs it spawned (workers/step/children.py): field
                                       "call:<seg>/<call id>" = JSON list of child ids, "open:<seg>/<call
                                       id>" = how many of them have not ended, "<child id>" = the ended
                                       child's record (HSETNX), "ids" = every child id (JSON list),
                                       "spent_micros" = the ended children's spend in micro-dollars
    tl:{<run>}:mcptasks        hash    field = a two-phase MCP tool's start step key, value = its task
                                       (server, task id, session; how it ended: workers/step/mcptasks.py)
    tl:runs:live               zset    run ids that may still need work, score = enqueue time
    tl:runs:all                zset    every run id, score = enqueue time (`toolloop list`, newest
                                       first); an id whose run expired is dropped when read or pruned
    tl:runs:ended              zset    finished run ids, score = when they ended (retention, prune)
    tl:sweep:lock              string  held (PX) by the worker sweeping now
    tl:sched:<id>              hash    a schedule's state (workers/protocol/schedules.py): `next`
                                       (its next tick, unix seconds; "" once it has no more), `held`,
                                       the counts fired/skipped/missed/failed, its last fire; every
                                       value short, so Redis keeps it packed (listpack)
    tl:sched:<id>:def          string  the schedule's definition (JSON), written once when added
    tl:sched:due               zset    schedule ids, score = when the sweeper next looks at it (or,
                                       for a round one sweeper took, when another may: DUE_TAKE)
    tl:sched:all               zset    every schedule id, score = when it was added (listing)
    tl:{<run>}:sends           hash    field = a follow-up's idempotency key, value = its outcome
                                       (JSON {what, segment}): workers/protocol/scripts/talk.py
    tl:cancel                  channel pubsub: a run id whose live step must abort now
    tl:interrupt               channel pubsub: "<run id>|<segment>" whose live step must stop now
    tl:acct:<name>             hash    an account's limit and spend per period (workers/client/accounts.py)
    tl:rl:<key hash>:<model>   hash    a provider rate-limit bucket (workers/config/ratelimit.py)
    toolloop:wake:<hostname>   list    only that worker's step consumer waits on it beside its queues
    toolloop:rejected          list    messages found on a toolloop queue that are not valid tasks,
                                       newest first: JSON {at, queue, reason, worker, size, truncated,
                                       raw} (workers/worker/consumer.py; the newest 10,000 are kept)
"""

from __future__ import annotations

from toolloop.journal.keys import CHILD_SEP, PREFIX, fence, journal, lease, run_key

# the library's three, re-exported
__all__ = [
    "CHILD_SEP",
    "PREFIX",
    "fence",
    "journal",
    "lease",
]

LIVE_RUNS = f"{PREFIX}runs:live"
ALL_RUNS = f"{PREFIX}runs:all"
ENDED_RUNS = f"{PREFIX}runs:ended"
CANCEL_CHANNEL = f"{PREFIX}cancel"
INTERRUPT_CHANNEL = f"{PREFIX}interrupt"
SWEEP_LOCK = f"{PREFIX}sweep:lock"
REJECTED = "toolloop:rejected"
SCHEDULES_DUE = f"{PREFIX}sched:due"
SCHEDULES_ALL = f"{PREFIX}sched:all"


def schedule(schedule_id: str) -> str:
    """The hash of one schedule (`tl:sched:<id>`; an id never reads "due" or "all")."""
    return f"{PREFIX}sched:{schedule_id}"


def schedule_def(schedule_id: str) -> str:
    """The definition of one schedule (`tl:sched:<id>:def`, JSON)."""
    return f"{PREFIX}sched:{schedule_id}:def"


def root_of(run_id: str) -> str:
    """The root run of `run_id`'s tree (itself for a run that is no run's child)."""
    return run_id.partition(CHILD_SEP)[0]


def parent_of(run_id: str) -> str | None:
    """The parent run of a child run's id (None for a root)."""
    parent, sep, _ = run_id.rpartition(CHILD_SEP)
    return parent if sep else None


def spec(run_id: str) -> str:
    return run_key(run_id, "spec")


def state(run_id: str) -> str:
    return run_key(run_id, "state")


def inputs(run_id: str) -> str:
    return run_key(run_id, "input")


def history(run_id: str) -> str:
    return run_key(run_id, "history")


def answers(run_id: str) -> str:
    return run_key(run_id, "answers")


def inbox(run_id: str) -> str:
    return run_key(run_id, "inbox")


def events(run_id: str) -> str:
    return run_key(run_id, "events")


def outbox(run_id: str) -> str:
    return run_key(run_id, "outbox")


def attempts(run_id: str) -> str:
    return run_key(run_id, "attempts")


def alone_field(n: int) -> str:
    """The field of `attempts(run)` counting task n's deliveries that ran alone
    (workers/process/suspects.py)."""
    return f"{n}:alone"


def sends(run_id: str) -> str:
    """The follow-ups sent with an idempotency key: field = key, value = outcome (workers/client/talk.py)."""
    return run_key(run_id, "sends")


def spend(run_id: str) -> str:
    return run_key(run_id, "spend")


def mcp_tools(run_id: str) -> str:
    """The MCP tool lists a run journaled (workers/step/mcptools.py): field = server label (HSETNX)."""
    return run_key(run_id, "mcptools")


def mcp_tasks(run_id: str) -> str:
    """The MCP tasks a run started (workers/step/mcptasks.py): field = the start step's key."""
    return run_key(run_id, "mcptasks")


def children(run_id: str) -> str:
    """The child runs a run spawned and how each ended (workers/step/children.py)."""
    return run_key(run_id, "children")


def segment_name(index: int) -> str:
    """The name of segment `index`: "s0", "s1", ... (its journal key prefix is this plus "/")."""
    return f"s{index}"


def decisions(run_id: str) -> str:
    """Decisions on held calls: field "s<segment>:<call id>", value the decision (JSON, HSETNX)."""
    return run_key(run_id, "decisions")


def decide_inbox(run_id: str) -> str:
    """Decisions sent by clients, not applied yet: field = decision id, value = JSON."""
    return run_key(run_id, "decide")


def decide_outcomes(run_id: str) -> str:
    """What workers made of the decisions they applied: field = decision id, value = JSON {call_id,
    outcome, why, at} (a refusal stays readable after its reply list expired)."""
    return run_key(run_id, "decide:outcomes")


def decide_order(run_id: str) -> str:
    """The ids of the decisions sent and not applied yet, in the order they were sent (a list: the
    client's MULTI pushes its id beside its inbox entry; the worker applies them in that order)."""
    return run_key(run_id, "decide:order")


def decide_claim(run_id: str, decision_id: str) -> str:
    """Held by the control task applying a decision (a lease: it expires if that worker dies)."""
    return run_key(run_id, f"decide:claim:{decision_id}")


def decided(run_id: str, decision_id: str) -> str:
    """The list a worker pushes a decision's outcome to, for the client that sent it."""
    return run_key(run_id, f"decided:{decision_id}")


WAITS_DUE = f"{PREFIX}waits:due"
"""zset: run ids parked with a deadline (or an early decision to apply), score = when to look."""


RUN_KEY_NAMES = (
    "spec",
    "state",
    "input",
    "history",
    "answers",
    "inbox",
    "events",
    "lease",
    "fence",
    "outbox",
    "attempts",
    "spend",
    "decisions",
    "decide",
    "decide:outcomes",
    "mcptools",
    "mcptasks",
    "sends",
    "children",
)


def run_keys(run_id: str, segments: int) -> list[str]:
    """Every key of a run whose segments are 0..`segments` (what retention expires and prune deletes)."""
    return [run_key(run_id, name) for name in RUN_KEY_NAMES] + [
        journal(run_id, segment_name(i)) for i in range(segments + 1)
    ]


WAKE_PREFIX = "toolloop:wake:"
"""`<prefix><hostname>`: a list only that worker's step consumer waits on beside its queues."""
ACCOUNT_PREFIX = f"{PREFIX}acct:"
"""`<prefix><name>`: an account's spend (workers/client/accounts.py)."""
RATE_PREFIX = f"{PREFIX}rl:"
"""`<prefix><key hash>:<model>`: a rate-limit bucket (workers/config/ratelimit.py)."""


def wake_key(hostname: str) -> str:
    return f"{WAKE_PREFIX}{hostname}"
