"""The stream index and its rules: limits, discard policies, dedup, expectations, purge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.errors import ApiError
from tether.engine.streams.config import StreamConfig, normalize
from tether.engine.streams.stream import Stream, message_ttl
from tether.storage.base import MessageMeta

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def make(**config: Any) -> Stream:
    config.setdefault("name", "S")
    config.setdefault("subjects", ["s.>"])
    stream = Stream(normalize(StreamConfig(**config)), T0)
    stream.start_empty()
    return stream


def add(stream: Stream, subject: str, size: int = 10, ts: int = T0, msg_id: str = "") -> list[int]:
    """Append the next message as the broker does; returns what the limits evicted."""
    seq = stream.last_seq + 1
    return stream.append(MessageMeta(seq, subject, size, ts), msg_id)


def live(stream: Stream) -> list[int]:
    return list(stream.seqs(0))


def error_of(excinfo: pytest.ExceptionInfo[ApiError]) -> tuple[int, int, str]:
    err = excinfo.value
    return err.code, err.err_code, err.description


# -- state --------------------------------------------------------------------------------


def test_a_new_stream_reports_zero_sequences() -> None:
    stream = make()
    assert stream.info_state() == {
        "messages": 0,
        "bytes": 0,
        "first_seq": 0,
        "first_ts": 0,
        "last_seq": 0,
        "last_ts": 0,
        "consumer_count": 0,
    }


def test_first_seq_config_sets_where_numbering_starts() -> None:
    stream = make(first_seq=100)
    assert (stream.first_seq, stream.last_seq) == (100, 99)
    add(stream, "s.a")
    assert live(stream) == [100]


def test_append_counts_messages_bytes_and_subjects() -> None:
    stream = make()
    add(stream, "s.a", 10, T0 + 1)
    add(stream, "s.b", 20, T0 + 2)
    add(stream, "s.a", 30, T0 + 3)
    state = stream.info_state()
    assert state["messages"] == 3
    assert state["bytes"] == 60
    assert (state["first_seq"], state["last_seq"]) == (1, 3)
    assert (state["first_ts"], state["last_ts"]) == (T0 + 1, T0 + 3)
    assert state["num_subjects"] == 2
    assert "num_deleted" not in state


def test_interior_deletes_are_counted_and_listed() -> None:
    stream = make()
    for _ in range(5):
        add(stream, "s.a")
    stream.remove(2)
    stream.remove(4)
    assert stream.info_state()["num_deleted"] == 2
    assert stream.deleted() == [2, 4]
    stream.remove(1)  # the head moves; 2 is no longer interior
    assert stream.first_seq == 3
    assert stream.deleted() == [4]


def test_removing_everything_moves_first_past_last() -> None:
    stream = make()
    add(stream, "s.a")
    add(stream, "s.a")
    stream.remove(1)
    stream.remove(2)
    assert (stream.first_seq, stream.last_seq) == (3, 2)


def test_load_rebuilds_the_index_and_keeps_the_high_water_mark() -> None:
    stream = Stream(normalize(StreamConfig(name="S")), T0)
    stream.load([MessageMeta(3, "S", 10, T0), MessageMeta(5, "S", 10, T0)], last_seq=7)
    assert (stream.first_seq, stream.last_seq, len(stream)) == (3, 7, 2)
    empty = Stream(normalize(StreamConfig(name="E")), T0)
    empty.load([], last_seq=4)
    assert (empty.first_seq, empty.last_seq) == (5, 4)
    never = Stream(normalize(StreamConfig(name="N", first_seq=10)), T0)
    never.load([], last_seq=0)
    assert (never.first_seq, never.last_seq) == (10, 9)


# -- limits, discard old -------------------------------------------------------------------


def test_max_msgs_evicts_the_oldest() -> None:
    stream = make(max_msgs=3)
    evicted = [add(stream, "s.a") for _ in range(5)]
    assert evicted == [[], [], [], [1], [2]]
    assert live(stream) == [3, 4, 5]


def test_max_bytes_evicts_the_oldest_until_it_fits() -> None:
    stream = make(max_bytes=100)
    add(stream, "s.a", 40)
    add(stream, "s.a", 40)
    assert add(stream, "s.a", 20) == []  # exactly at the limit
    assert add(stream, "s.a", 41) == [1, 2]
    assert stream.state.bytes == 61


def test_max_msgs_per_subject_evicts_that_subjects_oldest() -> None:
    stream = make(max_msgs_per_subject=2)
    for subject in ("s.a", "s.b", "s.a", "s.a", "s.b", "s.b"):
        add(stream, subject)
    assert live(stream) == [3, 4, 5, 6]
    assert stream.subjects_state(">") == {"s.a": 2, "s.b": 2}


def test_a_tighter_limit_applies_to_what_is_stored() -> None:
    stream = make()
    for _ in range(5):
        add(stream, "s.a")
    stream.config = normalize(StreamConfig(name="S", subjects=["s.>"], max_msgs=2))
    assert stream.enforce_limits() == [1, 2, 3]
    assert live(stream) == [4, 5]


# -- limits, discard new -----------------------------------------------------------------


def test_discard_new_refuses_over_max_msgs() -> None:
    stream = make(max_msgs=2, discard="new")
    add(stream, "s.a")
    add(stream, "s.b")
    with pytest.raises(ApiError) as excinfo:
        stream.check_limits_for_new("s.c", 10)
    assert error_of(excinfo) == (503, 10077, "maximum messages exceeded")


def test_discard_new_refuses_over_max_bytes() -> None:
    stream = make(max_bytes=100, discard="new")
    add(stream, "s.a", 60)
    stream.check_limits_for_new("s.a", 40)  # exactly full is fine
    with pytest.raises(ApiError) as excinfo:
        stream.check_limits_for_new("s.a", 41)
    assert error_of(excinfo) == (503, 10077, "maximum bytes exceeded")


def test_discard_new_per_subject_refuses_but_lets_rollups_through() -> None:
    stream = make(
        max_msgs_per_subject=1,
        discard="new",
        discard_new_per_subject=True,
        allow_rollup_hdrs=True,
    )
    add(stream, "s.a")
    with pytest.raises(ApiError) as excinfo:
        stream.check_limits_for_new("s.a", 10)
    assert error_of(excinfo) == (503, 10077, "maximum messages per subject exceeded")
    stream.check_limits_for_new("s.a", 10, rollup=True)
    stream.check_limits_for_new("s.b", 10)


def test_discard_new_without_per_subject_still_replaces_a_full_subject() -> None:
    # The message replaces the subject's oldest, so a full stream takes it (KV updates).
    stream = make(max_msgs_per_subject=1, max_msgs=2, discard="new")
    add(stream, "s.a")
    add(stream, "s.b")
    stream.check_limits_for_new("s.a", 10)
    assert add(stream, "s.a") == [1]
    with pytest.raises(ApiError):
        stream.check_limits_for_new("s.c", 10)


def test_discard_new_replacing_a_smaller_message_still_counts_bytes() -> None:
    stream = make(max_msgs_per_subject=1, max_bytes=100, discard="new")
    add(stream, "s.a", 30)
    add(stream, "s.b", 60)
    stream.check_limits_for_new("s.a", 30)  # replaces 30 bytes with 30 bytes
    with pytest.raises(ApiError):
        stream.check_limits_for_new("s.a", 50)


def test_max_msg_size_counts_headers_and_payload_not_the_subject() -> None:
    stream = make(max_msg_size=10)
    stream.check_size(0, 10)
    stream.check_size(4, 6)
    with pytest.raises(ApiError) as excinfo:
        stream.check_size(4, 7)
    assert error_of(excinfo) == (400, 10054, "message size exceeds maximum allowed")
    with pytest.raises(ApiError) as excinfo:
        make().check_size(70_000, 0)
    assert excinfo.value.err_code == 10097


# -- max_age -----------------------------------------------------------------------------


def test_expired_removes_what_is_older_than_max_age() -> None:
    stream = make(max_age=10 * NS)
    add(stream, "s.a", ts=T0)
    add(stream, "s.a", ts=T0 + 5 * NS)
    add(stream, "s.a", ts=T0 + 9 * NS)
    assert stream.next_expiry() == T0 + 10 * NS
    assert stream.expired(T0 + 10 * NS - 1) == []
    assert stream.expired(T0 + 15 * NS) == [1, 2]
    assert stream.next_expiry() == T0 + 19 * NS
    assert stream.expired(T0 + 60 * NS) == [3]
    assert stream.next_expiry() == 0
    assert (stream.first_seq, stream.last_seq) == (4, 3)


def test_without_max_age_nothing_expires() -> None:
    stream = make()
    add(stream, "s.a", ts=T0)
    assert stream.expired(T0 + 10**6 * NS) == []
    assert stream.next_expiry() == 0


# -- dedup ---------------------------------------------------------------------------------


def test_duplicates_are_found_inside_the_window_only() -> None:
    stream = make(duplicate_window=2 * NS)
    add(stream, "s.a", ts=T0, msg_id="a")
    add(stream, "s.a", ts=T0 + NS, msg_id="b")
    assert stream.duplicate_of("a", T0 + NS) == 1
    assert stream.duplicate_of("b", T0 + NS) == 2
    assert stream.duplicate_of("c", T0 + NS) == 0
    assert stream.duplicate_of("a", T0 + 2 * NS + 1) == 0  # expired
    assert stream.duplicate_of("b", T0 + 2 * NS + 1) == 2


def test_forget_undoes_an_append_and_its_msg_id() -> None:
    stream = make()
    add(stream, "s.a", msg_id="a")
    stream.forget(1, "a")
    assert len(stream) == 0
    assert stream.duplicate_of("a", T0) == 0
    assert stream.last_msg_id == ""
    assert (stream.first_seq, stream.last_seq) == (0, 0)


def test_forgetting_a_failed_tail_gives_its_sequences_back() -> None:
    stream = make()
    for _ in range(5):
        add(stream, "s.a")
    for seq in (5, 4):  # newest first, as the broker does
        stream.forget(seq, "")
    assert (stream.first_seq, stream.last_seq, len(stream)) == (1, 3, 3)
    stream.forget(2, "")  # not the tail: stays a gap
    assert (stream.last_seq, stream.deleted()) == (3, [2])


def test_remembered_msg_ids_survive_a_reload() -> None:
    stream = Stream(normalize(StreamConfig(name="S")), T0)
    stream.load([MessageMeta(1, "S", 10, T0)], last_seq=1)
    stream.remember_msg_id("a", 1, T0)
    assert stream.duplicate_of("a", T0 + NS) == 1
    assert stream.last_msg_id == "a"


# -- expectations ----------------------------------------------------------------------------


def check(target: Stream, subject: str = "s.a", **headers: str) -> None:
    def raw(key: str) -> bytes | None:
        value = headers.get(key)
        return None if value is None else value.encode()

    target.check_expectations(
        subject,
        raw("stream"),
        raw("last_seq"),
        raw("subj_seq"),
        raw("subj_seq_subject"),
    )


def test_expected_stream() -> None:
    stream = make()
    check(stream, stream="S")
    with pytest.raises(ApiError) as excinfo:
        check(stream, stream="T")
    assert error_of(excinfo) == (400, 10060, "expected stream does not match")


def test_expected_last_sequence() -> None:
    stream = make()
    check(stream, last_seq="0")
    add(stream, "s.a")
    add(stream, "s.b")
    check(stream, last_seq="2")
    with pytest.raises(ApiError) as excinfo:
        check(stream, last_seq="1")
    assert error_of(excinfo) == (400, 10071, "wrong last sequence: 2")
    with pytest.raises(ApiError):
        check(stream, last_seq="not a number")


def test_expected_last_subject_sequence_with_and_without_a_subject_override() -> None:
    stream = make()
    check(stream, "s.a", subj_seq="0")
    add(stream, "s.a")
    add(stream, "s.b")
    add(stream, "s.c.d")
    check(stream, "s.a", subj_seq="1")
    with pytest.raises(ApiError) as excinfo:
        check(stream, "s.a", subj_seq="0")
    assert error_of(excinfo) == (400, 10071, "wrong last sequence: 1")
    check(stream, "s.x", subj_seq="2", subj_seq_subject="s.b")
    check(stream, "s.x", subj_seq="2", subj_seq_subject="s.*")
    check(stream, "s.x", subj_seq="3", subj_seq_subject="s.>")
    with pytest.raises(ApiError) as excinfo:
        check(stream, "s.x", subj_seq_subject="s.b")
    assert error_of(excinfo)[:2] == (400, 10193)


def test_expected_last_msg_id() -> None:
    stream = make()
    stream.check_last_msg_id(b"")
    add(stream, "s.a", msg_id="m1")
    stream.check_last_msg_id(b"m1")
    with pytest.raises(ApiError) as excinfo:
        stream.check_last_msg_id(b"m0")
    assert error_of(excinfo) == (400, 10070, "wrong last msg ID: m1")
    add(stream, "s.a")  # a message without an id resets it
    stream.check_last_msg_id(b"")


# -- lookups ---------------------------------------------------------------------------------


@pytest.fixture
def subjects_stream() -> Stream:
    stream = make()
    for subject in ("s.a", "s.b", "s.a", "s.c.d", "s.b", "s.c.e"):
        add(stream, subject)
    return stream


def test_last_by_subject_literal_and_wildcards(subjects_stream: Stream) -> None:
    stream = subjects_stream
    assert stream.last_by_subject("s.a") == 3
    assert stream.last_by_subject("s.*") == 5
    assert stream.last_by_subject("s.c.*") == 6
    assert stream.last_by_subject("s.>") == 6
    assert stream.last_by_subject("s.z") == 0
    assert stream.last_by_subject("t.>") == 0


def test_next_by_subject(subjects_stream: Stream) -> None:
    stream = subjects_stream
    assert stream.next_by_subject(0, "s.a") == 1
    assert stream.next_by_subject(2, "s.a") == 3
    assert stream.next_by_subject(4, "s.a") == 0
    assert stream.next_by_subject(4, "s.*") == 5
    assert stream.next_by_subject(4, "s.>") == 4
    assert stream.next_by_subject(1, "s.c.*") == 4


def test_counts_and_subject_totals(subjects_stream: Stream) -> None:
    stream = subjects_stream
    assert stream.count_matching(0, ()) == 6
    assert stream.count_matching(3, ()) == 4
    assert stream.count_matching(2, ("s.a",)) == 1
    assert stream.count_matching(0, ("s.c.>",)) == 2
    assert stream.subjects_state("s.c.*") == {"s.c.d": 1, "s.c.e": 1}
    assert stream.subjects_state("s.a") == {"s.a": 2}
    assert stream.subjects_state("nope") == {}


def test_seq_from_time() -> None:
    stream = make()
    for i in range(3):
        add(stream, "s.a", ts=T0 + i * NS)
    assert stream.seq_from_time(T0 - 1) == 1
    assert stream.seq_from_time(T0 + 1) == 2
    assert stream.seq_from_time(T0 + 2 * NS) == 3
    assert stream.seq_from_time(T0 + 3 * NS) == 0


# -- purge and rollup ----------------------------------------------------------------------


@pytest.fixture
def ten() -> Stream:
    stream = make()
    for i in range(10):
        add(stream, "s.a" if i % 2 == 0 else "s.b")  # odd seqs on s.a
    return stream


def test_purge_everything(ten: Stream) -> None:
    assert ten.purge() == list(range(1, 11))
    assert (ten.first_seq, ten.last_seq, len(ten)) == (11, 10, 0)


def test_purge_below_a_sequence(ten: Stream) -> None:
    assert ten.purge(up_to_seq=4) == [1, 2, 3]
    assert ten.first_seq == 4


def test_purge_keeping_the_newest(ten: Stream) -> None:
    assert ten.purge(keep=3) == list(range(1, 8))
    assert ten.purge(keep=5) == []


def test_purge_with_a_filter(ten: Stream) -> None:
    assert ten.purge("s.a", keep=2) == [1, 3, 5]
    assert ten.purge("s.b", up_to_seq=6) == [2, 4]
    assert ten.purge("s.*", up_to_seq=9) == [6, 7, 8]
    assert live(ten) == [9, 10]
    assert ten.purge("nothing.here") == []


def test_rollup_sub_and_all(ten: Stream) -> None:
    assert ten.rollup("s.a", "sub") == [1, 3, 5, 7, 9]
    assert live(ten) == [2, 4, 6, 8, 10]
    assert ten.rollup("s.z", "all") == [2, 4, 6, 8, 10]
    assert len(ten) == 0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5", 5),
        ("1m", 60),
        ("1h30m", 5400),
        ("never", -1),
        ("0", None),
        ("500ms", None),
        ("abc", None),
        ("-1", None),
    ],
)
def test_message_ttl_values_are_read_as_nats_server_reads_them(
    value: str, seconds: int | None
) -> None:
    assert message_ttl(value) == seconds


def test_a_per_message_ttl_needs_allow_msg_ttl() -> None:
    stream = make()
    with pytest.raises(ApiError) as excinfo:
        stream.check_expectations("s.a", None, None, None, None, b"10s")
    assert excinfo.value.err_code == 10166
    with pytest.raises(ApiError) as excinfo:
        stream.check_expectations("s.a", None, None, None, None, b"0")
    assert excinfo.value.err_code == 10165
    with_ttl = make(allow_msg_ttl=True)
    assert with_ttl.check_expectations("s.a", None, None, None, None, b"1h") == 3600
    assert with_ttl.check_expectations("s.a", None, None, None, None, b"never") == -1
    assert with_ttl.check_expectations("s.a", None, None, None, None, None) == 0


def test_purging_below_a_sequence_past_the_end_moves_numbering_forward(ten: Stream) -> None:
    assert ten.purge(up_to_seq=20) == list(range(1, 11))
    assert (ten.first_seq, ten.last_seq) == (20, 19)
    assert add(ten, "s.a") == []
    assert live(ten) == [20]


def test_count_from_a_sequence_with_and_without_gaps() -> None:
    stream = make()
    for i in range(10):
        add(stream, f"s.{i % 3}")
    assert stream.count_matching(4, ()) == 7  # dense: arithmetic
    assert stream.count_matching(11, ()) == 0
    stream.remove(6)
    stream.remove(9)
    assert stream.count_matching(4, ()) == 5  # gaps: counted
    assert stream.count_matching(1, ()) == 8
    assert stream.count_matching(4, ("s.0",)) == 3  # seqs 4, 7 and 10 are on s.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(17, 60)), max_size=5),
    st.lists(st.integers(17, 60), max_size=20),
    st.sampled_from([0, 5]),
    st.booleans(),
)
def test_append_run_is_append_one_by_one(
    before: list[tuple[str, int]], sizes: list[int], first_seq: int, remove_all: bool
) -> None:
    streams = [make(first_seq=first_seq) if first_seq else make() for _ in range(2)]
    for stream in streams:
        for subject, size in before:
            add(stream, subject, size, msg_id=f"id-{size}")
        if remove_all:
            for seq in live(stream):
                stream.remove(seq)
    one, run = streams
    assert not run.evicts
    first = one.last_seq + 1
    for i, size in enumerate(sizes):
        meta = MessageMeta(first + i, "a", size, T0 + 1, 0, one.sizing.plain)
        assert one.append(meta, "") == []
    if sizes:
        assert run.append_run("a", sizes, T0 + 1) == first
    assert run.info_state() == one.info_state()
    assert live(run) == live(one)
    assert [run.meta(s) for s in live(run)] == [one.meta(s) for s in live(one)]
    assert run.subjects_state(">") == one.subjects_state(">")
    assert (run.last_msg_id, run.state.last_ts) == (one.last_msg_id, one.state.last_ts)
    assert list(run.seqs_matching(0, ("a",))) == list(one.seqs_matching(0, ("a",)))


# -- remove_many (interest retention's batches) ------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    subjects=st.lists(st.sampled_from(["s.a", "s.b", "s.c"]), min_size=1, max_size=40),
    gone=st.sets(st.integers(1, 45)),
    batch=st.sets(st.integers(1, 45)),
)
def test_remove_many_is_remove_of_each(
    subjects: list[str], gone: set[int], batch: set[int]
) -> None:
    one, many = make(), make()
    for subject in subjects:
        add(one, subject)
        add(many, subject)
    for seq in sorted(gone):  # holes first, as earlier ticks leave them
        one.remove(seq)
        many.remove(seq)
    expected = [seq for seq in sorted(batch) if one.remove(seq) is not None]
    assert many.remove_many(sorted(batch)) == expected
    assert many.info_state() == one.info_state()
    assert live(many) == live(one)
    for subject in ("s.a", "s.b", "s.c"):
        assert list(many.seqs_matching(0, (subject,))) == list(one.seqs_matching(0, (subject,)))
