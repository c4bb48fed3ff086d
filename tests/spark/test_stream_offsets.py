"""The streaming source's offset logic, driven directly as Spark's planner drives it.

No Spark session: ``TetherStreamReader`` is a plain object whose ``initialOffset``,
``latestOffset``, ``partitions`` and ``commit`` run against a real server here, so
every branch (sentinels, admission control, availableNow, data loss, the durable
hint) is checked quickly and deterministically. ``test_streaming.py`` runs the
same source inside Spark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from tether.spark import _runtime
from tether.spark._fetch import RangePartition, read_partition
from tether.spark.options import TetherSparkError, read_options
from tether.spark.streaming import TetherStreamReader
from tether.testing import RunningServer, run_nats_server, run_server

pytestmark = pytest.mark.spark


def reader(url: str, stream: str, **options: str) -> TetherStreamReader:
    return TetherStreamReader(
        read_options(
            CaseInsensitiveDict({"servers": url, "stream": stream, **options}), streaming=True
        )
    )


def rows(parts: Any) -> list[int]:
    seqs: list[int] = []
    for part in parts:
        assert isinstance(part, RangePartition)
        for batch in read_partition(part):
            seqs.extend(batch.column(2).to_pylist())
    return seqs


def test_initial_offset_is_constant_and_latest_is_a_bookmark(
    server: RunningServer, tools: Any
) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 10))
    r = reader(server.url, name)
    start = r.initialOffset()
    assert start == {"stream": name, "seq": -1}
    tools.publish(server.url, tools.numbered(f"{name}.a", 10, 5))
    assert r.initialOffset() == start  # asking again never moves the start
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"stream": name, "seq": 16}
    assert r.partitions(start, end) == []  # the bookmark batch reads nothing
    tools.publish(server.url, tools.numbered(f"{name}.a", 15, 3))
    nxt = r.latestOffset(end, ReadAllAvailable())
    assert rows(r.partitions(end, nxt)) == [16, 17, 18]


def test_earliest_and_explicit_starts(server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 20))
    r = reader(server.url, name, startingOffsets="earliest")
    start = r.initialOffset()
    assert start["seq"] == 0
    end = r.latestOffset(start, ReadAllAvailable())
    assert rows(r.partitions(start, end)) == list(range(1, 21))
    r = reader(server.url, name, startingOffsets="15")
    start = r.initialOffset()
    assert rows(r.partitions(start, r.latestOffset(start, ReadAllAvailable()))) == [
        15,
        16,
        17,
        18,
        19,
        20,
    ]


def test_max_offsets_per_trigger_and_available_now(server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 25))
    r = reader(server.url, name, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    limit = r.getDefaultReadLimit()
    assert limit == ReadMaxRows(10)
    r.prepareForTriggerAvailableNow()
    tools.publish(server.url, tools.numbered(f"{name}.a", 25, 5))  # after the target
    offsets = [r.initialOffset()]
    while (nxt := r.latestOffset(offsets[-1], limit)) != offsets[-1]:
        offsets.append(nxt)
    assert [o["seq"] for o in offsets] == [0, 11, 21, 26]
    # ReadAllAvailable (Spark's Trigger.Once) ignores the option but not the target.
    assert r.latestOffset(offsets[1], ReadAllAvailable())["seq"] == 26


def test_min_offsets_wait_for_rows_or_the_delay(server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 3))
    r = reader(
        server.url,
        name,
        startingOffsets="1",
        minOffsetsPerTrigger="5",
        maxTriggerDelay="700ms",
    )
    limit = r.getDefaultReadLimit()
    assert limit == ReadMinRows(5)
    start = r.initialOffset()
    assert r.latestOffset(start, limit) == start  # 3 < 5: wait
    tools.publish(server.url, tools.numbered(f"{name}.a", 3, 2))
    assert r.latestOffset(start, limit)["seq"] == 6  # 5 available: go
    tools.publish(server.url, tools.numbered(f"{name}.a", 5, 1))
    nxt = {"stream": name, "seq": 6}
    assert r.latestOffset(nxt, limit) == nxt
    time.sleep(0.8)
    assert r.latestOffset(nxt, limit)["seq"] == 7  # the delay passed: take what there is


def test_fail_on_data_loss(server: RunningServer, tools: Any) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 10))
    checkpointed = {"stream": name, "seq": 4}
    tools.api(server.url, f"STREAM.PURGE.{name}", {"seq": 8})  # removes 1..7
    strict = reader(server.url, name)
    with pytest.raises(TetherSparkError, match=r"messages 4\.\.7 .* 'failOnDataLoss'"):
        strict.latestOffset(checkpointed, ReadAllAvailable())
    with pytest.raises(TetherSparkError, match="failOnDataLoss"):
        strict.partitions(checkpointed, {"stream": name, "seq": 11})
    lenient = reader(server.url, name, failOnDataLoss="false")
    end = lenient.latestOffset(checkpointed, ReadAllAvailable())
    assert end["seq"] == 11
    assert rows(lenient.partitions(checkpointed, end)) == [8, 9, 10]


def test_offsets_of_another_stream_or_a_recreated_stream_fail(
    server: RunningServer, tools: Any
) -> None:
    name = tools.unique()
    tools.make_stream(server.url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 3))
    r = reader(server.url, name)
    with pytest.raises(TetherSparkError, match="new checkpoint location"):
        r.latestOffset({"stream": "OTHER", "seq": 2}, ReadAllAvailable())
    with pytest.raises(TetherSparkError, match="deleted and recreated"):
        r.latestOffset({"stream": name, "seq": 50}, ReadAllAvailable())


def test_missing_stream_names_the_option(server: RunningServer) -> None:
    r = reader(server.url, "NOPE")
    with pytest.raises(TetherSparkError, match=r"stream 'NOPE' \(option 'stream'\) does not exist"):
        r.latestOffset({"stream": "NOPE", "seq": -1}, ReadAllAvailable())


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    try:
        with run_nats_server() as srv:
            yield srv.url
    finally:
        _runtime.close_all()


@pytest.mark.parametrize("backend", ["tether", "nats-server"])
def test_durable_hint_acks_up_to_the_committed_sequence(
    backend: str, request: pytest.FixtureRequest, tools: Any
) -> None:
    url = (
        request.getfixturevalue("server").url
        if backend == "tether"
        else request.getfixturevalue("nats_url")
    )
    name = tools.unique("D")
    tools.make_stream(url, name, [f"{name}.>"], tools.numbered(f"{name}.a", 0, 10))
    r = reader(url, name, startingOffsets="earliest", durable="spark_q")
    r.commit({"stream": name, "seq": 4})  # creates the consumer after sequence 3
    info = tools.api(url, f"CONSUMER.INFO.{name}.spark_q")
    assert info["config"]["opt_start_seq"] == 4
    assert info["num_pending"] == 7
    r.commit({"stream": name, "seq": 9})  # acknowledges 4..8
    info = tools.api(url, f"CONSUMER.INFO.{name}.spark_q")
    assert info["ack_floor"]["stream_seq"] == 8
    assert info["num_pending"] == 2
    assert info["num_ack_pending"] == 0
    r.commit({"stream": name, "seq": 9})  # already there: nothing to do
    assert tools.api(url, f"CONSUMER.INFO.{name}.spark_q")["ack_floor"]["stream_seq"] == 8


@pytest.mark.parametrize(
    ("server_args", "url_auth", "good", "bad"),
    [
        (
            ("--user", "spark", "--password", "s3cret"),
            "spark:s3cret@",
            {"user": "spark", "password": "s3cret"},
            {"user": "spark", "password": "nope"},
        ),
        (("--auth-token", "t0ken"), "t0ken@", {"token": "t0ken"}, {"token": "wrong"}),
    ],
)
def test_credentials(
    server_args: tuple[str, ...],
    url_auth: str,
    good: dict[str, str],
    bad: dict[str, str],
    tools: Any,
) -> None:
    """Options user/password and token reach the server; refused ones name the options."""
    with run_server(store="memory", args=server_args) as srv:
        try:
            setup_url = srv.url.replace("nats://", "nats://" + url_auth)
            tools.make_stream(setup_url, "AUTH", ["auth.>"], tools.numbered("auth.a", 0, 3))
            r = reader(srv.url, "AUTH", startingOffsets="earliest", **good)
            start = r.initialOffset()
            end = r.latestOffset(start, ReadAllAvailable())
            assert rows(r.partitions(start, end)) == [1, 2, 3]
            with pytest.raises(TetherSparkError, match="'user'/'password'/'token'"):
                reader(srv.url, "AUTH", **bad).latestOffset(start, ReadAllAvailable())
        finally:
            _runtime.close_all()
