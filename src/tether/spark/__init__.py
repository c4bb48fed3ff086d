"""PySpark data source for Tether streams (``pip install tether[spark]``).

Batch and streaming reads of a stream into ``stream, subject, seq, value, timestamp
[, headers]`` rows, and a sink publishing DataFrames with idempotent message ids::

    df = spark.read.format("tether").option("servers", "nats://127.0.0.1:4222") \\
        .option("stream", "ORDERS").load()

The short name ``tether`` is registered automatically (see :mod:`pyspark_tether`);
``spark.dataSource.register(TetherDataSource)`` does the same explicitly. Spark runs
the data source in Python processes of its own: :func:`session` builds a SparkSession
whose Python processes use this interpreter, so that they can import Tether. Options,
offsets and delivery guarantees are documented in ``docs/spark.md``.
"""

from tether.spark._session import session
from tether.spark.options import TetherSparkError
from tether.spark.source import TetherDataSource

__all__ = ["TetherDataSource", "TetherSparkError", "session"]
