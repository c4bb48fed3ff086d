"""Stream bytes through nats-py against ``tether serve`` on SQLite: a file stream
counts nats-server's file-store record, a memory stream subject + headers + payload +
16; a key-value bucket's status reports the same, and a restart rebuilds the same
count from the store."""

from __future__ import annotations

from pathlib import Path

import nats
from nats.js.api import StorageType

from tether.testing import run_server

HEADERS = {"K": "v"}  # sent as the 18-byte block NATS/1.0\r\nK: v\r\n\r\n


async def test_bytes_kv_status_and_a_restart(tmp_path: Path) -> None:
    file_bytes = (3 + 5 + 30) + (3 + 18 + 5 + 34)
    memory_bytes = (3 + 5 + 16) + (3 + 18 + 5 + 16)
    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="F", subjects=["f.>"])
            await js.add_stream(name="M", subjects=["m.>"], storage=StorageType.MEMORY)
            for subject in ("f.a", "m.a"):
                await js.publish(subject, b"hello")
                await js.publish(subject, b"hello", headers=HEADERS)
            assert (await js.stream_info("F")).state.bytes == file_bytes
            assert (await js.stream_info("M")).state.bytes == memory_bytes
            kv = await js.create_key_value(bucket="cfg")
            await kv.put("k", b"value")
            await kv.delete("k")  # a KV-Operation: DEL header block, no payload
            status = await kv.status()
            # History 1: the delete marker alone is left, "$KV.cfg.k" (9) with its
            # header block and no payload, + 34.
            marker = len(b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n")
            assert status.stream_info.state.bytes == 9 + marker + 34
            kv_bytes = status.stream_info.state.bytes
        finally:
            await nc.close()

    with run_server(store=tmp_path) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            assert (await js.stream_info("F")).state.bytes == file_bytes
            assert (await js.stream_info("M")).state.bytes == memory_bytes
            status = await (await js.key_value("cfg")).status()
            assert status.stream_info.state.bytes == kv_bytes
            info = await js.account_info()
            assert (info.storage, info.memory) == (file_bytes + kv_bytes, memory_bytes)
        finally:
            await nc.close()
