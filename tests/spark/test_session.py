"""``tether.spark.session()``: ``format("tether")`` works from any interpreter that has
Tether installed, also when that interpreter's directory is not on ``PATH``.

Spark starts its own Python processes (data source lookup, planning, tasks) with
``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` or else ``python3`` from ``PATH``. Someone
who runs ``.venv/bin/python script.py`` without activating the environment gets a
``python3`` without Tether, and a plain SparkSession fails with ``DATA_SOURCE_NOT_FOUND``.
The scripts here run in exactly that environment: the virtual environment's ``bin/``
removed from ``PATH``, no ``PYSPARK_*`` variables, and a ``python3`` first on ``PATH``
that is the interpreter the environment was made from (no Tether, no PySpark).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.spark._session import _same_interpreter, import_problem
from tether.testing import RunningServer

pytestmark = pytest.mark.spark

SCRIPT_TIMEOUT = 240.0

CONFIG = (
    "{'spark.ui.enabled': 'false', 'spark.ui.showConsoleProgress': 'false', "
    "'spark.driver.host': '127.0.0.1', 'spark.driver.bindAddress': '127.0.0.1'}"
)

# What a user writes: the helper, then a read.
WITH_HELPER = f"""
import sys
import tether.spark

spark = tether.spark.session("local[1]", config={CONFIG})
df = spark.read.format("tether").option("servers", sys.argv[1]).option("stream", sys.argv[2])
print("rows", df.load().count())
print("workers", spark.sparkContext.pythonExec)
spark.stop()
"""

# Without the helper the read fails; the helper, called too late, says what to do.
WITHOUT_HELPER = f"""
import sys
from pyspark.sql import SparkSession
import tether.spark

builder = SparkSession.builder.master("local[1]")
for key, value in {CONFIG}.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
try:
    spark.read.format("tether").option("servers", sys.argv[1]).option("stream", sys.argv[2]).load()
except Exception as exc:
    print("plain session:", " ".join(str(exc).split())[:1000])
else:
    print("plain session: read worked")
try:
    tether.spark.session()
except tether.spark.TetherSparkError as exc:
    print("helper:", exc)
else:
    print("helper: no error")
spark.stop()
"""


def base_interpreter() -> str:
    """The interpreter this virtual environment was made from (without its packages)."""
    base = getattr(sys, "_base_executable", sys.executable)
    if not base or _same_interpreter(base, sys.executable) or sys.prefix == sys.base_prefix:
        pytest.skip("needs to run in a virtual environment")
    return str(base)


def outside_the_environment(tmp_path: Path) -> dict[str, str]:
    """The environment of ``.venv/bin/python script.py`` typed in a fresh shell."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    python3 = shim / "python3"
    if not python3.exists():
        python3.symlink_to(base_interpreter())
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    path = [str(shim)] + [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and os.path.abspath(d) != venv_bin
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    # Short-lived JVMs start about twice as fast without the optimizing JIT compiler.
    env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1".strip()
    return env


def start(script: str, args: list[str], tmp_path: Path, name: str) -> subprocess.Popen[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        cwd=tmp_path,
        env=outside_the_environment(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def runs(
    server: RunningServer, tools: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Both scripts, started together (each starts a JVM: they overlap)."""
    from shutil import which

    if which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("needs Java for a local Spark session")
    stream = tools.unique("SESSION")
    tools.make_stream(server.url, stream, [f"{stream}.>"], tools.numbered(f"{stream}.a", 0, 3))
    tmp = tmp_path_factory.mktemp("session")
    procs = {
        "with": start(WITH_HELPER, [server.url, stream], tmp, "with_helper"),
        "without": start(WITHOUT_HELPER, [server.url, stream], tmp, "without_helper"),
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # also closes the pipes of a script no test read to the end


def test_environment_reproduces_the_problem(tmp_path: Path) -> None:
    """``python3`` on the stripped PATH cannot import Tether (else nothing is shown)."""
    env = outside_the_environment(tmp_path)
    result = subprocess.run(
        ["python3", "-c", "import pyspark_tether"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "No module named" in result.stderr


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
def test_helper_session_reads_from_an_unactivated_environment(
    runs: dict[str, subprocess.Popen[str]],
) -> None:
    code, out, err = finish(runs["with"])
    assert code == 0, f"{out}\n{err}"
    assert "rows 3" in out.splitlines(), out
    assert f"workers {sys.executable}" in out.splitlines(), out


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
def test_plain_session_fails_and_helper_says_what_to_do(
    runs: dict[str, subprocess.Popen[str]],
) -> None:
    code, out, err = finish(runs["without"])
    assert code == 0, f"{out}\n{err}"
    lines = out.splitlines()
    plain = next(line for line in lines if line.startswith("plain session:"))
    assert "DATA_SOURCE_NOT_FOUND" in plain, out
    helper = next(line for line in lines if line.startswith("helper:"))
    assert "'python3'" in helper and "cannot import tether" in helper, helper
    assert "tether.spark.session()" in helper and f"PYSPARK_PYTHON={sys.executable}" in helper


def test_import_problem(tmp_path: Path) -> None:
    assert import_problem(sys.executable) is None
    missing = import_problem("no-such-python-for-tether")
    assert missing is not None and "not an executable found on PATH" in missing
    outside_the_environment(tmp_path)  # creates bin/python3, the base interpreter
    problem = import_problem(str(tmp_path / "bin" / "python3"))
    assert problem is not None and "No module named" in problem


def test_same_interpreter() -> None:
    assert _same_interpreter(sys.executable, sys.executable)
    # A virtual environment's python links to its base interpreter: not the same.
    assert not _same_interpreter(base_interpreter(), sys.executable)
