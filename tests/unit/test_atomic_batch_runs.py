"""Runs of atomic batch messages: staging a stretch at a time must do exactly what
publishing each message on its own does.

The front door hands a run of publishes with headers to a stream taking atomic batches
to ``Broker.stage_batch_run``, which stages the messages that only continue an open
batch in one call, and publishes every other message (a batch's first one, its commit,
one with a reply or other headers, an error) on its own. Each plan is published both
ways and everything is compared: the answers, the transactions, what is stored, the
stream's index, the batches left open and the batches abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.engine.broker import Broker, PubAck
from tether.engine.clock import FakeClock
from tether.engine.errors import ApiError
from tether.engine.streams.batches import BatchLimits
from tether.storage.base import StorageError
from tether.storage.group_commit import APPEND, Batch
from tether.storage.memory import MemoryStore


class RecordingStore(MemoryStore):
    """Remembers the appends of each transaction; fails commits while ``full``."""

    full = False

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[list[int]] = []

    def _hand_off(self, batch: Batch) -> None:
        if self.full:
            self._group.settle(batch, StorageError("database or disk is full"))
            return
        appends = [op[2].seq for op in batch.ops if op[0] == APPEND]
        if appends:
            self.commits.append(appends)
        super()._hand_off(batch)


def block(batch: str, seq: str | None, commit: str | None, extra: bytes) -> bytes:
    """A batch message's header block, as publishers write it (batch headers first)."""
    lines = b"Nats-Batch-Id: %s\r\n" % batch.encode()
    if seq is not None:
        lines += b"Nats-Batch-Sequence: %s\r\n" % seq.encode()
    if commit is not None:
        lines += b"Nats-Batch-Commit: %s\r\n" % commit.encode()
    return b"NATS/1.0\r\n" + lines + extra + b"\r\n"


# The next sequence of the batch mostly, so that batches grow and commit; now and then
# a gap, a repeat, a restart, a sequence with a leading zero (read as its number) or none.
SEQS = st.sampled_from(["next"] * 8 + ["again", "skip", "one", "padded", "none"])
COMMITS = st.sampled_from([None] * 8 + ["1", "1", "eob", "bogus"])
EXTRAS = st.sampled_from(
    [b""] * 8
    + [
        b"Nats-Msg-Id: m\r\n",
        b"Nats-Required-Api-Level: 99\r\n",
        b"Nats-Required-Api-Level: 0\r\n",
        b"X-App: 1\r\n",
        b"Nats-Expected-Last-Sequence: 0\r\n",
    ]
)
# (batch, sequence, commit, other headers, payload length, with a reply)
MESSAGES = st.tuples(
    st.sampled_from(["a", "b", "c" * 65]), SEQS, COMMITS, EXTRAS, st.integers(0, 40), st.booleans()
)
runs = st.tuples(st.sampled_from(["s.a", "s.b"]), st.lists(MESSAGES, min_size=1, max_size=12))
# A tick: runs and whether its commit fails; then seconds of the clock going by (a batch
# idle for 10 s is abandoned).
ticks = st.lists(
    st.tuples(st.lists(runs, min_size=1, max_size=3), st.booleans(), st.sampled_from([0, 0, 11])),
    min_size=1,
    max_size=5,
)
configs = st.fixed_dictionaries(
    {},
    optional={
        "max_msg_size": st.integers(60, 140),
        "max_msgs": st.integers(1, 8),
        "discard": st.sampled_from(["old", "new"]),
        "no_ack": st.booleans(),
    },
)
batch_limits = st.builds(
    BatchLimits, max_size=st.integers(2, 8), inflight_per_stream=st.integers(1, 3)
)


def headers_of(plan: list[Any]) -> list[list[list[tuple[str, bytes, bytes, str]]]]:
    """The plan as header blocks, payloads and replies: the sequences a publisher would
    send (``next``) follow a model of each batch that a commit ends."""
    sent: dict[str, int] = {}
    n = 0
    out = []
    for tick_runs, _, _ in plan:
        tick = []
        for subject, msgs in tick_runs:
            run = []
            for batch, kind, commit, extra, size, with_reply in msgs:
                n += 1
                last = sent.get(batch, 0)
                seq: str | None = {
                    "next": str(last + 1),
                    "again": str(max(last, 1)),
                    "skip": str(last + 2),
                    "one": "1",
                    "padded": "0" + str(last + 1),
                    "none": None,
                }[kind]
                sent[batch] = int(seq) if seq else last
                if commit in ("1", "eob"):
                    sent[batch] = 0
                head = block(batch, seq, commit, extra)
                reply = f"_INBOX.{n}" if with_reply else ""
                run.append((subject, head, b"%d" % n * size, reply))
            tick.append(run)
        out.append(tick)
    return out


