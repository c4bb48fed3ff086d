"""Per-user publish and subscribe permissions, checked the way nats-server checks them.

A permission subject is matched against the subject of a PUB or a SUB with the SUB's
tokens taken literally (``*`` in a permission matches any one token, ``*`` and ``>``
included), as nats-server's subscription list does. Deny wins over allow; no allow list
means everything not denied. Publish decisions are remembered per subject in a dict
shared by every connection of the user, so the publish path costs one lookup.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tether.engine.subjects import filters_overlap, is_valid_filter, subject_matches
from tether.server.config import Permissions, ResponseRules, SubjectRules

# Publish decisions remembered per user before the cache starts afresh.
MAX_CACHED = 4096
# Reply subjects a connection tracks before the expired ones are swept out, and how
# often they are swept anyway (nats-server's replyPermLimit and replyPruneTime).
REPLY_LIMIT = 4096
REPLY_PRUNE_SECONDS = 1.0


def go_quote(text: str) -> str:
    """``text`` quoted as Go's ``%q`` quotes it (nats-server's -ERR texts use it)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not ch.isprintable() and code > 0x7F:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def publish_violation(subject: str) -> str:
    return f"Permissions Violation for Publish to {go_quote(subject)}"


# Reply prefixes nats-server keeps for itself (JetStream acks, service imports, gateway
# replies): a client may not use them as the reply of what it publishes.
_RESERVED_REPLIES = ("$JS.ACK.", "_R_.", "_GR_.")


def reserved_reply(reply: str) -> bool:
    return reply.startswith(_RESERVED_REPLIES)


def reply_violation(reply: str) -> str:
    return f"Permissions Violation for Publish with Reply of {go_quote(reply)}"


def subscribe_violation(subject: str, queue: str) -> str:
    text = f"Permissions Violation for Subscription to {go_quote(subject)}"
    if queue:
        text += f" using queue {go_quote(queue)}"
    return text


