"""Who a CONNECT is: the server's users (passwords plain or bcrypt, nkeys), its token,
``no_auth_user``, or a user JWT trusted through the operator (see :mod:`.jwt`).

Every secret is compared in constant time, and a user name is looked up by comparing
it with every name, so neither the time a refusal takes nor its answer tells a name
that exists from one that does not. A bcrypt check costs what its hash's cost says
(tens of milliseconds); a password that passed it is remembered as a keyed hash, so a
client reconnecting with the same password does not pay it again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

import bcrypt

from tether.server.config import Permissions, ServerConfig
from tether.server.nats.auth import keys
from tether.server.nats.auth.certificates import same_name
from tether.server.nats.auth.jwt import Trust
from tether.server.nats.auth.permissions import Identity, UserPermissions

_BCRYPT = re.compile(r"^\$2[abxy]\$\d{2}\$")


def is_bcrypt(secret: str) -> bool:
    return _BCRYPT.match(secret) is not None


@dataclass(slots=True)
class _User:
    name: str
    password: str
    permissions: UserPermissions | None


class Authenticator:
    """The server's authorization settings, checked once at start, applied per CONNECT."""

    def __init__(self, cfg: ServerConfig) -> None:
        default = (
            UserPermissions(cfg.default_permissions, "default_permissions")
            if cfg.default_permissions is not None
            else None
        )
        self.token = cfg.auth_token
        self.users: list[_User] = []
        self.nkeys: dict[str, UserPermissions | None] = {}
        self.trust: Trust | None = None
        if cfg.operator is not None:
            if cfg.users or cfg.user or cfg.auth_token:
                raise ValueError("operators do not allow users to be configured directly")
            if cfg.no_auth_user:
                raise ValueError("no_auth_user not compatible with Trusted Operator")
            self.trust = Trust.from_config(cfg)
        elif cfg.resolver is not None or cfg.resolver_preload:
            raise ValueError("resolver and resolver_preload need an operator")
        if cfg.auth_token and (cfg.user or cfg.users):
            raise ValueError("cannot have a user/pass and a token")
        if cfg.user is not None and cfg.users:
            raise ValueError("cannot have a single user/pass and a users array")
        if cfg.user is not None:
            self.users.append(_User(cfg.user, cfg.password or "", default))
        seen: set[str] = set()
        for n, entry in enumerate(cfg.users):
            where = f"users[{n}]"
            perms = default
            if entry.permissions is not None:
                perms = _compile(entry.permissions, f"{where}.permissions")
            if entry.nkey is not None:
                if entry.user is not None or entry.password is not None:
                    raise ValueError(f"{where}: nkey users do not take usernames or passwords")
                if keys.public_key(entry.nkey, keys.USER) is None:
                    raise ValueError(f"{where}: not a valid public nkey for a user")
                if entry.nkey in self.nkeys:
                    raise ValueError(f'{where}: duplicate nkey "{entry.nkey}" detected')
                self.nkeys[entry.nkey] = perms
                continue
            if not entry.user:
                raise ValueError(f"{where}: a user entry requires a user")
            if entry.user in seen:
                raise ValueError(f'{where}: duplicate user "{entry.user}" detected')
            seen.add(entry.user)
            self.users.append(_User(entry.user, entry.password or "", perms))
        self.no_auth: Identity | None = None
        if cfg.no_auth_user is not None:
            found = [u for u in self.users if u.name == cfg.no_auth_user]
            if not found and cfg.no_auth_user not in self.nkeys:
                raise ValueError(
                    f'no_auth_user: "{cfg.no_auth_user}" not present as user or nkey '
                    "in authorization block or account configuration"
                )
            perms = found[0].permissions if found else self.nkeys[cfg.no_auth_user]
            self.no_auth = Identity(cfg.no_auth_user, perms)
        # Keyed hashes of passwords that passed a bcrypt check (see the module doc).
        self._key = secrets.token_bytes(32)
        self._verified: dict[str, bytes] = {}

    @property
    def nonce_required(self) -> bool:
        """INFO carries a nonce to sign when nkey users or an operator are configured."""
        return bool(self.nkeys) or self.trust is not None

    def authenticate(
        self,
        *,
        user: str | None,
        password: str | None,
        token: str | None,
        nkey: str | None,
        jwt: str | None,
        sig: str | None,
        nonce: str,
    ) -> Identity | None:
        """The client's identity, or ``None`` for an Authorization Violation."""
        if self.trust is not None:
            if jwt is None:
                return None
            return self.trust.authenticate(jwt, sig, nonce)
        if nkey is not None and self.nkeys:
            return self._nkey_user(nkey, sig, nonce)
        if user is not None and self.users:
            return self._password_user(user, password or "")
        if token is not None and self.token is not None:
            return Identity("") if self._secret_ok("", self.token, token) else None
        if user is None and nkey is None and jwt is None and token is None:
            return self.no_auth
        return None

    def certificate_user(self, names: list[str]) -> Identity | None:
        """TLS verify_and_map: the user the client certificate names (its names most
        preferred first, see certificates.py), with no password; ``None`` if none."""
        for name in names:
            for candidate in self.users:
                if same_name(candidate.name, name):
                    return Identity(candidate.name, candidate.permissions)
        return None

    def _nkey_user(self, nkey: str, sig: str | None, nonce: str) -> Identity | None:
        match: str | None = None
        for known in self.nkeys:
            if hmac.compare_digest(known.encode(), nkey.encode()):
                match = known
        if match is None or sig is None:
            return None
        if not keys.verify(match, keys.USER, nonce.encode(), sig):
            return None
        return Identity(match, self.nkeys[match])

    def _password_user(self, name: str, password: str) -> Identity | None:
        found: _User | None = None
        for candidate in self.users:
            if hmac.compare_digest(candidate.name.encode(), name.encode()):
                found = candidate
        if found is None:
            # The same work as a wrong plain password, so a name's existence does not show.
            hmac.compare_digest(password.encode(), b"\0" * len(password))
            return None
        if not self._secret_ok("user:" + found.name, found.password, password):
            return None
        return Identity(found.name, found.permissions)

    def _secret_ok(self, slot: str, known: str, given: str) -> bool:
        """Whether ``given`` is the password or token ``known`` (plain or bcrypt)."""
        raw = given.encode()
        if not is_bcrypt(known):
            return hmac.compare_digest(raw, known.encode())
        digest = hmac.new(self._key, raw, hashlib.sha256).digest()
        seen = self._verified.get(slot)
        if seen is not None and hmac.compare_digest(seen, digest):
            return True
        try:
            ok = bcrypt.checkpw(raw, known.encode())
        except ValueError:  # not a hash bcrypt can read
            return False
        if ok:
            self._verified[slot] = digest
        return ok


def _compile(perms: Permissions, what: str) -> UserPermissions:
    return UserPermissions(perms, what)
