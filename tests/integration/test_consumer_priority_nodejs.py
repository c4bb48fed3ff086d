"""nats.js (the ``@nats-io`` v3 packages) against ``tether serve``: a ``pinned_client``
consumer through the library's own priority group support (it keeps the pin id it is
given and sends it back), ``unpin``, an ``overflow`` fetch, and consumer reset when the
server's version lets nats.js use it. Without node or npm the test is skipped, unless
``CI`` is set (see ``nodejs_support``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.testing import RunningServer, run_server

sys.path.insert(0, str(Path(__file__).parent))
from nodejs_support import npm_install, run_node

PACKAGES = ["@nats-io/transport-node", "@nats-io/jetstream"]

SCRIPT = r"""
const { connect } = require('@nats-io/transport-node')
const { jetstreamManager, jetstream } = require('@nats-io/jetstream')

const done = (result) => { console.log(JSON.stringify(result)); process.exit(0) }
setTimeout(() => done({ error: 'timeout' }), 30000)

async function take (consumer, opts) {
  const got = []
  const pins = []
  const iter = await consumer.fetch(opts)
  for await (const m of iter) {
    got.push(m.string())
    pins.push(m.headers ? m.headers.get('Nats-Pin-Id') : '')
    m.ack()
  }
  return { got, pins }
}

async function main (url) {
  const nc = await connect({ servers: url })
  const out = { version: nc.info.version }
  const jsm = await jetstreamManager(nc)
  const js = jetstream(nc)
  await jsm.streams.add({ name: 'PG', subjects: ['pg.>'] })
  await jsm.consumers.add('PG', {
    durable_name: 'workers', ack_policy: 'explicit',
    priority_groups: ['jobs'], priority_policy: 'pinned_client'
  })
  for (let i = 0; i < 6; i++) await js.publish('pg.a', `m${i}`)
  const first = await js.consumers.get('PG', 'workers')
  const a = await take(first, { max_messages: 4, expires: 1000, group: 'jobs' })
  out.first = a.got
  out.onePin = new Set(a.pins).size === 1 && a.pins[0] !== ''
  const info = await jsm.consumers.info('PG', 'workers')
  out.infoPin = info.priority_groups[0].pinned_client_id === a.pins[0]
  // A pull without the pin (another client, or a later fetch: nats.js keeps the pin
  // for one fetch) gets nothing while the pin holds; after an unpin it takes over.
  const second = await js.consumers.get('PG', 'workers')
  out.standby = (await take(second, { max_messages: 1, expires: 1000, group: 'jobs' })).got
  await jsm.consumers.unpin('PG', 'workers', 'jobs')
  const c = await take(second, { max_messages: 2, expires: 1000, group: 'jobs' })
  out.afterUnpin = c.got
  out.newPin = c.pins[0] !== '' && c.pins[0] !== a.pins[0]
  // Overflow: a backup pull only gets messages past its threshold.
  await jsm.consumers.add('PG', {
    durable_name: 'backup', ack_policy: 'explicit',
    priority_groups: ['jobs'], priority_policy: 'overflow'
  })
  const backup = await js.consumers.get('PG', 'backup')
  out.belowThreshold = (await take(backup, { max_messages: 1, expires: 1000, group: 'jobs', min_pending: 100 })).got
  out.pastThreshold = (await take(backup, { max_messages: 1, expires: 1000, group: 'jobs', min_pending: 6 })).got
  try {
    const r = await jsm.consumers.reset('PG', 'backup', 3)
    out.reset = { seq: r.reset_seq }
  } catch (err) {
    out.reset = { error: String(err) }
  }
  await nc.close()
  done(out)
}
main(process.argv[2]).catch((err) => done({ error: String(err) }))
"""


@pytest.fixture(scope="module")
def natsjs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return npm_install(tmp_path_factory, "natsjs-priority", PACKAGES, {"check.js": SCRIPT})


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server(store="memory") as srv:
        yield srv


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("-")[0].split(".")[:3])


def test_natsjs_priority_groups(natsjs: Path, server: RunningServer) -> None:
    result = run_node(natsjs, "check.js", server.url, timeout=90)
    assert "error" not in result, result
    assert result["first"] == ["m0", "m1", "m2", "m3"]
    assert result["onePin"] is True and result["infoPin"] is True
    assert result["standby"] == []
    assert result["afterUnpin"] == ["m4", "m5"]
    assert result["newPin"] is True
    assert result["belowThreshold"] == []
    assert result["pastThreshold"] == ["m0"]
    if _version(result["version"]) >= (2, 14, 0):
        assert result["reset"] == {"seq": 3}
    else:  # nats.js only sends a reset to a server that reports 2.14 or later
        assert "error" in result["reset"]
