"""A minimal leaf node connection to another NATS server: subscribe to a few subjects
there (``LS+``) and exchange messages with it (``LMSG``, and ``HMSG`` when they have headers).

Only what an :class:`~tether.server.nats.api_export.ApiExport` needs is spoken: no
queue subscriptions, no interest propagation the other way (its ``LS+`` lines are
read and ignored), no TLS, no compression; user/password or token authentication
from the URL. A leaf node rather than a client connection because nats-server
refuses ``$JS.ACK.…`` reply subjects from clients, and JetStream deliveries carry
exactly those.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from tether.engine.subjects import subject_matches
from tether.protocol.nats.commands import encode
from tether.version import __version__

log = logging.getLogger("tether.sourcing")

Handler = Callable[[str, str, bytes | None, bytes], None]
# Seconds between attempts to (re)connect.
RETRY = 2.0


class LeafLink:
    """One solicited leaf node connection, reconnected for as long as it runs."""

    def __init__(self, urls: list[str], name: str) -> None:
        self.urls = urls
        self.name = name
        self.subs: list[tuple[str, Handler]] = []
        self.address = ""
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close()

    def subscribe(self, subject: str, handler: Handler) -> None:
        self.subs.append((subject, handler))
        if self._writer is not None:
            self._writer.write(b"LS+ " + encode(subject) + b"\r\n")

    def publish(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> bool:
        """Send a message into the other server's account; whether it could be sent."""
        writer = self._writer
        if writer is None:
            return False
        head = encode(subject) + (b" " + encode(reply) if reply else b"")
        if hdr:
            size = len(hdr) + len(payload)
            writer.write(b"HMSG %s %d %d\r\n" % (head, len(hdr), size) + hdr + payload + b"\r\n")
        else:
            writer.write(b"LMSG %s %d\r\n" % (head, len(payload)) + payload + b"\r\n")
        return True

    # -- connection ------------------------------------------------------------------------------
    async def _run(self) -> None:
        i = 0
        while True:
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                await self._session(url)
            except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                log.warning("leaf link %s to %s: %s", self.name, url, exc or type(exc).__name__)
            self._close()
            await asyncio.sleep(RETRY)

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        self.connected.clear()
        if writer is not None:
            writer.close()

    async def _session(self, url: str) -> None:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 7422)
        line = await reader.readline()
        if not line.startswith(b"INFO "):
            raise ValueError(f"not a NATS leaf node port: {line[:40]!r}")
        connect: dict[str, object] = {
            "version": __version__,
            "name": self.name,
            "headers": True,
            "protocol": 1,
        }
        if parts.username and parts.password is not None:
            connect["user"] = unquote(parts.username)
            connect["pass"] = unquote(parts.password)
        elif parts.username:
            connect["auth_token"] = unquote(parts.username)
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        for subject, _ in self.subs:
            writer.write(b"LS+ " + encode(subject) + b"\r\n")
        await writer.drain()
        self._writer = writer
        self.address = f"{parts.hostname}:{parts.port}"
        self.connected.set()
        log.info("leaf link %s connected to %s", self.name, self.address)
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionResetError("closed by the other server")
            op, _, rest = line.rstrip(b"\r\n").partition(b" ")
            op = op.upper()
            if op == b"PING":
                writer.write(b"PONG\r\n")
            elif op in (b"LMSG", b"HMSG"):
                args = rest.split()
                size = int(args[-1])
                hlen = int(args[-2]) if op == b"HMSG" else 0
                body = await reader.readexactly(size + 2)
                fixed = 2 if op == b"LMSG" else 3
                reply = args[1].decode() if len(args) > fixed else ""
                if reply in ("+", "|"):
                    reply = args[2].decode() if reply == "+" else ""
                self._dispatch(
                    args[0].decode(), reply, body[:hlen] if hlen else None, body[hlen:size]
                )
            elif op == b"-ERR":
                log.warning("leaf link %s: %s", self.name, rest.decode(errors="replace"))
            # INFO, PONG, +OK, LS+, LS-: nothing to do.
            await writer.drain()

    def _dispatch(self, subject: str, reply: str, hdr: bytes | None, payload: bytes) -> None:
        for pattern, handler in self.subs:
            if subject_matches(pattern, subject):
                try:
                    handler(subject, reply, hdr, payload)
                except Exception:
                    log.exception("leaf link %s: handling %s failed", self.name, subject)
