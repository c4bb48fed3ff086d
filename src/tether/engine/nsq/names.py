"""How NSQ names map onto streams, subjects and consumers, and message ids onto sequences.

An NSQ topic ``clicks`` is the stream ``NSQ_clicks`` capturing the subject
``nsq.clicks``; its channel ``archive`` is the durable consumer ``archive`` of that
stream. Topic and channel names may contain ``.``, which stream names, consumer names
and subject tokens may not: it is written ``~``, a character NSQ names never contain,
so the mapping is reversible (topic ``events.eu`` is stream ``NSQ_events~eu`` and
subject ``nsq.events~eu``). ``#ephemeral`` stays as it is (``#`` is allowed in all three).

An NSQ message id is 16 ASCII bytes; here it is the message's stream sequence in
zero-padded lower-case hexadecimal (seq 255 is ``00000000000000ff``), so a ``FIN``,
``REQ`` or ``TOUCH`` names the message itself.
"""

from __future__ import annotations

import re

STREAM_PREFIX = "NSQ_"
SUBJECT_PREFIX = "nsq."
# The durable consumer that holds a topic's messages while it has no channel (NSQ
# keeps them for the first channel); no channel name can start with ``#``.
BACKLOG = "#backlog"
# Marks, in CONSUMER.INFO, the durable consumers that are NSQ channels.
OWNER_KEY = "tether.owner"
OWNER = "nsq"
# In a topic's stream metadata: the topic is paused (``/topic/pause``).
PAUSED_KEY = "tether.nsq.paused"
# A paused channel's consumer is paused until then (2**62 ns: the year 2116).
PAUSED_FOREVER_NS = 1 << 62

_HEX_ID = re.compile(rb"[0-9a-f]{16}")


def escape(name: str) -> str:
    return name.replace(".", "~")


def unescape(token: str) -> str:
    return token.replace("~", ".")


def stream_name(topic: str) -> str:
    return STREAM_PREFIX + escape(topic)


def subject(topic: str) -> str:
    return SUBJECT_PREFIX + escape(topic)


def topic_of(stream: str) -> str | None:
    """The topic an ``NSQ_`` stream carries (None for other streams)."""
    if not stream.startswith(STREAM_PREFIX) or len(stream) == len(STREAM_PREFIX):
        return None
    return unescape(stream[len(STREAM_PREFIX) :])


def consumer_name(channel: str) -> str:
    return escape(channel)


def channel_of(consumer: str) -> str:
    return unescape(consumer)


def message_id(seq: int) -> bytes:
    return b"%016x" % seq


def seq_of(msg_id: bytes) -> int:
    """The sequence a message id names (0 if it is not one of ours)."""
    return int(msg_id, 16) if _HEX_ID.fullmatch(msg_id) else 0
