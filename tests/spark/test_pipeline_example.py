"""examples/spark_pipeline/pipeline.py does not succeed silently on messages that are
not orders: it aggregates the orders, reports how many messages it skipped and the
first of them, and exits with status 1.

The job runs in this process (as ``__main__``), on the JVM the other Spark tests use,
so it costs a micro-batch or two rather than a JVM start-up. The documented commands
run as subprocesses in tests/acceptance/test_examples.py.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from tether.spark import _runtime
from tether.testing import RunningServer

pytestmark = pytest.mark.spark

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline" / "pipeline.py"


def order(i: int, created: str) -> bytes:
    return json.dumps(
        {"id": f"t-{i}", "customer": "c1", "region": "eu", "amount": 10.0, "created": created}
    ).encode()


def test_messages_that_are_not_orders_fail_the_run(
    server: RunningServer,
    tools: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("needs Java for a local Spark session")
    messages: list[tuple[str, bytes, None]] = [
        ("shop.orders.eu", order(0, "2030-01-01T10:00:30+00:00"), None),
        ("shop.orders.eu", b"order 1", None),  # what another example might publish
        ("shop.orders.us", b'{"id": "t-2", "region": "us"}', None),  # no amount, no time
        ("shop.orders.eu", order(3, "2030-01-01T10:05:00+00:00"), None),
    ]
    tools.make_stream(server.url, "SHOP_ORDERS", ["shop.orders.>"], messages)
    argv = ["pipeline.py", "--servers", server.url, "--checkpoint", str(tmp_path / "ck")]
    monkeypatch.setattr("sys.argv", argv)
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exited:
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        runpy.run_path(str(PIPELINE), run_name="__main__")
    _runtime.close_all()
    assert exited.value.code == 1
    out, err = capsys.readouterr()
    assert "read 4 messages from SHOP_ORDERS" in out
    assert "2 messages not orders" in out
    # The first order's window is final (the second order moved the watermark past it).
    assert "SHOP_REVENUE holds 1 windows" in out
    assert "error: 2 messages in SHOP_ORDERS are not orders and were skipped" in err
    assert "the first: seq 2 on shop.orders.eu: 'order 1'" in err
