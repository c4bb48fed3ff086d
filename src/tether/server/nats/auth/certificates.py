"""TLS ``verify_and_map``: the names a client certificate offers for its user.

In nats-server's order of preference: the e-mail addresses, DNS names and URIs of its
subject alternative names, then its subject as an RFC 2253 distinguished name
(``CN=alice,OU=Ops,O=Example``), also in the certificate's own order. A ``users`` entry
whose name is one of these is the client's user, with no password; names that are
distinguished names match whatever the spacing and the case of the attribute types.
"""

from __future__ import annotations

import asyncio
from typing import Any

# The attribute types Go's pkix.Name writes by their short names.
_SHORT = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "postalCode": "POSTALCODE",
    "serialNumber": "SERIALNUMBER",
    "domainComponent": "DC",
    "userId": "UID",
}
_SPECIAL = set(',+"\\<>;')


def peer_names(transport: asyncio.BaseTransport | None) -> list[str]:
    """What the peer's verified certificate names, most preferred first; ``[]`` when
    the connection has none."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    cert: dict[str, Any] | None = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return []
    alt = cert.get("subjectAltName", ())
    names = [value for kind in ("email", "DNS", "URI") for key, value in alt if key == kind]
    rdns = [
        "+".join(f"{_SHORT.get(key, key)}={_escape(value)}" for key, value in rdn)
        for rdn in cert.get("subject", ())
    ]
    if rdns:
        names.append(",".join(reversed(rdns)))  # RFC 2253: the last RDN first
        names.append(",".join(rdns))
    return names


def _escape(value: str) -> str:
    out = "".join("\\" + ch if ch in _SPECIAL else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def same_name(user: str, name: str) -> bool:
    """Whether a ``users`` name is a name the certificate offers."""
    if user == name:
        return True
    if "=" not in user or "=" not in name:
        return False
    return _dn_parts(user) == _dn_parts(name)


def _dn_parts(dn: str) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    current = ""
    escaped = False
    pieces: list[str] = []
    for ch in dn:
        if escaped:
            current += ch
            escaped = False
        elif ch == "\\":
            current += ch
            escaped = True
        elif ch in ",;":
            pieces.append(current)
            current = ""
        else:
            current += ch
    pieces.append(current)
    for piece in pieces:
        key, _, value = piece.partition("=")
        parts.append((key.strip().upper(), value.strip()))
    return parts
