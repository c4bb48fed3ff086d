"""The HTTP API's consumers are durable consumers everyone can see over NATS, but only
the HTTP API may delete them (or the channel stream under them): a NATS delete would
leave the HTTP consumer, its token and its jobs without an engine."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import nats
import pytest
from nats.js.errors import BadRequestError, NotFoundError

from tether.testing import RunningServer, run_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


async def test_nats_cannot_delete_what_the_http_api_owns(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
        assert (await http.put("/channel/owned", data={"token": "ct"})).status_code == 200
        hook = "/channel/owned/consumer/hook"
        form = {"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"}
        assert (await http.put(hook, data=form)).status_code == 200
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.publish("wb.owned", b"job")
            with pytest.raises(BadRequestError, match="managed by the HTTP API") as refused:
                await js.delete_consumer("WB_owned", "hook")
            assert refused.value.err_code == 10003
            assert "DELETE /channel/owned/consumer/hook" in str(refused.value.description)
            with pytest.raises(BadRequestError, match="HTTP consumers hook"):
                await js.delete_stream("WB_owned")
            # Nothing changed: the job is still there for the HTTP consumer.
            info = await js.consumer_info("WB_owned", "hook")
            assert info.num_pending == 1
            auth = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
            jobs = await http.get(f"{hook}/queued-jobs", headers=auth)
            assert jobs.status_code == 200 and len(jobs.json()["Result"]) == 1
            # A consumer of the same stream created over NATS is NATS's to delete, and
            # once the HTTP consumer is deleted over HTTP the stream may go too.
            await js.add_consumer("WB_owned", durable_name="mine")
            assert await js.delete_consumer("WB_owned", "mine")
            since = (await http.get(hook)).headers["Last-Modified"]
            deleted = await http.delete(hook, headers={"If-Unmodified-Since": since})
            assert deleted.status_code == 204
            assert await js.delete_stream("WB_owned")
            with pytest.raises(NotFoundError):
                await js.stream_info("WB_owned")
        finally:
            await nc.close()
