"""Decentralised authentication: NATS JWTs (v2 claims) trusted through an operator.

The operator JWT names the keys trusted to sign accounts; the memory resolver holds
account JWTs (``resolver_preload``); a client presents a user JWT signed by its
account (or one of the account's signing keys) and signs the INFO nonce with the
user's key. A JWT is ``b64url(header).b64url(claims).b64url(signature)``, unpadded,
signed with Ed25519 by the key in ``iss`` over the ASCII ``header.claims``.

Tether has one account: the preload holds the account whose users connect, and may
also hold the operator's system account, whose users are refused (Tether has no
system account). Messages of users of different accounts would not be kept apart,
so a second ordinary account is refused at start.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tether.server.config import (
    Permissions,
    ResponseRules,
    ServerConfig,
    SubjectRules,
)
from tether.server.nats.auth import keys
from tether.server.nats.auth.permissions import Identity, UserPermissions

log = logging.getLogger("tether.nats")

_MEMORY = re.compile(r"(?i)^(MEM|MEMORY)$")
_ALGORITHMS = ("ed25519-nkey", "ed25519")
_JWT_LINE = re.compile(r"^\s*(eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+)\s*$", re.M)
_decode_json = msgspec.json.Decoder().decode


class JwtError(ValueError):
    """A JWT that cannot be trusted, and why (for the log, never the client)."""


def _b64url(part: str) -> bytes:
    if "=" in part:
        raise JwtError("padded base64")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise JwtError("not base64url") from None


def decode(token: str, kind: str, issuers: tuple[int, ...]) -> dict[str, Any]:
    """The claims of a JWT of type ``kind``, its signature checked with its ``iss`` key,
    which must be a public key of one of the roles ``issuers``."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("not a JWT")
    try:
        header = _decode_json(_b64url(parts[0]))
        claims = _decode_json(_b64url(parts[1]))
    except msgspec.DecodeError:
        raise JwtError("not JSON") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise JwtError("not a JSON object")
    if str(header.get("typ", "")).upper() != "JWT" or header.get("alg") not in _ALGORITHMS:
        raise JwtError("not a NATS JWT")
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise JwtError("no issuer")
    signature = _b64url(parts[2])
    signed = f"{parts[0]}.{parts[1]}".encode()
    if not any(keys.verify(issuer, role, signed, signature) for role in issuers):
        raise JwtError("bad signature")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type", kind) != kind:
        raise JwtError(f"not a {kind} JWT")
    if not isinstance(claims.get("sub"), str):
        raise JwtError("no subject")
    return claims


def _expired(claims: dict[str, Any], now: float) -> bool:
    exp = claims.get("exp")
    nbf = claims.get("nbf")
    if isinstance(exp, int | float) and exp and exp <= now:
        return True
    return isinstance(nbf, int | float) and bool(nbf) and nbf > now


def _signing_keys(nats: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """An account's signing keys: plain ones, and scoped ones with their template."""
    out: dict[str, dict[str, Any] | None] = {}
    for entry in nats.get("signing_keys") or []:
        if isinstance(entry, str):
            out[entry] = None
        elif isinstance(entry, dict) and isinstance(entry.get("key"), str):
            template = entry.get("template")
            out[entry["key"]] = template if isinstance(template, dict) else {}
    return out


def read_jwt_text(value: str) -> str:
    """An operator setting: an inline JWT, or a file holding one (decorated or bare)."""
    if value.startswith("eyJ"):
        return value
    try:
        text = Path(value).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"operator: cannot read {value!r}: {exc.strerror}") from None
    found = _JWT_LINE.search(text)
    if found is None:
        raise ValueError(f"operator: {value!r} holds no JWT")
    return found.group(1)


def _rules(value: Any) -> SubjectRules | None:
    if not isinstance(value, dict):
        return None
    allow = value.get("allow")
    deny = value.get("deny")
    if not allow and not deny:
        return None
    return SubjectRules(
        allow=[str(s) for s in allow] if allow else None,
        deny=[str(s) for s in deny] if deny else None,
    )


def permissions_of(nats: dict[str, Any]) -> Permissions | None:
    """A JWT's ``pub``/``sub``/``resp`` as permissions (None: no restriction)."""
    publish = _rules(nats.get("pub"))
    subscribe = _rules(nats.get("sub"))
    resp = nats.get("resp")
    responses: bool | ResponseRules = False
    if isinstance(resp, dict):
        ttl = resp.get("ttl") or 0
        responses = ResponseRules(
            max=int(resp.get("max") or 0), expires=float(ttl) / 1e9 if ttl else 0.0
        )
    if publish is None and subscribe is None and responses is False:
        return None
    return Permissions(publish=publish, subscribe=subscribe, allow_responses=responses)


