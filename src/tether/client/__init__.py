"""Tether's client SDK: NATS core and JetStream, asyncio first (``tether.client.sync`` for
blocking code).

Works against Tether and against nats-server alike::

    from tether.client import connect

    nc = await connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    await js.add_stream(name="ORDERS", subjects=["orders.>"])
    await js.publish("orders.new", b"hello")
    sub = await js.pull_subscribe("ORDERS", "worker", ConsumerConfig(ack_policy=AckPolicy.EXPLICIT))
    for msg in await sub.fetch(10, timeout=1):
        await msg.ack()
    await nc.close()

See ``docs/client.md`` for the pull algorithm, the worker and catch-up subscriptions.
"""

from tether.client.backoff import Backoff
from tether.client.bulk_read import NotSupported
from tether.client.catchup import CatchUpSubscription
from tether.client.connection import Connection, connect
from tether.client.consume import MessageStream
from tether.client.credentials import CredentialsError
from tether.client.errors import (
    ApiError,
    AuthorizationError,
    BadRequest,
    BadSubscription,
    ClientError,
    ConnectionClosed,
    ConsumerDeleted,
    ConsumerNotFound,
    FlushTimeout,
    HeartbeatMissed,
    JetStreamError,
    MaxPayloadExceeded,
    MsgAlreadyAcked,
    NoMessageFound,
    NoResponders,
    NoServersAvailable,
    NoStreamResponse,
    NotFound,
    NotJetStreamMessage,
    OutboundBufferFull,
    PermissionsViolation,
    ProtocolViolation,
    PublishStalled,
    PullError,
    ServerError,
    ServiceUnavailable,
    SlowConsumer,
    StaleConnection,
    StreamNameInUse,
    StreamNotFound,
    Timeout,
    WrongLastMsgId,
    WrongLastSequence,
)
from tether.client.jetstream import JetStream
from tether.client.message import JsMsg, Msg, MsgMetadata
from tether.client.models import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    PubAck,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
    StreamState,
)
from tether.client.options import Options
from tether.client.publish import PubAckFuture
from tether.client.pull import PullSubscription
from tether.client.subscription import Subscription
from tether.client.worker import Retry, ThreadMsg, Worker
from tether.protocol.block import MessageBlock

__all__ = [
    "AckPolicy",
    "ApiError",
    "AuthorizationError",
    "Backoff",
    "BadRequest",
    "BadSubscription",
    "CatchUpSubscription",
    "ClientError",
    "Connection",
    "ConnectionClosed",
    "ConsumerConfig",
    "ConsumerDeleted",
    "ConsumerInfo",
    "ConsumerNotFound",
    "CredentialsError",
    "DeliverPolicy",
    "DiscardPolicy",
    "FlushTimeout",
    "HeartbeatMissed",
    "JetStream",
    "JetStreamError",
    "JsMsg",
    "MaxPayloadExceeded",
    "MessageBlock",
    "MessageStream",
    "Msg",
    "MsgAlreadyAcked",
    "MsgMetadata",
    "NoMessageFound",
    "NoResponders",
    "NoServersAvailable",
    "NoStreamResponse",
    "NotFound",
    "NotJetStreamMessage",
    "NotSupported",
    "Options",
    "OutboundBufferFull",
    "PermissionsViolation",
    "ProtocolViolation",
    "PubAck",
    "PubAckFuture",
    "PublishStalled",
    "PullError",
    "PullSubscription",
    "ReplayPolicy",
    "RetentionPolicy",
    "Retry",
    "ServerError",
    "ServiceUnavailable",
    "SlowConsumer",
    "StaleConnection",
    "StorageType",
    "StreamConfig",
    "StreamInfo",
    "StreamNameInUse",
    "StreamNotFound",
    "StreamState",
    "Subscription",
    "ThreadMsg",
    "Timeout",
    "Worker",
    "WrongLastMsgId",
    "WrongLastSequence",
    "connect",
]
