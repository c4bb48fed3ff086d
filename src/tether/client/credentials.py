"""Proving who we are with keys: nkey seeds and ``.creds`` files (a user JWT and its seed).

The server puts a nonce in INFO; CONNECT carries the signature of that nonce (Ed25519,
through the ``nkeys`` package) with the public key (nkey users) or the user JWT (operator
mode), as every NATS client does.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

from tether.client.errors import ClientError


class CredentialsError(ClientError):
    """A seed or ``.creds`` file that cannot be read or used."""


@dataclass(frozen=True)
class Signer:
    """Signs a server's nonce: with a user JWT (``.creds``) or as an nkey user."""

    seed: bytes
    jwt: str | None = None

    def connect_fields(self, nonce: str | None) -> dict[str, Any]:
        """The CONNECT fields that log us in: ``jwt`` or ``nkey``, and ``sig``."""
        try:
            pair = nkeys.from_seed(bytearray(self.seed))
        except Exception as exc:  # nkeys raises its own error types and binascii's
            raise CredentialsError(f"invalid nkey seed: {exc}") from None
        fields: dict[str, Any] = {}
        if self.jwt is not None:
            fields["jwt"] = self.jwt
        else:
            fields["nkey"] = pair.public_key.decode()
        if nonce:
            signature = pair.sign(nonce.encode())
            fields["sig"] = base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
        pair.wipe()
        return fields


def _read(path: str | Path, what: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise CredentialsError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def _check_seed(seed: str, source: str) -> bytes:
    if not seed.startswith("S") or len(seed) < 58:
        raise CredentialsError(f"{source}: no nkey seed (a line starting with S…)")
    try:
        nkeys.from_seed(bytearray(seed.encode())).wipe()
    except Exception:
        raise CredentialsError(f"{source}: invalid nkey seed") from None
    return seed.encode()


def _blocks(text: str) -> list[str]:
    """The framed blocks of a ``.creds`` file (``-----BEGIN …-----`` to ``------END …------``;
    nsc writes 5 dashes before and 6 after, readers take any dashed marker line)."""
    blocks: list[str] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("---") and "BEGIN" in line:
            current = []
        elif line.startswith("---") and "END" in line:
            if current is not None:
                blocks.append("".join(current))
            current = None
        elif current is not None and line:
            current.append(line)
    return blocks


def from_creds_file(path: str | Path) -> Signer:
    """A ``.creds`` file as ``nsc`` writes it: the user JWT block, then the seed block."""
    text = _read(path, "credentials")
    blocks = _blocks(text)
    if len(blocks) < 2:
        raise CredentialsError(f"credentials {path}: expected a user JWT and an nkey seed block")
    jwt, seed = blocks[0], blocks[1]
    if jwt.count(".") != 2:
        raise CredentialsError(f"credentials {path}: the first block is not a JWT")
    return Signer(_check_seed(seed, f"credentials {path}"), jwt)


def from_seed_file(path: str | Path) -> Signer:
    """A file holding an nkey seed (the first line that looks like one)."""
    text = _read(path, "nkey seed file")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("SU") or (line.startswith("S") and len(line) == 58):
            return Signer(_check_seed(line, f"nkey seed file {path}"))
    raise CredentialsError(f"nkey seed file {path}: no nkey seed (a line starting with SU…)")


def from_seed(seed: str) -> Signer:
    """An nkey seed given as a string."""
    return Signer(_check_seed(seed.strip(), "nkey seed"))