def _subjects(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _split(
    value: str | list[str] | SubjectRules | None,
) -> tuple[list[str] | None, list[str] | None]:
    """(allow, deny) of one side; a bare subject or list is an allow list."""
    if value is None:
        return None, None
    if isinstance(value, SubjectRules):
        return _subjects(value.allow), _subjects(value.deny)
    return _subjects(value), None


def _check_publish(subjects: list[str] | None, what: str) -> tuple[str, ...] | None:
    if subjects is None:
        return None
    for subject in subjects:
        if not is_valid_filter(subject):
            raise ValueError(f"{what}: subject {subject!r} is not a valid subject")
    return tuple(subjects)


def _check_subscribe(subjects: list[str] | None, what: str) -> tuple[tuple[str, str], ...] | None:
    if subjects is None:
        return None
    out = []
    for entry in subjects:
        if is_valid_filter(entry):
            out.append((entry, ""))
            continue
        parts = entry.split()
        if len(parts) != 2:
            raise ValueError(f"{what}: subject {entry!r} is not a valid subject")
        if not is_valid_filter(parts[0]):
            raise ValueError(f"{what}: subject {parts[0]!r} is not a valid subject")
        if not is_valid_filter(parts[1]):
            raise ValueError(f"{what}: queue {parts[1]!r} is not a valid queue")
        out.append((parts[0], parts[1]))
    return tuple(out)


def _queue_matches(queue: str, queues: Sequence[str]) -> bool:
    """Whether a SUB's queue is one of the permission's queues (which may be wildcards)."""
    return any(queue == name or subject_matches(name, queue) for name in queues)


class UserPermissions:
    """One user's compiled permissions; shared by all the user's connections."""

    __slots__ = (
        "deny_cache",
        "pub_allow",
        "pub_cache",
        "pub_deny",
        "responses",
        "sub_allow",
        "sub_deny",
    )

    def __init__(self, perms: Permissions, what: str = "permissions") -> None:
        pub_allow, pub_deny = _split(perms.publish)
        sub_allow, sub_deny = _split(perms.subscribe)
        self.responses: tuple[int, float] | None = None
        if perms.allow_responses is not False:
            rules = (
                perms.allow_responses
                if isinstance(perms.allow_responses, ResponseRules)
                else ResponseRules()
            )
            self.responses = (rules.max or 1, rules.expires or 120.0)
            if pub_allow is None:
                pub_allow = []  # only replies, unless publish says more
        self.pub_allow = _check_publish(pub_allow, f"{what}.publish")
        self.pub_deny = _check_publish(pub_deny or None, f"{what}.publish")
        self.sub_allow = _check_subscribe(sub_allow or None, f"{what}.subscribe")
        self.sub_deny = _check_subscribe(sub_deny or None, f"{what}.subscribe")
        # subject -> whether the allow and deny lists let it be published to.
        self.pub_cache: dict[str, bool] = {}
        self.deny_cache: dict[tuple[str, str], bool] = {}

    @property
    def restricts_publish(self) -> bool:
        return self.pub_allow is not None or self.pub_deny is not None

    # -- publish -------------------------------------------------------------------------
    def may_publish(self, subject: str) -> bool:
        """The allow and deny lists' answer for ``subject``, remembered."""
        allowed = self.pub_cache.get(subject)
        if allowed is None:
            allowed = True
            if self.pub_allow is not None:
                allowed = any(subject_matches(f, subject) for f in self.pub_allow)
            if allowed and self.pub_deny is not None:
                allowed = not any(subject_matches(f, subject) for f in self.pub_deny)
            if len(self.pub_cache) >= MAX_CACHED:
                self.pub_cache.clear()
            self.pub_cache[subject] = allowed
        return allowed

    # -- subscribe -----------------------------------------------------------------------
    def may_subscribe(self, subject: str, queue: str) -> bool:
        allowed = True
        if self.sub_allow is not None:
            plain, queues = self._hits(self.sub_allow, subject)
            allowed = plain
            if queue and queues:
                allowed = _queue_matches(queue, queues)
        if allowed and self.sub_deny is not None:
            plain, queues = self._hits(self.sub_deny, subject)
            allowed = not plain
            if allowed and queue and queues:
                allowed = not _queue_matches(queue, queues)
        return allowed

    @staticmethod
    def _hits(entries: tuple[tuple[str, str], ...], subject: str) -> tuple[bool, list[str]]:
        """Whether a plain entry matches ``subject``, and the queues of those that do."""
        plain = False
        queues: list[str] = []
        for filter, queue in entries:
            if subject_matches(filter, subject):
                if queue:
                    queues.append(queue)
                else:
                    plain = True
        return plain, queues

    def needs_delivery_check(self, subject: str, queue: str) -> bool:
        """Whether an allowed SUB can still receive denied subjects: a wildcard or queue
        subscription overlapping a deny entry (nats-server checks those on delivery)."""
        if self.sub_deny is None:
            return False
        if not queue and "*" not in subject and ">" not in subject:
            return False
        return any(filters_overlap(f, subject) for f, _ in self.sub_deny)

    def delivery_denied(self, subject: str, queue: str) -> bool:
        """Whether a message on ``subject`` must not reach a subscription (of ``queue``)."""
        key = (subject, queue)
        denied = self.deny_cache.get(key)
        if denied is None:
            denied = False
            if self.sub_deny is not None:
                plain, queues = self._hits(self.sub_deny, subject)
                denied = plain or bool(queue and queues and _queue_matches(queue, queues))
            if len(self.deny_cache) >= MAX_CACHED:
                self.deny_cache.clear()
            self.deny_cache[key] = denied
        return denied


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated client: its name (user, nkey or JWT subject), what it may do
    (``None``: anything), and when its credentials expire (epoch seconds, or ``None``)."""

    name: str
    permissions: UserPermissions | None = None
    expires: float | None = None


class Replies:
    """``allow_responses``: the reply subjects of requests a connection received, each
    publishable ``max`` times within ``expires`` seconds (0 or less: unbounded)."""

    __slots__ = ("_last_prune", "_since_prune", "expires", "max", "tracked")

    def __init__(self, max_msgs: int, expires: float) -> None:
        self.max = max_msgs
        self.expires = expires
        self.tracked: dict[str, list[float]] = {}  # reply -> [published, received at]
        self._since_prune = 0
        self._last_prune = time.monotonic()

    def received(self, reply: str) -> None:
        now = time.monotonic()
        self.tracked[reply] = [0, now]
        self._since_prune += 1
        if self._since_prune > REPLY_LIMIT or now - self._last_prune > REPLY_PRUNE_SECONDS:
            self._prune(now)

    def use(self, subject: str) -> bool:
        """Whether ``subject`` may be published as a reply now (and count it)."""
        entry = self.tracked.get(subject)
        if entry is None:
            return False
        entry[0] += 1
        if (self.max > 0 and entry[0] > self.max) or (
            self.expires > 0 and time.monotonic() - entry[1] > self.expires
        ):
            del self.tracked[subject]
            return False
        return True

    def _prune(self, now: float) -> None:
        for reply, (count, at) in list(self.tracked.items()):
            if (self.max > 0 and count >= self.max) or (
                self.expires > 0 and now - at > self.expires
            ):
                del self.tracked[reply]
        self._since_prune = 0
        self._last_prune = now
