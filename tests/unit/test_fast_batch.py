"""Fast-ingest batches: the control fields of a reply subject, read as nats-server reads
them (the behaviour on the wire is compared with nats-server in
tests/conformance/test_batch_counter_schedule_conformance.py)."""

from __future__ import annotations

from tether.server.nats.fast_batch import Control, parse_reply


def test_reply_subjects_are_read_from_the_right() -> None:
    assert parse_reply("_INBOX.a.b.id1.25.ok.1.0.$FI") == Control("id1", 25, False, 1, 0)
    assert parse_reply("_INBOX.x.id.-5.fail.7.1.$FI") == Control("id", 10, True, 7, 1)
    assert parse_reply("_INBOX.x.id.0.ok.1.2.$FI") == Control("id", 10, False, 1, 2)
    assert parse_reply("_INBOX.x.id.99999.ok.3.4.$FI") == Control("id", 65535, False, 3, 4)


def test_malformed_reply_subjects() -> None:
    for reply in (
        "_INBOX.x.$FI",
        "_INBOX.x.id.10.ok.2.0.$FI",  # a start that is not at 1
        "_INBOX.x.id.10.ok.1.1.$FI",  # an append at 1
        "_INBOX.x.id.10.ok.1.3.$FI",  # end of batch at 1
        "_INBOX.x.id.10.ok.0.0.$FI",  # sequence 0
        "_INBOX.x.id.10.ok.1.9.$FI",  # no such operation
        "_INBOX.x.id.10.maybe.1.0.$FI",  # gap mode
        "_INBOX.x.id.ten.ok.1.0.$FI",  # flow
    ):
        assert parse_reply(reply) is None, reply
