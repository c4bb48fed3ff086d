"""Core NATS routing: who gets a copy of a published message.

Client subscriptions and the server's own internal subscriptions (the JetStream API,
streams capturing subjects) live in one subject index, so a request to a stream's
subject has a responder exactly as on nats-server.
"""

from __future__ import annotations

import random

from tether.engine.subjects import SubjectIndex
from tether.protocol.nats.commands import encode
from tether.server.nats.requests import is_utf8
from tether.server.nats.subscriptions import (
    BatchHandler,
    Client,
    ClientSubscription,
    HeaderedRunHandler,
    InternalHandler,
    InternalSubscription,
    RunHandler,
    Subscriber,
)


# Pre-built no-responders status: nats-server names the original subject in a header.
def _no_responders_block(subject: str) -> bytes:
    return b"NATS/1.0 503\r\nNats-Subject: " + encode(subject) + b"\r\n\r\n"


def _plain_literal(subject: str) -> bool:
    """No empty token (the rest of a published subject is not checked, as in publish)."""
    return ".." not in subject and subject[0] != "." and subject[-1] != "."


# Subjects that are (almost) never published to twice: caching their matches would
# only evict the subjects that do repeat.
_ONE_SHOT = ("_INBOX.", "$JS.ACK.")
_ACK_STEM = "$JS.ACK"
_ACK = _ACK_STEM + "."


