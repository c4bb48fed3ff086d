"""nsqjs, NSQ's Node.js client, against ``tether serve``: its Writer publishes over TCP,
its Reader finds the node through nsqlookupd's ``/lookup`` on Tether's HTTP port and
reads everything (one message requeued once); and both over TLS, with snappy and with
deflate inside it. nsqjs is installed with npm into a temporary directory; without node
or npm the test is skipped, unless ``CI`` is set."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

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


# Writer and Reader over TLS (the CA in NODE_EXTRA_CA_CERTS), with a compression.
TLS_SCRIPT = r"""
const nsq = require('nsqjs')
const [host, port, topic, compression] = process.argv.slice(2)
const options = {tls: true, tlsVerification: true}
if (compression) options[compression] = true
const got = []
const done = (result) => { console.log(JSON.stringify(result)); process.exit(0) }
setTimeout(() => done({error: 'timeout', got}), 20000)
const writer = new nsq.Writer(host, Number(port), options)
writer.on('error', (err) => done({error: 'writer: ' + err, got}))
writer.on('ready', () => {
  writer.publish(topic, ['x'.repeat(3000), 'small', 'last'], (err) => {
    if (err) return done({error: 'mpub: ' + err, got})
    const reader = new nsq.Reader(topic, 'js', {
      nsqdTCPAddresses: [host + ':' + port], maxInFlight: 10, ...options,
    })
    reader.on('error', (err2) => done({error: 'reader: ' + err2, got}))
    reader.on('message', (msg) => {
      got.push(msg.body.toString().length)
      msg.finish()
      if (got.length === 3) {
        reader.close()
        writer.close()
        done({got})
      }
    })
    reader.connect()
  })
})
writer.connect()
"""


@pytest.fixture(scope="module")
def nsqjs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_install(
        tmp_path_factory, "nsqjs", ["nsqjs"], {"check.js": SCRIPT, "tls.js": TLS_SCRIPT}
    )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    tmp = tmp_path_factory.mktemp("nsqjs-tls")
    cert.cert_chain_pems[0].write_to_path(tmp / "cert.pem")
    cert.private_key_pem.write_to_path(tmp / "key.pem")
    ca.cert_pem.write_to_path(tmp / "ca.pem")
    conf = tmp / "tether.toml"
    conf.write_text(f'nsq_tls_cert = "{tmp / "cert.pem"}"\nnsq_tls_key = "{tmp / "key.pem"}"\n')
    with run_server(store="memory", args=["--config", str(conf)]) as srv:
        yield srv, str(tmp / "ca.pem")


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


@pytest.mark.parametrize("compression", ["", "snappy", "deflate"])
def test_nsqjs_over_tls(
    nsqjs: Path,
    tls_server: tuple[RunningServer, str],
    compression: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, ca = tls_server
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", ca)
    topic = f"nsqjs.tls{compression}"
    result = run_node(nsqjs, "tls.js", server.host, str(server.nsq_port), topic, compression)
    assert "error" not in result, result
    assert sorted(result["got"]) == [4, 5, 3000]
