"""nsqjs, NSQ's Node.js client, against ``tether serve``: its Writer publishes over TCP,
its Reader finds the node through nsqlookupd's ``/lookup`` on Tether's HTTP port and
reads everything (one message requeued once). nsqjs is installed with npm into a
temporary directory; without node or npm the test is skipped, unless ``CI`` is set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tether.testing import RunningServer, run_server

SCRIPT = r"""
const nsq = require('nsqjs')
const [tcp, lookupd, topic] = process.argv.slice(2)
const [host, port] = tcp.split(':')
const seen = []
let requeued = false
const done = (result) => { console.log(JSON.stringify(result)); process.exit(0) }
setTimeout(() => done({error: 'timeout', seen}), 20000)
const writer = new nsq.Writer(host, Number(port))
writer.on('error', (err) => done({error: 'writer: ' + err, seen}))
writer.on('ready', () => {
  writer.publish(topic, 'one', (err) => {
    if (err) return done({error: 'publish: ' + err, seen})
    writer.publish(topic, ['two', 'three', 'four'], (err2) => {
      if (err2) return done({error: 'mpub: ' + err2, seen})
      const reader = new nsq.Reader(topic, 'js', {
        lookupdHTTPAddresses: [lookupd], lookupdPollInterval: 1, maxInFlight: 4,
      })
      reader.on('error', (err3) => done({error: 'reader: ' + err3, seen}))
      reader.on('message', (msg) => {
        const body = msg.body.toString()
        if (body === 'two' && !requeued) {
          requeued = true
          msg.requeue(0, false)
          return
        }
        seen.push([body, msg.attempts])
        msg.finish()
        if (seen.length === 4) {
          reader.close()
          writer.close()
          done({seen})
        }
      })
      reader.connect()
    })
  })
})
writer.connect()
"""


def _missing(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: nsqjs must be tested)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def nsqjs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node and npm are needed to test nsqjs")
    where = tmp_path_factory.mktemp("nsqjs")
    (where / "package.json").write_text('{"name": "nsqjs-check", "private": true}')
    done = subprocess.run(
        [str(npm), "install", "--no-audit", "--no-fund", "--silent", "nsqjs"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        _missing(f"npm install nsqjs failed: {done.stderr.strip()[-500:]}")
    (where / "check.js").write_text(SCRIPT)
    yield where


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


def test_nsqjs_writer_and_reader_through_lookupd(nsqjs: Path, server: RunningServer) -> None:
    done = subprocess.run(
        [
            "node",
            "check.js",
            f"{server.host}:{server.nsq_port}",
            server.http_url,
            "nsqjs.topic",
        ],
        cwd=nsqjs,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    assert sorted(result["seen"]) == [["four", 1], ["one", 1], ["three", 1], ["two", 2]]
