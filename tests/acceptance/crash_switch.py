"""The kill switch of the mixed-load crash test: a process of its own that kills the
server right after one answer, an ack's reply or a job change's ``202``.

It pulls messages from the NATS consumer and acks them with replies, or claims jobs of
the HTTP consumer and sets them DELIVERED (one ``POST …/job/{id}`` or one ``POST
…/jobs``), and sends SIGKILL to the server the moment the first answer arrives. A
server that answers before its commit is durable is caught before it commits.

It runs in its own process, on blocking sockets and the standard library only, so that
nothing stands between the answer and the kill: not the test's busy event loop, not its
GIL, not an HTTP client's header parsing. Run by ``test_crash_mixed.py``::

    python crash_switch.py '{"kind": "ack", "pid": ..., ...}'

It prints what it was told as one JSON line: the kill time, the acks confirmed (stream
seq -> time) and the jobs confirmed DELIVERED (id -> time). Times are
``time.monotonic()``, the same clock in every process of the machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from typing import Any, BinaryIO

TIMEOUT = 3.0
INBOX = "_KILL"


def stream_seq(ack_subject: str) -> int:
    """The stream sequence in a ``$JS.ACK`` subject (with or without domain and account)."""
    tokens = ack_subject.split(".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])


class RawNats:
    """A blocking NATS connection that reads every message itself."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.rfile = self.sock.makefile("rb")
        assert self.rfile.readline().startswith(b"INFO "), "no INFO"
        options = {"verbose": False, "pedantic": False, "headers": True, "protocol": 1}
        self.sock.sendall(
            b"CONNECT %s\r\nSUB %s.> 1\r\nPING\r\n" % (json.dumps(options).encode(), INBOX.encode())
        )
        while (line := self.rfile.readline()) != b"PONG\r\n":
            assert line and not line.startswith(b"-ERR"), line

    def read(self) -> tuple[str, str, bytes]:
        """The next message: (subject, reply, header block); raises once the server is gone."""
        while True:
            line = self.rfile.readline()
            if not line:
                raise ConnectionResetError("the server closed the connection")
            if line == b"PING\r\n":
                self.sock.sendall(b"PONG\r\n")
                continue
            parts = line.split()
            if parts[0] not in (b"MSG", b"HMSG"):
                assert not line.startswith(b"-ERR"), line
                continue
            headers = parts[0] == b"HMSG"
            reply = parts[3].decode() if len(parts) == (6 if headers else 5) else ""
            size = int(parts[-1])
            data = self.rfile.read(size + 2)
            if len(data) < size + 2:
                raise ConnectionResetError("cut short")
            return parts[1].decode(), reply, data[: int(parts[-2])] if headers else b""

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class RawHttp:
    """A blocking HTTP/1.1 keep-alive connection: the status line is read on its own, so
    the kill can follow it before the rest of the answer is parsed."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.rfile: BinaryIO = self.sock.makefile("rb")
        self.head = f"Host: {host}\r\nContent-Type: application/json\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )

    def post(self, path: str, body: Any) -> int:
        """Send a request; returns the status of its answer (read the rest with ``body``)."""
        data = json.dumps(body).encode()
        request = f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}\r\n\r\n"
        self.sock.sendall(request.encode() + data)
        line = self.rfile.readline()
        if not line:
            raise ConnectionResetError("the server closed the connection")
        return int(line.split()[1])

    def body(self) -> Any:
        length = 0
        while (line := self.rfile.readline()) != b"\r\n":
            if not line:
                raise ConnectionResetError("the server closed the connection")
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = self.rfile.read(length)
        if len(data) < length:
            raise ConnectionResetError("cut short")
        return json.loads(data) if data else None

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class Switch:
    def __init__(self, task: dict[str, Any]) -> None:
        self.task = task
        self.killed_at: float | None = None
        self.acked: dict[int, float] = {}
        self.delivered: dict[str, float] = {}

    def fire(self) -> None:
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            os.kill(self.task["pid"], signal.SIGKILL)

    def run(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.task["within"]
        error = None
        try:
            if self.task["kind"] == "ack":
                self._ack(deadline)
            else:
                self._job(deadline)
        except OSError as exc:
            if self.killed_at is None:
                error = repr(exc)
        except Exception as exc:
            error = repr(exc)
        return {
            "killed_at": self.killed_at,
            "acked": self.acked,
            "delivered": self.delivered,
            "error": error,
        }

    def _ack(self, deadline: float) -> None:
        task = self.task
        batch = task["batch"]
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{task['stream']}.{task['consumer']}"
        request = json.dumps({"batch": batch, "expires": 500_000_000, "no_wait": True})
        conn = RawNats(task["host"], task["port"])
        try:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                conn.sock.sendall(
                    f"PUB {subject} {INBOX}.pull.{n} {len(request)}\r\n{request}\r\n".encode()
                )
                acks: list[str] = []
                while len(acks) < batch:
                    got, reply, _ = conn.read()
                    if reply.startswith("$JS.ACK."):
                        acks.append(reply)  # a message (on its own subject)
                    elif got == f"{INBOX}.pull.{n}":
                        break  # a status (404, 408): nothing more pending
                if not acks:
                    time.sleep(0.002)
                    continue
                conn.sock.sendall(
                    "".join(
                        f"PUB {ack} {INBOX}.ack.{i} 0\r\n\r\n" for i, ack in enumerate(acks)
                    ).encode()
                )
                answered = 0
                while answered < len(acks):  # after the kill: the answers already sent
                    got, _, headers = conn.read()
                    if not got.startswith(f"{INBOX}.ack."):
                        continue
                    now = time.monotonic()
                    answered += 1
                    assert not headers, f"ack refused: {headers!r}"
                    self.fire()
                    self.acked[stream_seq(acks[int(got.rsplit(".", 1)[1])])] = now
                return
        finally:
            conn.close()

    def _job(self, deadline: float) -> None:
        task = self.task
        path = task["job_path"]
        web = RawHttp(task["host"], task["http_port"], task["job_headers"])
        try:
            while time.monotonic() < deadline:
                status = web.post(f"{path}/claim", {"Max": task["batch"]})
                answer = web.body()
                assert status == 200, (status, answer)
                ids = [job["ID"] for job in answer["Result"]]
                if not ids:
                    time.sleep(0.002)
                    continue
                if not task["bulk"]:
                    status = web.post(f"{path}/job/{ids[0]}", {"NextState": "DELIVERED"})
                    now = time.monotonic()
                    assert status == 202, status
                    self.fire()
                    self.delivered[ids[0]] = now
                    return
                changes = [{"ID": i, "NextState": "DELIVERED"} for i in ids]
                status = web.post(f"{path}/jobs", {"Jobs": changes})
                now = time.monotonic()
                assert status == 200, status
                self.fire()
                for item in web.body()["Results"]:  # the answers already sent
                    assert item["Status"] == 202, item
                    self.delivered[item["ID"]] = now
                return
        finally:
            web.close()


if __name__ == "__main__":
    print(json.dumps(Switch(json.loads(sys.argv[1])).run()), flush=True)
