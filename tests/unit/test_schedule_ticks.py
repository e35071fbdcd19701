"""When schedules tick (workers/protocol/schedules.py, pure): intervals, cron in a time zone, the catch-up
count, the id and key forms; and the `toolloop schedule add` errors found before anything connects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from toolloop.cli import main
from workers.protocol import schedules
from workers.protocol.errors import ScheduleError, ScheduleNotFoundError


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_an_interval_ticks_from_its_start() -> None:
    trigger = schedules.every(10, start=100.0, now=50.0)
    assert schedules.first_tick(trigger, 50.0) == 100.0
    # a start gone by: the next tick to come
    assert schedules.first_tick(trigger, 105.0) == 110.0
    assert schedules.tick_after(trigger, 110.0) == 120.0
    assert schedules.upcoming(trigger, 100.0, 3) == [110.0, 120.0, 130.0]
    # default: one interval from now
    assert schedules.every(30, now=1000.0).start == 1030.0


def test_the_latest_due_tick_and_the_missed_ones() -> None:
    trigger = schedules.every(1, start=100.0, now=0.0)
    assert schedules.latest_due(trigger, 100.0, 100.5) == (100.0, 0)
    assert schedules.latest_due(trigger, 100.0, 103.7) == (103.0, 3)
    cron = schedules.cron("*/15 * * * *")
    due = ts("2026-01-01T10:00:00+00:00")
    assert schedules.latest_due(cron, due, ts("2026-01-01T11:07:00+00:00")) == (
        ts("2026-01-01T11:00:00+00:00"),
        4,
    )
    once = schedules.once(200.0, now=100.0)
    assert schedules.latest_due(once, 200.0, 5000.0) == (200.0, 0)
    assert schedules.tick_after(once, 200.0) is None


def test_a_long_outage_of_a_cron_schedule_is_counted_up_to_a_bound() -> None:
    cron = schedules.cron("* * * * * *")  # every second (6 fields: seconds first)
    due = ts("2026-01-01T00:00:00+00:00")
    tick, missed = schedules.latest_due(cron, due, due + 86_400.5)
    assert tick == due + 86_400 and missed == schedules.CATCH_UP_SCAN


def test_cron_ticks_in_its_time_zone_across_daylight_saving() -> None:
    paris = schedules.cron("0 9 * * *", "Europe/Paris")
    winter = schedules.cron_after(paris, ts("2026-01-15T00:00:00+00:00"))
    summer = schedules.cron_after(paris, ts("2026-07-15T00:00:00+00:00"))
    assert winter == ts("2026-01-15T08:00:00+00:00") and summer == ts(
        "2026-07-15T07:00:00+00:00"
    )
    # 02:30 does not exist on 29 March 2026
    spring = schedules.cron("30 2 * * *", "Europe/Paris")
    tick = schedules.cron_after(spring, ts("2026-03-28T12:00:00+00:00"))
    # Debian cron's way: at 03:00 local, once
    assert tick == ts("2026-03-29T01:00:00+00:00")
    assert schedules.describe(paris) == "cron '0 9 * * *' (Europe/Paris)"


def test_a_one_time_trigger_takes_an_aware_datetime_only() -> None:
    at = datetime(2030, 1, 1, 9, tzinfo=UTC)
    assert schedules.once(at, now=0.0).at == at.timestamp()
    with pytest.raises(ScheduleError, match="no time zone"):
        schedules.once(datetime(2030, 1, 1, 9), now=0.0)
    with pytest.raises(ScheduleError, match="not a number"):
        schedules.once(True, now=0.0)


def test_ids_and_fire_keys() -> None:
    assert schedules.check_id("sched-" + "a" * 24) and schedules.check_id(
        "s2-sched-" + "0" * 24
    )
    for bad in (
        "due",
        "all",
        "sched-xyz",
        "tl:sched:due",
        "s2-" + "a" * 32,
        "sched-" + "a" * 24 + "\n",
    ):
        with pytest.raises(ScheduleNotFoundError):
            schedules.check_id(bad)
    assert schedules.fire_key("sched-1", 100.5) == "schedule:sched-1:100.5"


def test_the_add_command_refuses_a_time_without_a_zone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "schedule",
            "add",
            "Go.",
            "--toolset",
            "agents",
            "--model",
            "m",
            "--at",
            "2030-01-01T09:00",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "has no time zone" in err and err.count("\n") == 2
    code = main(
        [
            "schedule",
            "add",
            "Go.",
            "--toolset",
            "agents",
            "--model",
            "m",
            "--every",
            "soon",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "is not a duration" in err
