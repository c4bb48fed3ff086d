"""Ack subjects: the reply subject a delivery carries so that its ack finds its way back.

Tether sends nats-server's v1 form,
``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>``
(9 tokens), and also accepts the v2 form, which puts ``<domain>.<account hash>`` after
``$JS.ACK`` and may end with a random token (11 or 12 tokens). Only the stream, the
consumer and the stream sequence matter to an ack; the other numbers are for the client.

Both directions are on the hot path (one ack subject per delivered message, one parse
per ack), so a subject is built with one ``%`` format of a per-consumer template and
parsed with one ``split``.
"""

from __future__ import annotations

V1_TOKENS = 9
# A stream sequence is a uint64: 20 digits at most. Longer tokens (or non-ASCII digits,
# which ``int`` would accept) are not numbers to nats-server either.
_MAX_DIGITS = 20


def ack_format(stream: str, consumer: str) -> str:
    """The template of a consumer's ack subjects.

    ``ack_format(s, c) % (delivered, stream_seq, consumer_seq, timestamp_ns, pending)``
    is the subject.
    """
    return _escaped_prefix(stream, consumer) + "%d.%d.%d.%d.%d"


def first_delivery_format(stream: str, consumer: str) -> str:
    """Like :func:`ack_format` for a first delivery (delivered count 1), the common case.

    ``first_delivery_format(s, c) % (stream_seq, consumer_seq, timestamp_ns, pending)``.
    """
    return _escaped_prefix(stream, consumer) + "1.%d.%d.%d.%d"


def _escaped_prefix(stream: str, consumer: str) -> str:
    # Names may contain '%', which must not be taken for a format directive.
    return f"$JS.ACK.{stream}.{consumer}.".replace("%", "%%")


def parse_ack_subject(subject: str) -> tuple[str, str, int] | None:
    """``(stream, consumer, stream sequence)`` of an ack subject, None if it has neither
    the v1 nor the v2 shape.

    The sequence is -1 when its token is not a plain decimal number. Never raises for
    any ``str``.
    """
    tokens = subject.split(".")
    n = len(tokens)
    if n == V1_TOKENS:
        seq = tokens[5]
        stream, consumer = tokens[2], tokens[3]
    elif n >= 11:
        seq = tokens[7]
        stream, consumer = tokens[4], tokens[5]
    else:
        return None
    if seq.isdigit() and seq.isascii() and len(seq) <= _MAX_DIGITS:
        return stream, consumer, int(seq)
    return stream, consumer, -1
