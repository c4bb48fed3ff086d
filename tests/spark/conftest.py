"""Fixtures for the Spark data source tests: a local Spark session and a Tether server.

Each test module gets one ``local[2]`` session (``spark`` fixture, module scope);
the JVM started by the first module is reused by the next ones, so later sessions
start in about a second. Modules that don't need Spark use only ``server``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="needs the spark extra (pyarrow)")

from tether.client import ServiceUnavailable, connect
from tether.spark import _runtime
from tether.testing import RunningServer, run_server

# Python workers must run this interpreter (the one with tether and pyarrow).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_names = itertools.count(1)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv
    _runtime.close_all()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("needs Java for a local Spark session")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("tether-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # The tests' JVM is short-lived: it starts about twice as fast without the
        # optimizing JIT compiler.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    )
    with warnings.catch_warnings():
        # PySpark warns at session start when pandas >= 3 is installed; these tests
        # do not use pandas.
        warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


class Helpers:
    """Test helpers, handed to tests by the ``tools`` fixture (test modules cannot
    import conftest under ``--import-mode=importlib``)."""

    @staticmethod
    def unique(prefix: str = "S") -> str:
        """A stream name not used before in this process."""
        return f"{prefix}{next(_names)}"

    @staticmethod
    async def _publish(
        url: str,
        stream: str | None,
        subjects: Sequence[str],
        messages: Sequence[tuple[str, bytes, dict[str, str] | None]],
        config: dict[str, Any],
    ) -> None:
        nc = await connect(url)
        try:
            js = nc.jetstream(timeout=10)
            if stream is not None:
                for attempt in range(50):  # a freshly started server may not answer yet
                    try:
                        await js.add_stream(name=stream, subjects=list(subjects), **config)
                        break
                    except ServiceUnavailable:
                        if attempt == 49:
                            raise
                        await asyncio.sleep(0.1)
            for subject, payload, headers in messages:
                await js.publish_async(subject, payload, headers=headers)
            await js.publish_async_completed(timeout=30)
        finally:
            await nc.close()

    @staticmethod
    def make_stream(
        url: str,
        stream: str,
        subjects: Sequence[str],
        messages: Sequence[tuple[str, bytes, dict[str, str] | None]] = (),
        **config: Any,
    ) -> None:
        """Create ``stream`` (``allow_direct`` on unless told) and publish ``messages``."""
        config.setdefault("allow_direct", True)
        asyncio.run(Helpers._publish(url, stream, subjects, messages, config))

    @staticmethod
    def publish(url: str, messages: Sequence[tuple[str, bytes, dict[str, str] | None]]) -> None:
        asyncio.run(Helpers._publish(url, None, (), messages, {}))

    @staticmethod
    def numbered(subject: str, first: int, count: int) -> list[tuple[str, bytes, None]]:
        """``count`` messages ``b"m<i>"`` on ``subject``, i from ``first``."""
        return [(subject, b"m%d" % i, None) for i in range(first, first + count)]

    @staticmethod
    async def _api(url: str, operation: str, body: Any = None) -> Any:
        nc = await connect(url)
        try:
            return await nc.jetstream(timeout=10).api(operation, body)
        finally:
            await nc.close()

    @staticmethod
    def api(url: str, operation: str, body: Any = None) -> Any:
        """One JetStream API request (purge, info...) from the test."""
        return asyncio.run(Helpers._api(url, operation, body))


@pytest.fixture(scope="session")
def tools() -> type[Helpers]:
    return Helpers
