"""NSQ's model over streams: topics are streams, channels are durable consumers dealt
out to clients by RDY, message ids are stream sequences."""

from tether.engine.nsq.channel import Channel
from tether.engine.nsq.member import Member, MessageSink
from tether.engine.nsq.service import NsqService, NsqSettings, owned_by_nsq
from tether.engine.nsq.topic import Topic

__all__ = ["Channel", "Member", "MessageSink", "NsqService", "NsqSettings", "Topic", "owned_by_nsq"]
