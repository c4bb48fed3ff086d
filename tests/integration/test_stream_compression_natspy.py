"""Streams with ``compression: "s2"`` through nats-py against ``tether serve`` on SQLite:
payloads are stored compressed, every read gives them back as sent (get, direct get,
consumers, key-value, object store, and after a restart block reads), sizes stay those
of the messages as sent, and it all holds across a restart and a change of the setting.
The NSQ and HTTP front doors read them back from the store after a restart too."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import httpx
import nats
from nats.js.api import StoreCompression, StreamConfig

from tether.client import connect
from tether.protocol.nsq import FrameReader, commands
from tether.protocol.nsq.frames import FRAME_MESSAGE, FRAME_RESPONSE
from tether.testing import run_server

N = 200
HEADERS = {"K": "v"}


def document(i: int) -> bytes:
    """About 2.4 kB of JSON that compresses well."""
    items = [{"sku": f"item-{k}", "qty": k, "status": "reserved"} for k in range(40)]
    return json.dumps({"order": i, "customer": "alice", "items": items}).encode()


def stored(directory: Path, stream: str) -> list[tuple[int, int | None, int]]:
    """(seq, plain_size, bytes stored for the payload) of every row of ``stream``."""
    db = directory / "tether.db"
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    try:
        sql = "SELECT seq, plain_size, length(data) FROM messages WHERE stream = ? ORDER BY seq"
        return list(conn.execute(sql, (stream,)))
    finally:
        conn.close()


def database_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("tether.db*"))


async def test_compressed_streams_read_back_as_sent_across_a_restart(tmp_path: Path) -> None:
    sent = [document(i) for i in range(N)]
    plain_bytes = sum(map(len, sent))
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(
                    name="C",
                    subjects=["c.>"],
                    compression=StoreCompression.S2,
                    allow_direct=True,
                )
            )
            await js.add_stream(name="P", subjects=["p.>"])
            for i, data in enumerate(sent):
                headers = HEADERS if i % 2 else None
                await js.publish("c.x", data, headers=headers)
                await js.publish("p.x", data, headers=headers)
            info_c, info_p = await js.stream_info("C"), await js.stream_info("P")
            assert info_c.config.compression == StoreCompression.S2
            # nats-server counts the messages as sent, compressed or not.
            assert info_c.state.bytes == info_p.state.bytes
            msg = await js.get_msg("C", 2)
            assert (msg.data, msg.headers) == (sent[1], HEADERS)
            direct = await js.get_msg("C", 3, direct=True)
            assert direct.data == sent[2]
            last = await js.get_last_msg("C", "c.x")
            assert last.data == sent[-1]
            sub = await js.pull_subscribe("c.x", durable="reader", stream="C")
            got = []
            while len(got) < N:
                for m in await sub.fetch(100, timeout=5):
                    got.append(m.data)
                    await m.ack()
            assert got == sent
            bytes_before = info_c.state.bytes
        finally:
            await nc.close()

    # Block reads (what Spark and `tether stream backup` read with), from the store.
    with run_server(store=tmp_path) as srv:
        tc = await connect(srv.url)
        try:
            blocks = tc.jetstream(timeout=5).read_blocks("C", window=64)
            assert [row[3] async for block in blocks for row in block.rows()] == sent
        finally:
            await tc.close()

    rows = stored(tmp_path, "C")
    assert len(rows) == N
    assert all(size == len(sent[seq - 1]) for seq, size, _ in rows)
    assert sum(length for _, _, length in rows) < plain_bytes / 3
    assert all(size is None for _, size, _ in stored(tmp_path, "P"))

    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            info = await js.stream_info("C")
            assert info.state.bytes == bytes_before
            assert info.config.compression == StoreCompression.S2
            assert (await js.get_msg("C", N)).data == sent[-1]
            await js.publish("c.x", document(N))  # still compressed after the restart
            # Turning it off keeps every stored message readable; new ones go in plain.
            cfg = info.config
            cfg.compression = StoreCompression.NONE
            await js.update_stream(cfg)
            await js.publish("c.x", document(N + 1))
            sub = await js.pull_subscribe("c.x", durable="again", stream="C")
            got = []
            while len(got) < N + 2:
                got += [m.data for m in await sub.fetch(100, timeout=5)]
            assert got == [*sent, document(N), document(N + 1)]
        finally:
            await nc.close()
    rows = stored(tmp_path, "C")
    assert [size is not None for _, size, _ in rows[-2:]] == [True, False]


async def test_the_database_holds_fewer_bytes_than_the_payloads(tmp_path: Path) -> None:
    sent = [document(i) for i in range(N * 2)]
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="C", subjects=["c.>"], compression=StoreCompression.S2)
            for data in sent:
                await js.publish("c.x", data)
        finally:
            await nc.close()
    # The whole store (database and log, checkpointed as it closed) is a fraction of
    # the payloads alone.
    assert database_bytes(tmp_path) < sum(map(len, sent)) / 2


async def test_key_value_and_object_store_on_compressed_streams(tmp_path: Path) -> None:
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            kv = await js.create_key_value(bucket="cfg", history=5)
            obj = await js.create_object_store(bucket="files")
            for name in ("KV_cfg", "OBJ_files"):  # what nats.js's compression: true sets
                cfg = (await js.stream_info(name)).config
                cfg.compression = StoreCompression.S2
                await js.update_stream(cfg)
            await kv.put("a", document(1))
            await kv.put("a", document(2))
            assert (await kv.get("a")).value == document(2)
            history = await kv.history("a")
            assert [e.value for e in history] == [document(1), document(2)]
            blob = b"".join(document(i) for i in range(100))  # several chunks
            await obj.put("big.json", blob)
            assert (await obj.get("big.json")).data == blob
        finally:
            await nc.close()
    assert any(size is not None for _, size, _ in stored(tmp_path, "KV_cfg"))
    assert all(size is not None for _, size, _ in stored(tmp_path, "OBJ_files")[:-1])


async def test_an_nsq_channel_reads_compressed_messages_from_the_store(tmp_path: Path) -> None:
    sent = [document(i) for i in range(20)]
    args = ["--nsq-port", "-1"]
    with run_server(store=tmp_path, args=args) as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        writer.write(commands.MAGIC_V2 + commands.sub("zipped", "ch"))  # makes the topic
        frames = FrameReader()
        assert frames.feed(await reader.read(1024)) == [(FRAME_RESPONSE, b"OK")]
        writer.close()
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            cfg = (await js.stream_info("NSQ_zipped")).config
            cfg.compression = StoreCompression.S2
            await js.update_stream(cfg)
            for data in sent:
                await js.publish("nsq.zipped", data)
        finally:
            await nc.close()
    assert all(size is not None for _, size, _ in stored(tmp_path, "NSQ_zipped"))

    # After a restart nothing is cached: the channel's messages come from the store.
    with run_server(store=tmp_path, args=args) as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.nsq_port)
        writer.write(commands.MAGIC_V2 + commands.sub("zipped", "ch") + commands.rdy(100))
        frames = FrameReader()
        bodies: list[bytes] = []
        while len(bodies) < len(sent):
            data = await asyncio.wait_for(reader.read(1 << 16), 10)
            assert data, "connection closed"
            for frame in frames.feed(data):
                if frame.frame_type == FRAME_MESSAGE:
                    bodies.append(frame.message().body)
        writer.close()
        assert bodies == sent


async def test_the_http_front_door_reads_compressed_messages_from_the_store(
    tmp_path: Path,
) -> None:
    payload = document(7).decode()
    producer = {
        "X-Broker-Channel-Token": "ct",
        "X-Broker-Producer-ID": "p",
        "X-Broker-Producer-Token": "pt",
    }
    with run_server(store=tmp_path) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=10) as http:
            assert (await http.put("/channel/zip", data={"token": "ct"})).status_code == 200
            assert (await http.put("/producer/p", data={"token": "pt"})).status_code == 200
            nc = await nats.connect(srv.url)
            try:
                js = nc.jetstream()
                cfg = (await js.stream_info("WB_zip")).config
                cfg.compression = StoreCompression.S2
                await js.update_stream(cfg)
            finally:
                await nc.close()
            r = await http.post(
                "/channel/zip/broadcast",
                content=payload.encode(),
                headers={**producer, "X-Broker-Message-ID": "m1", "Content-Type": "text/plain"},
            )
            assert r.status_code == 201, r.text
    assert [size is not None for _, size, _ in stored(tmp_path, "WB_zip")] == [True]

    with run_server(store=tmp_path) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url, timeout=10) as http:
            r = await http.get("/channel/zip/message/m1")
            assert r.status_code == 200, r.text
            assert r.json()["Payload"] == payload


async def test_a_stream_stored_before_the_store_kept_its_setting_compresses_after_a_start(
    tmp_path: Path,
) -> None:
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="OLD", subjects=["old"], compression=StoreCompression.S2)
            await js.publish("old", document(1))
        finally:
            await nc.close()
    # What a store written by an earlier version holds: the stream's configuration
    # says s2, the store's own setting is the migration's default.
    conn = sqlite3.connect(tmp_path / "tether.db")
    conn.execute("UPDATE streams SET compression = 'none'")
    conn.execute("UPDATE messages SET data = ?, plain_size = NULL", (document(1),))
    conn.commit()
    conn.close()
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.publish("old", document(2))
            assert (await js.get_msg("OLD", 1)).data == document(1)
            assert (await js.get_msg("OLD", 2)).data == document(2)
        finally:
            await nc.close()
    assert [size is not None for _, size, _ in stored(tmp_path, "OLD")] == [False, True]