@dataclass
class Account:
    key: str
    claims: dict[str, Any]
    signing_keys: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass
class Trust:
    """The operator's keys and the accounts of the memory resolver."""

    operator_keys: frozenset[str]
    accounts: dict[str, Account]
    system_account: str | None = None

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Trust:
        assert cfg.operator is not None
        if cfg.resolver is None:
            raise ValueError("operators require an account resolver to be configured")
        if not _MEMORY.match(cfg.resolver):
            raise ValueError(
                f"resolver: {cfg.resolver!r} is not supported: Tether has the MEMORY resolver "
                "(with resolver_preload) only"
            )
        try:
            operator = decode(read_jwt_text(cfg.operator), "operator", (keys.OPERATOR,))
        except JwtError as exc:
            raise ValueError(f"operator: not a valid operator JWT ({exc})") from None
        op_nats = operator["nats"]
        trusted = {operator["sub"], *(k for k in op_nats.get("signing_keys") or [] if k)}
        system = op_nats.get("system_account")
        accounts: dict[str, Account] = {}
        for key, token in cfg.resolver_preload.items():
            try:
                claims = decode(token, "account", (keys.OPERATOR,))
            except JwtError as exc:
                raise ValueError(f"resolver_preload: {key}: invalid account JWT ({exc})") from None
            if claims["sub"] != key:
                raise ValueError(f"resolver_preload: {key}: the JWT is for {claims['sub']}")
            if claims["iss"] not in trusted:
                raise ValueError(f"resolver_preload: {key}: not signed by the trusted operator")
            accounts[key] = Account(key, claims, _signing_keys(claims["nats"]))
        ordinary = [k for k in accounts if k != system]
        if len(ordinary) > 1:
            raise ValueError(
                "resolver_preload: Tether has one account, so it takes one account JWT "
                f"(besides the operator's system account); got {len(ordinary)}"
            )
        return cls(frozenset(trusted), accounts, system if isinstance(system, str) else None)

    def authenticate(self, token: str, sig: str | None, nonce: str) -> Identity | None:
        """The identity of a user JWT's holder, or ``None`` (each reason is logged)."""
        try:
            return self._check(token, sig, nonce)
        except JwtError as exc:
            log.info("user JWT refused: %s", exc)
            return None

    def _check(self, token: str, sig: str | None, nonce: str) -> Identity:
        now = time.time()
        claims = decode(token, "user", (keys.ACCOUNT,))
        user_key = claims["sub"]
        if keys.public_key(user_key, keys.USER) is None:
            raise JwtError("subject is not a user key")
        if _expired(claims, now):
            raise JwtError(f"user {user_key} expired or not yet valid")
        nats = claims["nats"]
        account_key = nats.get("issuer_account") or claims["iss"]
        account = self.accounts.get(account_key)
        if account is None:
            raise JwtError(f"account {account_key} not found")
        if account_key == self.system_account:
            raise JwtError("users of the system account are not supported")
        if _expired(account.claims, now):
            raise JwtError(f"account {account_key} expired")
        template: dict[str, Any] | None = None
        if claims["iss"] != account_key:
            if claims["iss"] not in account.signing_keys:
                raise JwtError("issuer is not the account nor one of its signing keys")
            template = account.signing_keys[claims["iss"]]
        acc_nats = account.claims["nats"]
        revoked = acc_nats.get("revocations") or {}
        issued = claims.get("iat") or 0
        for key in (user_key, "*"):
            at = revoked.get(key)
            if isinstance(at, int | float) and at >= issued:
                raise JwtError(f"user {user_key} revoked")
        types = nats.get("allowed_connection_types")
        if types and "STANDARD" not in types:
            raise JwtError("connection type STANDARD not allowed")
        if nats.get("src") or nats.get("times"):
            raise JwtError("source network and time limits are not supported")
        if nats.get("bearer_token"):
            if (acc_nats.get("limits") or {}).get("disallow_bearer"):
                raise JwtError("bearer tokens are not allowed by the account")
        elif sig is None or not keys.verify(user_key, keys.USER, nonce.encode(), sig):
            raise JwtError("nonce signature missing or wrong")
        source = template if template is not None else nats
        perms = permissions_of(source)
        if perms is None and template is None:
            perms = permissions_of(acc_nats.get("default_permissions") or {})
        exp = claims.get("exp")
        return Identity(
            name=str(claims.get("name") or user_key),
            permissions=UserPermissions(perms, "user JWT") if perms is not None else None,
            expires=float(exp) if isinstance(exp, int | float) and exp else None,
        )
