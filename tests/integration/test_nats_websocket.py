"""NATS over WebSocket: nats-py's ws:// and wss:// URLs, JetStream through them, the
Origin checks and permessage-deflate, each against Tether and the real nats-server
started with the same configuration file."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import nats
import pytest
import trustme

from tether.testing import run_nats_server, run_server

# nats-py's WebSocket transport still hands aiohttp a float timeout.
pytestmark = pytest.mark.filterwarnings(
    "ignore:parameter 'timeout' of type 'float' is deprecated:DeprecationWarning"
)

_WS_LISTEN = re.compile(r"Listening for websocket clients on (wss?)://\S+:(\d+)")


def _conf(tmp_path: Path, body: str) -> str:
    path = tmp_path / "ws.conf"
    path.write_text(f"websocket {{\n  port: -1\n{body}}}\n")
    return str(path)


@contextmanager
def _serve(kind: str, conf: str) -> Iterator[int]:
    """The WebSocket port of a server of ``kind`` started with ``conf``."""
    if kind == "tether":
        with run_server(store="memory", args=["-c", conf]) as srv:
            log = srv.stderr
            found = _WS_LISTEN.search(log)
            assert found, log
            yield int(found.group(2))
    else:
        with run_nats_server(["-c", conf]) as ns:
            found = _WS_LISTEN.search(ns.stderr)
            assert found, ns.stderr
            yield int(found.group(2))


async def _first_message(port: int, **kwargs: object) -> tuple[aiohttp.WSMessage, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/any/path", **kwargs) as ws,  # type: ignore[arg-type]
    ):
        return await ws.receive(timeout=5), dict(ws._response.headers)


async def test_ws_pub_sub(kind: str, tmp_path: Path) -> None:
    with _serve(kind, _conf(tmp_path, "  no_tls: true\n")) as port:
        msg, _ = await _first_message(port)
        assert msg.type == aiohttp.WSMsgType.BINARY  # INFO, alone in the first message
        assert msg.data.startswith(b"INFO {") and msg.data.endswith(b"\r\n")
        info = json.loads(msg.data[5:])
        assert info["port"] == port and "tls_required" not in info
        nc = await nats.connect(f"ws://127.0.0.1:{port}")
        sub = await nc.subscribe("ws.>")
        await nc.publish("ws.a", b"x" * 70_000)  # more than one frame's worth for a browser
        await nc.publish("ws.b", b"small")
        got = [await sub.next_msg(2), await sub.next_msg(2)]
        assert [(m.subject, len(m.data)) for m in got] == [("ws.a", 70_000), ("ws.b", 5)]
        await nc.close()


async def test_ws_jetstream_publish(kind: str, tmp_path: Path) -> None:
    with _serve(kind, _conf(tmp_path, "  no_tls: true\n")) as port:
        nc = await nats.connect(f"ws://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.add_stream(name="WS", subjects=["orders.>"])
        ack = await js.publish("orders.1", b"one")
        assert (ack.stream, ack.seq) == ("WS", 1)
        msg = await js.get_msg("WS", 1)
        assert msg.data == b"one"
        await nc.close()


async def test_ws_origin_refused(kind: str, tmp_path: Path) -> None:
    conf = _conf(tmp_path, '  no_tls: true\n  allowed_origins: ["http://good.example"]\n')
    with _serve(kind, conf) as port:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _first_message(port, headers={"Origin": "http://evil.example"})
        assert refused.value.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as wrong_port:
            await _first_message(port, headers={"Origin": "http://good.example:8080"})
        assert wrong_port.value.status == 403
        msg, _ = await _first_message(port, headers={"Origin": "http://good.example"})
        assert msg.data.startswith(b"INFO ")
        msg, _ = await _first_message(port)  # no Origin header: let in
        assert msg.data.startswith(b"INFO ")


async def test_ws_same_origin(kind: str, tmp_path: Path) -> None:
    with _serve(kind, _conf(tmp_path, "  no_tls: true\n  same_origin: true\n")) as port:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _first_message(port, headers={"Origin": "http://elsewhere.example"})
        assert refused.value.status == 403
        msg, _ = await _first_message(port, headers={"Origin": f"http://127.0.0.1:{port}"})
        assert msg.data.startswith(b"INFO ")


async def test_ws_compression(kind: str, tmp_path: Path) -> None:
    with _serve(kind, _conf(tmp_path, "  no_tls: true\n  compression: true\n")) as port:
        _, headers = await _first_message(port, compress=15)
        assert headers["Sec-WebSocket-Extensions"] == (
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        )
        nc = await nats.connect(f"ws://127.0.0.1:{port}")
        sub = await nc.subscribe("z")
        await nc.publish("z", b"compressible " * 1000)
        assert (await sub.next_msg(2)).data == b"compressible " * 1000
        await nc.close()
    with _serve(kind, _conf(tmp_path, "  no_tls: true\n")) as port:
        _, headers = await _first_message(port, compress=15)
        assert "Sec-WebSocket-Extensions" not in headers


async def test_wss(kind: str, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    pem = tmp_path / "server.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(pem)
    body = f'  tls {{\n    cert_file: "{pem}"\n    key_file: "{pem}"\n  }}\n'
    with _serve(kind, _conf(tmp_path, body)) as port:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        nc = await nats.connect(f"wss://localhost:{port}", tls=ctx)
        assert nc._server_info.get("tls_required") is True
        sub = await nc.subscribe("s")
        await nc.publish("s", b"secure")
        assert (await sub.next_msg(2)).data == b"secure"
        await nc.close()
