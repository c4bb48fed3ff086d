"""kill -9 under NSQ load: every message answered ``OK`` is there after the restart, and
a message in flight but not finished is delivered again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tether.protocol.nsq import FRAME_MESSAGE, FrameReader, commands
from tether.testing import run_server


async def _frames(reader: asyncio.StreamReader, parse: FrameReader, n: int) -> list[bytes]:
    """Read until ``n`` frames other than heartbeats came; returns their data."""
    got: list[bytes] = []
    while len(got) < n:
        data = await asyncio.wait_for(reader.read(1 << 20), 10)
        assert data, "connection closed"
        for frame in parse.feed(data):
            if frame.data != b"_heartbeat_":
                got.append(frame.data if frame.frame_type != FRAME_MESSAGE else frame.data[10:])
    return got


async def test_oked_messages_survive_kill_9(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text("nsq_msg_timeout = 1.0\n")  # the unfinished message returns soon
    with run_server(args=["--config", str(config)]) as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        bodies = [b"m%05d" % i for i in range(2000)]
        writer.write(
            commands.MAGIC_V2
            + b"".join(commands.pub("orders", b) for b in bodies[:1000])
            + commands.mpub("orders", bodies[1000:])
        )
        parse = FrameReader()
        assert await _frames(reader, parse, 1001) == [b"OK"] * 1001
        # One message taken and never finished.
        writer.write(commands.sub("orders", "billing") + commands.rdy(1))
        sub_ok, first = await _frames(reader, parse, 2)
        assert sub_ok == b"OK" and first[16:] == b"m00000"
        srv.kill()
        writer.close()

        srv.start()
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        parse = FrameReader()
        writer.write(commands.MAGIC_V2 + commands.sub("orders", "billing") + commands.rdy(2500))
        assert await _frames(reader, parse, 1) == [b"OK"]
        seen: list[bytes] = []
        while len(seen) < 2000:
            for data in await _frames(reader, parse, 1):
                msg_id, body = data[:16], data[16:]
                seen.append(body)
                writer.write(commands.fin(msg_id))
        # The unfinished one comes again once its timeout passes after the restart.
        assert sorted(seen) == bodies
        writer.close()
