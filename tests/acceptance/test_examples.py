"""Every script in examples/ runs as its documentation says, against one live server.

A reader starts ``./scripts/serve`` (Tether on the default ports, SQLite store) and
runs the examples from the repository's root with ``.venv/bin/python examples/...``,
without activating the environment. Here the server runs on free ports (SQLite store
in a temporary directory), each command is given its address, this interpreter stands
in for ``.venv/bin/python``, and the interpreter's directory is taken off ``PATH``.

- ``examples/client/*.py``: the usage line of each script's docstring
  (``NATS_URL=... .venv/bin/python examples/client/...``).
- ``examples/spark_pipeline/``: the README's commands, in the README's order: produce
  orders, run the job, produce more, run it again with the same checkpoint (it must
  read the new orders, and only those), and the Parquet variant. These need PySpark
  and Java: without them they are skipped, except when ``CI`` is set (then they fail).

All examples share the one server, client examples first, so an example that takes
another's stream names fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.testing import RunningServer, run_server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PIPELINE_README = EXAMPLES / "spark_pipeline" / "README.md"
PYTHON = ".venv/bin/python"

CLIENT_TIMEOUT = 60.0
SPARK_TIMEOUT = 240.0

_USAGE = re.compile(r"^NATS_URL=\S+ (\.venv/bin/python examples/\S+\.py)\s*$", re.MULTILINE)
_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def client_commands() -> dict[str, list[str]]:
    """Each client example's usage line, by script path."""
    commands = {}
    for script in sorted((EXAMPLES / "client").glob("*.py")):
        m = _USAGE.search(script.read_text())
        assert m, f"{script.name}: no 'NATS_URL=... {PYTHON} examples/...' usage line"
        commands[script.relative_to(ROOT).as_posix()] = shlex.split(m.group(1))
    return commands


def readme_commands() -> list[list[str]]:
    """The ``.venv/bin/python examples/...`` commands of the pipeline README, in order."""
    commands = []
    for block in _SH_BLOCK.findall(PIPELINE_README.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:1] == [PYTHON] and argv[1].startswith("examples/"):
                commands.append(argv)
    return commands


def covered_scripts() -> set[str]:
    return set(client_commands()) | {argv[1] for argv in readme_commands()}


def environment() -> dict[str, str]:
    """A shell in which the virtual environment was not activated."""
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    path = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and os.path.abspath(d) != venv_bin
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    }
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    # Short-lived JVMs start about twice as fast without the optimizing JIT compiler.
    env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1".strip()
    return env


def start(argv: list[str], server: RunningServer, tmp: Path) -> subprocess.Popen[str]:
    """Start a documented command: this interpreter for ``.venv/bin/python``, the
    server's address, and ``/tmp/...`` paths moved under ``tmp``."""
    args = [sys.executable]
    for arg in argv[1:]:
        args.append(str(tmp / arg.removeprefix("/tmp/")) if arg.startswith("/tmp/") else arg)
    env = environment()
    if "client" in argv[1]:
        env["NATS_URL"] = server.url
    else:
        args += ["--servers", server.url]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n(killed after {timeout} s)"
    return proc.returncode, out, err


def succeeded(proc: subprocess.Popen[str], timeout: float) -> str:
    """The command's stdout, once it exited with status 0."""
    code, out, err = finish(proc, timeout)
    command = " ".join(map(str, proc.args))
    assert code == 0, f"{command} exited {code}\n{out}\n{err[-5000:]}"
    return out


def require_spark() -> None:
    reason = None
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        reason = "needs the spark extra (pyspark, pyarrow)"
    if reason is None and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        reason = "needs Java for a local Spark session"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set: CI must run the Spark examples)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:  # SQLite, as ./scripts/serve
        yield srv


def test_every_example_is_run() -> None:
    scripts = {p.relative_to(ROOT).as_posix() for p in EXAMPLES.rglob("*.py")}
    assert scripts, "no examples found"
    assert scripts == covered_scripts(), "examples without a documented command run here"


def test_client_examples(server: RunningServer, tmp_path: Path) -> None:
    procs = {name: start(argv, server, tmp_path) for name, argv in client_commands().items()}
    for proc in procs.values():
        assert succeeded(proc, CLIENT_TIMEOUT).strip()


def count_of(argv: list[str]) -> int:
    return int(argv[argv.index("--count") + 1]) if "--count" in argv else 5000


def parse_run(out: str) -> tuple[int, int]:
    """(messages read, windows in SHOP_REVENUE) as printed by pipeline.py."""
    read = re.search(r"^read (\d+) messages from SHOP_ORDERS", out, re.MULTILINE)
    windows = re.search(r"^SHOP_REVENUE holds (\d+) windows", out, re.MULTILINE)
    assert read and windows, out
    return int(read.group(1)), int(windows.group(1))


@pytest.mark.spark
@pytest.mark.timeout(4 * SPARK_TIMEOUT)
def test_spark_pipeline(server: RunningServer, tmp_path: Path) -> None:
    require_spark()
    commands = readme_commands()
    scripts = [Path(argv[1]).name for argv in commands]
    # The README's story: produce, run, produce more, run again; then the Parquet job.
    assert scripts == [
        "produce_orders.py",
        "pipeline.py",
        "produce_orders.py",
        "pipeline.py",
        "pipeline.py",
    ], commands
    produce1, run1, produce2, run2, parquet = commands
    assert run1 == run2 and "--sink" not in run1
    assert "parquet" in parquet

    out = succeeded(start(produce1, server, tmp_path), CLIENT_TIMEOUT)
    assert f"published {count_of(produce1)} orders" in out
    read, windows = parse_run(succeeded(start(run1, server, tmp_path), SPARK_TIMEOUT))
    assert read == count_of(produce1)
    assert windows > 0

    out = succeeded(start(produce2, server, tmp_path), CLIENT_TIMEOUT)
    assert f"published {count_of(produce2)} orders" in out
    # The second run and the Parquet job (its own checkpoint) side by side: each
    # starts a JVM, so they overlap their start-up.
    second = start(run2, server, tmp_path)
    to_parquet = start(parquet, server, tmp_path)
    read_again, windows_again = parse_run(succeeded(second, SPARK_TIMEOUT))
    assert read_again == count_of(produce2), "the second run reads the new orders, only those"
    assert windows_again >= windows
    out = succeeded(to_parquet, SPARK_TIMEOUT)
    assert f"read {count_of(produce1) + count_of(produce2)} messages" in out
    output = tmp_path / parquet[parquet.index("--output") + 1].removeprefix("/tmp/")
    assert list(output.glob("*.parquet")), "the Parquet job wrote no files"
