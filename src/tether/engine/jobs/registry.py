"""The webhook-broker registry: producers, channels, consumers and scheduled messages.

Records are persisted through the ordinary :class:`Store` as consumer records of a
reserved pseudo stream, :data:`REGISTRY_STREAM`, whose name no real stream can take
(stream names cannot contain ``.``). That gives the registry group commit and both
backends for free without widening the storage interface. The jobs themselves are the
delivery state of the consumer's durable consumer on the channel's stream; a consumer's
record carries only the job details that state has no field for (see
:class:`~tether.engine.jobs.JobView`) as the record's ``state``, which the store
coalesces per commit.

Tokens are never stored in clear: each is kept as a salted SHA-256 digest and checked
in constant time. A push consumer's token must still be presented to its callback (the
webhook-broker protocol sends it in a header), so it is additionally *sealed*: encrypted
and authenticated with a key held outside the store when one is configured.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
import string
from typing import Literal

import msgspec

from tether.storage.base import ConsumerRecord, Store

REGISTRY_STREAM = "$tether.webhook"  # not a valid stream name: cannot collide
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TOKEN_ALPHABET = string.ascii_letters + string.digits

ConsumerType = Literal["push", "pull"]


def valid_id(value: str) -> bool:
    """IDs become stream names and subject tokens, so they keep to ``[A-Za-z0-9_-]``."""
    return ID_PATTERN.fullmatch(value) is not None


def random_token() -> str:
    """webhook-broker's default token: 12 random alphanumerics (from a CSPRNG here)."""
    return "".join(secrets.choice(_TOKEN_ALPHABET) for _ in range(12))


def hash_token(token: str) -> str:
    salt = secrets.token_hex(8)
    digest = hashlib.sha256(bytes.fromhex(salt) + token.encode()).hexdigest()
    return f"sha256${salt}${digest}"


def verify_token(token: str | None, stored: str) -> bool:
    """Constant-time check of a presented token against its stored digest."""
    try:
        _, salt, digest = stored.split("$", 2)
        raw_salt = bytes.fromhex(salt)
    except ValueError:
        return False
    given = hashlib.sha256(raw_salt + (token or "").encode()).hexdigest()
    return hmac.compare_digest(given, digest) and token is not None


class Sealer:
    """Authenticated encryption of short secrets with HMAC-SHA256 as the PRF
    (counter-mode keystream, encrypt-then-MAC), from the standard library only."""

    def __init__(self, key: bytes) -> None:
        self._enc = hmac.new(key, b"tether-seal-enc", hashlib.sha256).digest()
        self._mac = hmac.new(key, b"tether-seal-mac", hashlib.sha256).digest()

    def _stream(self, nonce: bytes, n: int) -> bytes:
        out = b""
        counter = 0
        while len(out) < n:
            out += hmac.new(self._enc, nonce + counter.to_bytes(4, "big"), hashlib.sha256).digest()
            counter += 1
        return out[:n]

    def seal(self, secret: str) -> str:
        data = secret.encode()
        nonce = os.urandom(16)
        ct = bytes(a ^ b for a, b in zip(data, self._stream(nonce, len(data)), strict=True))
        tag = hmac.new(self._mac, nonce + ct, hashlib.sha256).digest()[:16]
        return (nonce + tag + ct).hex()

    def unseal(self, sealed: str) -> str | None:
        try:
            raw = bytes.fromhex(sealed)
        except ValueError:
            return None
        nonce, tag, ct = raw[:16], raw[16:32], raw[32:]
        if len(nonce) < 16 or not hmac.compare_digest(
            tag, hmac.new(self._mac, nonce + ct, hashlib.sha256).digest()[:16]
        ):
            return None
        data = bytes(a ^ b for a, b in zip(ct, self._stream(nonce, len(ct)), strict=True))
        return data.decode(errors="replace")


class Producer(msgspec.Struct, kw_only=True):
    id: str
    name: str
    token_hash: str
    created_ns: int
    changed_ns: int


class Channel(msgspec.Struct, kw_only=True):
    id: str
    name: str
    token_hash: str
    created_ns: int
    changed_ns: int


class Consumer(msgspec.Struct, kw_only=True):
    channel: str
    id: str
    name: str
    token_hash: str
    callback: str
    type: ConsumerType
    num: int  # short number that job ids carry
    created_ns: int
    changed_ns: int
    sealed_token: str = ""  # push consumers only


