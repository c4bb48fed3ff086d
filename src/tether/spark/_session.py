"""``tether.spark.session()``: a SparkSession whose Python processes can import Tether.

Spark runs Python data sources in Python processes of its own, not in the process
that created the session: the JVM looks the data source up and plans reads with
``PYSPARK_DRIVER_PYTHON``, else ``PYSPARK_PYTHON``, else ``python3`` from ``PATH``,
and runs tasks with ``PYSPARK_PYTHON``, else ``python3``. A virtual environment that
is not activated is not on ``PATH``, so ``python3`` is some other interpreter without
``tether`` (often without ``pyspark``), and ``format("tether")`` fails with
``DATA_SOURCE_NOT_FOUND ... ClassNotFoundException: tether.DefaultSource``.

The JVM reads those variables once, when it starts; ``spark.pyspark.python`` given
to ``SparkSession.builder`` does not reach it when Spark is started from Python. So
the variables must be set before the first session of the process: that is what
:func:`session` does, and it checks afterwards that the interpreters Spark will use
can import Tether, failing with a message that says what to change when they cannot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tether.spark.options import TetherSparkError
from tether.spark.source import TetherDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What a Spark Python process must be able to import to find the data source.
_PROBE = "import pyspark_tether"
_PROBE_TIMEOUT = 60.0


def session(
    master: str | None = None,
    app_name: str | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    python: str | None = None,
) -> SparkSession:
    """Get or create a SparkSession that can read and write ``format("tether")``.

    ``master`` and ``app_name`` default to Spark's own defaults (``local[*]`` when
    Spark is started from Python); ``config`` holds any other Spark settings.

    Spark's Python workers run ``python``, else ``$PYSPARK_PYTHON``, else this
    interpreter (``sys.executable``); Spark's driver-side Python processes (data
    source lookup and planning) run this interpreter. Both are set through the
    environment before the JVM starts, so call this before creating any other
    SparkSession or SparkContext in the process. If a session already exists it is
    returned as it is, after checking that its interpreters can import Tether. Under
    ``spark-submit`` or the ``pyspark`` shell, where Spark started this process, the
    interpreters are Spark's configured ones unless ``python`` is given.

    Raises :class:`TetherSparkError` naming the interpreter and the fix when Spark
    would not find the data source. The data source is also registered explicitly
    (``spark.dataSource.register``), which is harmless where the automatic
    registration by :mod:`pyspark_tether` already happened.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    # Under spark-submit or the pyspark shell the JVM started this process, with the
    # interpreters its configuration names: only an explicit ``python`` changes them.
    attached = "PYSPARK_GATEWAY_PORT" in os.environ
    if active is None:
        if python is not None:
            os.environ["PYSPARK_PYTHON"] = python
        elif not attached and not os.environ.get("PYSPARK_PYTHON"):
            os.environ["PYSPARK_PYTHON"] = sys.executable
        if SparkContext._gateway is None and not attached:
            # This process starts the JVM: its Python processes on the driver side
            # run the driver's own interpreter.
            os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    elif python is not None and active.pythonExec != python:
        raise TetherSparkError(
            f"a SparkContext is already running with Python workers {active.pythonExec!r}; "
            f"stop it (spark.stop()) before asking for python={python!r}"
        )

    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    if app_name is not None:
        builder = builder.appName(app_name)
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    check_interpreters(spark)
    spark.dataSource.register(TetherDataSource)
    return spark


def check_interpreters(spark: SparkSession) -> None:
    """Fail with :class:`TetherSparkError` if the Python processes Spark starts for
    ``spark`` cannot import Tether (and so cannot find ``format("tether")``)."""
    context = spark.sparkContext
    jvm = context._jvm
    assert jvm is not None
    getenv = jvm.java.lang.System.getenv
    planner = str(getenv("PYSPARK_DRIVER_PYTHON") or getenv("PYSPARK_PYTHON") or "python3")
    problem = import_problem(planner)
    if problem is not None:
        raise TetherSparkError(
            f"Spark looks up and plans Python data sources with {planner!r} "
            "(PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON, else python3 from PATH, as "
            f"the Spark JVM saw them when it started), which cannot import tether: "
            f"{problem}. format('tether') would fail with DATA_SOURCE_NOT_FOUND. This "
            "process started Spark before tether.spark.session() could choose the "
            "interpreter: call tether.spark.session() before creating any other "
            "SparkSession or SparkContext, or set the environment variable "
            f"PYSPARK_PYTHON={sys.executable} before Spark starts"
        )
    # Workers of a cluster run on other machines, where paths differ: check local ones.
    if (context.master or "").startswith("local"):
        workers = context.pythonExec
        problem = import_problem(workers)
        if problem is not None:
            raise TetherSparkError(
                f"Spark's Python workers run {workers!r} (PYSPARK_PYTHON), which cannot "
                f"import tether: {problem}. Pass python= to tether.spark.session() or set "
                "PYSPARK_PYTHON to an interpreter that has tether[spark] installed (this "
                f"one does: {sys.executable}) before the SparkContext starts"
            )


def import_problem(interpreter: str) -> str | None:
    """Why ``interpreter`` cannot import the data source, or None if it can."""
    path = interpreter if os.path.dirname(interpreter) else shutil.which(interpreter)
    if path is None or not os.access(path, os.X_OK):
        return f"{interpreter!r} is not an executable found on PATH"
    if _same_interpreter(path, sys.executable):
        return None
    try:
        result = subprocess.run(
            [path, "-c", _PROBE],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"running it failed ({exc})"
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"it exited with status {result.returncode}"


def _same_interpreter(a: str, b: str) -> bool:
    """Same executable in the same directory: a virtual environment's ``python`` is a
    link to its base interpreter, so the file alone does not tell them apart."""
    try:
        same_dir = os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b))
        return same_dir and os.path.samefile(a, b)
    except OSError:
        return False
