"""nsqjs, NSQ's Node.js client, against ``tether serve``: its Writer publishes over TCP,
its Reader finds the node through nsqlookupd's ``/lookup`` on Tether's HTTP port and
reads everything (one message requeued once). nsqjs is installed with npm into a
temporary directory; without node or npm the test is skipped, unless ``CI`` is set."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.testing import RunningServer, run_server

# Imported with --import-mode=importlib: the npm and node runner is a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from nodejs_support import npm_install, run_node

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


@pytest.fixture(scope="module")
def nsqjs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_install(tmp_path_factory, "nsqjs", ["nsqjs"], {"check.js": SCRIPT})


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


def test_nsqjs_writer_and_reader_through_lookupd(nsqjs: Path, server: RunningServer) -> None:
    result = run_node(
        nsqjs,
        "check.js",
        f"{server.host}:{server.nsq_port}",
        server.http_url,
        "nsqjs.topic",
    )
    assert "error" not in result, result
    assert sorted(result["seen"]) == [["four", 1], ["one", 1], ["three", 1], ["two", 2]]
