"""NKeys: public keys as NATS writes them, nonces, and Ed25519 signature checks.

A public key is base32 (no padding) of a prefix byte naming its role, the 32-byte
Ed25519 key and a CRC16 of both. The ``nkeys`` package provides the prefixes and the
checksum; PyNaCl checks signatures. Nothing here signs: the server never needs a seed.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets

import nacl.exceptions
import nacl.signing
import nkeys  # type: ignore[import-untyped]

USER: int = nkeys.PREFIX_BYTE_USER
ACCOUNT: int = nkeys.PREFIX_BYTE_ACCOUNT
OPERATOR: int = nkeys.PREFIX_BYTE_OPERATOR

NONCE_BYTES = 11  # as nats-server: 15 characters once encoded


def new_nonce() -> str:
    """A fresh nonce for INFO: random bytes, base64url without padding."""
    return base64.urlsafe_b64encode(secrets.token_bytes(NONCE_BYTES)).rstrip(b"=").decode()


def public_key(text: str, prefix: int) -> bytes | None:
    """The raw Ed25519 key of a public nkey of the role ``prefix``, or ``None`` if
    ``text`` is not one (wrong role, length, alphabet or checksum)."""
    if len(text) != 56 or not text.isascii():
        return None
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != prefix:
        return None
    checksum = int.from_bytes(raw[33:35], "little")
    if not hmac.compare_digest(
        checksum.to_bytes(2, "little"), int(nkeys.crc16(raw[:33])).to_bytes(2, "little")
    ):
        return None
    return raw[1:33]


def decode_signature(sig: str) -> bytes | None:
    """A signature as clients send it: base64url without padding (nats-server's own
    encoding) or standard base64 with padding (nats.py's)."""
    text = sig.strip()
    for decode in (_b64url_raw, _b64_std):
        try:
            raw = decode(text)
        except (binascii.Error, ValueError):
            continue
        if len(raw) == 64:
            return raw
    return None


def _b64url_raw(text: str) -> bytes:
    if "=" in text:
        raise ValueError("padded")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _b64_std(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def verify(key: str, prefix: int, data: bytes, sig: str | bytes) -> bool:
    """Whether ``sig`` (raw, or as a client sends it) is ``key``'s signature of ``data``."""
    raw_key = public_key(key, prefix)
    raw_sig = decode_signature(sig) if isinstance(sig, str) else sig
    if raw_key is None or raw_sig is None or len(raw_sig) != 64:
        return False
    try:
        nacl.signing.VerifyKey(raw_key).verify(data, raw_sig)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True
