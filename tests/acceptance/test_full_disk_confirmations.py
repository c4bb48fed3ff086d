"""A full disk: nothing is confirmed that is not stored, and nothing confirmed is lost.

While the store's disk is full, an ack with a reply gets an error (nats-py's
``ack_sync`` raises), an HTTP job change gets a 503 and a publish an error PubAck. Once
there is room again the same requests succeed; then the server is killed (SIGKILL) and
restarted on the same store, and everything that was confirmed is there: acked
messages are not delivered again, DELIVERED jobs stay DELIVERED, acknowledged messages
are stored at their sequences.

The disk is a real small file system (a 2 MiB tmpfs, which needs the right to mount),
or else a file size limit on the server process (``RLIMIT_FSIZE``, set from outside
with ``prlimit``): both make the store's files unable to grow, as a full disk does.
The test is skipped only if neither is possible here, and never when ``CI`` is set.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.errors import ServiceUnavailableError

from tether.testing import RunningServer

AUTH = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}
JOBS = "/channel/tasks/consumer/w"
PAYLOAD = b"x" * 1000


class Disk:
    """Where the store lives, and a way to fill it up and to make room again."""

    def __init__(self, directory: Path, how: str) -> None:
        self.directory = directory
        self.how = how
        self.server: RunningServer | None = None
        self._ballast = directory / "ballast"

    @property
    def store(self) -> Path:
        return self.directory / "store"

    def fill(self) -> None:
        if self.how == "tmpfs":
            fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                chunk = b"\0" * 65536
                while chunk:
                    try:
                        os.write(fd, chunk)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        chunk = chunk[: len(chunk) // 2]
            finally:
                os.close(fd)
            return
        # No file of the store may grow any more (it may fill what it has).
        assert self.server is not None and self.server.proc is not None
        largest = max(p.stat().st_size for p in self.store.iterdir() if p.is_file())
        _, hard = resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE, (largest, hard))

    def make_room(self) -> None:
        if self.how == "tmpfs":
            self._ballast.unlink()
            return
        assert self.server is not None and self.server.proc is not None
        _, hard = resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))


def _mount_tmpfs(point: Path) -> str:
    """Mount a 2 MiB tmpfs on ``point``; the reason it cannot be done, or ""."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(point)],
        capture_output=True,
        check=False,
    )
    return result.stderr.decode().strip() or "mount failed" if result.returncode else ""


def _can_limit_file_size() -> str:
    """Whether this process may lower another one's RLIMIT_FSIZE; why not, or ""."""
    try:
        current = resource.prlimit(os.getpid(), resource.RLIMIT_FSIZE)
        resource.prlimit(os.getpid(), resource.RLIMIT_FSIZE, current)
    except (AttributeError, OSError) as exc:
        return f"cannot set RLIMIT_FSIZE: {exc}"
    return ""


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    point = tmp_path / "disk"
    point.mkdir()
    no_tmpfs = _mount_tmpfs(point)
    if not no_tmpfs:
        try:
            yield Disk(point, "tmpfs")
        finally:
            subprocess.run(["umount", "-l", str(point)], check=False)
        return
    no_limit = _can_limit_file_size()
    if no_limit:
        reason = f"no way to fill a disk here: {no_tmpfs}; {no_limit}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    yield Disk(point, "rlimit")


async def publish_until_refused(nc: Client, subject: str) -> tuple[int, int]:
    """Publish to stream A until the store refuses three times: (last seq, refusals)."""
    js = nc.jetstream()
    last = (await js.stream_info("A")).state.last_seq
    refused = 0
    for i in range(5000):
        try:
            last = (await js.publish(subject, b"%06d" % i + PAYLOAD)).seq
        except ServiceUnavailableError as exc:
            assert (exc.code, exc.err_code) == (503, 10077), exc
            refused += 1
            if refused == 3:
                return last, refused
    raise AssertionError("the disk never filled up")


