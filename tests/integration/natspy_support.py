"""nats-py in the integration tests."""

from __future__ import annotations

from nats.aio.client import Client


async def flush_subscriptions(nc: Client) -> None:
    """Return once the server has read every SUB ``nc`` sent so far.

    nats-py (2.16) writes a flush's PING straight to the socket, while a SUB waits in
    its pending buffer for the flusher task: one flush can come back before the server
    has read the SUB, and another connection's publish then finds no subscriber (seen
    on nats-server and on Tether alike). During the first round trip the flusher writes
    the SUB; the second PING follows it on the wire, so its PONG comes after the SUB.
    """
    await nc.flush()
    await nc.flush()
