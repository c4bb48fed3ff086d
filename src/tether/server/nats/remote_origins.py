"""Origins on other servers: mirrors and sources with ``external.api`` read a stream of
another NATS server (nats-server or Tether) over a client connection Tether opens.

``js_external_origins`` maps an API prefix (``$JS.hub.API`` for a server whose
JetStream domain is ``hub``) to the URLs of that server. The stream is read through an
ephemeral pull consumer created with that prefix (``ack_policy: none``, in memory,
starting where the copy stands, filtered as the source is); its messages are checked
to arrive in order (consumer sequences without gaps), and any surprise — a gap, the
consumer gone, the connection lost — drops the consumer and starts a new one right
after the last message stored, as an ordered consumer does. So what is stored is
exactly the origin's sequence of messages, whatever happens on the way.
"""

from __future__ import annotations

import contextlib
import logging

from tether.client import connect
from tether.client.connection import Connection
from tether.client.errors import ApiError as ClientApiError
from tether.client.errors import ClientError
from tether.client.errors import Timeout as ClientTimeout
from tether.client.jetstream import JetStream
from tether.client.models import AckPolicy, ConsumerConfig, DeliverPolicy
from tether.client.pull import PullSubscription
from tether.engine import errors
from tether.engine.sourcing import Batch
from tether.engine.sourcing.origin import BATCH
from tether.engine.streams.sourcing import SourceSpec, format_time, stream_identity
from tether.engine.streams.sourcing import parse_time as parse_rfc3339
from tether.storage.base import StoredMessage

log = logging.getLogger("tether.sourcing")

# A read waits this long for the origin to have something (the feed's heartbeat).
LINGER = 1.0
# How long an ephemeral consumer outlives a reader that vanished (a crash).
INACTIVE = 30.0


def parse_routes(entries: list[str]) -> dict[str, list[str]]:
    """``PREFIX=URL[,URL…]`` entries as a map; raises ValueError on a bad one."""
    routes: dict[str, list[str]] = {}
    for entry in entries:
        prefix, sep, urls = entry.partition("=")
        prefix = prefix.strip()
        found = [u.strip() for u in urls.split(",") if u.strip()]
        if not sep or not prefix or not found:
            raise ValueError(f"js_external_origins entry {entry!r}: expected PREFIX=URL[,URL…]")
        routes.setdefault(prefix, []).extend(found)
    return routes


class RemoteStreams:
    """Opens a :class:`RemoteStream` for each external mirror or source."""

    def __init__(self, routes: dict[str, list[str]]) -> None:
        self.routes = routes

    def open(self, spec: SourceSpec) -> RemoteStream:
        api = spec.external.api if spec.external is not None else ""
        return RemoteStream(spec, api, self.routes.get(api, []))


class RemoteStream:
    """One stream on another server, read in order for one mirror or source."""

    def __init__(self, spec: SourceSpec, api: str, urls: list[str]) -> None:
        self.spec = spec
        self.api = api
        self.urls = urls
        self.conn: Connection | None = None
        self.js: JetStream | None = None
        self.sub: PullSubscription | None = None
        self.consumer = ""
        self.identity = ""
        # The origin sequence of the last message handed out, and the consumer
        # sequence it came with: the next must follow both.
        self.position = -1
        self.delivered = 0

    async def read(self, after: int, spec: SourceSpec, filters: tuple[str, ...]) -> Batch:
        if not self.urls:
            raise errors.ApiError(
                503,
                10029,
                f"no server configured for external api prefix {self.api!r} (js_external_origins)",
            )
        try:
            if self.sub is None or after != self.position:
                await self._restart(after, filters)
            assert self.sub is not None
            try:
                msgs = await self.sub.fetch(BATCH, timeout=LINGER)
            except ClientTimeout:
                msgs = []
        except ClientApiError as exc:
            await self._drop()
            raise errors.ApiError(exc.code or 503, exc.err_code or 10029, exc.description) from None
        except (ClientError, OSError) as exc:
            await self._drop()
            raise errors.ApiError(503, 10029, f"origin unreachable: {exc}") from None
        out: list[StoredMessage] = []
        pending = 0
        for msg in msgs:
            meta = msg.metadata
            if meta.consumer_seq != self.delivered + 1 or meta.stream_seq <= self.position:
                # Out of order (a redelivery, a lost message): start again after what
                # is kept so far.
                log.info("source %s: out of order, restarting the consumer", self.spec.name)
                await self._drop()
                break
            self.delivered = meta.consumer_seq
            self.position = meta.stream_seq
            pending = meta.num_pending
            out.append(
                StoredMessage(
                    meta.stream_seq,
                    msg.subject,
                    msg.raw_headers or b"",
                    msg.data,
                    meta.timestamp_ns,
                )
            )
        return Batch(out, pending, self.identity)

    async def _restart(self, after: int, filters: tuple[str, ...]) -> None:
        await self._drop()
        if self.conn is None or self.conn.is_closed:
            self.conn = await connect(
                self.urls, name=f"tether source {self.spec.name}", max_reconnect_attempts=0
            )
            self.js = self.conn.jetstream(prefix=self.api)
        assert self.js is not None
        info = await self.js.stream_info(self.spec.name)
        self.identity = stream_identity(parse_rfc3339(info.created)) if info.created else ""
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=INACTIVE,
            max_deliver=1,
            filter_subjects=list(filters) or None,
        )
        if after:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = after + 1
        elif spec_seq := self.spec.opt_start_seq:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = spec_seq
        elif self.spec.opt_start_time:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = format_time(self.spec.start_time_ns())
        else:
            config.deliver_policy = DeliverPolicy.ALL
        consumer = await self.js.add_consumer(self.spec.name, config)
        self.consumer = consumer.name
        self.sub = await self.js.pull_subscribe(self.spec.name, self.consumer)
        self.position = after
        self.delivered = 0

    async def _drop(self) -> None:
        """Forget the consumer (deleted on the origin, or left to its inactivity limit)."""
        sub, self.sub = self.sub, None
        consumer, self.consumer = self.consumer, ""
        self.position = -1
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if consumer and self.js is not None and self.conn is not None and not self.conn.is_closed:
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.spec.name, consumer)

    async def wait(self, seconds: float) -> None:
        """Nothing to wait for here: each read already lingers for new messages."""

    async def close(self) -> None:
        await self._drop()
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
