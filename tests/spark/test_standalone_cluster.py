"""The connector on a Spark standalone cluster: a master and two workers, each its own
process started from the pyspark installation, and a driver started by ``spark-submit``.

The application (``cluster_app.py``) runs a batch read, a streaming read feeding the
tether sink, and a batch write, all against ``tether serve``. Every read and write task
records the executor JVM it ran under (found from its Python worker's parent processes):
partitions are read in the executors, never in the driver. While the write's tasks wait
after publishing, one worker is killed with its executor (the whole process group, as
when a machine goes away); Spark runs the lost tasks again on the other worker and the
stream holds every row exactly once (the retried tasks reuse their message ids).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tether.client import connect
from tether.testing import RunningServer, run_server

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

APP = Path(__file__).with_name("cluster_app.py")
START_TIMEOUT = 60.0
JOB_TIMEOUT = 150.0
INPUT_ROWS = 2000
SINK_ROWS = 4000  # cluster_app.SINK_ROWS
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
# One core each: the two executors run one task at a time, so both get work.
WORKER_ARGS = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "1"]
WORKER_ARGS += ["--memory", "1g"]
FAST_JVM = "-XX:TieredStopAtLevel=1"  # short-lived JVMs start faster without the C2 JIT


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def java_or_skip() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if os.environ.get("CI") == "true":
            pytest.fail("Java is required for the Spark cluster test in CI")
        pytest.skip("needs Java for a Spark standalone cluster")


def spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,  # what executors run Python tasks with
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """The process and everything it started (executors, Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@dataclass
class Cluster:
    url: str
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)

    def worker_of(self, executor_pid: int) -> Daemon:
        """The worker whose process group holds an executor JVM."""
        group = os.getpgid(executor_pid)
        for worker in self.workers:
            if worker.proc.pid == group:
                return worker
        raise AssertionError(f"executor {executor_pid} belongs to no worker")


def start(name: str, args: list[str], tmp: Path) -> Daemon:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=spark_env(),
            cwd=tmp,
            start_new_session=True,  # its own process group: killed with its children
        )
    return Daemon(name, proc, log)


def wait_for(daemon: Daemon, pattern: str, count: int = 1) -> list[str]:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = re.findall(pattern, daemon.text())
        if len(found) >= count:
            return found
        if daemon.proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{daemon.name} did not log {pattern!r}:\n{daemon.text()[-3000:]}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    java_or_skip()
    master = start(
        "master",
        [MASTER, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
        tmp_path,
    )
    daemons = [master]
    try:
        url = wait_for(master, r"Starting Spark master at (spark://[\d.]+:\d+)")[0]
        cluster = Cluster(url, master)
        for i in (1, 2):
            work = tmp_path / f"work{i}"
            work.mkdir()
            worker = start(
                f"worker{i}",
                [WORKER, *WORKER_ARGS, "--work-dir", str(work), url],
                tmp_path,
            )
            daemons.append(worker)
            cluster.workers.append(worker)
        wait_for(master, r"Registering worker", count=2)
        yield cluster
    finally:
        for daemon in reversed(daemons):
            daemon.kill()


def submit(cluster: Cluster, servers: str, evidence: Path, tmp: Path) -> subprocess.Popen[str]:
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.url,
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        f"spark.executor.extraJavaOptions={FAST_JVM}",
        "--conf",
        f"spark.driver.extraJavaOptions={FAST_JVM}",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        # Jobs start once both executors are there, so that both get tasks.
        "--conf",
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
        "--conf",
        "spark.scheduler.maxRegisteredResourcesWaitingTime=60s",
        str(APP),
        servers,
        str(evidence),
    ]
    with (tmp / "driver.log").open("w") as log:
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=spark_env(),
            cwd=tmp,
        )


def evidence_lines(evidence: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(evidence.glob("*.json"))]


def kill_a_worker_mid_write(
    cluster: Cluster, evidence: Path, driver: subprocess.Popen[str]
) -> dict[str, Any]:
    """Once a write task has published and not finished, its worker goes; the task's
    evidence line is returned."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline and driver.poll() is None:
        lines = evidence_lines(evidence)
        done = {(e["executor"], e["partition"], e["attempt"]) for e in lines if e["what"] == "done"}
        for e in lines:
            key = (e["executor"], e["partition"], e["attempt"])
            if e["what"] == "published" and key not in done:
                cluster.worker_of(e["executor_pid"]).kill()
                return e
        time.sleep(0.05)
    output = driver.stdout.read() if driver.poll() is not None and driver.stdout else ""
    raise AssertionError(
        f"no write task was caught between publishing and finishing:\n{output[-5000:]}"
    )


def test_batch_streaming_and_sink_on_a_standalone_cluster(
    cluster: Cluster, tmp_path: Path, tools: Any
) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    with run_server(store="memory") as server:
        prepare(server, tools)
        driver = submit(cluster, server.url, evidence, tmp_path)
        try:
            killed = kill_a_worker_mid_write(cluster, evidence, driver)
            out, _ = driver.communicate(timeout=JOB_TIMEOUT)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
            if driver.stdout is not None:
                driver.stdout.close()  # a failed run must not leave the pipe to a later test
        log = (tmp_path / "driver.log").read_text(errors="replace")
        assert driver.returncode == 0, log[-5000:]
        result = json.loads(out.split("RESULT ", 1)[1])
        assert result["master"] == cluster.url

        lines = evidence_lines(evidence)
        by_job = {job: [e for e in lines if e["job"] == job] for job in ("batch", "stream", "sink")}
        # Every read and write task ran in an executor JVM, and both executors worked.
        for job, entries in by_job.items():
            assert entries, job
            assert all(e["executor_pid"] > 0 and e["executor"] for e in entries), entries
        assert len({e["executor"] for e in by_job["batch"]}) == 2
        assert len({e["partition"] for e in by_job["batch"]}) >= 4

        # The batch read and the streaming copy saw every input message once.
        assert result["batch_rows"] == result["batch_distinct"] == INPUT_ROWS
        assert count(tools, server.url, "COUT") == INPUT_ROWS

        # The task that had published on the killed worker ran again on the other one;
        # the sink holds each row once.
        again = [
            e
            for e in by_job["sink"]
            if e["what"] == "done"
            and e["partition"] == killed["partition"]
            and e["executor"] != killed["executor"]
        ]
        assert again, by_job["sink"]
        assert count(tools, server.url, "CSINK") == SINK_ROWS
        values = sorted(int(v) for v in read_values(server.url, "CSINK"))
        assert values == list(range(SINK_ROWS))


def prepare(server: RunningServer, tools: Any) -> None:
    tools.make_stream(server.url, "CIN", ["CIN.>"], tools.numbered("CIN.a", 0, INPUT_ROWS))
    tools.make_stream(server.url, "COUT", ["COUT.>"])
    tools.make_stream(server.url, "CSINK", ["CSINK.>"])


def count(tools: Any, url: str, stream: str) -> int:
    return int(tools.api(url, f"STREAM.INFO.{stream}")["state"]["messages"])


def read_values(url: str, stream: str) -> list[bytes]:

    async def go() -> list[bytes]:
        nc = await connect(url)
        try:
            js = nc.jetstream(timeout=10)
            info = await js.api(f"STREAM.INFO.{stream}")
            out = []
            for seq in range(1, int(info["state"]["last_seq"]) + 1):
                got = await js.api(f"STREAM.MSG.GET.{stream}", {"seq": seq})
                out.append(base64.b64decode(got["message"]["data"]))
            return out
        finally:
            await nc.close()

    return asyncio.run(go())
