"""Runs of PUBs and batches of replies: the shortcuts of the publish path must write
exactly what routing each message on its own writes.

A connection hands the header-less PUBs of one read to one subject to the router as a
run (``Router.publish_many``), or, when the subjects of consecutive PUBs all go to one
stream capture and nothing else, straight to its batch handler; PubAcks go out through
``Router.publish_replies``.
Each is compared with the message-by-message path on an identical server.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from transport_support import FakeTransport, connect

from tether.server.config import ServerConfig
from tether.server.nats.connection import ClientConnection
from tether.server.nats.server import NatsServer

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'


def written(conn: ClientConnection, transport: FakeTransport) -> bytes:
    conn.flush_now()
    out = bytes(transport.written)
    transport.written.clear()
    return out


# -- runs of PUBs ---------------------------------------------------------------------------

SUBJECTS = ["cap.x", "cap.y", "cap.z.1", "sub.a", "a..b"]
frames = st.one_of(
    st.tuples(st.just("pub"), st.sampled_from(SUBJECTS), st.booleans(), st.binary(max_size=3)).map(
        lambda f: (
            b"PUB %s %s%d\r\n%s\r\n" % (f[1].encode(), b"r.1 " if f[2] else b"", len(f[3]), f[3])
        )
    ),
    st.sampled_from(
        [
            b"HPUB cap.x 12 13\r\nNATS/1.0\r\n\r\nh\r\n",
            b"SUB sub.* 1\r\n",
            b"SUB cap.x 2\r\n",
            b"SUB cap.z.* 4\r\n",
            b"SUB r.1 3\r\n",
            b"UNSUB 1 2\r\n",
            b"UNSUB 2\r\n",
            b"PING\r\n",
        ]
    ),
)


async def _serve(stream: bytes, cuts: list[int], runs: bool) -> tuple[bytes, list[Any], int]:
    """Feed ``stream`` (cut at ``cuts``) to a server whose capture of ``cap.*`` and
    ``cap.z.*`` takes runs and batches; returns what was written, what the capture got
    and how many runs and batches it got."""
    server = NatsServer(ServerConfig())
    captured: list[Any] = []
    run_calls = 0

    def handler(subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        captured.append((subject, reply, headers, payload))

    def run_handler(subject: str, replies: list[str], payloads: list[bytes]) -> None:
        nonlocal run_calls
        run_calls += 1
        captured.extend((subject, r, None, p) for r, p in zip(replies, payloads, strict=True))

    def batch_handler(subjects: list[str], replies: list[str], payloads: list[bytes]) -> None:
        nonlocal run_calls
        run_calls += 1
        captured.extend(
            (s, r, None, p) for s, r, p in zip(subjects, replies, payloads, strict=True)
        )

    for subject in ("cap.*", "cap.z.*"):
        server.router.subscribe_internal(
            subject, handler, run_handler=run_handler, batch_handler=batch_handler
        )
    conn, transport = connect(server)
    written(conn, transport)
    conn.data_received(CONNECT)
    conn._runs = runs
    pos = 0
    for cut in sorted(cuts):
        if cut > pos:
            conn.data_received(stream[pos:cut])
            pos = cut
    conn.data_received(stream[pos:])
    return written(conn, transport), captured, run_calls


@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames, max_size=25),
    st.lists(st.integers(0, 400), max_size=4),
    st.booleans(),
)
def test_runs_route_like_single_publishes(
    parts: list[bytes], cuts: list[int], garbage: bool
) -> None:
    stream = b"".join(parts) + (b"BOGUS\r\n" if garbage else b"")
    single = asyncio.run(_serve(stream, cuts, runs=False))
    batched = asyncio.run(_serve(stream, cuts, runs=True))
    assert batched[:2] == single[:2]
    assert single[2] == 0


async def test_a_read_of_pubs_to_a_capture_is_one_run() -> None:
    stream = b"".join(b"PUB cap.x r.%d 1\r\n%d\r\n" % (i, i % 10) for i in range(50))
    out, captured, run_calls = await _serve(stream + b"PUB cap.y 0\r\n\r\n", [], runs=True)
    # The first message to a subject takes the general path (which checks the subject
    # and remembers it), the other 49 are one run; cap.y is new and alone.
    assert run_calls == 1
    assert [c[1] for c in captured[:50]] == [f"r.{i}" for i in range(50)]
    assert captured[-1] == ("cap.y", "", None, b"")
    assert out == b""


async def test_pubs_cycling_through_a_captures_subjects_are_one_run() -> None:
    subjects = [b"cap.x", b"cap.y", b"cap.z.1"]
    first = b"".join(b"PUB %s 1\r\n-\r\n" % s for s in subjects)  # each seen once
    stream = b"".join(b"PUB %s r.%d 1\r\n%d\r\n" % (subjects[i % 3], i, i % 10) for i in range(60))
    out, captured, run_calls = await _serve(first + b"PING\r\n" + stream, [], runs=True)
    # Each subject's first message takes the general path; the 60 after the PING,
    # cycling through two filters of the capture, are one batch.
    assert run_calls == 1
    names = ["cap.x", "cap.y", "cap.z.1"]
    assert [c[:2] for c in captured[3:]] == [(names[i % 3], f"r.{i}") for i in range(60)]
    assert out == b"PONG\r\n"


# -- batches of replies ---------------------------------------------------------------------

REPLIES = [
    "",
    "_INBOX.a.1",
    "_INBOX.a.2",
    "_INBOX.a.7",
    "_INBOX.b.x.y",
    "_INBOX.c.1",
    "_INBOX.q.1",
    "nobody.1",
    "_INBOX..1",
    "_INBOX",
]


async def _replies(
    replies: list[str], batched: bool, first_seq: int = 0
) -> tuple[bytes, bytes, list[int]]:
    server = NatsServer(ServerConfig())
    one, t1 = connect(server)
    two, t2 = connect(server)
    one.data_received(
        CONNECT + b"SUB _INBOX.a.* 1\r\nSUB _INBOX.a.7 2\r\nSUB _INBOX.b.> 3\r\nUNSUB 3 2\r\n"
    )
    two.data_received(CONNECT + b"SUB _INBOX.c.* 1\r\nSUB _INBOX.q.* g 2\r\nSUB _INBOX 3\r\n")
    written(one, t1)
    written(two, t2)
    head = b'{"stream":"S","seq":'
    bodies = [b"%s%d}" % (head, first_seq + i) for i in range(len(replies))]
    if batched and first_seq:
        server.router.publish_acks(replies, head, first_seq)
    elif batched:
        server.router.publish_replies(replies, bodies)
    else:
        for reply, body in zip(replies, bodies, strict=True):
            if reply:
                server.router.publish(None, reply, "", None, body)
    counts = [sub.delivered for conn in (one, two) for sub in conn.subs.values()]
    return written(one, t1), written(two, t2), counts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(REPLIES), max_size=30))
def test_publish_replies_is_publish_one_by_one(replies: list[str]) -> None:
    assert asyncio.run(_replies(replies, True)) == asyncio.run(_replies(replies, False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(REPLIES), max_size=30), st.sampled_from([1, 7, 95, 9990]))
def test_publish_acks_is_publish_one_by_one(replies: list[str], first_seq: int) -> None:
    # First sequences just below a power of ten: the digits of the bodies grow mid-run.
    batched = asyncio.run(_replies(replies, True, first_seq))
    assert batched == asyncio.run(_replies(replies, False, first_seq))


# -- many messages with headers to one inbox (batched DIRECT.GET) --------------------------

NO_HEADERS = b'CONNECT {"verbose":false,"pedantic":false,"headers":false}\r\n'


async def _headered(reply: str, n: int, batched: bool) -> tuple[bytes, bytes, bytes, list[int]]:
    server = NatsServer(ServerConfig())
    one, t1 = connect(server)
    two, t2 = connect(server)
    old, t3 = connect(server)
    one.data_received(
        CONNECT + b"SUB _INBOX.a.* 1\r\nSUB _INBOX.a.7 2\r\nSUB _INBOX.b.> 3\r\nUNSUB 3 2\r\n"
    )
    two.data_received(CONNECT + b"SUB _INBOX.c.* 1\r\nSUB _INBOX.q.* g 2\r\nSUB _INBOX 3\r\n")
    old.data_received(NO_HEADERS + b"SUB _INBOX.h.* 1\r\n")
    for conn, transport in ((one, t1), (two, t2), (old, t3)):
        written(conn, transport)
    blocks = [b"NATS/1.0\r\nNats-Sequence: %d\r\n\r\n" % i for i in range(n)]
    payloads = [b"m%d" % i if i % 3 else b"" for i in range(n)]
    if batched:
        server.router.publish_headered(reply, blocks, payloads)
    else:
        for block, payload in zip(blocks, payloads, strict=True):
            server.router.publish(None, reply, "", block, payload)
    counts = [sub.delivered for conn in (one, two, old) for sub in conn.subs.values()]
    return written(one, t1), written(two, t2), written(old, t3), counts


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([r for r in REPLIES if r] + ["_INBOX.h.1", "_INBOX.a.", "_INBOX.b.x"]),
    st.integers(1, 5),
)
def test_publish_headered_is_publish_one_by_one(reply: str, n: int) -> None:
    assert asyncio.run(_headered(reply, n, True)) == asyncio.run(_headered(reply, n, False))
