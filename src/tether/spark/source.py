"""The data source Spark instantiates for ``format("tether")``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tether.spark.options import (
    TetherSparkError,
    bool_option,
    read_options,
    write_options,
)
from tether.spark.schema import source_schema


class TetherDataSource(DataSource):
    """Tether (or any JetStream server) as a Spark source and sink.

    Registered automatically under the short name ``tether`` by the
    ``pyspark_tether`` module, or explicitly with
    ``spark.dataSource.register(TetherDataSource)``. Options and guarantees are
    described in ``docs/spark.md``.
    """

    @classmethod
    def name(cls) -> str:
        return "tether"

    def schema(self) -> StructType:
        return source_schema(bool_option(self.options, "includeHeaders", False))

    def _check_schema(self, schema: StructType, include_headers: bool) -> None:
        expected = source_schema(include_headers)
        given = [(f.name, f.dataType) for f in schema.fields]
        if given != [(f.name, f.dataType) for f in expected.fields]:
            raise TetherSparkError(
                f"the tether source has the fixed schema {expected.simpleString()}; "
                f"got {schema.simpleString()} (drop .schema(); option 'includeHeaders' "
                "adds the headers column)"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        from tether.spark.batch import TetherBatchReader

        opts = read_options(self.options, streaming=False)
        self._check_schema(schema, opts.include_headers)
        return TetherBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from tether.spark.streaming import TetherStreamReader

        opts = read_options(self.options, streaming=True)
        self._check_schema(schema, opts.include_headers)
        return TetherStreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from tether.spark.writer import TetherBatchWriter, check_sink_schema

        if overwrite:
            raise TetherSparkError(
                "the tether sink only appends messages: use mode('append'), not overwrite"
            )
        opts = write_options(self.options, streaming=False)
        check_sink_schema(schema, opts)
        return TetherBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from tether.spark.writer import TetherStreamWriter, check_sink_schema

        # Every output mode just publishes the rows of each micro-batch.
        opts = write_options(self.options, streaming=True)
        check_sink_schema(schema, opts)
        return TetherStreamWriter(opts)
