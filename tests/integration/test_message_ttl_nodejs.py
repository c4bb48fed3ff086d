"""nats.js (the ``@nats-io`` v3 packages) against ``tether serve``: a KV bucket with
``markerTTL`` (subject delete markers) whose key created with a TTL expires and reaches a
watcher as a ``PURGE``, and a stream's ``republish``. The packages are installed with npm
into a temporary directory; without node or npm the test is skipped, unless ``CI`` is set."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.testing import RunningServer, run_server

# Imported with --import-mode=importlib: the npm and node runner is a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from nodejs_support import npm_install, run_node

PACKAGES = ["@nats-io/transport-node", "@nats-io/jetstream", "@nats-io/kv"]

SCRIPT = r"""
const { connect } = require('@nats-io/transport-node')
const { Kvm } = require('@nats-io/kv')
const { jetstreamManager, jetstream } = require('@nats-io/jetstream')

const done = (result) => { console.log(JSON.stringify(result)); process.exit(0) }
setTimeout(() => done({ error: 'timeout' }), 20000)

async function main (url) {
  const nc = await connect({ servers: url })
  const out = {}
  // A KV bucket with delete markers and a key with its own TTL.
  const kv = await new Kvm(nc).create('SESS', { markerTTL: 1000 })
  out.markerTTL = (await kv.status()).markerTTL
  const ops = []
  const watch = await kv.watch()
  await kv.create('user', 'token', '1s')
  await kv.put('kept', 'v')
  for await (const e of watch) {
    ops.push([e.key, e.operation])
    if (e.key === 'user' && e.operation === 'PURGE') break
  }
  out.ops = ops
  out.gone = (await kv.get('user')) === null || (await kv.get('user')).operation !== 'PUT'
  out.kept = (await kv.get('kept')).string()
  // Republish.
  const jsm = await jetstreamManager(nc)
  await jsm.streams.add({ name: 'R', subjects: ['r.>'], republish: { src: 'r.>', dest: 'out.>' } })
  const sub = nc.subscribe('out.>', { max: 1 })
  await jetstream(nc).publish('r.a', 'one')
  for await (const m of sub) {
    out.republished = [m.subject, m.headers.get('Nats-Stream'), m.headers.get('Nats-Sequence'),
      m.headers.get('Nats-Last-Sequence'), m.string()]
  }
  await nc.close()
  done(out)
}
main(process.argv[2]).catch((err) => done({ error: String(err) }))
"""


@pytest.fixture(scope="module")
def natsjs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_install(tmp_path_factory, "natsjs", PACKAGES, {"check.js": SCRIPT})


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as srv:
        yield srv


def test_natsjs_kv_key_ttl_markers_and_republish(natsjs: Path, server: RunningServer) -> None:
    result = run_node(natsjs, "check.js", server.url)
    assert "error" not in result, result
    assert result["markerTTL"] == 1000
    assert result["ops"] == [["user", "PUT"], ["kept", "PUT"], ["user", "PURGE"]]
    assert result["gone"] is True and result["kept"] == "v"
    assert result["republished"] == ["out.a", "R", "1", "0", "one"]
