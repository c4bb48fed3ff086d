"""What the dashboard tests (with and without a browser) share."""

from __future__ import annotations

from nats.js import JetStreamContext, api


async def dead_letter(
    js: JetStreamContext, stream: str, subject: str, durable: str = "c", payload: bytes = b"x"
) -> JetStreamContext.PullSubscription:
    """A stream ``stream`` on ``subject``'s first token, one message on ``subject``, and a
    consumer ``durable`` that gave up on it (``max_deliver=1``, then a term): one dead
    letter. Returns the consumer's subscription."""
    await js.add_stream(name=stream, subjects=[subject.split(".")[0] + ".>"])
    await js.publish(subject, payload)
    sub = await js.pull_subscribe(
        subject, durable=durable, stream=stream, config=api.ConsumerConfig(max_deliver=1)
    )
    await (await sub.fetch(1, timeout=5))[0].term()  # given up on: a dead letter
    return sub
