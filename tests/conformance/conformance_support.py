"""What the conformance modules share besides fixtures (conftest.py holds those)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Peers:
    """The client URLs of the two servers a scenario runs on, step by step."""

    tether: str
    nats: str
