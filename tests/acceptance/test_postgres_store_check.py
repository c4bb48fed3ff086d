"""``tether store check`` and ``tether store repair`` on a PostgreSQL store.

The damage is done behind the store's back with UPDATE statements, as a mistaken
script, a bad restore or a faulty disk under PostgreSQL would leave it: a payload's
bytes flipped, a checksum changed, a compressed payload replaced by garbage, a
stream's high-water mark lowered. The commands run as the operator runs them, as
``python -m tether`` subprocesses.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from tether.storage import (
    ConsumerRecord,
    CorruptMessage,
    StoredMessage,
    StreamRecord,
    postgres_integrity,
)
from tether.storage.postgres import PostgresStore
from tether.storage.postgres_integrity import check_postgres
from tether.testing import PostgresServer, RunningServer

TS = 1_700_000_000_123_456_789
_databases = itertools.count(1)


def run(*args: str, block_psycopg: bool = False) -> subprocess.CompletedProcess[str]:
    prelude = "import sys; sys.modules['psycopg'] = None; " if block_psycopg else ""
    code = f"{prelude}import sys; sys.argv[0] = 'tether'; from tether.cli.main import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "store", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def document(seq: int) -> bytes:
    """A payload that compresses well: an "s2" stream stores it compressed."""
    return json.dumps({"order": seq, "items": [{"sku": f"item-{i}"} for i in range(20)]}).encode()


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database(f"store_check_{next(_databases)}")


async def fill(url: str) -> None:
    """PLAIN: 5 messages as sent; PACKED ("s2"): 4 compressed ones; one consumer."""
    store = PostgresStore(url)
    await store.open()
    try:
        store.put_stream(StreamRecord("PLAIN", b"{}", TS))
        store.put_stream(StreamRecord("PACKED", b"{}", TS, "s2"))
        for seq in range(1, 6):
            headers = b"NATS/1.0\r\nK: v\r\n\r\n" if seq % 2 else b""
            store.append("PLAIN", StoredMessage(seq, "orders.new", headers, b"p-%d" % seq, TS))
        for seq in range(1, 5):
            store.append("PACKED", StoredMessage(seq, "docs.new", b"", document(seq), TS + seq))
        store.put_consumer(ConsumerRecord("PLAIN", "worker", b"{}", b"", TS))
        await store.flush()
    finally:
        await store.close()


def sql(url: str, statement: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


def damage(url: str) -> None:
    sql(url, "UPDATE tether_messages SET data = set_byte(data, 0, get_byte(data, 0) # 1)"
             " WHERE stream = 'PLAIN' AND seq = 2")  # fmt: skip
    sql(url, "UPDATE tether_messages SET crc = crc # 1 WHERE stream = 'PLAIN' AND seq = 5")
    packed = sql(url, "SELECT plain_size FROM tether_messages WHERE stream = 'PACKED' AND seq = 3")
    assert packed[0][0] is not None  # stored compressed
    sql(url, "UPDATE tether_messages SET data = '\\xff00ff00'::bytea"
             " WHERE stream = 'PACKED' AND seq = 3")  # fmt: skip
    sql(url, "UPDATE tether_stream_seq SET last_seq = 2 WHERE stream = 'PACKED'")


@pytest.mark.postgres
async def test_a_whole_store_checks_whole(database: str) -> None:
    await fill(database)
    done = run("check", "--store", database)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"store {database}"
    assert lines[1].startswith("  PostgreSQL ") and lines[1].endswith("Tether schema version 2")
    assert "tether_stream_seq" in lines[2]
    assert lines[3:] == [
        "stream 'PACKED': 4 messages, 4 verified, last sequence 4",
        "stream 'PLAIN': 5 messages, 5 verified, last sequence 5",
        "2 streams, 9 messages, 9 verified, 0 damaged, 1 consumers",
        "the store is whole",
    ]
    again = run("repair", "--store", database.replace("postgresql://", "postgres://"))
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "nothing to repair"


@pytest.mark.postgres
async def test_check_reports_damage_and_repair_deletes_it(database: str) -> None:
    await fill(database)
    damage(database)
    done = run("check", "--store", database)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[3:] == [
        "stream 'PACKED': 4 messages, 3 verified, last sequence 2",
        "  1 damaged (checksum mismatch): sequence 3",
        "  messages up to sequence 4 lie beyond the last sequence 2 (a damaged high-water mark)",
        "stream 'PLAIN': 5 messages, 3 verified, last sequence 5",
        "  2 damaged (checksum mismatch): sequence 2, 5",
        "2 streams, 9 messages, 6 verified, 3 damaged, 1 consumers",
        f"the store is damaged: `tether store repair --store {database}` keeps what is intact"
        " (stop the server first)",
    ]
    # Checking changed nothing.
    assert sql(database, "SELECT count(*) FROM tether_messages") == [(9,)]
    # A read meets the damage as an error that points to these commands.
    damaged = PostgresStore(database)
    await damaged.open()
    try:
        for stream, seq in (("PLAIN", 2), ("PACKED", 3)):
            with pytest.raises(CorruptMessage, match=r"PostgreSQL store; `tether store check`"):
                await damaged.read(stream, seq)
    finally:
        await damaged.close()

    repaired = run("repair", "--store", database)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    out = repaired.stdout.splitlines()
    assert out[out.index("repaired:") :] == [
        "repaired:",
        "  stream 'PACKED': 3 messages kept",
        "  stream 'PLAIN': 3 messages kept",
        "  lost: stream 'PACKED': 1 damaged message (sequence 3)",
        "  lost: stream 'PLAIN': 2 damaged messages (sequence 2, 5)",
        "  3 rows deleted from tether_messages in one transaction; every stream keeps its"
        " last sequence",
        "  stream 'PACKED': last sequence raised to 4 (its messages went past it)",
    ]
    # The last message of PLAIN was lost, its sequence stays taken.
    assert sorted(sql(database, "SELECT stream, last_seq FROM tether_stream_seq")) == [
        ("PACKED", 4),
        ("PLAIN", 5),
    ]
    assert sql(database, "SELECT count(*) FROM tether_consumers") == [(1,)]
    after = run("check", "--store", database)
    assert after.returncode == 0, after.stdout
    assert after.stdout.splitlines()[3:] == [
        "stream 'PACKED': 3 messages, 3 verified, last sequence 4",
        "stream 'PLAIN': 3 messages, 3 verified, last sequence 5",
        "2 streams, 6 messages, 6 verified, 0 damaged, 1 consumers",
        "the store is whole",
    ]
    store = PostgresStore(database)
    await store.open()
    try:
        assert await store.load_last_seq("PLAIN") == 5
        assert [m.seq for m in await store.read_range("PLAIN", 1, 10)] == [1, 3, 4]
        assert [m.data for m in await store.read_range("PACKED", 1, 10)] == [
            document(1),
            document(2),
            document(4),
        ]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_the_check_reads_the_messages_a_batch_at_a_time(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(database)
    damage(database)
    monkeypatch.setattr(postgres_integrity, "BATCH", 2)  # many fetches of the cursor
    report = check_postgres(database)
    assert [(s.name, s.messages, s.damaged, s.highest) for s in report.streams] == [
        ("PACKED", 4, [3], 4),
        ("PLAIN", 5, [2, 5], 5),
    ]
    assert report.consumers == 1 and not report.ok


@pytest.mark.postgres
async def test_repair_is_refused_while_a_node_is_active(database: str) -> None:
    await fill(database)
    damage(database)
    server = RunningServer(store=database)
    try:
        server.start()
        refused = run("repair", "--store", database)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"tether store repair: a Tether node is active on {database} (it holds the"
            " leader lock): stop it before repairing its store"
        )
        assert sql(database, "SELECT count(*) FROM tether_messages") == [(9,)]
        # A check reads one snapshot and changes nothing: it runs beside the node.
        assert run("check", "--store", database).returncode == 1
    finally:
        server.cleanup()
    repaired = run("repair", "--store", database)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert run("check", "--store", database).returncode == 0
    # The repair let go of the lock: a node becomes active again.
    with_node = RunningServer(store=database)
    try:
        with_node.start()
    finally:
        with_node.cleanup()


@pytest.mark.postgres
def test_what_is_not_a_store(postgres_server: PostgresServer, database: str) -> None:
    done = run("check", "--store", database)  # an empty database
    assert done.returncode == 1
    assert "problem: there is no Tether store in this database (no tether_* tables)" in (
        done.stdout.splitlines()
    )
    refused = run("repair", "--store", database)
    assert refused.returncode == 1
    assert "cannot repair the store" in refused.stderr and "no tether_* tables" in refused.stderr
    nobody = database.replace(f":{postgres_server.port}/", ":1/")
    unreachable = run("check", "--store", nobody)
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("tether store check: cannot connect to PostgreSQL at")


def test_a_missing_psycopg_names_the_extra() -> None:
    for command in ("check", "repair"):
        done = run(command, "--store", "postgresql://u:secret@127.0.0.1:1/db", block_psycopg=True)
        assert done.returncode == 1
        assert done.stderr.strip() == (
            f"tether store {command}: the PostgreSQL store needs psycopg 3, which is not"
            " installed: pip install 'tether[postgres]'"
        )


def test_compact_is_for_sqlite_stores() -> None:
    done = run("compact", "--store", "postgresql://u:secret@db/x")
    assert done.returncode == 2
    assert "secret" not in done.stderr and "compact works on SQLite stores only" in done.stderr
