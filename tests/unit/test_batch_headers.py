"""The quick read of a batch message's header block (batch headers and maybe a
Nats-Msg-Id, in any order) gives exactly what the general header parser gives, and
leaves every other block to it."""

from __future__ import annotations

import pytest

from tether.engine.broker import _header_fields
from tether.engine.streams.batches import batch_fields

QUICK = [
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: a:b\r\nNats-Batch-Sequence: 99\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: x\r\nNats-Batch-Sequence: 2\r\nNats-Batch-Commit: 1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: x\r\nNats-Batch-Sequence: 2\r\nNats-Batch-Commit: eob\r\n\r\n",
    # Values the batch checks refuse are still read as the general parser reads them.
    b"NATS/1.0\r\nNats-Batch-Id: x\r\nNats-Batch-Sequence: -1\r\nNats-Batch-Commit: 2\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: " + b"i" * 65 + b"\r\nNats-Batch-Sequence: 1\r\n\r\n",
    # A msg id, and the headers in other orders (a Go client writes a map's headers).
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\nNats-Msg-Id: m\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id: m:1\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 9\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Sequence: 1\r\nNats-Batch-Id: b1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Commit: 1\r\nNats-Msg-Id: m\r\nNats-Batch-Sequence: 2\r\n"
    b"Nats-Batch-Id: b1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\n\r\n",  # no sequence (refused when staged)
    # A repeated header: its first value, as the general parser reads it.
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Id: b2\r\nNats-Batch-Sequence: 1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b\r\nNats-Batch-Sequence: 1\r\nNats-Msg-Id: 1\r\n"
    b"Nats-Msg-Id: 2\r\n\r\n",
]

GENERAL = [
    b"",
    b"NATS/1.0\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id: m\r\nNats-Batch-Sequence: 1\r\n\r\n",  # no batch id
    b"NATS/1.0\r\nNats-Batch-Id:  b1\r\nNats-Batch-Sequence: 1\r\n\r\n",  # two spaces
    b"NATS/1.0\r\nNats-Batch-Id: b1 \r\nNats-Batch-Sequence: 1\r\n\r\n",  # trailing blank
    b"NATS/1.0\r\nNats-Batch-Id: b 1\r\nNats-Batch-Sequence: 1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\nNats-Batch-Commit: \r\n\r\n",
    b"NATS/1.0\r\nnats-batch-id: b1\r\nNats-Batch-Sequence: 1\r\n\r\n",  # other case
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\nNats-Msg-Id: \r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\nnats-msg-id: m\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\nX-App: m\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Msg-Id: m\r\nNats-Batch-Sequence: 1\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b\xc3\xa9\r\nNats-Batch-Sequence: 1\r\n\r\n",  # not ASCII
    b"NATS/1.0 503\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\n\r\n",
    b"NATS/1.0\r\nNats-Batch-Id: b1\r\nNats-Batch-Sequence: 1\r\n\r\nX",
]


@pytest.mark.parametrize("block", QUICK)
def test_batch_blocks_read_as_the_general_parser_reads_them(block: bytes) -> None:
    assert batch_fields(block) == _header_fields(block)


@pytest.mark.parametrize("block", GENERAL)
def test_other_blocks_are_left_to_the_general_parser(block: bytes) -> None:
    assert batch_fields(block) is None
