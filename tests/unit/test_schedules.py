"""Message schedules in the engine, on a FakeClock: patterns and cron as nats-server reads
them, what a due schedule produces, and schedules rebuilt from the store after a restart
(nothing fires twice, nothing is lost). Also the shared timetable."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import zoneinfo
from collections.abc import AsyncIterator
from typing import Any

import pytest
from headers_support import hdrs

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.streams import schedules as sched
from tether.storage.memory import MemoryStore

NS = 1_000_000_000
# 2023-11-14T22:13:20Z, FakeClock's default start.
START = 1_700_000_000 * NS


def at(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns // NS, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    await store.open()
    yield store
    await store.close()


async def open_broker(store: MemoryStore, clock: FakeClock) -> Broker:
    broker = Broker(store, clock)
    await broker.load()
    if "S" not in broker.streams:
        config = {"name": "S", "subjects": ["s.>"], "allow_msg_schedules": True}
        await broker.create_stream("S", json.dumps(config).encode())
    return broker


@pytest.fixture
async def broker(store: MemoryStore, clock: FakeClock) -> AsyncIterator[Broker]:
    broker = await open_broker(store, clock)
    yield broker
    broker.close()


async def publish(broker: Broker, subject: str, headers: bytes, payload: bytes = b"p") -> Any:
    results: list[PubAck | ApiError] = []
    broker.publish(broker.get_stream("S"), subject, headers, payload, results.append)
    await broker.store.flush()
    result = results[0]
    return result.err_code if isinstance(result, ApiError) else result.seq


async def advance(broker: Broker, clock: FakeClock, seconds: float) -> None:
    """Move time on a second at a time, letting each due schedule store what it produces."""
    for _ in range(int(seconds)):
        clock.advance(1)
        for _ in range(5):
            await asyncio.sleep(0)
        await broker.store.flush()


async def produced(broker: Broker, target: str) -> list[dict[str, str]]:
    stream = broker.get_stream("S")
    out = []
    for seq in stream.seqs_matching(0, (target,)):
        msg = await broker.store.read("S", seq)
        assert msg is not None
        lines = msg.headers.decode().split("\r\n")[1:]
        out.append(dict(line.split(": ", 1) for line in lines if line))
    return out


def test_patterns_as_nats_server_reads_them() -> None:
    assert sched.parse_pattern("@at 2020-01-01T00:00:00+02:00", None).at_ns == (1577829600 * NS)
    assert sched.parse_pattern("@every 1m30s", None).every_ns == 90 * NS
    for bad in ("@every 500ms", "@at 2020-01-01", "* * * * *", "bogus", "@every"):
        with pytest.raises(ApiError) as excinfo:
            sched.parse_pattern(bad, None)
        assert excinfo.value.err_code == 10189
    with pytest.raises(ApiError) as excinfo:
        sched.parse_pattern("@every 1s", "UTC")  # a time zone is for cron only
    assert excinfo.value.err_code == 10189
    with pytest.raises(ApiError) as excinfo:
        sched.parse_pattern("0 0 * * * *", "Nope/Zone")
    assert excinfo.value.err_code == 10223


def test_cron_next_fire_in_a_time_zone() -> None:
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    # Every day at 09:30:00 Paris time, after 2023-11-14T22:13:20Z (23:13:20 in Paris).
    daily = sched.parse_pattern("0 30 9 * * *", "Europe/Paris")
    nxt = daily.next_after(START)
    assert dt.datetime.fromtimestamp(nxt // NS, paris).isoformat() == "2023-11-15T09:30:00+01:00"
    assert daily.stamp(nxt) == "2023-11-15T09:30:00+01:00"
    # Mondays or the 1st, names and steps, as robfig/cron reads them.
    either = sched.parse_pattern("0 0 12 1 * mon", None)
    got = dt.datetime.fromtimestamp(either.next_after(START) // NS, dt.UTC)
    assert got.isoformat() == "2023-11-20T12:00:00+00:00"  # the next Monday
    steps = sched.parse_pattern("*/20 * * * * *", None)
    assert steps.next_after(START) == START + 20 * NS
    hourly = sched.parse_pattern("@hourly", None)
    assert hourly.next_after(START) == (START // (3600 * NS) + 1) * 3600 * NS


async def test_at_fires_once_and_removes_the_schedule_in_the_same_commit(
    broker: Broker, clock: FakeClock
) -> None:
    due = START + 3 * NS
    headers = hdrs(
        Nats_Schedule=f"@at {at(due)}", Nats_Schedule_Target="s.t", Foo="bar", Nats_Msg_Id="m"
    )
    assert await publish(broker, "s.sch", headers) == 1
    await advance(broker, clock, 2)
    assert await produced(broker, "s.t") == []
    await advance(broker, clock, 2)
    assert await produced(broker, "s.t") == [
        {"Foo": "bar", "Nats-Scheduler": "s.sch", "Nats-Schedule-Next": "purge"}
    ]
    assert broker.get_stream("S").last_by_subject("s.sch") == 0  # purged with it
    await advance(broker, clock, 5)
    assert len(await produced(broker, "s.t")) == 1


async def test_every_repeats_and_says_when_it_fires_next(broker: Broker, clock: FakeClock) -> None:
    headers = hdrs(Nats_Schedule="@every 2s", Nats_Schedule_Target="s.t", Nats_Expected_Stream="S")
    await publish(broker, "s.sch", headers)
    stored = await broker.store.read("S", 1)
    assert stored is not None and stored.headers.endswith(b"Nats-Rollup: sub\r\n\r\n")
    await advance(broker, clock, 7)
    out = await produced(broker, "s.t")
    assert len(out) == 3
    assert out[0] == {"Nats-Scheduler": "s.sch", "Nats-Schedule-Next": at(START + 4 * NS)}


def test_what_a_schedule_produces() -> None:
    pattern = sched.parse_pattern("@every 1s", None)
    schedule = sched.Schedule("S", "s.sch", 1, pattern, "s.t", "", "5m", "sub")
    headers = hdrs(
        Nats_Schedule="@every 1s",
        Nats_Schedule_Target="s.t",
        Nats_Schedule_TTL="5m",
        Nats_Schedule_Rollup="sub",
        Nats_Rollup="sub",
        Nats_Msg_Id="m",
        Nats_Expected_Last_Sequence="1",
        Keep="me",
    )
    assert sched.produced_headers(headers, schedule, START) == hdrs(
        Keep="me",
        Nats_Scheduler="s.sch",
        Nats_Schedule_Next=at(START),
        Nats_TTL="5m",
        Nats_Rollup="sub",
    )


async def test_a_client_stops_a_schedule(broker: Broker, clock: FakeClock) -> None:
    await publish(broker, "s.sch", hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.t"))
    stop = hdrs(Nats_Schedule_Next="purge", Nats_Scheduler="s.sch")
    assert await publish(broker, "s.stop", stop) == 2
    await advance(broker, clock, 3)
    assert await produced(broker, "s.t") == []
    # Naming a subject whose last message is not a schedule, or only half of the pair:
    # 10212. A subject with no message may be named (nothing to purge), as on nats-server.
    assert await publish(broker, "s.stop", stop) == 3
    await publish(broker, "s.plain", hdrs(Foo="bar"))
    not_one = hdrs(Nats_Schedule_Next="purge", Nats_Scheduler="s.plain")
    assert await publish(broker, "s.stop", not_one) == 10212
    assert await publish(broker, "s.stop", hdrs(Nats_Scheduler="s.sch")) == 10212


async def test_publish_checks(broker: Broker) -> None:
    cases = [
        (hdrs(Nats_Schedule="@every 1s"), 10190),  # no target
        (hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.sch"), 10190),
        (hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="x.y"), 10190),
        (hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.*"), 10190),
        (hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.t", Nats_Schedule_TTL="x"), 10191),
        (hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.t", Nats_Rollup="all"), 10192),
        (
            hdrs(Nats_Schedule="@every 1s", Nats_Schedule_Target="s.t", Nats_Schedule_TTL="5s"),
            10166,
        ),
    ]
    for headers, code in cases:
        assert await publish(broker, "s.sch", headers) == code


async def test_schedules_come_back_from_the_store_and_never_fire_twice(
    store: MemoryStore, clock: FakeClock
) -> None:
    broker = await open_broker(store, clock)
    await publish(broker, "s.every", hdrs(Nats_Schedule="@every 10s", Nats_Schedule_Target="s.e"))
    later = START + 30 * NS
    await publish(
        broker, "s.at", hdrs(Nats_Schedule=f"@at {at(later)}", Nats_Schedule_Target="s.a")
    )
    await advance(broker, clock, 11)
    assert len(await produced(broker, "s.e")) == 1
    broker.close()  # a restart: the timetable is rebuilt from what the store holds
    await advance(broker, clock, 3)
    again = await open_broker(store, clock)
    await advance(again, clock, 1)
    assert len(await produced(again, "s.e")) == 1  # not fired again on load
    await advance(again, clock, 6)  # 21 s after the schedule: its next fire
    assert len(await produced(again, "s.e")) == 2
    await advance(again, clock, 10)
    assert len(await produced(again, "s.a")) == 1  # the @at, fired once after the restart
    again.close()
    third = await open_broker(store, clock)
    await advance(third, clock, 2)
    assert len(await produced(third, "s.a")) == 1
    third.close()


async def test_a_schedule_missed_while_down_fires_once(
    store: MemoryStore, clock: FakeClock
) -> None:
    broker = await open_broker(store, clock)
    await publish(broker, "s.every", hdrs(Nats_Schedule="@every 5s", Nats_Schedule_Target="s.e"))
    broker.close()
    clock.advance(60)  # twelve runs missed: they collapse into one
    again = await open_broker(store, clock)
    await advance(again, clock, 1)
    assert len(await produced(again, "s.e")) == 1
    again.close()


def test_the_timetable_runs_each_key_once_in_order() -> None:
    clock = FakeClock(START)
    table = sched.Timetable(clock)
    ran: list[str] = []
    table.set("a", START + 3 * NS, lambda: ran.append("a"))
    table.set("b", START + 1 * NS, lambda: ran.append("b"))
    table.set("c", START + 2 * NS, lambda: ran.append("c"))
    table.set("b", START + 4 * NS, lambda: ran.append("b2"))  # replaces b
    table.cancel("c")
    clock.advance(10)
    assert ran == ["a", "b2"]
    assert len(table) == 0


def test_cron_across_the_end_of_daylight_saving() -> None:
    """02:30 happens twice in Paris on 2023-10-29: from the second one, the next run of
    an every-10-seconds cron is 10 s later (not at once, not an hour later)."""
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    second = dt.datetime(2023, 10, 29, 2, 30, tzinfo=paris, fold=1)
    ns = int(second.timestamp()) * NS
    every_ten = sched.parse_pattern("*/10 * * * * *", "Europe/Paris")
    assert every_ten.next_after(ns) == ns + 10 * NS


async def test_a_cron_that_never_matches_never_fires(broker: Broker, clock: FakeClock) -> None:
    headers = hdrs(Nats_Schedule="0 0 0 31 2 *", Nats_Schedule_Target="s.t")  # 31 February
    assert await publish(broker, "s.sch", headers) == 1
    await advance(broker, clock, 3)
    assert await produced(broker, "s.t") == []
