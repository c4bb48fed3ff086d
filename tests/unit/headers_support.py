"""A NATS header block for the unit tests that publish through the broker."""

from __future__ import annotations


def hdrs(**headers: str) -> bytes:
    """``NATS/1.0`` and one line a header; ``_`` in a name stands for ``-``
    (``hdrs(Nats_TTL="5s")`` is ``Nats-TTL: 5s``)."""
    lines = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"NATS/1.0\r\n{lines}\r\n".encode()
