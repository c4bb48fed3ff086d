"""Active/standby over one PostgreSQL database: who may write, and the fencing epoch.

Any number of nodes may point at the same database; exactly one is **active**. It holds
a session-level advisory lock on its own connection (the lock session) and the epoch
it wrote into the leader row when it took over. Standbys try the lock every
``poll_interval`` seconds. Taking over: the lock, then the schema migrations, then
``epoch = epoch + 1`` in the leader row — an UPDATE that waits for the former leader's
commit in progress, since every commit reads the row ``FOR SHARE`` and checks its
epoch (see postgres.py): once the epoch is raised the former leader can write nothing.

How long a takeover takes is bounded by settings, not by luck:

* a crashed process: its socket closes, PostgreSQL ends its session at once and the
  lock is free at the standby's next poll;
* a dead machine or a cut network: TCP keepalives (``keepalive`` seconds, set on
  both sides) end the session;
* a paused process (SIGSTOP, a VM frozen): the lock session has
  ``idle_session_timeout = session_timeout``; the active node runs a heartbeat on it
  every ``poll_interval`` seconds, so only a node that stopped running loses it. The
  write connection has ``idle_in_transaction_session_timeout`` and
  ``statement_timeout``, so a commit frozen half-way cannot hold the leader row.

Every blocking call runs on one dedicated thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from tether.storage.base import StorageError
from tether.storage.postgres import LEADER_LOCK, connect, migrate, redact, require_psycopg

if TYPE_CHECKING:
    import psycopg

__all__ = ["Leadership", "Role"]

log = logging.getLogger("tether")

Role = Literal["standby", "active", "stopped"]

SQL_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
SQL_UNLOCK = "SELECT pg_advisory_unlock(%s)"
SQL_TAKE_OVER = (
    "UPDATE tether_leader SET epoch = epoch + 1, node = %s, since = now() WHERE id = 1"
    " RETURNING epoch"
)
SQL_EPOCH = "SELECT epoch FROM tether_leader WHERE id = 1"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class Leadership:
    """This node's role over the database at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        poll_interval: float = 1.0,
        session_timeout: float = 10.0,
        keepalive: float = 5.0,
        node: str = "",
    ) -> None:
        if not 0 < poll_interval < session_timeout:
            raise ValueError(
                f"the lock poll interval ({poll_interval:g} s) must be more than 0 and less"
                f" than the session timeout ({session_timeout:g} s)"
            )
        require_psycopg()
        self.url = url
        self.poll_interval = poll_interval
        self.session_timeout = session_timeout
        self.keepalive = keepalive
        self.node = node or socket.gethostname()
        self.role: Role = "standby"
        self.epoch: int | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-leadership")
        self._watch: asyncio.Task[None] | None = None
        self._last_error = ""

    @property
    def writer_options(self) -> str:
        """Server settings for the active node's write connection (see the module)."""
        ms = _ms(self.session_timeout)
        return f"-c idle_in_transaction_session_timeout={ms} -c statement_timeout={ms}"

    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    # -- on the leadership thread ------------------------------------------------------
    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(
                self.url,
                keepalive=self.keepalive,
                application_name="tether-leader-lock",
                options=f"-c idle_session_timeout={_ms(self.session_timeout)}",
            )
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _try_take_over(self) -> int | None:
        """The epoch this node now holds, or None while another node holds the lock."""
        psycopg = require_psycopg()
        try:
            conn = self._connection()
            (got,) = conn.execute(SQL_TRY_LOCK, (LEADER_LOCK,)).fetchone() or (False,)
            if not got:
                return None
            try:
                migrate(conn)
                with conn.transaction():
                    # A former leader's commit frozen half-way ends by its own timeouts.
                    conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{_ms(self.session_timeout * 2)}ms",),
                    )
                    row = conn.execute(SQL_TAKE_OVER, (self.node,)).fetchone()
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.execute(SQL_UNLOCK, (LEADER_LOCK,))
                raise
            if row is None:
                raise StorageError("the leader row is missing from tether_leader")
            return int(row[0])
        except psycopg.Error as exc:
            self._drop()
            raise StorageError(f"PostgreSQL at {redact(self.url)}: {exc}") from exc

    def _check(self) -> str | None:
        """The active node's heartbeat: None while it is still the leader, else why not.

        A lock session that ended (PostgreSQL restarted, the session timed out) is
        opened again and the lock tried again: this node stays active only if it gets
        the lock back and the leader row still holds its epoch."""
        psycopg = require_psycopg()
        try:
            conn = self._conn
            if conn is not None and not conn.closed:
                row = conn.execute(SQL_EPOCH).fetchone()
                current = None if row is None else int(row[0])
                if current != self.epoch:
                    return f"the leader row holds epoch {current}, not this node's {self.epoch}"
                return None
        except psycopg.Error as exc:
            self._drop()
            log.warning("the leader lock session ended (%s); taking the lock again", exc)
        # No session: the lock went with it.
        try:
            conn = self._connection()
            (got,) = conn.execute(SQL_TRY_LOCK, (LEADER_LOCK,)).fetchone() or (False,)
            if not got:
                return "another node holds the leader lock"
            row = conn.execute(SQL_EPOCH).fetchone()
            current = None if row is None else int(row[0])
            if current != self.epoch:
                return f"the leader row holds epoch {current}, not this node's {self.epoch}"
            log.info("Leader lock taken again (epoch %s)", self.epoch)
            return None
        except (psycopg.Error, StorageError) as exc:
            self._drop()
            log.warning("PostgreSQL unreachable, still active until told otherwise: %s", exc)
            return None

    # -- on the loop -------------------------------------------------------------------
    async def acquire(self, stopping: asyncio.Event | None = None) -> int | None:
        """Wait until this node is active; returns its epoch (None: ``stopping`` was set
        first). Connection failures are logged and retried."""
        announced = False
        while stopping is None or not stopping.is_set():
            try:
                epoch: int | None = await self._call(self._try_take_over)
            except StorageError as exc:
                if str(exc) != self._last_error:
                    log.warning("Waiting for PostgreSQL: %s", exc)
                    self._last_error = str(exc)
                epoch = None
            if epoch is not None:
                self.epoch = epoch
                self.role = "active"
                log.info("Became the active node (epoch %d)", epoch)
                return epoch
            if not announced:
                log.info(
                    "Standby: another node is active; trying its lock every %gs", self.poll_interval
                )
                announced = True
            if stopping is None:
                await asyncio.sleep(self.poll_interval)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.poll_interval)
        return None

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Run the active node's heartbeat; ``on_lost(why)`` once it is not the leader."""

        async def beat() -> None:
            while self.role == "active":
                await asyncio.sleep(self.poll_interval)
                why = await self._call(self._check)
                if why is not None and self.role == "active":
                    self.role = "stopped"
                    on_lost(why)
                    return

        self._watch = asyncio.ensure_future(beat())

    async def close(self) -> None:
        """Stop the heartbeat and end the lock session (the lock goes with it)."""
        self.role = "stopped"
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._call(self._drop)
        self._thread.shutdown(wait=True)
