"""The NSQ model on top of the broker: topics are streams, channels are durable consumers.

A topic ``clicks`` is the stream ``NSQ_clicks`` capturing ``nsq.clicks`` (see
:mod:`tether.engine.nsq.names` for ``.`` in names) with ``interest`` retention: a
message is deleted once every channel has finished it, as nsqd forgets it. While a
topic has no channel, the durable consumer ``#backlog`` holds its messages, and the
first channel starts from them (``deliver_policy: all``) and replaces it; later
channels get only what is published after they exist (``new``), as in nsqd. A channel
is an explicit-ack durable consumer with no ack-pending or delivery limit whose
``ack_wait`` is the server's ``msg_timeout``; the NSQ front door owns it (see
:class:`~tether.engine.nsq.channel.Channel`).

``#ephemeral`` topics are memory streams bounded to ``mem_queue_size`` messages (the
oldest go first) and ``#ephemeral`` channels are consumers kept in memory; a channel
is deleted with its last client and a topic with its last channel, as in nsqd (and
both are dropped at startup: they held nothing on disk).

Publishing is the broker's (``publish_many`` with the stream of :meth:`stream_of`), so
a message published over NSQ is an ordinary stream message and anything published to
``nsq.<topic>`` over NATS reaches the topic's channels.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from tether.engine.broker import Broker, PubAck
from tether.engine.consumers import Consumer, ConsumerConfig, ConsumerRegistry
from tether.engine.errors import ApiError
from tether.engine.nsq.channel import Channel
from tether.engine.nsq.deferred import DeferredPublishes
from tether.engine.nsq.member import Member, MessageSink
from tether.engine.nsq.names import (
    BACKLOG,
    OWNER,
    OWNER_KEY,
    PAUSED_FOREVER_NS,
    PAUSED_KEY,
    channel_of,
    consumer_name,
    topic_of,
)
from tether.engine.nsq.topic import Topic
from tether.engine.streams import Stream

log = logging.getLogger("tether.nsq")

NS = 1_000_000_000


@dataclass(slots=True)
class NsqSettings:
    """nsqd's settings that shape the model (its defaults)."""

    msg_timeout_ns: int = 60 * NS
    max_msg_timeout_ns: int = 15 * 60 * NS
    mem_queue_size: int = 10_000


def owned_by_nsq(config: ConsumerConfig) -> bool:
    """Whether a durable consumer is an NSQ channel."""
    return config.metadata is not None and config.metadata.get(OWNER_KEY) == OWNER