class Router:
    """Matches published subjects to subscribers and hands each one its copy."""

    __slots__ = ("_choice", "_match", "_subject_bytes", "index", "out_bytes", "out_msgs")

    def __init__(self) -> None:
        self.index: SubjectIndex[Subscriber] = SubjectIndex()
        self.out_msgs = 0
        self.out_bytes = 0
        self._choice = random.choice
        self._match = self.index._cache  # the match cache itself: a hit is one C subscript
        self._subject_bytes: dict[str, bytes] = {}

    def subscribe_internal(
        self,
        subject: str,
        handler: InternalHandler,
        queue: str = "",
        run_handler: RunHandler | None = None,
        batch_handler: BatchHandler | None = None,
        headered_handler: HeaderedRunHandler | None = None,
    ) -> InternalSubscription:
        sub = InternalSubscription(
            subject, handler, queue, run_handler, batch_handler, headered_handler
        )
        self.index.add(subject, sub, queue or None)
        return sub

    def unsubscribe_internal(self, sub: InternalSubscription) -> None:
        self.index.remove(sub.subject, sub, sub.queue or None)

    def has_interest(self, subject: str) -> bool:
        m = self.index.match(subject)
        return bool(m.plain or m.groups)

    def publish(
        self,
        origin: Client | None,
        subject: str,
        reply: str,
        headers: bytes | None,
        payload: bytes,
    ) -> int:
        """Deliver to every matching subscriber; returns how many copies went out."""
        sb = self._subject_bytes.get(subject)
        if sb is not None:
            m = self._match[subject]  # the match cache itself: a hit is one C subscript
        else:
            if ".." in subject or subject[0] == "." or subject[-1] == ".":
                # An empty token matches no subscription, as in nats-server's sublist.
                if reply and origin is not None and origin.no_responders:
                    self._no_responders(origin, subject, reply)
                return 0
            sb = encode(subject)
            if subject.startswith(_ACK):
                m = self.index.match_beneath(_ACK_STEM, subject)  # one match for all acks
            elif subject.startswith(_ONE_SHOT) or not is_utf8(subject):
                # Not remembered, so never part of a run: a stream capturing a subject
                # that is not UTF-8 refuses each message on its own (see JetStreamApi).
                m = self.index.match_once(subject)
            else:
                # First sight of this subject: checked once, its wire bytes remembered.
                if len(self._subject_bytes) >= 8192:
                    self._subject_bytes.clear()
                self._subject_bytes[subject] = sb
                m = self._match[subject]
        plain = m.plain
        groups = m.groups
        if not plain and not groups:
            if reply and origin is not None and origin.no_responders:
                self._no_responders(origin, subject, reply)
            return 0
        rb = encode(reply) if reply else b""
        no_echo = origin is not None and not origin.echo
        sent = 0
        for sub in plain:
            if no_echo and sub.client is origin:
                continue
            sub.deliver(subject, reply, headers, payload, sb, rb)
            sent += 1
        for members in groups:
            if no_echo:
                members = tuple(s for s in members if s.client is not origin)
                if not members:
                    continue
            member = members[0] if len(members) == 1 else self._choice(members)
            member.deliver(subject, reply, headers, payload, sb, rb)
            sent += 1
        if sent == 0 and reply and origin is not None and origin.no_responders:
            self._no_responders(origin, subject, reply)
        return sent

    def publish_many(
        self,
        origin: Client,
        subject: str,
        replies: list[str],
        payloads: list[bytes],
    ) -> None:
        """:meth:`publish` for each of a run of header-less messages to one subject.

        When the subject's only subscriber is an internal one that takes runs (a stream
        capturing it), the run goes to it in one call; otherwise message by message.
        """
        publish = self.publish
        if subject not in self._subject_bytes:
            # First sight: the general path checks the subject and remembers it.
            publish(origin, subject, replies[0], None, payloads[0])
            if len(replies) == 1:
                return
            replies, payloads = replies[1:], payloads[1:]
        if subject in self._subject_bytes:
            m = self._match[subject]
            if len(m.plain) == 1 and not m.groups:
                sub = m.plain[0]
                if type(sub) is InternalSubscription and sub.run_handler is not None:
                    sub.run_handler(subject, replies, payloads)
                    return
        for reply, payload in zip(replies, payloads, strict=True):
            publish(origin, subject, reply, None, payload)

    def publish_headered_run(
        self,
        origin: Client,
        subject: str,
        replies: list[str],
        blocks: list[bytes],
        payloads: list[bytes],
    ) -> None:
        """:meth:`publish` for each of a run of messages with headers to one subject
        (``blocks[i]`` the header block of ``payloads[i]``; an empty one is none).

        When the subject's only subscriber is an internal one that takes such runs (a
        stream capturing it), the run goes to it in one call; otherwise message by
        message.
        """
        publish = self.publish
        if subject not in self._subject_bytes:
            # First sight: the general path checks the subject and remembers it.
            publish(origin, subject, replies[0], blocks[0] or None, payloads[0])
            if len(replies) == 1:
                return
            replies, blocks, payloads = replies[1:], blocks[1:], payloads[1:]
        if subject in self._subject_bytes:
            m = self._match[subject]
            if len(m.plain) == 1 and not m.groups:
                sub = m.plain[0]
                if type(sub) is InternalSubscription and sub.headered_handler is not None:
                    sub.headered_handler(subject, replies, blocks, payloads)
                    return
        for reply, block, payload in zip(replies, blocks, payloads, strict=True):
            publish(origin, subject, reply, block or None, payload)

    def publish_batch(
        self,
        origin: Client,
        subjects: list[str],
        replies: list[str],
        payloads: list[bytes],
    ) -> None:
        """:meth:`publish` for each of a batch of header-less messages, in order.

        Meant for acks: while the server's own ``$JS.ACK.>`` is all that reaches beneath
        ``$JS.ACK`` and it takes batches, the valid ack subjects go to it in one call per
        stretch between the others, which are published one by one in their place.
        """
        publish = self.publish
        handler = self._ack_batch_handler(subjects[0])
        if handler is None:
            for subject, reply, payload in zip(subjects, replies, payloads, strict=True):
                publish(origin, subject, reply, None, payload)
            return
        start = 0
        for i, subject in enumerate(subjects):
            if not (subject.startswith(_ACK) and _plain_literal(subject)):
                if i > start:
                    handler(subjects[start:i], replies[start:i], payloads[start:i])
                publish(origin, subject, replies[i], None, payloads[i])
                start = i + 1
        if start == 0:
            handler(subjects, replies, payloads)
        elif start < len(subjects):
            handler(subjects[start:], replies[start:], payloads[start:])

    def _ack_batch_handler(self, subject: str) -> BatchHandler | None:
        """The batch handler of the one subscriber of every subject beneath ``$JS.ACK``,
        if there is one; ``subject`` is any published subject."""
        if not (subject.startswith(_ACK) and _plain_literal(subject)):
            return None
        shared = self.index.shared_beneath(_ACK_STEM, subject)
        if shared is None or len(shared.plain) != 1 or shared.groups:
            return None
        sub = shared.plain[0]
        return sub.batch_handler if type(sub) is InternalSubscription else None

    def batch_target(self, subject: str) -> BatchHandler | None:
        """The batch handler of ``subject``'s only subscriber, if that is an internal
        subscription taking batches (a stream capture); None otherwise, and for a
        subject not published to yet (whose first message takes :meth:`publish`)."""
        if subject not in self._subject_bytes:
            return None
        m = self._match[subject]
        if len(m.plain) != 1 or m.groups:
            return None
        sub = m.plain[0]
        return sub.batch_handler if type(sub) is InternalSubscription else None

    def publish_headered(self, reply: str, blocks: list[bytes], payloads: list[bytes]) -> None:
        """``publish(None, reply, "", blocks[i], payloads[i])`` for each i, in order: many
        messages with headers to one inbox (the replies of a batched DIRECT.GET).

        The inbox is matched once; when its one subscriber is a client subscription
        that can take frames directly (no queue group, no UNSUB maximum) and speaks
        headers, the HMSG frames are appended to its buffer in one go.
        """
        sub: ClientSubscription | None = None
        if reply and _plain_literal(reply):
            m = self.index.match_once(reply)
            if len(m.plain) == 1 and not m.groups and type(m.plain[0]) is ClientSubscription:
                sub = m.plain[0]
        client = sub.client if sub is not None else None
        if sub is None or client is None or not client.headers or sub.max_msgs:
            for block, payload in zip(blocks, payloads, strict=True):
                self.publish(None, reply, "", block, payload)
            return
        rb = reply.encode("utf-8", "surrogateescape")
        sid_b = sub.sid_b
        frames = []
        payload_bytes = 0
        for block, payload in zip(blocks, payloads, strict=True):
            hlen = len(block)
            plen = len(payload)
            frames.append(
                b"HMSG %s %s %d %d\r\n%s%s\r\n" % (rb, sid_b, hlen, hlen + plen, block, payload)
            )
            payload_bytes += plen
        sub.delivered += len(frames)
        client.send_frames(frames, payload_bytes)

    def publish_replies(self, replies: list[str], bodies: list[bytes]) -> None:
        """``publish(None, reply, "", None, body)`` for each pair, in order (PubAcks).

        Every reply is usually a different inbox of the same few clients, with one
        subscription per client on ``<prefix>.*``: the subscriber is found once per
        prefix (:meth:`SubjectIndex.family`) and the frames for one client are appended
        to its buffer in one go. Anything else takes the general path. An empty reply
        is skipped (nobody asked).
        """
        self._publish_replies(replies, bodies, b"", 0)

    def publish_acks(self, replies: list[str], head: bytes, first_seq: int) -> None:
        """:meth:`publish_replies` with ``head + b"%d}" % (first_seq + i)`` as the i-th
        body (the PubAcks of a run), each formatted straight into its frame."""
        self._publish_replies(replies, None, head, first_seq)

    def _publish_replies(
        self, replies: list[str], bodies: list[bytes] | None, head: bytes, first_seq: int
    ) -> None:
        prefix: str | None = None
        sub: ClientSubscription | None = None
        exceptions: frozenset[str] = frozenset()
        client: Client | None = None
        frames: list[bytes] = []
        payload_bytes = 0
        # For bodies made of ``head`` and a sequence: the length of the sequence's digits.
        digits = len(str(first_seq))
        bound = 10**digits
        for i, reply in enumerate(replies):
            if not reply:
                continue
            body: bytes | None = None
            if bodies is not None:
                body = bodies[i]
            parent, _, last = reply.rpartition(".")
            if parent != prefix:
                prefix = parent
                sub, exceptions = self._reply_target(parent)
            if sub is not None and last and last not in exceptions:
                owner = sub.client
                if owner is not client:
                    if frames and client is not None:
                        client.send_frames(frames, payload_bytes)
                        frames = []
                        payload_bytes = 0
                    client = owner
                sub.delivered += 1
                rb = reply.encode("utf-8", "surrogateescape")
                if body is None:
                    seq = first_seq + i
                    while seq >= bound:
                        digits += 1
                        bound *= 10
                    size = len(head) + digits + 1
                    frames.append(b"MSG %s %s %d\r\n%s%d}\r\n" % (rb, sub.sid_b, size, head, seq))
                else:
                    size = len(body)
                    frames.append(b"MSG %s %s %d\r\n%s\r\n" % (rb, sub.sid_b, size, body))
                payload_bytes += size
                continue
            if frames and client is not None:
                client.send_frames(frames, payload_bytes)
                frames = []
                payload_bytes = 0
            if body is None:
                body = b"%s%d}" % (head, first_seq + i)
            self.publish(None, reply, "", None, body)
        if frames and client is not None:
            client.send_frames(frames, payload_bytes)

    def _reply_target(self, prefix: str) -> tuple[ClientSubscription | None, frozenset[str]]:
        """The one client subscription every ``prefix.<token>`` goes to (but for the
        tokens returned), when it can take frames directly: no queue group, no UNSUB
        maximum (it could go away after any message). Valid for one call of
        :meth:`publish_replies`: nothing there adds subscriptions, and the only one
        that may go away (a maximum reached on the general path) is not this one."""
        if not prefix or prefix[0] == "." or prefix[-1] == "." or ".." in prefix:
            return None, frozenset()  # a malformed reply: the general path decides
        m, exceptions = self.index.family(prefix)
        if len(m.plain) == 1 and not m.groups:
            sub = m.plain[0]
            if type(sub) is ClientSubscription and sub.client is not None and not sub.max_msgs:
                return sub, exceptions
        return None, exceptions

    def no_interest(self, origin: Client, subject: str, reply: str) -> None:
        """A publish that matches nobody by construction (a malformed subject)."""
        if reply and origin.no_responders:
            self._no_responders(origin, subject, reply)

    def _no_responders(self, origin: Client, subject: str, reply: str) -> None:
        # Sent only to the requester's own plain subscription on the reply subject, as
        # nats-server does; it does not count towards that subscription's UNSUB maximum.
        for sub in self.index.match(reply).plain:
            if sub.client is origin and isinstance(sub, ClientSubscription):
                origin.send_msg(sub.sid_b, encode(reply), b"", _no_responders_block(subject), b"")
                return
