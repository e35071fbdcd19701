"""Schedules (SPEC.md 6.3): what a schedule is, when it ticks, and how it reads back. Pure: no I/O.

A schedule has a trigger and a target:

    trigger  Cron(expr, timezone)   a 5-field cron expression (or 6 fields, seconds first), cronsim's
                                    dialect (Debian cron's, DST included), in an IANA time zone
             Every(seconds, start)  every `seconds` s from `start` (ticks start + k * seconds)
             Once(at)               one tick at `at` (unix seconds)
    target   Enqueue(spec)          enqueue a new run from a RunSpec, checked when the schedule is
                                    added exactly as `Client.enqueue` checks it
             Send(run_id, content)  a follow-up message to an existing run (Client.send)

`if_busy` says what a tick does while its target is still busy (for `Enqueue`: the run of its last
fire has not ended; for `Send`: the run is queued or running):
    skip   the tick is dropped (counted `skipped`)
    queue  the tick waits (`held`) and fires once the target is free; a later tick while one waits
           replaces it (the one replaced is counted `skipped`), so at most one tick waits
    steer  the tick's message steers the running run (Client.steer); `Send` targets only

`catch_up` says what happens to ticks missed while no worker swept (workers down, Redis away): the
sweeper never fires more than one tick at a time; the ticks before the latest due one are counted
`missed`, and the latest one
    latest fires (late) however old it is (the default)
    skip   fires only when it is at most `grace_s` old; else it is counted `missed` too

Each tick fires at most once across every worker: the fire is one script that claims the tick
(the schedule's `next` must still be the tick the sweeper read) and, for an `Enqueue` target, stores
the run in the same script (workers/protocol/scripts/schedules.py). The run's id derives from the schedule's
id and the tick (`fire_key`), so a tick can never make two runs.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from workers.protocol.errors import ScheduleError, ScheduleNotFoundError
from workers.protocol.spec import RunSpec

MAX_CRON_CHARS = 120
MAX_NAME_CHARS = 200
MAX_SCHEDULE_BYTES = 64_000
"""The most a schedule's stored definition may have as JSON (its run spec included): a schedule is
small; large inputs belong in a tool the run calls."""
MIN_EVERY_S = 1.0
"""The sweeper looks once a second: a shorter interval could not be kept."""
MAX_AHEAD_S = 100 * 365.25 * 86400
CATCH_UP_SCAN = 10_000
"""Missed cron ticks counted one by one at most (a longer outage counts this many)."""

BusyPolicy = Literal["skip", "queue", "steer"]
CatchUp = Literal["latest", "skip"]
_ID = re.compile(r"(s\d{1,3}-)?sched-[0-9a-f]{24}")
_ZONE = re.compile(r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,3}$")
HINT = "  See docs/schedules.md, or `toolloop schedule add --help`."


class Cron(BaseModel):
    """The tagged parts (`kind` required, so the stored JSON, defaults left out, keeps every tag)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["cron"]
    expr: str
    timezone: str = "UTC"


