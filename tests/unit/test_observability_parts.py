"""The pieces behind the logs and /metrics on their own: JSON log lines, the store URL
as the start lines show it, the commit histograms, load progress lines."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from tether.cli.logs import JsonFormatter
from tether.engine.broker import LoadProgress
from tether.server import banner
from tether.storage.stats import Histogram, disk_bytes


def test_json_lines() -> None:
    record = logging.LogRecord("tether", logging.INFO, __file__, 1, "hello %s", ("wörld",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "hello wörld"
    assert line["level"] == "info"
    assert line["logger"] == "tether"
    assert line["time"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("tether", logging.ERROR, __file__, 1, "x", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(JsonFormatter().format(failed))["exc"]


def test_store_location_is_absolute_and_hides_passwords(tmp_path: Path) -> None:
    assert banner.store_location("memory").startswith("memory")
    rel = banner.store_location("sqlite:./data")
    assert rel == f"sqlite://{Path('./data').resolve()}"
    assert banner.store_location(f"sqlite://{tmp_path}") == f"sqlite://{tmp_path}"
    hidden = banner.store_location("postgresql://tether:s3cret@db.example:5432/tether")
    assert "s3cret" not in hidden
    assert hidden == "postgresql://tether:***@db.example:5432/tether"


def test_histogram_is_cumulative() -> None:
    hist = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 3.0):
        hist.observe(value)
    assert hist.cumulative() == [("1.0", 2), ("2.0", 3), ("+Inf", 4)]
    assert hist.count == 4
    assert hist.total == pytest.approx(6.0)


def test_disk_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 5)
    (tmp_path / "sub").mkdir()
    assert disk_bytes(tmp_path) == 15
    assert disk_bytes(tmp_path / "missing") == 0


async def test_progress_lines_while_loading(caplog: pytest.LogCaptureFixture) -> None:
    loaded = LoadProgress(streams_total=2)
    caplog.set_level(logging.INFO, logger="tether")
    original = banner.PROGRESS_EVERY
    banner.PROGRESS_EVERY = 0.05
    try:
        async with banner.loading("the store", banner.load_progress(loaded)):
            loaded.current = "ORDERS"
            loaded.messages = 600_000
            await asyncio.sleep(0.2)
            loaded.streams = 2
            loaded.current = ""
    finally:
        banner.PROGRESS_EVERY = original
    lines = [r.getMessage() for r in caplog.records]
    assert any("reading ORDERS" in line and "600,000 messages" in line for line in lines)
    assert lines[-1].startswith("Loaded the store: 2 of 2 streams, 600,000 messages in ")


async def test_the_broker_counts_into_the_progress_it_was_given() -> None:
    from tether.engine.broker import Broker
    from tether.engine.clock import FakeClock
    from tether.storage.memory import MemoryStore

    store = MemoryStore()
    await store.open()
    broker = Broker(store, FakeClock())
    stream, _ = await broker.create_stream("A", b'{"name":"A","subjects":["a"]}')
    for i in range(3):
        broker.publish(stream, "a", None, b"%d" % i, None)
    await store.flush()
    again = Broker(store, FakeClock())
    watched = again.loaded  # what the progress lines read while load() runs
    await again.load()
    assert watched is again.loaded
    assert (watched.streams, watched.streams_total, watched.messages) == (1, 1, 3)