class Scheduled(msgspec.Struct, kw_only=True):
    channel: str
    message_id: str
    producer: str
    content_type: str
    priority: int
    headers: dict[str, str]
    payload: bytes
    due_ns: int
    created_ns: int
    dispatched_ns: int = 0


class Meta(msgspec.Struct, kw_only=True):
    next_consumer_num: int = 1
    seal_key: str = ""  # used only when no key is configured


_json = msgspec.json.Encoder()


def _name(kind: str, *parts: str) -> str:
    return "/".join((kind, *parts))


class Registry:
    """In-memory registry mirrored to the store; writes return the commit awaitable."""

    def __init__(self, store: Store, seal_key: str | None = None) -> None:
        self.store = store
        self.producers: dict[str, Producer] = {}
        self.channels: dict[str, Channel] = {}
        self.consumers: dict[tuple[str, str], Consumer] = {}
        self.by_num: dict[int, Consumer] = {}
        self.scheduled: dict[tuple[str, str], Scheduled] = {}
        self.states: dict[tuple[str, str], bytes] = {}
        self.meta = Meta()
        self._configured_key = seal_key
        self.sealer = Sealer(b"")

    async def load(self) -> None:
        for rec in await self.store.load_consumers(REGISTRY_STREAM):
            kind = rec.name.split("/", 1)[0]
            if kind == "p":
                p = msgspec.json.decode(rec.config, type=Producer)
                self.producers[p.id] = p
            elif kind == "c":
                c = msgspec.json.decode(rec.config, type=Channel)
                self.channels[c.id] = c
            elif kind == "k":
                k = msgspec.json.decode(rec.config, type=Consumer)
                self.consumers[(k.channel, k.id)] = k
                self.by_num[k.num] = k
                self.states[(k.channel, k.id)] = rec.state
            elif kind == "s":
                s = msgspec.json.decode(rec.config, type=Scheduled)
                self.scheduled[(s.channel, s.message_id)] = s
            elif kind == "meta":
                self.meta = msgspec.json.decode(rec.config, type=Meta)
        key = self._configured_key
        if not key:
            if not self.meta.seal_key:
                self.meta.seal_key = secrets.token_hex(32)
                self._put("meta", _json.encode(self.meta), 0)
            key = self.meta.seal_key
        self.sealer = Sealer(hashlib.sha256(key.encode()).digest())

    def _put(
        self, name: str, config: bytes, created_ns: int, state: bytes = b""
    ) -> asyncio.Future[None]:
        return self.store.put_consumer(
            ConsumerRecord(REGISTRY_STREAM, name, config, state, created_ns)
        )

    # -- writes ---------------------------------------------------------------------------
    def put_producer(self, p: Producer) -> asyncio.Future[None]:
        self.producers[p.id] = p
        return self._put(_name("p", p.id), _json.encode(p), p.created_ns)

    def put_channel(self, c: Channel) -> asyncio.Future[None]:
        self.channels[c.id] = c
        return self._put(_name("c", c.id), _json.encode(c), c.created_ns)

    def new_consumer_num(self) -> int:
        num = self.meta.next_consumer_num
        self.meta.next_consumer_num += 1
        self._put("meta", _json.encode(self.meta), 0)
        return num

    def put_consumer(self, k: Consumer, state: bytes) -> asyncio.Future[None]:
        self.consumers[(k.channel, k.id)] = k
        self.by_num[k.num] = k
        return self._put(_name("k", k.channel, k.id), _json.encode(k), k.created_ns, state)

    def put_consumer_state(self, k: Consumer, state: bytes) -> asyncio.Future[None]:
        return self.store.put_consumer_state(REGISTRY_STREAM, _name("k", k.channel, k.id), state)

    def delete_consumer(self, k: Consumer) -> asyncio.Future[None]:
        self.consumers.pop((k.channel, k.id), None)
        self.by_num.pop(k.num, None)
        return self.store.delete_consumer(REGISTRY_STREAM, _name("k", k.channel, k.id))

    def put_scheduled(self, s: Scheduled) -> asyncio.Future[None]:
        self.scheduled[(s.channel, s.message_id)] = s
        return self._put(_name("s", s.channel, s.message_id), _json.encode(s), s.created_ns)

    # -- tokens -----------------------------------------------------------------------------
    def consumer_token(self, k: Consumer) -> str:
        """The clear token of a push consumer, for its callback's header."""
        if not k.sealed_token:
            return ""
        return self.sealer.unseal(k.sealed_token) or ""
