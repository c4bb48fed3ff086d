"""Ack subjects: built from a per-consumer template, parsed without surprises."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.engine.consumers.ack_subject import (
    ack_format,
    first_delivery_format,
    parse_ack_subject,
)


def test_format_is_nats_v1() -> None:
    subject = ack_format("ORDERS", "worker") % (2, 17, 40, 1_700_000_000_123_456_789, 5)
    assert subject == "$JS.ACK.ORDERS.worker.2.17.40.1700000000123456789.5"


def test_first_delivery_format_is_delivered_once() -> None:
    first = first_delivery_format("S", "C") % (17, 40, 99, 0)
    assert first == ack_format("S", "C") % (1, 17, 40, 99, 0)
    assert first == "$JS.ACK.S.C.1.17.40.99.0"


def test_percent_in_names_is_not_a_directive() -> None:
    assert ack_format("a%d", "b%s") % (1, 2, 3, 4, 5) == "$JS.ACK.a%d.b%s.1.2.3.4.5"
    assert first_delivery_format("100%", "c") % (2, 3, 4, 5) == "$JS.ACK.100%.c.1.2.3.4.5"


def test_parse_v1() -> None:
    subject = ack_format("S", "C") % (3, 12, 7, 1_700_000_000, 0)
    assert parse_ack_subject(subject) == ("S", "C", 12)


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.dom.hash.S.C.3.12.7.1700000000.0",  # 11 tokens
        "$JS.ACK.dom.hash.S.C.3.12.7.1700000000.0.rnd",  # 12 tokens, as nats-server 2.10+
    ],
)
def test_parse_v2(subject: str) -> None:
    assert parse_ack_subject(subject) == ("S", "C", 12)


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "$JS.ACK",
        "$JS.ACK.S.C",
        "$JS.ACK.S.C.1.2.3.4",  # 8 tokens
        "$JS.ACK.S.C.1.2.3.4.5.6",  # 10 tokens
    ],
)
def test_wrong_shape_is_none(subject: str) -> None:
    assert parse_ack_subject(subject) is None


@pytest.mark.parametrize(
    "seq",
    [
        "",
        "x",
        "-1",
        "+1",
        "1e3",
        " 1",
        "²",  # a digit to str.isdigit, not to int()
        "٣",  # an Arabic-Indic three: int() takes it, nats-server does not
        "9" * 21,  # more than a uint64
        "9" * 5000,  # more digits than int() converts
    ],
)
def test_a_sequence_that_is_not_a_number_is_minus_one(seq: str) -> None:
    assert parse_ack_subject(f"$JS.ACK.S.C.1.{seq}.1.1.0") == ("S", "C", -1)


def test_largest_sequence() -> None:
    assert parse_ack_subject(f"$JS.ACK.S.C.1.{2**64 - 1}.1.1.0") == ("S", "C", 2**64 - 1)


@given(st.text())
def test_never_raises(subject: str) -> None:
    result = parse_ack_subject(subject)
    assert result is None or isinstance(result[2], int)


@given(st.lists(st.text(alphabet="0123456789.$JSACKx²", max_size=8), max_size=14))
def test_never_raises_on_dotted_tokens(tokens: list[str]) -> None:
    parse_ack_subject("$JS.ACK." + ".".join(tokens))
