"""The ``durable`` hint: acknowledge a JetStream consumer up to the committed sequence.

The streaming checkpoint is the query's position; this consumer only mirrors it, so
that interest/work-queue retention can drop what the query has processed and
operators can watch the lag with ordinary consumer tooling. It is called from the
source's ``commit()``, which Spark runs one micro-batch late, so the consumer trails
the checkpoint by up to a batch, and failures are logged, never raised.
"""

from __future__ import annotations

from tether.client import (
    AckPolicy,
    ConsumerConfig,
    ConsumerNotFound,
    DeliverPolicy,
)
from tether.spark import _runtime
from tether.spark.options import ReadOptions

# Messages pulled per round; below the default max_ack_pending (1000) so a round
# never stalls on unacknowledged messages.
_ROUND = 500


async def ack_through(opts: ReadOptions, seq: int) -> int:
    """Acknowledge consumer ``opts.durable`` up to stream sequence ``seq``; returns how
    many messages were acknowledged. A missing consumer is created positioned right
    after ``seq`` (acknowledge-all, headers only: the hint moves no payloads)."""
    assert opts.durable is not None
    js = await _runtime.jetstream(opts.conn)
    name = opts.durable
    try:
        info = await js.consumer_info(opts.stream, name)
    except ConsumerNotFound:
        config = ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=seq + 1,
            headers_only=True,
            description="position hint of a Spark structured streaming query",
        )
        if len(opts.subjects) == 1:
            config.filter_subject = opts.subjects[0]
        elif opts.subjects:
            config.filter_subjects = list(opts.subjects)
        await js.add_consumer(opts.stream, config)
        return 0
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    if floor >= seq:
        return 0
    policy = info.config.ack_policy or AckPolicy.EXPLICIT
    delivered = info.delivered.stream_seq if info.delivered else 0
    sub = await js.pull_subscribe(opts.stream, name)
    acked = 0
    try:
        while delivered < seq:
            # At most seq - delivered new messages can lie at or below seq: asking for
            # no more keeps the consumer from running ahead of the checkpoint.
            want = min(_ROUND, seq - delivered)
            msgs = await sub.fetch(want, timeout=2.0, no_wait=True)
            if not msgs:
                break
            delivered = max(delivered, max(m.metadata.stream_seq for m in msgs))
            within = [m for m in msgs if m.metadata.stream_seq <= seq]
            # Messages past ``seq`` (possible with subject filters) stay unacknowledged:
            # the server redelivers them after ack_wait and a later commit acks them.
            if policy == AckPolicy.ALL and within:
                await within[-1].ack_sync()
            elif policy == AckPolicy.EXPLICIT:
                for msg in within:
                    msg.ack_nowait()
            acked += len(within)
            if len(within) < len(msgs):
                break
        await js.conn.flush()
    finally:
        await sub.unsubscribe(nak_buffered=False)
    return acked
