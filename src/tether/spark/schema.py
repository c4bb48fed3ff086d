"""The source's row schema, in Spark and in Arrow form.

``read()`` yields Arrow record batches, which Spark accepts only when their schema
equals its own Arrow rendering of the Spark schema exactly (list field names,
timestamp unit and zone, ``string`` not ``large_string``). So the Arrow schema is
derived with PySpark's own converter, the one its reader checks against.
"""

from __future__ import annotations

import functools
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADER_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def source_schema(include_headers: bool) -> StructType:
    """``stream, subject, seq, value, timestamp`` (+ ``headers`` with ``includeHeaders``)."""
    fields = [
        StructField("stream", StringType()),
        StructField("subject", StringType()),
        StructField("seq", LongType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADER_TYPE))
    return StructType(fields)


@functools.cache
def arrow_schema(include_headers: bool) -> Any:
    """The Arrow schema Spark expects from ``read()`` for :func:`source_schema`."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(source_schema(include_headers), timezone="UTC")
