"""``tether serve --signal ldm=<pid>``: nats-server's way of signalling a running server.

The commands Tether acts on, as nats-server names them: ``ldm`` (SIGUSR2, lame duck
mode), ``term`` (SIGTERM), ``quit`` (SIGINT) and ``stop`` (SIGKILL). The server is named
by its process id or a file holding it (``pid_file``). nats-server's ``reload`` and
``reopen`` are refused: Tether does not handle SIGHUP or SIGUSR1, which would end it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

COMMANDS = {"ldm": "SIGUSR2", "term": "SIGTERM", "quit": "SIGINT", "stop": "SIGKILL"}


def send(command: str) -> None:
    """Send the signal ``command`` (``ldm=1234``, ``quit=/run/tether.pid``) names.

    ``ValueError`` says what is wrong with the command or its process.
    """
    name, _, target = command.partition("=")
    number = getattr(signal, COMMANDS.get(name, ""), None)
    if number is None:
        raise ValueError(
            f"--signal {command}: unknown signal {name!r}: expected one of {', '.join(COMMANDS)}"
        )
    if not target:
        raise ValueError(f"--signal {command}: name the server: {name}=<pid or pid file>")
    pid = _pid(target)
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        raise ValueError(f"--signal {command}: no process {pid}") from None
    except PermissionError:
        raise ValueError(f"--signal {command}: not allowed to signal process {pid}") from None


def _pid(target: str) -> int:
    if target.isdigit():
        return int(target)
    try:
        text = Path(target).read_text().strip()
    except OSError as exc:
        raise ValueError(f"--signal: pid file {target}: {exc.strerror or exc}") from None
    if not text.isdigit():
        raise ValueError(f"--signal: pid file {target} holds no process id")
    return int(text)
