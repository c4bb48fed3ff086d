"""The blocking facade (``tether.client.sync``) against nats-server and Tether."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tether.client import StreamNotFound, Timeout
from tether.client.sync import connect
from tether.client.testing import PeerServer


@pytest.fixture(scope="module", params=["nats-server", "tether"])
def server(request: pytest.FixtureRequest) -> Iterator[PeerServer]:
    with PeerServer(request.param) as srv:
        yield srv


def test_blocking_publish_pull_and_ack(server: PeerServer) -> None:
    with connect(server.url) as nc:
        js = nc.jetstream()
        js.add_stream(name="SYNC", subjects=["sync.>"])
        assert js.publish("sync.a", b"one").seq == 1
        assert js.publish("sync.a", b"two", msg_id="2").seq == 2
        js.add_consumer("SYNC", durable_name="C", ack_policy="explicit")
        sub = js.pull_subscribe("SYNC", "C")
        msgs = sub.fetch(5, timeout=1)
        assert [m.data for m in msgs] == [b"one", b"two"]
        assert msgs[1].headers == {"Nats-Msg-Id": "2"}
        msgs[0].ack()
        msgs[1].ack_sync()
        with pytest.raises(Timeout):
            sub.fetch(1, timeout=0.3)
        assert js.consumer_info("SYNC", "C").num_ack_pending == 0
        nc.flush()
        assert js.delete_stream("SYNC")
        with pytest.raises(StreamNotFound):
            js.stream_info("SYNC")