class NsqService:
    """Topics and channels over one :class:`Broker` and its consumers."""

    def __init__(self, broker: Broker, consumers: ConsumerRegistry, settings: NsqSettings) -> None:
        self.broker = broker
        self.consumers = consumers
        self.clock = broker.clock
        self.settings = settings
        self.topics: dict[str, Topic] = {}
        self._by_stream: dict[str, Topic] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.deferred = DeferredPublishes(broker.store, self.clock, self._publisher)

    # -- startup / shutdown -------------------------------------------------------------------
    async def start(self) -> None:
        for stream in list(self.broker.streams.values()):
            name = topic_of(stream.name)
            if name is None:
                continue
            if name.endswith("#ephemeral"):
                await self.broker.delete_stream(stream.name)  # held nothing on disk
                continue
            topic = self._adopt(name)
            metadata = stream.config.metadata or {}
            topic.paused = metadata.get(PAUSED_KEY) == "true"
            for consumer in list(self.consumers.streams.get(stream.name, {}).values()):
                if owned_by_nsq(consumer.config):
                    self._attach(topic, consumer)
        self.broker.listeners.append(self)
        await self.deferred.load()

    def stop(self) -> None:
        if self in self.broker.listeners:
            self.broker.listeners.remove(self)
        self.deferred.stop()
        for topic in self.topics.values():
            for channel in topic.channels.values():
                channel.consumer.on_available = None
        for task in self._tasks:
            task.cancel()

    def _adopt(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(name)
            self._by_stream[topic.stream_name] = topic
        return topic

    def _attach(self, topic: Topic, consumer: Consumer) -> Channel:
        name = channel_of(consumer.name)
        channel = Channel(topic.name, name, consumer, self.clock, self.settings.max_msg_timeout_ns)
        channel.held = topic.paused
        topic.channels[name] = channel
        return channel

    # -- topics -----------------------------------------------------------------------------------
    def stream_of(self, topic: str) -> Stream | None:
        """The topic's stream if it exists (the publish path: no await)."""
        found = self.topics.get(topic)
        if found is None:
            return None
        return self.broker.streams.get(found.stream_name)

    async def topic_stream(self, name: str) -> Stream:
        """The topic's stream, created (with its ``#backlog``) if it does not exist."""
        stream = self.stream_of(name)
        if stream is not None:
            return stream
        async with self._lock:
            return await self._ensure_topic(name)

    async def _ensure_topic(self, name: str) -> Stream:
        topic = self._adopt(name)
        stream = self.broker.streams.get(topic.stream_name)
        if stream is None:
            config: dict[str, Any] = {
                "name": topic.stream_name,
                "subjects": [topic.subject],
                "retention": "interest",
            }
            if topic.ephemeral:
                config["storage"] = "memory"
                config["max_msgs"] = self.settings.mem_queue_size
            body = msgspec.json.encode(config)
            stream, _ = await self.broker.create_stream(topic.stream_name, body)
        if not topic.channels and self.consumers.find(topic.stream_name, BACKLOG) is None:
            await self._hold(topic)
        return stream

    async def _hold(self, topic: Topic) -> None:
        """Keep the topic's messages until it has a channel again."""
        config = ConsumerConfig(
            durable_name=BACKLOG,
            deliver_policy="new",
            ack_policy="explicit",
            max_ack_pending=-1,
            mem_storage=topic.ephemeral,
            description="holds an NSQ topic's messages while it has no channel",
        )
        await self.consumers.create(topic.stream_name, config)

    # -- channels ---------------------------------------------------------------------------------
    async def subscribe(
        self,
        topic_name: str,
        channel_name: str,
        sink: MessageSink,
        msg_timeout_ns: int,
        sample_rate: int = 0,
    ) -> tuple[Channel, Member]:
        """``SUB``: the channel (and topic) created if needed, and the client in it."""
        async with self._lock:
            await self._ensure_topic(topic_name)
            topic = self.topics[topic_name]
            channel = topic.channels.get(channel_name)
            if channel is None:
                channel = await self._create_channel(topic, channel_name)
            return channel, channel.join(sink, msg_timeout_ns, sample_rate)

    async def _create_channel(self, topic: Topic, name: str) -> Channel:
        backlog = self.consumers.find(topic.stream_name, BACKLOG)
        consumer = self.consumers.find(topic.stream_name, consumer_name(name))
        if consumer is None:
            config = ConsumerConfig(
                durable_name=consumer_name(name),
                deliver_policy="all" if backlog is not None and not topic.channels else "new",
                ack_policy="explicit",
                ack_wait=self.settings.msg_timeout_ns,
                max_ack_pending=-1,
                mem_storage=name.endswith("#ephemeral"),
                metadata={OWNER_KEY: OWNER},
            )
            consumer, _ = await self.consumers.create(topic.stream_name, config)
        channel = self._attach(topic, consumer)
        if backlog is not None and not backlog.deleted:
            await self.consumers.delete(topic.stream_name, BACKLOG)
        return channel

    def unsubscribe(self, channel: Channel, member: Member) -> None:
        """The client left its channel; an ephemeral channel goes with its last client."""
        channel.leave(member)
        if channel.ephemeral and not channel.members:
            topic = self.topics.get(channel.topic)
            if topic is not None and topic.channels.get(channel.name) is channel:
                del topic.channels[channel.name]
                channel.consumer.on_available = None
                self._spawn(self._delete_channel(topic, channel))

    async def _delete_channel(self, topic: Topic, channel: Channel) -> None:
        async with self._lock:
            stream = topic.stream_name
            if not topic.channels:
                if topic.ephemeral:
                    if self.topics.get(topic.name) is topic and stream in self.broker.streams:
                        await self.broker.delete_stream(stream)
                    return
                if stream in self.broker.streams:
                    await self._hold(topic)  # before the channel goes: nothing is dropped
            if not channel.consumer.deleted:
                await self.consumers.delete(stream, channel.consumer.name)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("nsq: %s", task.exception())

    # -- administration (nsqd's HTTP API) -----------------------------------------------------------
    async def create_channel(self, topic_name: str, channel_name: str) -> Channel:
        """``/channel/create``: the channel, created if needed (the topic must exist)."""
        async with self._lock:
            topic = self.topics[topic_name]
            channel = topic.channels.get(channel_name)
            if channel is None:
                channel = await self._create_channel(topic, channel_name)
            return channel

    async def delete_topic(self, name: str) -> None:
        """``/topic/delete``: the stream goes, and with it every channel and its clients."""
        async with self._lock:
            topic = self.topics[name]
            if topic.stream_name in self.broker.streams:
                await self.broker.delete_stream(topic.stream_name)  # on_stream_deleted
                return
            self._by_stream.pop(topic.stream_name, None)
            self.topics.pop(name, None)
            for channel in topic.channels.values():
                channel.drop()

    async def delete_channel(self, topic_name: str, channel_name: str) -> None:
        """``/channel/delete``: its clients are closed and its messages dropped; a topic
        left with no channel keeps what is published next for its next channel."""
        async with self._lock:
            topic = self.topics[topic_name]
            channel = topic.channels.pop(channel_name)
            channel.drop()
            stream = topic.stream_name
            if not topic.channels and stream in self.broker.streams:
                if topic.ephemeral:
                    await self.broker.delete_stream(stream)
                    return
                await self._hold(topic)
            if not channel.consumer.deleted:
                await self.consumers.delete(stream, channel.consumer.name)

    async def empty_topic(self, name: str) -> int:
        """``/topic/empty``: drop what the topic holds that no channel has taken yet (its
        messages while it has no channel); how many."""
        async with self._lock:
            topic = self.topics[name]
            if topic.channels or topic.stream_name not in self.broker.streams:
                return 0
            return await self.broker.purge_stream(topic.stream_name, "", 0, 0)

    async def pause_topic(self, name: str, paused: bool) -> None:
        """``/topic/pause`` and ``unpause``: no channel of the topic is sent anything
        while it is paused; kept in the stream's metadata, so it survives a restart."""
        async with self._lock:
            topic = self.topics[name]
            stream = self.broker.streams.get(topic.stream_name)
            if stream is not None:
                config = stream.config.to_dict()
                metadata = dict(config.get("metadata") or {})
                if paused:
                    metadata[PAUSED_KEY] = "true"
                else:
                    metadata.pop(PAUSED_KEY, None)
                config["metadata"] = metadata
                await self.broker.update_stream(stream.name, msgspec.json.encode(config))
            topic.paused = paused
            for channel in topic.channels.values():
                channel.held = paused
            if not paused:
                for channel in list(topic.channels.values()):
                    channel.dispatch()

    async def pause_channel(self, topic_name: str, channel_name: str, paused: bool) -> None:
        """``/channel/pause`` and ``unpause``: the channel's consumer is paused until
        :data:`PAUSED_FOREVER_NS` (saved with the consumer, so it survives a restart)."""
        async with self._lock:
            channel = self.topics[topic_name].channels[channel_name]
            until = PAUSED_FOREVER_NS if paused else None
            await self.consumers.pause(channel.consumer.stream.name, channel.consumer.name, until)
            if not paused:
                channel.dispatch()

    # -- deferred publishes ------------------------------------------------------------------------
    async def defer(self, topic: str, body: bytes, delay_ns: int) -> None:
        """``DPUB``: publish ``body`` to ``topic`` in ``delay_ns``; returns once durable."""
        await self.deferred.add(topic, body, delay_ns)

    async def _publisher(self, topic_name: str, body: bytes) -> Callable[[], None]:
        stream = await self.topic_stream(topic_name)
        subject = self.topics[topic_name].subject

        def publish() -> None:
            # A refusal (the server's size bound reached) is told at once: raised, so
            # the deferred message waits and is tried again rather than dropped.
            refused: list[PubAck | ApiError] = []
            self.broker.publish(stream, subject, None, body, refused.append)
            if refused and isinstance(refused[0], ApiError):
                raise refused[0]
            refused.clear()

        return publish

    # -- broker listener ---------------------------------------------------------------------------
    def on_stream_changed(self, stream: Stream) -> None:
        pass

    def on_stream_deleted(self, stream: Stream) -> None:
        topic = self._by_stream.pop(stream.name, None)
        if topic is None:
            return
        self.topics.pop(topic.name, None)
        for channel in topic.channels.values():
            channel.drop()
        topic.channels.clear()

    def on_messages_committed(self, stream: Stream, seqs: list[int]) -> None:
        topic = self._by_stream.get(stream.name)
        if topic is not None:
            topic.message_count += len(seqs)
            meta = stream.meta
            for seq in seqs:
                found = meta(seq)
                if found is not None:
                    topic.message_bytes += found.size
            for channel in topic.channels.values():
                if channel.members:
                    channel.dispatch()

    def on_messages_removed(self, stream: Stream, seqs: list[int]) -> None:
        pass
