"""Registers Tether's data source with PySpark under the short name ``tether``.

On the first data source lookup of a session, PySpark imports every top-level
module whose name starts with ``pyspark_`` and registers its ``DefaultSource``
under ``DefaultSource.name()``. Installing ``tether[spark]`` therefore makes
``spark.read.format("tether")`` work without ``spark.dataSource.register``.
"""

from tether.spark.source import TetherDataSource as DefaultSource

__all__ = ["DefaultSource"]
