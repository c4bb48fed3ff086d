"""The executor read path without Spark, against Tether and the real nats-server.

``read_partition`` is what a Spark task runs; here it reads ranges directly, so every
method (Tether's block reads, batched DIRECT.GET and the consumer fallback) is checked
against both servers with the same data: subject filters, range ends, headers,
timestamps. Block reads exist on Tether only; on nats-server they are a clear error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from tether.spark import _runtime
from tether.spark._fetch import RangePartition, read_partition
from tether.spark.options import TetherSparkError, read_options
from tether.testing import RunningServer, run_nats_server

pytestmark = pytest.mark.spark

MESSAGES = [
    (f"F.{('a', 'b', 'c')[i % 3]}", b"v%d" % i, {"N": str(i), "Dup": "x"} if i % 7 == 0 else None)
    for i in range(60)
]


@pytest.fixture(scope="module", params=["tether", "nats-server"])
def url(request: pytest.FixtureRequest, tools: Any) -> Iterator[str]:
    if request.param == "tether":
        srv: RunningServer = request.getfixturevalue("server")
        address = srv.url
        tools.make_stream(address, "F", ["F.>"], MESSAGES)
        yield address
        return
    with run_nats_server() as nats:
        tools.make_stream(nats.url, "F", ["F.>"], MESSAGES)
        yield nats.url
    _runtime.close_all()


@pytest.fixture(params=["bulk", "direct", "consumer"])
def method(request: pytest.FixtureRequest, url: str) -> str:
    if request.param == "bulk" and request.node.callspec.params.get("url") == "nats-server":
        pytest.skip("block reads are a Tether extension")
    return str(request.param)


def read(url: str, start: int, end: int, method: str, subjects: tuple[str, ...] = ()) -> Any:
    import pyarrow as pa

    opts = read_options(CaseInsensitiveDict({"servers": url, "stream": "F"}), streaming=False)
    part = RangePartition(opts.conn, "F", start, end, subjects, True, method, 4, 1 << 20)
    batches = list(read_partition(part))
    return pa.Table.from_batches(batches) if batches else None


def test_range_contents(url: str, method: str) -> None:
    table = read(url, 5, 25, method)
    assert table.column("seq").to_pylist() == list(range(5, 25))
    assert table.column("stream").to_pylist() == ["F"] * 20
    assert table.column("value").to_pylist()[:2] == [b"v4", b"v5"]
    assert table.column("subject").to_pylist()[:3] == ["F.b", "F.c", "F.a"]
    headers = dict(
        zip(table.column("seq").to_pylist(), table.column("headers").to_pylist(), strict=True)
    )
    assert headers[8] == [{"key": "N", "value": b"7"}, {"key": "Dup", "value": b"x"}]
    assert headers[9] == []
    stamps = table.column("timestamp").to_pylist()
    now = dt.datetime.now(dt.UTC)
    assert all(now - dt.timedelta(minutes=10) < t <= now for t in stamps)
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(
    ("subjects", "expected"),
    [
        (("F.b",), [i + 1 for i in range(60) if i % 3 == 1 and 10 <= i + 1 < 40]),
        (("F.a", "F.c"), [i + 1 for i in range(60) if i % 3 != 1 and 10 <= i + 1 < 40]),
        (("F.*",), list(range(10, 40))),
        (("F.none",), []),
    ],
)
def test_subject_filters(
    url: str, method: str, subjects: tuple[str, ...], expected: list[int]
) -> None:
    table = read(url, 10, 40, method, subjects)
    assert (table.column("seq").to_pylist() if table is not None else []) == expected


def test_range_past_the_end_and_empty_ranges(url: str, method: str) -> None:
    assert read(url, 55, 500, method).column("seq").to_pylist() == list(range(55, 61))
    assert read(url, 100, 200, method) is None
    assert read(url, 7, 7, method) is None


def test_block_reads_on_nats_server_are_a_clear_error(
    url: str, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params.get("url") != "nats-server":
        pytest.skip("checks the peer's answer")
    with pytest.raises(TetherSparkError, match=r"not Tether.*readMethod"):
        read(url, 1, 10, "bulk")


def test_small_blocks_and_windows_cover_the_range_once(url: str, method: str) -> None:
    """Windows of 4 sequences and 1 KiB requests: many requests and continuations."""
    import pyarrow as pa

    opts = read_options(CaseInsensitiveDict({"servers": url, "stream": "F"}), streaming=False)
    part = RangePartition(opts.conn, "F", 1, 61, (), False, method, 4, 1024)
    table = pa.Table.from_batches(list(read_partition(part)))
    assert table.column("seq").to_pylist() == list(range(1, 61))
    assert table.column("value").to_pylist() == [m[1] for m in MESSAGES]


@pytest.mark.parametrize("wanted", ["auto", "bulk", "direct", "consumer"])
def test_read_method_follows_the_server(
    url: str, wanted: str, request: pytest.FixtureRequest
) -> None:
    """``auto`` reads Tether in blocks and nats-server with DIRECT.GET; ``bulk`` on
    nats-server is refused when the query is planned, naming the option."""
    from tether.spark import planning

    opts = read_options(
        CaseInsensitiveDict({"servers": url, "stream": "F", "readMethod": wanted}),
        streaming=False,
    )
    info = _runtime.run(_runtime.stream_info(opts.conn, "F"))
    on_tether = request.node.callspec.params.get("url") == "tether"
    if wanted == "bulk" and not on_tether:
        with pytest.raises(TetherSparkError, match=r"'readMethod' is 'bulk'.*not a Tether"):
            _runtime.run(planning.read_method(opts, info))
        return
    expected = {"auto": "bulk" if on_tether else "direct"}.get(wanted, wanted)
    assert _runtime.run(planning.read_method(opts, info)) == expected