@pytest.mark.slow
async def test_a_full_disk_confirms_nothing_it_does_not_store(disk: Disk) -> None:
    server = RunningServer(store=f"sqlite:{disk.store}")
    disk.server = server
    server.start()
    confirmed_acks: set[int] = set()
    delivered_jobs: list[str] = []
    try:
        nc = await nats.connect(server.url)
        http = httpx.AsyncClient(base_url=server.http_url, timeout=10)
        try:
            js = nc.jetstream()
            await js.add_stream(name="A", subjects=["a"])
            for i in range(20):
                await js.publish("a", b"m%d" % i)
            sub = await js.pull_subscribe("a", "w")
            msgs = list(await sub.fetch(20, timeout=5))
            assert (await http.put("/channel/tasks", data={"token": "ct"})).status_code == 200
            kind = {"token": "kt", "callbackUrl": "http://x.test/", "type": "pull"}
            assert (await http.put(JOBS, data=kind)).status_code == 200
            for i in range(8):
                await js.publish("wb.tasks", b"j%d" % i)
            r = await http.post(f"{JOBS}/claim", json={"Max": 6}, headers=AUTH)
            jobs = [job["ID"] for job in r.json()["Result"]]
            assert len(jobs) == 6
            # Before the disk fills up: confirmed as usual.
            for msg in msgs[:5]:
                await msg.ack_sync(timeout=5)
                confirmed_acks.add(msg.metadata.sequence.stream)
            r = await http.post(
                f"{JOBS}/job/{jobs[0]}", json={"NextState": "DELIVERED"}, headers=AUTH
            )
            assert r.status_code == 202
            delivered_jobs.append(jobs[0])

            disk.fill()
            last_acked, _ = await publish_until_refused(nc, "a")

            # Full: every confirmation is an error, none is a success.
            for msg in msgs[5:10]:
                with pytest.raises(NoRespondersError):
                    await msg.ack_sync(timeout=5)
            r = await http.post(
                f"{JOBS}/job/{jobs[1]}", json={"NextState": "DELIVERED"}, headers=AUTH
            )
            assert r.status_code == 503, r.text
            assert "could not be stored" in r.text
            bulk = {"Jobs": [{"ID": j, "NextState": "DELIVERED"} for j in jobs[2:4]]}
            assert (await http.post(f"{JOBS}/jobs", json=bulk, headers=AUTH)).status_code == 503
            r = await http.post(f"{JOBS}/claim", json={"Max": 1}, headers=AUTH)
            assert r.status_code == 503, r.text
            with pytest.raises(ServiceUnavailableError):
                await js.publish("a", b"refused")

            # Room again: the same requests succeed, numbering goes on without a hole.
            disk.make_room()
            for msg in msgs[5:10]:
                await msg.ack_sync(timeout=5)
                confirmed_acks.add(msg.metadata.sequence.stream)
            r = await http.post(
                f"{JOBS}/job/{jobs[1]}", json={"NextState": "DELIVERED"}, headers=AUTH
            )
            assert r.status_code == 202
            r = await http.post(f"{JOBS}/jobs", json=bulk, headers=AUTH)
            assert [x["Status"] for x in r.json()["Results"]] == [202, 202]
            delivered_jobs += jobs[1:4]
            assert (await js.publish("a", b"after")).seq == last_acked + 1
        finally:
            await http.aclose()
            await nc.close()

        server.kill()
        with contextlib.suppress(OSError):
            (disk.directory / "ballast").unlink()
        server.start()
        nc = await nats.connect(server.url)
        http = httpx.AsyncClient(base_url=server.http_url, timeout=10)
        try:
            js = nc.jetstream()
            info = await js.stream_info("A")
            assert info.state.last_seq == last_acked + 1
            sub = await js.pull_subscribe("a", "w")
            again = {m.metadata.sequence.stream for m in await sub.fetch(200, timeout=2)}
            assert again, "the unacked messages come back"
            assert not again & confirmed_acks, "a confirmed ack was lost"
            for jid in delivered_jobs:
                r = await http.get(f"{JOBS}/job/{jid}", headers=AUTH)
                assert r.json()["Status"] == "DELIVERED", (jid, r.text)
        finally:
            await http.aclose()
            await nc.close()
    finally:
        server.cleanup()