class Every(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["every"]
    seconds: float
    start: float


class Once(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["once"]
    at: float


Trigger = Annotated[Cron | Every | Once, Field(discriminator="kind")]


class Enqueue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["enqueue"]
    spec: RunSpec
    run_prefix: str = ""
    """The shard prefix of the runs it makes (workers/client/shards.py): the shard the schedule lives on."""


class Send(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["send"]
    run_id: str
    content: str
    add_budget_usd: float = 0.0
    """What each fire adds to the run's budget (Client.send's top-up)."""
    add_max_steps: int = 0


Target = Annotated[Enqueue | Send, Field(discriminator="kind")]


class Schedule(BaseModel):
    """A schedule as stored in `tl:sched:<id>`'s `def` field (JSON; read back by `SCHEDULE`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["schedule"] = "schedule"
    id: str
    name: str = ""
    trigger: Trigger
    target: Target
    if_busy: BusyPolicy = "skip"
    catch_up: CatchUp = "latest"
    grace_s: float = 60.0
    created: float


SCHEDULE: TypeAdapter[Schedule] = TypeAdapter(Schedule)


def check_id(schedule_id: str) -> str:
    """`schedule_id` when it has a schedule id's form, else ScheduleNotFoundError (nothing is read)."""
    if not isinstance(schedule_id, str) or not _ID.fullmatch(schedule_id):
        raise ScheduleNotFoundError(str(schedule_id))
    return schedule_id


def fire_key(schedule_id: str, tick: float) -> str:
    """The idempotency key of the fire of `tick`: the one run (or follow-up) that tick makes."""
    return f"schedule:{schedule_id}:{tick!r}"


def steer_id(schedule_id: str, tick: float) -> str:
    """The steer id of the fire of `tick` (if_busy="steer"): a second send of it is refused."""
    return (
        "sched-" + hashlib.sha256(fire_key(schedule_id, tick).encode()).hexdigest()[:32]
    )


# -- building and checking a trigger ---------------------------------------------------------------


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScheduleError(
            f"The {what} {str(value)[:60]!r} is not a number of seconds.\n{HINT}"
        )
    number = float(value)
    if not math.isfinite(number):
        raise ScheduleError(f"The {what} {value!r} is not a finite number.\n{HINT}")
    return number


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` ("UTC", "Europe/Paris"); ScheduleError for anything else (no path
    is read for a name that is not a zone's)."""
    if not isinstance(name, str) or len(name) > 64 or not _ZONE.fullmatch(name):
        raise ScheduleError(
            f"The time zone {str(name)[:64]!r} is not an IANA zone name.\n"
            "  Use one like UTC, Europe/Paris or America/New_York."
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"The time zone {name!r} is not known here.\n"
            "  Use one like UTC, Europe/Paris or America/New_York."
        ) from None


def cron_after(trigger: Cron, after: float) -> float | None:
    """The first tick of `trigger` strictly after `after` (None: none in the next 50 years)."""
    start = datetime.fromtimestamp(math.floor(after), zone(trigger.timezone))
    try:
        return next(CronSim(trigger.expr, start)).timestamp()
    except StopIteration:
        return None


def cron_latest(trigger: Cron, now: float) -> float | None:
    """The last tick of `trigger` at or before `now`."""
    start = datetime.fromtimestamp(math.floor(now), zone(trigger.timezone)) + timedelta(
        seconds=1
    )
    try:
        return next(CronSim(trigger.expr, start, reverse=True)).timestamp()
    except StopIteration:
        return None


def cron(expr: str, timezone: str = "UTC") -> Cron:
    """A checked cron trigger: ScheduleError for an expression cronsim refuses, or one that never
    fires in the next 50 years (31 February)."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > MAX_CRON_CHARS:
        shown = str(expr)[:MAX_CRON_CHARS]
        raise ScheduleError(
            f"The cron expression {shown!r} is empty or longer than {MAX_CRON_CHARS} "
            f"characters.\n  Write 5 fields (minute hour day month weekday), e.g. '0 9 * * 1-5'."
        )
    zone(timezone)
    trigger = Cron(kind="cron", expr=" ".join(expr.split()), timezone=timezone)
    try:
        first = cron_after(trigger, time.time())
    except CronSimError as error:
        raise ScheduleError(
            f"The cron expression {expr!r} is not valid: {error}.\n"
            "  Write 5 fields (minute hour day month weekday), e.g. '0 9 * * 1-5', or 6 with seconds first."
        ) from None
    except (
        Exception
    ) as error:  # whatever else the parser trips on: still the input's fault
        raise ScheduleError(
            f"The cron expression {expr!r} is not valid ({type(error).__name__}).\n"
            "  Write 5 fields (minute hour day month weekday), e.g. '0 9 * * 1-5'."
        ) from None
    if first is None:
        raise ScheduleError(
            f"The cron expression {expr!r} never fires in the next 50 years.\n"
            "  Check its day and month fields (there is no 31 February)."
        )
    return trigger


def every(seconds: Any, start: Any = None, now: float | None = None) -> Every:
    """A checked interval trigger: ticks at `start` + k * `seconds` (default start: now + seconds)."""
    now = time.time() if now is None else now
    value = _number(seconds, "interval")
    if not MIN_EVERY_S <= value <= MAX_AHEAD_S:
        raise ScheduleError(
            f"The interval {value:g} s is out of range.\n"
            f"  Give at least {MIN_EVERY_S:g} s (the sweeper looks once a second) and at most 100 years."
        )
    first = now + value if start is None else _number(start, "start time")
    if abs(first - now) > MAX_AHEAD_S:
        raise ScheduleError(
            f"The start time {first!r} is more than 100 years away.\n{HINT}"
        )
    return Every(kind="every", seconds=value, start=first)


def once(at: Any, now: float | None = None) -> Once:
    """A checked one-time trigger: `at` is unix seconds or an aware datetime, in the future."""
    now = time.time() if now is None else now
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ScheduleError(
                f"The time {at.isoformat()} has no time zone.\n"
                "  Give an aware datetime (tzinfo=timezone.utc) or an ISO time ending in Z or +01:00."
            )
        at = at.timestamp()
    value = _number(at, "time")
    if value < now - 1:
        shown = (
            datetime.fromtimestamp(value).astimezone().isoformat()
            if abs(value) < 1e11
            else repr(value)
        )
        raise ScheduleError(
            f"The time {shown} is in the past.\n  Give a time to come (or use --every / --cron)."
        )
    if value - now > MAX_AHEAD_S:
        raise ScheduleError(f"The time {value!r} is more than 100 years away.\n{HINT}")
    return Once(kind="once", at=value)


def check_policy(
    target: Enqueue | Send, if_busy: Any, catch_up: Any, grace_s: Any
) -> float:
    """ScheduleError for a policy that is not one, or `steer` for a target that is not a run."""
    if if_busy not in ("skip", "queue", "steer"):
        raise ScheduleError(
            f"if_busy={str(if_busy)[:40]!r} is not a policy.\n  Use skip, queue or steer."
        )
    if if_busy == "steer" and not isinstance(target, Send):
        raise ScheduleError(
            "if_busy='steer' needs a follow-up target (send_to=RUN_ID): a new run has "
            "nothing to steer.\n  Use skip or queue for a schedule that enqueues runs."
        )
    if catch_up not in ("latest", "skip"):
        raise ScheduleError(
            f"catch_up={str(catch_up)[:40]!r} is not a policy.\n  Use latest or skip."
        )
    grace = _number(grace_s, "grace")
    if not 0 <= grace <= MAX_AHEAD_S:
        raise ScheduleError(
            f"The grace {grace:g} s is out of range.\n  Give 0 s or more."
        )
    return grace


def check_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or len(name) > MAX_NAME_CHARS
        or not name.isprintable()
    ):
        raise ScheduleError(
            f"The schedule name {str(name)[:60]!r} is not printable text of at most "
            f"{MAX_NAME_CHARS} characters.\n  Give a short label, e.g. 'nightly report'."
        )
    return name


# -- ticks -----------------------------------------------------------------------------------------


def first_tick(trigger: Cron | Every | Once, now: float) -> float | None:
    """The first tick after `now` (for `Every`, `start` itself when it is still to come)."""
    if isinstance(trigger, Once):
        return trigger.at
    if isinstance(trigger, Every):
        return trigger.start if trigger.start > now else tick_after(trigger, now)
    return cron_after(trigger, now)


def tick_after(trigger: Cron | Every | Once, after: float) -> float | None:
    """The first tick strictly after `after` (None: the schedule has no more)."""
    if isinstance(trigger, Once):
        return trigger.at if trigger.at > after else None
    if isinstance(trigger, Every):
        if after < trigger.start:
            return trigger.start
        k = math.floor((after - trigger.start) / trigger.seconds) + 1
        return trigger.start + k * trigger.seconds
    return cron_after(trigger, after)


def latest_due(
    trigger: Cron | Every | Once, due: float, now: float
) -> tuple[float, int]:
    """The latest tick at or before `now`, from `due` (a tick at or before `now`), and how many
    ticks before it (from `due` on) it supersedes: the missed ones."""
    if isinstance(trigger, Once):
        return due, 0
    if isinstance(trigger, Every):
        k = math.floor((now - trigger.start) / trigger.seconds)
        latest = max(due, trigger.start + k * trigger.seconds)
        return latest, max(0, round((latest - due) / trigger.seconds))
    missed, tick = 0, due
    while missed < CATCH_UP_SCAN:
        following = cron_after(trigger, tick)
        if following is None or following > now:
            return tick, missed
        tick, missed = following, missed + 1
    last = cron_latest(trigger, now)
    return (last if last is not None else tick), missed


def upcoming(trigger: Cron | Every | Once, after: float, count: int) -> list[float]:
    """The next `count` ticks after `after` (fewer when the schedule has fewer)."""
    ticks: list[float] = []
    tick = tick_after(trigger, after)
    while tick is not None and len(ticks) < count:
        ticks.append(tick)
        tick = tick_after(trigger, tick)
    return ticks


def describe(trigger: Cron | Every | Once) -> str:
    """The trigger in one line: "cron '0 9 * * 1-5' (Europe/Paris)", "every 30 s", "once at ..."."""
    if isinstance(trigger, Cron):
        return f"cron {trigger.expr!r} ({trigger.timezone})"
    if isinstance(trigger, Every):
        return f"every {trigger.seconds:g} s"
    return f"once at {iso(trigger.at)}"


def iso(ts: float | None) -> str:
    """Unix seconds as an ISO 8601 UTC time ("-" for None)."""
    if ts is None:
        return "-"
    text = (
        datetime.fromtimestamp(ts)
        .astimezone(ZoneInfo("UTC"))
        .isoformat(timespec="seconds")
    )
    return text.replace("+00:00", "Z")


# -- what a schedule reads back as ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule and where it stands: `Client.get_schedule` / `list_schedules`, `toolloop schedule`.

    `status`: "active" (it has a next tick), or "done" (a one-time schedule that fired or was
    missed). `fired`: ticks whose target was applied; `skipped`: ticks dropped while the target was
    busy (or replaced by a later held one); `missed`: ticks no sweeper fired in time (the catch-up
    policy); `failed`: ticks whose target was refused at fire time (`last_error` says why).
    `held`: the tick waiting for a busy target (if_busy="queue"), else None."""

    id: str
    name: str
    trigger: str
    target: str
    if_busy: str
    catch_up: str
    status: str
    next_at: float | None
    held: float | None
    fired: int
    skipped: int
    missed: int
    failed: int
    last_tick: float | None
    last_at: float | None
    last_outcome: str
    last_run: str
    last_error: str
    created: float
    schedule: Schedule

    def as_json(self) -> dict[str, Any]:
        data = {
            name: getattr(self, name) for name in self.__slots__ if name != "schedule"
        }
        data["definition"] = self.schedule.model_dump(
            mode="json", exclude_defaults=True
        )
        return data


def _float_or_none(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def describe_target(target: Enqueue | Send) -> str:
    if isinstance(target, Enqueue):
        return f"enqueue model {target.spec.model}" + (
            f", toolset {target.spec.toolset}" if target.spec.toolset else ""
        )
    return f"send to run {target.run_id}"


def info_of(state: dict[str, str], raw: str) -> ScheduleInfo:
    """The `ScheduleInfo` of a schedule's hash (as HGETALL reads it) and its definition's JSON."""
    schedule = SCHEDULE.validate_json(raw)
    next_at = _float_or_none(state.get("next"))
    return ScheduleInfo(
        id=schedule.id,
        name=schedule.name,
        trigger=describe(schedule.trigger),
        target=describe_target(schedule.target),
        if_busy=schedule.if_busy,
        catch_up=schedule.catch_up,
        status="active" if next_at is not None or state.get("held") else "done",
        next_at=next_at,
        held=_float_or_none(state.get("held")),
        fired=int(state.get("fired") or 0),
        skipped=int(state.get("skipped") or 0),
        missed=int(state.get("missed") or 0),
        failed=int(state.get("failed") or 0),
        last_tick=_float_or_none(state.get("last_tick")),
        last_at=_float_or_none(state.get("last_at")),
        last_outcome=state.get("last_outcome", ""),
        last_run=state.get("last_run", ""),
        last_error=state.get("last_error", ""),
        created=schedule.created,
        schedule=schedule,
    )