async def _publish(config: dict[str, Any], limits: BatchLimits, plan: list[Any], runs: bool) -> Any:
    store = RecordingStore()
    await store.open()
    clock = FakeClock()
    broker = Broker(store, clock)
    broker.batches.limits = limits
    abandoned: list[tuple[str, str]] = []
    broker.batches.on_abandoned = lambda batch, reason: abandoned.append((batch.id, reason))
    await broker.load()
    cfg = {"name": "S", "subjects": ["s.*"], "allow_atomic": True, **config}
    await broker.create_stream("S", json.dumps(cfg).encode())
    stream = broker.get_stream("S")
    answers: list[tuple[str, Any]] = []

    def answer(reply: str) -> Any:
        def told(result: PubAck | ApiError) -> None:
            answers.append((reply, result.to_dict() if isinstance(result, ApiError) else result))

        return told

    def one(subject: str, head: bytes, payload: bytes, reply: str) -> None:
        # What the front door does with each message of a stream taking atomic batches.
        target = answer(reply) if reply and not stream.config.no_ack else None
        if not broker.publish_batch_message(stream, subject, head, payload, target):
            broker.publish(stream, subject, head, payload, target)

    for (_, fails, later), tick in zip(plan, headers_of(plan), strict=True):
        store.full = fails
        for run in tick:
            subject = run[0][0]
            heads = [head for _, head, _, _ in run]
            payloads = [payload for _, _, payload, _ in run]
            replies = [reply for _, _, _, reply in run]
            if not runs:
                for args in zip(heads, payloads, replies, strict=True):
                    one(subject, *args)
                continue
            i = 0
            while i < len(run):  # what the front door does with a run
                i = broker.stage_batch_run(stream, subject, heads, payloads, replies, i)
                if i < len(run):
                    one(subject, heads[i], payloads[i], replies[i])
                    i += 1
        with contextlib.suppress(StorageError):
            await store.flush()
        store.full = False
        if later:
            clock.advance(later)
            await asyncio.sleep(0)
    stored = [(m.seq, m.subject, m.headers, m.data) for m in await store.read_range("S", 1, 1000)]
    state = {
        "metas": [stream.meta(seq) for seq in stream.seqs(0)],
        "info": stream.info_state(),
        "open": len(broker.batches),
        "inflight": broker.batches.inflight("S"),
    }
    broker.close()
    await store.close()
    return answers, store.commits, stored, state, abandoned


@settings(max_examples=200, deadline=None)
@given(configs, batch_limits, ticks)
def test_a_run_of_batch_messages_is_publishing_one_by_one(
    config: dict[str, Any], limits: BatchLimits, plan: list[Any]
) -> None:
    by_runs = asyncio.run(_publish(config, limits, plan, True))
    one_by_one = asyncio.run(_publish(config, limits, plan, False))
    assert by_runs == one_by_one


async def test_a_batch_sent_in_one_run_is_staged_in_one_call_and_one_transaction() -> None:
    store = RecordingStore()
    await store.open()
    broker = Broker(store, FakeClock())
    await broker.load()
    cfg = {"name": "S", "subjects": ["s.*"], "allow_atomic": True}
    stream, _ = await broker.create_stream("S", json.dumps(cfg).encode())
    heads = [block("b", str(i), "1" if i == 50 else None, b"") for i in range(1, 51)]
    payloads = [b"p%d" % i for i in range(1, 51)]
    replies = [""] * 49 + ["r"]
    answers: list[Any] = []
    # Nothing open yet: the first message is left to the caller, which opens the batch.
    assert broker.stage_batch_run(stream, "s.a", heads, payloads, replies, 0) == 0
    assert broker.publish_batch_message(stream, "s.a", heads[0], payloads[0], None)
    # Then every message up to the commit in one call; the commit is left to the caller.
    assert broker.stage_batch_run(stream, "s.a", heads, payloads, replies, 1) == 49
    assert stream.last_seq == 0 and store.commits == []
    assert broker.publish_batch_message(stream, "s.a", heads[49], payloads[49], answers.append)
    await store.flush()
    assert answers == [PubAck("S", 50, batch="b", count=50)]
    assert store.commits == [list(range(1, 51))]
    stored = await store.read_range("S", 1, 100)
    assert [(m.subject, m.headers, m.data) for m in stored] == list(
        zip(["s.a"] * 50, heads, payloads, strict=True)
    )
    assert len(broker.batches) == 0
    broker.close()
    await store.close()
