"""The JetStream context: stream and consumer management, publishing with acks.

Every API call is a request on ``$JS.API.<operation>`` (or ``$JS.<domain>.API``) over
the connection's muxed inbox. ``publish_async`` bounds the number of publishes whose
ack is still outstanding: with ``backpressure=True`` (the default) it waits for a
slot, otherwise it fails fast with :class:`PublishStalled`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import msgspec

from tether.client.bulk_read import BulkReadConnection, read_blocks
from tether.client.errors import ApiError, NoResponders, ServiceUnavailable
from tether.client.models import ConsumerConfig, ConsumerInfo, StreamConfig, StreamInfo
from tether.client.nuid import Nuid
from tether.client.publish import PublishConnection, Publisher
from tether.client.pull import PullConnection, PullSubscription
from tether.protocol.block import MessageBlock

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.encode


class JetStreamConnection(PublishConnection, PullConnection, BulkReadConnection, Protocol):
    """The connection as a JetStream context (and what is built on it) uses it.

    ``js.conn`` is the :class:`~tether.client.connection.Connection` itself; the last
    three methods are here for callers that reach the connection through it.
    """

    _nuid: Nuid

    async def wait_connected(self, timeout: float | None = None) -> None: ...  # noqa: ASYNC109 - the NATS client API
    def jetstream(self, **kwargs: Any) -> JetStream: ...
    async def drain(self, timeout: float | None = None) -> None: ...  # noqa: ASYNC109 - the NATS client API
    async def close(self) -> None: ...


class JetStream(Publisher):
    """JetStream operations on one connection. Get one with ``conn.jetstream()``.

    ``max_pending_acks`` bounds unacknowledged ``publish_async`` calls;
    ``publish_ack_timeout`` is how long such a publish waits for its ack.
    """

    conn: JetStreamConnection

    def __init__(
        self,
        conn: JetStreamConnection,
        *,
        domain: str | None = None,
        prefix: str = "$JS.API",
        timeout: float = 5.0,
        max_pending_acks: int = 4000,
        backpressure: bool = True,
        publish_ack_timeout: float | None = None,
    ) -> None:
        self.conn = conn
        self.prefix = f"$JS.{domain}.API" if domain else prefix
        self.timeout = timeout
        self._init_publisher(
            max_pending_acks,
            backpressure,
            timeout if publish_ack_timeout is None else publish_ack_timeout,
        )

    # -- the API request --------------------------------------------------------------

    async def api(self, operation: str, body: Any = None, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the NATS client API
        """One ``$JS.API`` request; raises :class:`ApiError` for an error response."""
        payload = b"" if body is None else _encode_json(body)
        try:
            msg = await self.conn.request(
                f"{self.prefix}.{operation}", payload, timeout=timeout or self.timeout
            )
        except NoResponders:
            raise ServiceUnavailable(503, 0, "JetStream not available (no responders)") from None
        resp = _decode_json(msg.data) if msg.data else {}
        if isinstance(resp, dict) and isinstance(resp.get("error"), dict):
            raise ApiError.from_response(resp["error"])
        return resp

    def read_blocks(
        self,
        stream: str,
        start: int = 1,
        end: int | None = None,
        *,
        subjects: Sequence[str] = (),
        headers: bool = True,
        window: int = 50_000,
        ahead: int = 2,
        max_bytes: int = 16 * 1024 * 1024,
        block_bytes: int = 1024 * 1024,
    ) -> AsyncIterator[MessageBlock]:
        """Sequences ``[start, end)`` of ``stream`` as column blocks, in order (Tether only).

        ``end=None`` reads to the last sequence the stream holds when the read starts.
        ``subjects`` keeps only matching messages; ``headers=False`` leaves stored headers
        out. Raises :class:`NotSupported` against nats-server. See docs/client.md.
        """

        def blocks(stop: int) -> AsyncIterator[MessageBlock]:
            return read_blocks(
                self.conn,
                stream,
                start,
                stop,
                subjects=subjects,
                headers=headers,
                window=window,
                ahead=ahead,
                max_bytes=max_bytes,
                block_bytes=block_bytes,
                timeout=self.timeout,
            )

        if end is not None:
            return blocks(end)

        async def to_the_end() -> AsyncIterator[MessageBlock]:
            info = await self.stream_info(stream)
            async for block in blocks(max(start, info.state.last_seq + 1)):
                yield block

        return to_the_end()

    async def account_info(self) -> dict[str, Any]:
        """Usage and limits of this account."""
        info: dict[str, Any] = await self.api("INFO")
        return info

    # -- streams ----------------------------------------------------------------------

    async def add_stream(self, config: StreamConfig | None = None, **fields: Any) -> StreamInfo:
        """Create a stream (identical re-creation succeeds)."""
        config = config or StreamConfig(**fields)
        resp = await self.api(f"STREAM.CREATE.{config.name}", config.to_wire())
        return StreamInfo.from_wire(resp)

    async def update_stream(self, config: StreamConfig | None = None, **fields: Any) -> StreamInfo:
        """Change a stream's configuration."""
        config = config or StreamConfig(**fields)
        resp = await self.api(f"STREAM.UPDATE.{config.name}", config.to_wire())
        return StreamInfo.from_wire(resp)

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> StreamInfo:
        """Configuration and state (``subjects_filter`` adds per-subject counts)."""
        body = {"subjects_filter": subjects_filter} if subjects_filter else None
        return StreamInfo.from_wire(await self.api(f"STREAM.INFO.{name}", body))

    async def delete_stream(self, name: str) -> bool:
        resp = await self.api(f"STREAM.DELETE.{name}")
        return bool(resp.get("success"))

    async def purge_stream(
        self,
        name: str,
        *,
        subject: str | None = None,
        seq: int | None = None,
        keep: int | None = None,
    ) -> int:
        """Remove messages (all, or by subject / below ``seq`` / all but ``keep``); returns the count."""
        body = {
            k: v for k, v in (("filter", subject), ("seq", seq), ("keep", keep)) if v is not None
        }
        resp = await self.api(f"STREAM.PURGE.{name}", body or None)
        return int(resp.get("purged", 0))

    async def stream_names(self, subject: str | None = None) -> list[str]:
        """Names of all streams (optionally only those capturing ``subject``), every page."""
        names: list[str] = []
        async for page in self._pages(
            "STREAM.NAMES", "streams", {"subject": subject} if subject else {}
        ):
            names.extend(page)
        return names

    async def streams(self) -> list[StreamInfo]:
        """Info of every stream, every page."""
        infos: list[StreamInfo] = []
        async for page in self._pages("STREAM.LIST", "streams", {}):
            infos.extend(StreamInfo.from_wire(item) for item in page)
        return infos

    async def _pages(
        self, operation: str, key: str, body: dict[str, Any]
    ) -> AsyncIterator[list[Any]]:
        offset = 0
        while True:
            resp = await self.api(operation, {**body, "offset": offset})
            items = resp.get(key) or []
            yield items
            offset += len(items)
            if not items or offset >= int(resp.get("total", 0)):
                return

    # -- consumers --------------------------------------------------------------------

    async def add_consumer(
        self, stream: str, config: ConsumerConfig | None = None, **fields: Any
    ) -> ConsumerInfo:
        """Create (or update, when compatible) a consumer on ``stream``."""
        config = config or ConsumerConfig(**fields)
        name = config.name or config.durable_name
        operation = f"CONSUMER.CREATE.{stream}.{name}" if name else f"CONSUMER.CREATE.{stream}"
        resp = await self.api(operation, {"stream_name": stream, "config": config.to_wire()})
        return ConsumerInfo.from_wire(resp)

    update_consumer = add_consumer

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return ConsumerInfo.from_wire(await self.api(f"CONSUMER.INFO.{stream}.{name}"))

    async def delete_consumer(self, stream: str, name: str) -> bool:
        resp = await self.api(f"CONSUMER.DELETE.{stream}.{name}")
        return bool(resp.get("success"))

    async def consumers(self, stream: str) -> list[ConsumerInfo]:
        """Info of every consumer of ``stream``."""
        infos: list[ConsumerInfo] = []
        async for page in self._pages(f"CONSUMER.LIST.{stream}", "consumers", {}):
            infos.extend(ConsumerInfo.from_wire(item) for item in page)
        return infos

    async def pull_subscribe(
        self, stream: str, consumer: str, config: ConsumerConfig | None = None
    ) -> PullSubscription:
        """A pull subscription on an existing consumer (created first when ``config`` is given)."""
        if config is not None:
            if not (config.durable_name or config.name):
                config = msgspec.structs.replace(config, durable_name=consumer)
            await self.add_consumer(stream, config)
        return PullSubscription(self, stream, consumer)
