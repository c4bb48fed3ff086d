"""Batch reads through a local Spark session: ``spark.read.format("tether")``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tether.spark import TetherDataSource
from tether.testing import RunningServer

pytestmark = pytest.mark.spark


def read(spark: Any, url: str, stream: str, **options: str) -> Any:
    return (
        spark.read.format("tether")
        .option("servers", url)
        .option("stream", stream)
        .options(**options)
    )


@pytest.fixture(scope="module")
def orders(server: RunningServer, tools: Any) -> str:
    """ORDERS-like stream: 300 messages alternating orders.eu / orders.us, every 50th
    with headers (one repeated key)."""
    name = tools.unique("ORD")
    messages = []
    for i in range(300):
        headers = {"Trace": f"t{i}", "Kind": "x"} if i % 50 == 0 else None
        messages.append((f"{name}.{'eu' if i % 2 else 'us'}", b"order-%d" % i, headers))
    tools.make_stream(server.url, name, [f"{name}.>"], messages)
    return name


def test_counts_and_contents(spark: Any, server: RunningServer, orders: str) -> None:
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=5)
    df = read(spark, server.url, orders).load()
    assert df.columns == ["stream", "subject", "seq", "value", "timestamp"]
    rows = sorted(df.collect(), key=lambda r: r.seq)
    assert [r.seq for r in rows] == list(range(1, 301))
    assert {r.stream for r in rows} == {orders}
    assert rows[0].subject == f"{orders}.us" and rows[1].subject == f"{orders}.eu"
    assert [bytes(r.value) for r in rows[:3]] == [b"order-0", b"order-1", b"order-2"]
    assert all(before < r.timestamp < before + dt.timedelta(minutes=10) for r in rows)
    assert [r.timestamp for r in rows] == sorted(r.timestamp for r in rows)


def test_subject_filters(spark: Any, server: RunningServer, orders: str) -> None:
    eu = read(spark, server.url, orders, subjects=f"{orders}.eu").load()
    assert sorted(r.seq for r in eu.select("seq").collect()) == list(range(2, 301, 2))
    both = read(spark, server.url, orders, subjects=f"{orders}.eu, {orders}.nope").load()
    assert both.count() == 150
    wildcard = read(spark, server.url, orders, subjects=f"{orders}.*").load()
    assert wildcard.count() == 300


def test_ranges_and_partitions(spark: Any, server: RunningServer, orders: str) -> None:
    df = read(spark, server.url, orders, startingOffsets="101", endingOffsets="201").load()
    assert sorted(r.seq for r in df.select("seq").collect()) == list(range(101, 201))
    as_json = read(
        spark,
        server.url,
        orders,
        startingOffsets=f'{{"stream": "{orders}", "seq": 290}}',
        minPartitions="3",
    ).load()
    assert as_json.rdd.getNumPartitions() == 3
    assert sorted(r.seq for r in as_json.select("seq").collect()) == list(range(290, 301))
    small = read(spark, server.url, orders, maxRecordsPerPartition="50", fetchBatchSize="7")
    df = small.load()
    assert df.rdd.getNumPartitions() == 6
    assert df.select("seq").distinct().count() == 300


def test_starting_timestamp(spark: Any, server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 5))
    cut = dt.datetime.now(dt.UTC)
    tools.publish(server.url, tools.numbered(f"{name}.a", 5, 3))
    df = read(spark, server.url, name, startingTimestamp=cut.isoformat()).load()
    assert sorted(r.seq for r in df.select("seq").collect()) == [6, 7, 8]
    millis = str(int(cut.timestamp() * 1000) + 3_600_000)  # an hour ahead: nothing
    assert read(spark, server.url, name, startingTimestamp=millis).load().count() == 0


def test_headers(spark: Any, server: RunningServer, orders: str) -> None:
    df = read(spark, server.url, orders, includeHeaders="true", endingOffsets="52").load()
    assert df.columns[-1] == "headers"
    rows = {r.seq: r.headers for r in df.collect()}
    assert [(h.key, bytes(h.value)) for h in rows[1]] == [("Trace", b"t0"), ("Kind", b"x")]
    assert [(h.key, bytes(h.value)) for h in rows[51]] == [("Trace", b"t50"), ("Kind", b"x")]
    assert rows[2] == []


def test_consumer_fallback_without_allow_direct(
    spark: Any, server: RunningServer, tools: Any
) -> None:
    name = tools.unique()
    messages = [
        (f"{name}.{i % 3}", b"v%d" % i, {"H": str(i)} if i == 4 else None) for i in range(40)
    ]
    tools.make_stream(server.url, name, [f"{name}.>"], messages, allow_direct=False)
    df = read(
        spark, server.url, name, subjects=f"{name}.1", includeHeaders="true", minPartitions="2"
    ).load()
    rows = sorted(df.collect(), key=lambda r: r.seq)
    assert [r.seq for r in rows] == [i + 1 for i in range(40) if i % 3 == 1]
    assert [(h.key, bytes(h.value)) for h in rows[1].headers] == [("H", b"4")]
    assert rows[0].timestamp is not None
    with pytest.raises(Exception, match="allow_direct off"):
        read(spark, server.url, name, readMethod="direct").load().count()


def test_empty_stream(spark: Any, server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"])
    assert read(spark, server.url, name).load().count() == 0


def test_explicit_registration(spark: Any, server: RunningServer, orders: str) -> None:
    spark.dataSource.register(TetherDataSource)
    assert read(spark, server.url, orders, endingOffsets="11").load().count() == 10


def test_missing_stream_is_a_clear_error(spark: Any, server: RunningServer) -> None:
    with pytest.raises(Exception, match=r"stream 'NOPE' \(option 'stream'\) does not exist"):
        read(spark, server.url, "NOPE").load().count()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOfsets": "earliest"}, "unknown option 'startingofsets'"),
        ({"startingOffsets": '{"seq": 1'}, "option 'startingOffsets' is not valid JSON"),
        ({"maxOffsetsPerTrigger": "10"}, "option 'maxOffsetsPerTrigger' is not valid for batch"),
        ({"includeHeaders": "perhaps"}, "option 'includeHeaders' must be true or false"),
    ],
)
def test_bad_options_fail_at_load(
    spark: Any, server: RunningServer, orders: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, server.url, orders, **options).load().count()


def test_unreachable_server_names_the_option(spark: Any) -> None:
    df = read(spark, "nats://127.0.0.1:9", "ORDERS", timeout="2").load()
    with pytest.raises(Exception, match="cannot connect to option 'servers'"):
        df.count()


def test_user_schema_must_match(spark: Any, server: RunningServer, orders: str) -> None:
    with pytest.raises(Exception, match="fixed schema"):
        read(spark, server.url, orders).schema("value binary").load().count()
