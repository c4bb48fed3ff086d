"""Mirrors and sources: streams fed by copying other streams, of this server or of
another one, resuming from what they hold after a restart."""

from tether.engine.sourcing.origin import Batch, OriginReader, RemoteOrigins
from tether.engine.sourcing.service import SourcingService

__all__ = ["Batch", "OriginReader", "RemoteOrigins", "SourcingService"]
