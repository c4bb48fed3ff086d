"""The commit of an atomic batch as one run must do exactly what checking and storing
its messages one at a time does.

A batch whose messages carry nothing the commit checks one by one but ``Nats-Msg-Id``
is committed as one run: its msg ids checked together (against each other and the
duplicate window), the stream's limits applied once after it (evicting what
appending the messages one by one would have), ``discard: new`` refusing it whole.
Each plan is published twice, once with every batch committed message by message
(the path a batch with other checked headers takes), and everything is compared:
the answers, the transactions, what is stored, the stream's index, its dedup window,
last msg id and what it republishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.limits import ServerLimits
from tether.engine.streams import batches
from tether.engine.streams.batches import BATCH_ID
from tether.storage.base import StorageError
from tether.storage.group_commit import APPEND, DELETE_MESSAGES, DELETE_RANGE, Batch
from tether.storage.memory import MemoryStore

IDS = ["a", "b", "c", "d", "e"]


class RecordingStore(MemoryStore):
    """Remembers each transaction's appends and deletions (by sequence; a deletion
    always follows the append of its message); fails commits while ``full``."""

    full = False

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[list[int], list[int]]] = []

    def _hand_off(self, batch: Batch) -> None:
        if self.full:
            self._group.settle(batch, StorageError("database or disk is full"))
            return
        appends: list[int] = []
        deletes: list[int] = []
        for op in batch.ops:
            if op[0] == APPEND:
                assert op[2].seq not in deletes  # never appended after its deletion
                appends.append(op[2].seq)
            elif op[0] == DELETE_RANGE:
                deletes += range(op[2], op[3] + 1)
            elif op[0] == DELETE_MESSAGES:
                deletes += op[2]
        if appends or deletes:
            self.commits.append((appends, sorted(deletes)))
        super()._hand_off(batch)


def header_block(*lines: tuple[str, str]) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in lines)


MSG_ID = st.one_of(st.none(), st.none(), st.sampled_from(IDS))
# A batch: (subject, msg id, payload length, msg id first) per message, then its end.
BATCH = st.tuples(
    st.lists(
        st.tuples(st.sampled_from(["s.a", "s.b"]), MSG_ID, st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["1", "1", "eob"]),
)
# A publish on its own: subject, msg id, and the last msg id it expects (or none).
SINGLE = st.tuples(
    st.sampled_from(["s.a", "s.b"]), MSG_ID, st.one_of(st.none(), st.sampled_from(["", *IDS]))
)
STEP = st.one_of(
    st.tuples(st.just("batch"), BATCH),
    st.tuples(st.just("batch"), BATCH),
    st.tuples(st.just("single"), SINGLE),
)
# A tick: its steps, whether its commit fails, then seconds the clock moves on.
TICKS = st.lists(
    st.tuples(st.lists(STEP, min_size=1, max_size=4), st.booleans(), st.sampled_from([0, 0, 3])),
    min_size=1,
    max_size=6,
)
CONFIGS = st.fixed_dictionaries(
    {},
    optional={
        "max_msgs": st.integers(1, 8),
        "max_msgs_per_subject": st.integers(1, 4),
        "discard_new_per_subject": st.booleans(),
        "max_bytes": st.integers(150, 900),
        "discard": st.sampled_from(["old", "new"]),
        "max_msg_size": st.integers(90, 140),
        "duplicate_window": st.sampled_from([5_000_000_000, 60_000_000_000]),
        "storage": st.sampled_from(["file", "memory"]),
        "republish": st.just({"src": ">", "dest": "rp.>"}),
    },
).map(
    # discard_new_per_subject needs discard new and a subject limit.
    lambda c: (
        c
        if c.get("discard") == "new" and "max_msgs_per_subject" in c
        else {k: v for k, v in c.items() if k != "discard_new_per_subject"}
    )
)


# The server's bound for each storage (None: unbounded), which a commit checks too.
BOUNDS = st.sampled_from([None, None, 950, 1500])  # above any max_bytes it reserves


async def _publish(config: dict[str, Any], plan: list[Any], bound: int | None = None) -> Any:
    store = RecordingStore()
    await store.open()
    clock = FakeClock()
    broker = Broker(store, clock)
    if bound is not None:
        broker.set_limits(ServerLimits(max_memory=bound, max_storage=bound))
    republished: list[tuple[str, bytes, bytes]] = []
    broker.republisher.sink = lambda *out: republished.append(out)
    await broker.load()
    cfg = {"name": "S", "subjects": ["s.*"], "allow_atomic": True, **config}
    await broker.create_stream("S", json.dumps(cfg).encode())
    stream = broker.get_stream("S")
    answers: list[tuple[int, Any]] = []
    n = 0

    def answer(k: int) -> Any:
        def told(result: PubAck | ApiError) -> None:
            answers.append((k, result.to_dict() if isinstance(result, ApiError) else result))

        return told

    def one(subject: str, head: bytes, payload: bytes, reply: bool) -> None:
        # What the front door does with each message of a stream taking atomic batches.
        target = answer(n) if reply else None
        if not broker.publish_batch_message(stream, subject, head, payload, target):
            broker.publish(stream, subject, head, payload, target)

    batch_no = 0
    for steps, fails, later in plan:
        store.full = fails
        for kind, step in steps:
            n += 1
            if kind == "single":
                subject, msg_id, expected = step
                lines = [] if msg_id is None else [("Nats-Msg-Id", msg_id)]
                if expected is not None:
                    lines.append(("Nats-Expected-Last-Msg-Id", expected))
                head = header_block(*lines) + b"\r\n" if lines else None
                broker.publish(stream, subject, head, b"single %d" % n, answer(n))
                continue
            msgs, end = step
            batch_no += 1
            bid = f"b{batch_no}"
            heads, subjects, payloads, replies = [], [], [], []
            for i, (subject, msg_id, size, id_first) in enumerate(msgs, 1):
                lines = [("Nats-Batch-Id", bid), ("Nats-Batch-Sequence", str(i))]
                if msg_id is not None:
                    lines.insert(0 if id_first else 2, ("Nats-Msg-Id", msg_id))
                if i == len(msgs) and end == "1":
                    lines.append(("Nats-Batch-Commit", "1"))
                heads.append(header_block(*lines) + b"\r\n")
                subjects.append(subject)
                payloads.append(b"%d" % n * size)
                replies.append("r" if i == len(msgs) and end == "1" else "")
            if end == "eob":
                seq = str(len(msgs) + 1)
                lines = [("Nats-Batch-Id", bid), ("Nats-Batch-Sequence", seq)]
                heads.append(header_block(*lines, ("Nats-Batch-Commit", "eob")) + b"\r\n")
                subjects.append(subjects[-1])
                payloads.append(b"")
                replies.append("r")
            start = 0
            while start < len(heads):  # what the front door does, a subject run at a time
                stop = start + 1
                while stop < len(heads) and subjects[stop] == subjects[start]:
                    stop += 1
                run = (heads[start:stop], payloads[start:stop], replies[start:stop])
                i = 0
                while i < len(run[0]):
                    i = broker.stage_batch_run(stream, subjects[start], *run, i)
                    if i < len(run[0]):
                        one(subjects[start], run[0][i], run[1][i], bool(run[2][i]))
                        i += 1
                start = stop
        with contextlib.suppress(StorageError):
            await store.flush()
        store.full = False
        if later:
            clock.advance(later)
            await asyncio.sleep(0)
    stored = [(m.seq, m.subject, m.headers, m.data) for m in await store.read_range("S", 1, 1000)]
    now = clock.now()
    state = {
        "metas": [stream.meta(seq) for seq in stream.seqs(0)],
        "info": stream.info_state(),
        "window": {msg_id: stream.duplicate_of(msg_id, now) for msg_id in IDS},
        "last_msg_id": stream.last_msg_id,
        "open": len(broker.batches),
    }
    broker.close()
    await store.close()
    state["republished"] = republished
    return sorted(answers, key=lambda a: a[0]), store.commits, stored, state


def _per_message(config: dict[str, Any], plan: list[Any], bound: int | None = None) -> Any:
    # Every batch's first message holds Nats-Batch-Id: counting it among the headers
    # the commit checks one by one sends every batch down that path.
    with mock.patch.object(batches, "CHECKED", batches.CHECKED | {BATCH_ID}):
        return asyncio.run(_publish(config, plan, bound))


@settings(max_examples=150, deadline=None)
@given(CONFIGS, TICKS, BOUNDS)
def test_a_batch_committed_as_a_run_is_a_batch_committed_message_by_message(
    config: dict[str, Any], plan: list[Any], bound: int | None
) -> None:
    as_run = asyncio.run(_publish(config, plan, bound))
    assert as_run == _per_message(config, plan, bound)


def _plan(*steps: Any, fails: bool = False) -> list[Any]:
    return [(list(steps), fails, 0)]


def test_the_run_path_takes_msg_ids_and_evicting_limits() -> None:
    """The cases the property above compares, seen through the run path: a duplicate
    inside the batch or against the window refuses the batch whole; eviction during
    a batch (even of its own first messages) is that of publishing them one by one."""
    config = {"max_msgs": 3}
    batch = [("s.a", "a", 1, False), ("s.a", None, 1, False), ("s.b", "b", 1, True)]
    plan = _plan(
        ("single", ("s.a", "c", None)),
        ("batch", (batch, "1")),  # ids a, b: new
        ("batch", ([("s.a", "d", 1, False), ("s.a", "d", 1, False)], "1")),  # d twice
        ("batch", ([("s.a", "e", 1, False), ("s.a", "a", 1, False)], "1")),  # a in window
        ("batch", ([("s.a", None, 2, False)] * 5, "eob")),  # 5 messages, 3 kept
    )
    run_path = Broker._append_plain_batch
    with mock.patch.object(Broker, "_append_plain_batch", autospec=True) as as_run:
        as_run.side_effect = run_path
        answers, commits, stored, state = asyncio.run(_publish(config, plan))
    assert as_run.call_count == 4  # every batch
    assert [a for _, a in answers] == [
        PubAck("S", 1),
        PubAck("S", 4, batch="b1", count=3),
        ApiError(400, 10201, "atomic publish batch contains duplicate message id").to_dict(),
        ApiError(400, 10201, "atomic publish batch contains duplicate message id").to_dict(),
        PubAck("S", 9, batch="b4", count=5),
    ]
    # One transaction: the single publish, the batches appended (the last one evicting
    # its own first two messages as well).
    assert commits == [([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6])]
    assert [seq for seq, *_ in stored] == [7, 8, 9]
    assert state["window"] == {"a": 2, "b": 4, "c": 1, "d": 0, "e": 0}
    assert state["last_msg_id"] == ""
    assert answers == sorted(answers, key=lambda a: a[0])
    assert _per_message(config, plan) == (answers, commits, stored, state)


def test_discard_new_per_subject_and_the_server_bound_refuse_a_batch_whole() -> None:
    """Past a subject's limit with ``discard_new_per_subject`` (10077), or past the
    server's bound for the storage (10023, checked last), a batch is refused whole on
    either path: nothing stored, its ids not remembered."""
    config = {"max_msgs_per_subject": 2, "discard": "new", "discard_new_per_subject": True}
    plan = _plan(
        ("batch", ([("s.a", "a", 1, False), ("s.b", None, 1, False)], "1")),
        (
            "batch",
            ([("s.b", None, 1, False), ("s.a", "b", 1, False), ("s.a", None, 1, False)], "1"),
        ),  # s.a: 3
        (
            "batch",
            ([("s.b", "c", 300, False), *[("s.b", None, 300, False)] * 2], "1"),
        ),  # s.b: 4, and past the bound
        (
            "batch",
            ([("s.c", "d", 300, False), ("s.c", None, 300, False), ("s.d", None, 300, False)], "1"),
        ),  # past the bound only
        ("batch", ([("s.a", "e", 30, False)], "1")),
    )
    per_subject = ApiError(503, 10077, "maximum messages per subject exceeded").to_dict()
    full = ApiError(503, 10023, "insufficient resources").to_dict()
    run_path = Broker._append_plain_batch
    with mock.patch.object(Broker, "_append_plain_batch", autospec=True) as as_run:
        as_run.side_effect = run_path
        answers, commits, stored, state = asyncio.run(_publish(config, plan, 1000))
    assert as_run.call_count == 5
    assert [a for _, a in answers] == [
        PubAck("S", 2, batch="b1", count=2),
        per_subject,
        per_subject,
        full,
        PubAck("S", 3, batch="b5", count=1),
    ]
    assert [seq for seq, *_ in stored] == [1, 2, 3]
    assert state["window"] == {"a": 1, "b": 0, "c": 0, "d": 0, "e": 3}
    assert _per_message(config, plan, 1000) == (answers, commits, stored, state)


def test_what_a_batch_evicts_as_it_is_stored_counts_against_the_server_bound() -> None:
    """A batch larger than the server's bound fits when the stream's own limits evict
    enough as its messages are stored (each is checked after the evictions of those
    before it, as in nats-server)."""
    big = [("s.a", None, 300, False)] * 5
    plan = _plan(("batch", (big, "1")))
    for config, fits in (
        ({}, False),
        ({"max_msgs": 2}, True),
        ({"max_msgs_per_subject": 1}, True),
        ({"max_bytes": 900}, True),
    ):
        as_run = asyncio.run(_publish(config, plan, 1000))
        assert as_run == _per_message(config, plan, 1000)
        answers, _, stored, _ = as_run
        if fits:
            assert answers == [(1, PubAck("S", 5, batch="b1", count=5))]
            assert stored
        else:
            assert answers == [(1, ApiError(503, 10023, "insufficient resources").to_dict())]
            assert stored == []
