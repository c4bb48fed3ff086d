"""What /connz shows of a TLS connection: protocol version, cipher suite and, with
``auth``, the certificates the client presented — as nats-server names them."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

# OpenSSL's names of the TLS 1.2 suites nats-server (Go) offers, in Go's spelling.
# TLS 1.3 suites are named alike by both.
_GO_SUITES = {
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
}


def ssl_object_of(transport: asyncio.BaseTransport | None) -> ssl.SSLObject | None:
    if transport is None:
        return None
    found = transport.get_extra_info("ssl_object")
    return found if isinstance(found, ssl.SSLObject) else None


def tls_fields(transport: asyncio.BaseTransport | None, *, certificates: bool) -> dict[str, Any]:
    """``tls_version``, ``tls_cipher_suite`` and (``certificates``) ``tls_peer_certs``;
    nothing for a plain connection."""
    ssl_object = ssl_object_of(transport)
    if ssl_object is None:
        return {}
    out: dict[str, Any] = {}
    version = ssl_object.version()
    if version:
        out["tls_version"] = version.removeprefix("TLSv")
    cipher = ssl_object.cipher()
    if cipher:
        out["tls_cipher_suite"] = _GO_SUITES.get(cipher[0], cipher[0])
    if certificates:
        chain = _peer_chain(ssl_object)
        if chain:
            out["tls_peer_certs"] = [_describe(der) for der in chain]
    return out


def _peer_chain(ssl_object: ssl.SSLObject) -> list[bytes]:
    # The verified chain (leaf to root) where Python offers it (3.13+); the leaf alone
    # before that.
    verified = getattr(ssl_object, "get_verified_chain", None)
    if verified is not None:
        chain = verified()
        if chain and all(isinstance(der, bytes) for der in chain):
            return list(chain)
    leaf = ssl_object.getpeercert(binary_form=True)
    return [leaf] if leaf else []


def _describe(der: bytes) -> dict[str, str]:
    cert = x509.load_der_x509_certificate(der)
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return {
        "subject": cert.subject.rfc4514_string(),
        "spki_sha256": hashlib.sha256(spki).hexdigest(),
        "cert_sha256": hashlib.sha256(der).hexdigest(),
    }
