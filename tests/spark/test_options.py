"""Option parsing and the pure helpers of the data source (no Spark session)."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from tether.spark._fetch import RangePartition, split_range, subject_matches
from tether.spark.options import (
    EARLIEST,
    LATEST,
    TetherSparkError,
    parse_duration,
    read_options,
    write_options,
)
from tether.spark.schema import arrow_schema

pytestmark = pytest.mark.spark


def opts(**kv: str) -> CaseInsensitiveDict:
    return CaseInsensitiveDict(kv)


def test_defaults_for_batch_and_streaming() -> None:
    batch = read_options(opts(stream="ORDERS"), streaming=False)
    assert batch.start == EARLIEST and batch.end == LATEST
    assert batch.conn.servers == ("nats://127.0.0.1:4222",)
    stream = read_options(opts(stream="ORDERS"), streaming=True)
    assert stream.start == LATEST and stream.fail_on_data_loss


def test_option_names_are_case_insensitive() -> None:
    o = read_options(
        opts(STREAM="ORDERS", startingoffsets="5", MAXOFFSETSPERTRIGGER="10"), streaming=True
    )
    assert (o.stream, o.start, o.max_offsets_per_trigger) == ("ORDERS", 5, 10)


@pytest.mark.parametrize(
    ("raw", "seq"),
    [
        ("earliest", EARLIEST),
        ("42", 42),
        ('{"stream": "ORDERS", "seq": 7}', 7),
        ('{"seq": 8}', 8),
        ('{"ORDERS": 9}', 9),
    ],
)
def test_starting_offsets_forms(raw: str, seq: int) -> None:
    assert read_options(opts(stream="ORDERS", startingOffsets=raw), streaming=False).start == seq


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"stream": "S", "startingOffsets": "{not json"}, False, "option 'startingOffsets'"),
        ({"stream": "S", "startingOffsets": '{"stream": "T", "seq": 1}'}, False, "'stream' is 'S'"),
        ({"stream": "S", "startingOffsets": '{"seq": "x"}'}, False, "'seq' must be an integer"),
        ({"stream": "S", "startingOffsets": "0"}, False, "sequences start at 1"),
        ({"stream": "S", "startingOffsets": "latest"}, False, "option 'startingOffsets'"),
        ({"stream": "S", "endingOffsets": "yesterday"}, False, "option 'endingOffsets'"),
        ({"stream": "S", "startingOffsets": "9", "endingOffsets": "3"}, False, "before"),
        ({"stream": "S", "startingTimestamp": "noon"}, False, "option 'startingTimestamp'"),
        ({"stream": "S", "minPartitions": "0"}, False, "option 'minPartitions' must be >= 1"),
        ({"stream": "S", "includeHeaders": "maybe"}, False, "option 'includeHeaders'"),
        ({"stream": "S", "readMethod": "carrier-pigeon"}, False, "option 'readMethod'"),
        ({"stream": "S", "maxOffsetsPerTrigger": "ten"}, True, "option 'maxOffsetsPerTrigger'"),
        ({"stream": "S", "maxTriggerDelay": "soon"}, True, "option 'maxTriggerDelay'"),
        ({"stream": "S", "servers": "http://x:1"}, False, "option 'servers'"),
        ({"stream": "S", "token": "t", "user": "u"}, False, "'token' and 'user'"),
        ({"stream": "S", "subjects": "a.>.b"}, False, "option 'subjects'"),
        ({"stream": "a.b"}, False, "option 'stream'"),
        ({}, False, "option 'stream' is required"),
        ({"stream": "S", "startingOffset": "1"}, False, "unknown option 'startingoffset'"),
        ({"stream": "S", "endingOffsets": "5"}, True, "option 'endingOffsets' is not valid"),
        (
            {"stream": "S", "maxOffsetsPerTrigger": "5"},
            False,
            "'maxOffsetsPerTrigger' is not valid",
        ),
        (
            {"stream": "S", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
            True,
            "'minOffsetsPerTrigger' must not exceed",
        ),
    ],
)
def test_bad_read_options_name_the_option(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(TetherSparkError, match=message.replace("(", r"\(")):
        read_options(opts(**options), streaming=streaming)


def test_write_options() -> None:
    w = write_options(opts(subject="out.x", maxPendingAcks="100"), streaming=True)
    assert (w.subject, w.max_pending_acks, w.idempotent, w.stream) == ("out.x", 100, True, None)
    with pytest.raises(TetherSparkError, match="option 'subject'"):
        write_options(opts(subject="out.*"), streaming=False)
    with pytest.raises(TetherSparkError, match="'startingOffsets' is not valid for batch writes"):
        write_options(opts(startingOffsets="1"), streaming=False)


def test_starting_timestamp_forms() -> None:
    ms = read_options(opts(stream="S", startingTimestamp="1700000000123"), streaming=False)
    assert ms.starting_timestamp == "2023-11-14T22:13:20.123000Z"
    iso = read_options(opts(stream="S", startingTimestamp="2024-01-02T03:04:05Z"), streaming=True)
    assert iso.starting_timestamp == "2024-01-02T03:04:05.000000Z"


def test_durations() -> None:
    assert parse_duration("500ms", "x") == 0.5
    assert parse_duration("30s", "x") == 30
    assert parse_duration("2m", "x") == 120
    assert parse_duration("1h", "x") == 3600
    assert parse_duration("7", "x") == 7


def test_split_range_is_even_and_contiguous() -> None:
    assert split_range(1, 11, 3) == [(1, 5), (5, 8), (8, 11)]
    assert split_range(1, 3, 5) == [(1, 2), (2, 3)]
    assert split_range(5, 5, 2) == []


@pytest.mark.parametrize(
    ("subject", "pattern", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.*", True),
        ("a.b.c", "a.*", False),
        ("a.b.c", "a.>", True),
        ("a", "a.>", False),
        ("a.b", "*.b", True),
        ("a.c", "a.b", False),
    ],
)
def test_subject_matching(subject: str, pattern: str, expected: bool) -> None:
    assert subject_matches(subject, pattern) is expected


def test_partitions_pickle() -> None:
    o = read_options(opts(stream="S", subjects="a.*,b.>", includeHeaders="true"), streaming=False)
    part = RangePartition(o.conn, "S", 1, 10, o.subjects, True, "direct", 100, 1 << 20)
    assert pickle.loads(pickle.dumps(part)) == part


def test_arrow_schema_matches_spark() -> None:
    pa = pytest.importorskip("pyarrow")
    schema = arrow_schema(True)
    assert schema.names == ["stream", "subject", "seq", "value", "timestamp", "headers"]
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert schema.field("value").type == pa.binary()
    assert arrow_schema(False).names == schema.names[:-1]
