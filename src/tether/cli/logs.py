"""How ``tether serve`` writes its log: nats-server's line shape, or JSON lines for shippers.

The text form is nats-server's (``[pid] 2026/01/02 15:04:05.000000 [INF] message``), so
scripts that scrape its stderr read Tether's too. The JSON form is one object a line
with ``time`` (RFC 3339 UTC), ``level`` (``debug``, ``info``, ``warning``, ``error``),
``logger``, ``pid`` and ``msg``, plus ``exc`` when an exception is logged: what log
shippers (Vector, Fluent Bit, Loki's promtail) parse without a custom grok pattern.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object a line; never raises on odd arguments (``%r`` of anything)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "time": moment.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup(level: str, log_file: str | None = None, log_format: str = "text") -> None:
    """Send the ``tether`` loggers to stderr (or ``log_file`` only, as nats-server does)
    at ``level``, in ``log_format``. Raises ``OSError`` when the file cannot be opened."""
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if log_file:
        handler = logging.FileHandler(log_file)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(
                f"[{os.getpid()}] %(asctime)s.%(msecs)03d000 [%(levelname).3s] %(message)s",
                datefmt="%Y/%m/%d %H:%M:%S",
            )
        )
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO), handlers=[handler], force=True
    )
