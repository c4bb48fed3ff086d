"""kill -9 under NSQ load: every message answered ``OK`` is there after the restart, and
a message in flight but not finished is delivered again; a clean stop keeps every FIN."""

from __future__ import annotations

import asyncio
import contextlib
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
        # The SUB's OK may come in the same read as the first messages.
        sub_ok, *messages = await _frames(reader, parse, 1)
        assert sub_ok == b"OK"
        seen: list[bytes] = []
        while True:
            for data in messages:
                msg_id, body = data[:16], data[16:]
                seen.append(body)
                writer.write(commands.fin(msg_id))
            if len(seen) >= 2000:
                break
            messages = await _frames(reader, parse, 1)
        # The unfinished one comes again once its timeout passes after the restart.
        assert sorted(seen) == bodies
        writer.close()


async def test_finished_messages_stay_finished_after_a_clean_stop(tmp_path: Path) -> None:
    """FIN has no answer, so its save may come up to 0.1 s later; a clean stop right
    after the FINs still saves them: nothing comes again after the restart."""
    config = tmp_path / "tether.toml"
    config.write_text("nsq_msg_timeout = 1.0\n")  # a lost FIN would show within 1 s
    with run_server(args=["--config", str(config)]) as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        bodies = [b"f%03d" % i for i in range(200)]
        writer.write(commands.MAGIC_V2 + commands.mpub("tasks", bodies))
        parse = FrameReader()
        assert await _frames(reader, parse, 1) == [b"OK"]
        writer.write(commands.sub("tasks", "work") + commands.rdy(2500))
        sub_ok, *messages = await _frames(reader, parse, 1)
        assert sub_ok == b"OK"
        ids: list[bytes] = []
        while True:
            for data in messages:
                ids.append(data[:16])
                writer.write(commands.fin(data[:16]))
            if len(ids) >= len(bodies):
                break
            messages = await _frames(reader, parse, 1)
        # Commands are handled in order: the answer to a FIN of a finished message
        # (the only one a FIN gets) says every FIN before it was applied.
        writer.write(commands.fin(ids[0]))
        (failed,) = await _frames(reader, parse, 1)
        assert failed.startswith(b"E_FIN_FAILED")
        assert srv.stop() == 0
        writer.close()

        srv.start()
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        parse = FrameReader()
        writer.write(commands.MAGIC_V2 + commands.sub("tasks", "work") + commands.rdy(2500))
        sub_ok, *again = await _frames(reader, parse, 1)
        assert sub_ok == b"OK"
        with contextlib.suppress(TimeoutError):  # nothing came: what is expected
            again += await asyncio.wait_for(_frames(reader, parse, 1), 1.5)
        assert again == []
        writer.close()
