// Tether's dashboard: a hash-routed page over the server's JSON (see dashboard.py).
// Every text from the server goes into the page as textContent, never as HTML.

const main = document.getElementById("main");
let session = { csrf: "", may_act: false, needs_login: false, contents: false };
let timer = null;
let route = "";
const history = {}; // samples kept while the page is open: key -> [[t, value], ...]
const HISTORY = 120;

// -- helpers ---------------------------------------------------------------------------------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : n ?? "");
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (d ? `${d}d` : "") + (d || hh ? `${hh}h` : "") + (d || hh || m ? `${m}m` : "") + `${sec}s`;
}
function authHeaders() {
  const creds = sessionStorage.getItem("tether-basic");
  return creds ? { authorization: `Basic ${creds}` } : {};
}
async function getJSON(url) {
  const r = await fetch(url, { headers: authHeaders(), cache: "no-store" });
  if (!r.ok) {
    let msg = `${r.status}`;
    try { msg = (await r.json()).error || msg; } catch { /* not JSON */ }
    throw new Error(msg);
  }
  return r.json();
}
async function post(url, body) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", "x-tether-csrf": session.csrf, ...authHeaders() },
    body: JSON.stringify(body || {}),
  });
  let data = {};
  try { data = await r.json(); } catch { /* empty */ }
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}
function toast(text, error = false) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = "show" + (error ? " error" : "");
  clearTimeout(el._t);
  el._t = setTimeout(() => (el.className = ""), 4000);
}
function sample(key, value, t = Date.now() / 1000) {
  const list = (history[key] ||= []);
  list.push([t, value]);
  if (list.length > HISTORY) list.shift();
  return list;
}
function rates(list) {
  const out = [];
  for (let i = 1; i < list.length; i++) {
    const dt = list[i][0] - list[i - 1][0];
    out.push(dt > 0 ? Math.max(0, (list[i][1] - list[i - 1][1]) / dt) : 0);
  }
  return out;
}
function spark(values, height = 40, cls = "") {
  // A short history fills a quarter of the width at least, then grows to HISTORY.
  const width = Math.max(values.length, HISTORY / 4);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  if (cls) svg.setAttribute("class", cls);
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${width - values.length + i},${height - 2 - (v / max) * (height - 4)}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#2563eb");
  line.setAttribute("stroke-width", "1.5");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  svg.append(line);
  return svg;
}
function card(label, value, extra = null, small = false) {
  return h("div", { class: "card", "data-card": label },
    h("div", { class: "label" }, label),
    h("div", { class: "value" + (small ? " small" : "") }, value), extra);
}
function actionButton(label, cls, fn) {
  const b = h("button", { class: cls, disabled: !session.may_act, title: session.may_act ? null : session.refusal || "log in to act" }, label);
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await fn(); } catch (e) { toast(e.message, true); } finally { b.disabled = !session.may_act; }
    refresh();
  });
  return b;
}
function table(headers, rows) {
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map(([t, num]) => h("th", { class: num ? "num" : null }, t)))),
    h("tbody", {}, rows));
}

// -- session ----------------------------------------------------------------------------------
async function loadSession() {
  session = await getJSON("/ui/api/session");
  const box = document.getElementById("session");
  box.replaceChildren();
  if (session.read_only) box.append(h("span", { class: "badge ro" }, "read-only"));
  if (session.logged_in) {
    box.append(h("span", {}, `signed in as ${session.user}`),
      h("button", { class: "secondary", onclick: () => { sessionStorage.removeItem("tether-basic"); start(); } }, "Sign out"));
  } else if (session.needs_login && !session.read_only) {
    const user = h("input", { placeholder: "user", value: session.user, "aria-label": "user", id: "login-user" });
    const pass = h("input", { placeholder: "password", type: "password", "aria-label": "password", id: "login-password" });
    const form = h("form", { class: "toolbar", style: "margin:0" }, user, pass, h("button", { type: "submit" }, "Sign in"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const creds = btoa(unescape(encodeURIComponent(`${user.value}:${pass.value}`)));
      sessionStorage.setItem("tether-basic", creds);
      try {
        await post("/ui/api/login");
        await start();
      } catch (e) {
        sessionStorage.removeItem("tether-basic");
        toast(e.message, true);
      }
    });
    box.append(form);
  }
}

// -- pages ------------------------------------------------------------------------------------
async function overview() {
  const o = await getJSON("/ui/api/overview");
  const t = o.now;
  const pub = rates(sample("stored", o.stored_total ?? o.in_msgs, t));
  const del = rates(sample("delivered", o.delivered_total ?? o.out_msgs, t));
  const lag = sample("lag", o.lag ?? 0, t).map((p) => p[1]);
  const last = (list) => (list.length ? Math.round(list[list.length - 1]) : 0);
  return [
    h("h1", {}, o.server_name || o.server_id),
    h("div", { class: "cards" },
      card("Version", o.version, null, true),
      card("Uptime", duration(o.uptime_seconds)),
      card("Store", o.store, null, true),
      card("Sync", o.sync, null, true),
      card("Connections", fmt(o.connections)),
      card("Streams", fmt(o.streams ?? 0)),
      card("Messages", fmt(o.messages ?? 0), h("div", { class: "muted" }, bytes(o.bytes ?? 0))),
      card("Consumers", fmt(o.consumers ?? 0)),
      card("Publish rate (msg/s)", fmt(last(pub)), spark(pub)),
      card("Deliver rate (msg/s)", fmt(last(del)), spark(del)),
      card("Lag (pending, all consumers)", fmt(o.lag ?? 0), spark(lag)),
      card("Ack pending", fmt(o.ack_pending ?? 0)),
      card("Dead letters", fmt(o.dead ?? 0)),
      card("Slow consumers", fmt(o.slow_consumers)),
      card("NATS in / out (msgs)", `${fmt(o.in_msgs)} / ${fmt(o.out_msgs)}`, null, true),
    ),
    h("h2", {}, "Furthest behind"),
    (o.behind || []).length
      ? table([["Stream"], ...CONSUMER_HEADERS], consumerRows(o.behind, true))
      : h("p", { class: "muted" }, "No consumer is behind and nothing is dead."),
  ];
}

function consumerRows(list, withStream = false) {
  return list.map((c) => h("tr", { class: c.pending > 0 ? "lagging" : null, "data-consumer": c.name },
    withStream ? h("td", {}, h("a", { href: `#/stream/${encodeURIComponent(c.stream)}` }, c.stream)) : null,
    h("td", {}, h("a", { href: `#/consumer/${encodeURIComponent(c.stream)}/${encodeURIComponent(c.name)}` }, c.name)),
    h("td", {}, c.pull ? "pull" : "push"),
    h("td", { class: "num lag" }, fmt(c.pending)),
    h("td", { class: "num" }, fmt(c.ack_pending)),
    h("td", { class: "num" }, fmt(c.redelivered)),
    h("td", { class: "num dead-count" + (c.dead ? " some" : "") }, fmt(c.dead)),
    h("td", { class: "num" }, fmt(c.waiting)),
    h("td", { class: "num" }, fmt(c.delivered)),
    h("td", {}, c.last_active || "never")));
}
const CONSUMER_HEADERS = [["Consumer"], ["Kind"], ["Lag (pending)", 1], ["Ack pending", 1], ["Redelivered", 1], ["Dead", 1], ["Waiting pulls", 1], ["Delivered", 1], ["Last active"]];

async function streams() {
  const { streams } = await getJSON("/ui/api/streams");
  for (const s of streams) sample(`stream:${s.name}`, s.last_seq);
  return [
    h("h1", {}, "Streams"),
    streams.length ? table(
      [["Stream"], ["Subjects"], ["Messages", 1], ["Bytes", 1], ["First seq", 1], ["Last seq", 1], ["Rate (msg/s)", 1], ["Consumers", 1], ["Lag", 1], ["Dead", 1]],
      streams.map((s) => {
        const r = rates(history[`stream:${s.name}`] || []);
        return h("tr", { "data-stream": s.name },
          h("td", {}, h("a", { href: `#/stream/${encodeURIComponent(s.name)}` }, s.name)),
          h("td", {}, s.subjects.join(", ")),
          h("td", { class: "num" }, fmt(s.messages)),
          h("td", { class: "num" }, bytes(s.bytes)),
          h("td", { class: "num" }, fmt(s.first_seq)),
          h("td", { class: "num" }, fmt(s.last_seq)),
          h("td", { class: "num" }, fmt(r.length ? Math.round(r[r.length - 1]) : 0)),
          h("td", { class: "num" }, fmt(s.consumers)),
          h("td", { class: "num" }, fmt(s.lag)),
          h("td", { class: "num dead-count" + (s.dead ? " some" : "") }, fmt(s.dead)));
      })) : h("p", { class: "muted" }, "No streams yet."),
  ];
}

const browser = { stream: "", start: "", subject: "", mode: {} };

function payloadView(m) {
  const key = `${m.seq}`;
  const p = m.payload;
  let json = null;
  if (p.text !== null) { try { json = JSON.stringify(JSON.parse(p.text), null, 2); } catch { /* not JSON */ } }
  const mode = browser.mode[key] || (json ? "json" : p.text !== null ? "text" : "hex");
  const body = mode === "json" ? json : mode === "text" ? p.text : p.hex.replace(/(..)/g, "$1 ").trim();
  const buttons = ["text", "json", "hex"].filter((x) => (x === "json" ? json : x === "text" ? p.text !== null : true))
    .map((x) => h("button", { class: "secondary", disabled: x === mode, onclick: () => { browser.mode[key] = x; refresh(); } }, x));
  return h("div", {}, h("div", { class: "payload-modes" }, buttons,
    h("span", { class: "muted" }, ` ${bytes(p.size)}${p.truncated ? " (truncated)" : ""}`)), h("pre", { class: "payload" }, body ?? ""));
}

async function streamPage(name) {
  if (browser.stream !== name) Object.assign(browser, { stream: name, start: "", subject: "", mode: {} });
  const s = await getJSON(`/ui/api/streams/${encodeURIComponent(name)}`);
  const rate = rates(sample(`stream:${s.name}`, s.last_seq));
  const out = [
    h("h1", {}, `Stream ${s.name}`),
    h("div", { class: "cards" },
      card("Messages", fmt(s.messages)), card("Bytes", bytes(s.bytes)),
      card("Rate (msg/s)", fmt(rate.length ? Math.round(rate[rate.length - 1]) : 0), spark(rate)),
      card("Lag (all consumers)", fmt(s.lag)), card("Dead letters", fmt(s.dead)),
      card("First seq", fmt(s.first_seq)), card("Last seq", fmt(s.last_seq)),
      card("Subjects", s.subjects.join(", "), null, true), card("Retention", s.retention, null, true)),
    h("h2", {}, "Consumers"),
    s.consumer_list.length ? table(CONSUMER_HEADERS, consumerRows(s.consumer_list)) : h("p", { class: "muted" }, "No consumers."),
    s.consumers > s.consumer_list.length ? h("p", { class: "muted" }, `The ${s.consumer_list.length} furthest behind of ${fmt(s.consumers)}; /metrics has every one.`) : null,
    h("h2", {}, "Messages"),
  ];
  if (!session.contents) {
    out.push(h("p", { class: "muted" }, "Message contents need the admin's credentials: sign in."));
    return out;
  }
  const q = new URLSearchParams({ limit: "25" });
  if (browser.start) q.set("start", browser.start);
  if (browser.subject) q.set("subject", browser.subject);
  const page = await getJSON(`/ui/api/streams/${encodeURIComponent(name)}/messages?${q}`);
  const subject = h("input", { placeholder: "subject filter (wildcards)", value: browser.subject, id: "subject-filter" });
  const start = h("input", { placeholder: "from sequence", value: browser.start, size: 10, id: "start-seq" });
  const go = () => { browser.subject = subject.value.trim(); browser.start = start.value.trim(); refresh(); };
  subject.addEventListener("change", go);
  start.addEventListener("change", go);
  const msgs = page.messages;
  out.push(h("div", { class: "toolbar" }, subject, start,
    h("button", { onclick: go }, "Show"),
    h("button", { class: "secondary", onclick: () => { browser.start = ""; refresh(); } }, "Newest"),
    h("button", { class: "secondary", disabled: !msgs.length, onclick: () => { browser.start = String(Math.max(1, msgs[0].seq - 25)); refresh(); } }, "◀ Older"),
    h("button", { class: "secondary", disabled: !msgs.length, onclick: () => { browser.start = String(msgs[msgs.length - 1].seq + 1); refresh(); } }, "Newer ▶")));
  out.push(msgs.length ? table([["Seq", 1], ["Subject"], ["Time"], ["Headers"], ["Payload"]],
    msgs.map((m) => h("tr", { "data-seq": m.seq },
      h("td", { class: "num" }, m.seq), h("td", {}, m.subject), h("td", {}, m.time),
      h("td", {}, m.headers.map(([k, v]) => h("div", {}, `${k}: ${v}`))),
      h("td", {}, payloadView(m))))) : h("p", { class: "muted" }, "No messages here."));
  return out;
}

async function consumerPage(stream, name) {
  const c = await getJSON(`/ui/api/streams/${encodeURIComponent(stream)}/consumers/${encodeURIComponent(name)}`);
  const lag = sample(`lag:${stream}/${name}`, c.pending).map((p) => p[1]);
  const base = `/ui/api/streams/${encodeURIComponent(stream)}/consumers/${encodeURIComponent(name)}/dead`;
  const out = [
    h("h1", {}, `Consumer ${c.name} `, h("span", { class: "muted" }, `of `, h("a", { href: `#/stream/${encodeURIComponent(stream)}` }, stream))),
    h("div", { class: "cards" },
      card("Lag (pending)", fmt(c.pending)), card("Ack pending", fmt(c.ack_pending)),
      card("Redelivered", fmt(c.redelivered)), card("Dead", fmt(c.dead)),
      card("Waiting pulls", fmt(c.waiting)), card("Delivered", fmt(c.delivered)),
      card("Acked (since start)", fmt(c.acked)), card("Last active", c.last_active || "never", null, true),
      card("Kind", `${c.pull ? "pull" : "push"}, ack ${c.ack_policy}`, null, true),
      card("Filter", c.filter || "(all)", null, true)),
    h("h2", {}, "Lag over time"),
    h("div", { class: "chart", id: "lag-chart" }, spark(lag, 120), h("div", { class: "muted" }, `${lag.length} samples, newest ${fmt(c.pending)}`)),
    h("h2", {}, `Dead letters (${fmt(c.dead)})`),
  ];
  if (c.http_owned) {
    out.push(h("p", {}, "This consumer belongs to the webhook-broker API: its dead letters are dead jobs, acted on from ", h("a", { href: "#/jobs" }, "Webhook jobs"), "."));
  } else {
    out.push(h("div", { class: "toolbar" },
      actionButton("Requeue all", "", async () => toast(`requeued ${(await post(`${base}/requeue`)).requeued}`)),
      actionButton("Delete all", "danger", async () => toast(`deleted ${(await post(`${base}/delete`)).deleted}`))));
  }
  out.push(c.dead_letters.length ? table([["Seq", 1], ["Subject"], ["Deliveries", 1], ["Reason"], ["Last error"], ["Since"], [""]],
    c.dead_letters.map((d) => h("tr", { "data-dead": d.seq },
      h("td", { class: "num" }, d.seq), h("td", {}, d.subject ?? ""), h("td", { class: "num" }, d.deliveries),
      h("td", {}, d.reason), h("td", {}, d.detail || ""), h("td", {}, d.time),
      h("td", {}, c.http_owned ? "" : [
        actionButton("Requeue", "", async () => toast(`requeued ${(await post(`${base}/requeue`, { seq: d.seq })).requeued}`)), " ",
        actionButton("Delete", "danger", async () => toast(`deleted ${(await post(`${base}/delete`, { seq: d.seq })).deleted}`))])))) : h("p", { class: "muted" }, "None."));
  return out;
}

async function jobsPage() {
  const { channels } = await getJSON("/ui/api/jobs");
  const out = [h("h1", {}, "Webhook-broker jobs")];
  if (!channels.length) out.push(h("p", { class: "muted" }, "No channels."));
  for (const ch of channels) {
    out.push(h("h2", {}, `Channel ${ch.name} `, h("span", { class: "muted" }, `(${ch.id})`)));
    if (!ch.consumers.length) { out.push(h("p", { class: "muted" }, "No consumers.")); continue; }
    out.push(table([["Consumer"], ["Type"], ["Queued", 1], ["In flight", 1], ["Dead", 1], ["Delivered", 1], ["Dead jobs"]],
      ch.consumers.map((k) => {
        const base = `/ui/api/jobs/${encodeURIComponent(ch.id)}/${encodeURIComponent(k.id)}/dead`;
        return h("tr", { "data-job-consumer": k.id },
          h("td", {}, k.name, h("div", { class: "muted" }, k.callback)), h("td", {}, k.type),
          h("td", { class: "num" }, fmt(k.queued)), h("td", { class: "num" }, fmt(k.inflight)),
          h("td", { class: "num dead-count" + (k.dead ? " some" : "") }, fmt(k.dead)), h("td", { class: "num" }, fmt(k.delivered)),
          h("td", {}, k.dead ? [
            h("div", { class: "toolbar" },
              actionButton("Requeue all", "", async () => toast(`requeued ${(await post(`${base}/requeue`)).requeued}`)),
              actionButton("Delete all", "danger", async () => toast(`deleted ${(await post(`${base}/delete`)).deleted}`))),
            ...k.dead_jobs.map((j) => h("div", { "data-job": j.id }, `${j.id} (${j.retries} retries, ${j.changed}) `,
              actionButton("Requeue", "", async () => toast(`requeued ${(await post(`${base}/requeue`, { job: j.id })).requeued}`)), " ",
              actionButton("Delete", "danger", async () => toast(`deleted ${(await post(`${base}/delete`, { job: j.id })).deleted}`))))] : ""));
      })));
  }
  return out;
}

async function nsqPage() {
  let stats;
  try { stats = await getJSON("/stats?format=json"); } catch (e) {
    return [h("h1", {}, "NSQ"), h("p", { class: "muted" }, `The NSQ front door is off (${e.message}).`)];
  }
  const topics = stats.topics || [];
  const out = [h("h1", {}, "NSQ topics")];
  if (!topics.length) out.push(h("p", { class: "muted" }, "No topics."));
  for (const t of topics) {
    out.push(h("h2", {}, `Topic ${t.topic_name}`), h("div", { class: "cards" },
      card("Depth", fmt(t.depth)), card("Messages", fmt(t.message_count)), card("Paused", t.paused ? "yes" : "no")));
    out.push((t.channels || []).length ? table([["Channel"], ["Depth", 1], ["In flight", 1], ["Deferred", 1], ["Requeued", 1], ["Timed out", 1], ["Messages", 1], ["Clients", 1]],
      t.channels.map((c) => h("tr", {}, h("td", {}, c.channel_name), h("td", { class: "num" }, fmt(c.depth)),
        h("td", { class: "num" }, fmt(c.in_flight_count)), h("td", { class: "num" }, fmt(c.deferred_count)),
        h("td", { class: "num" }, fmt(c.requeue_count)), h("td", { class: "num" }, fmt(c.timeout_count)),
        h("td", { class: "num" }, fmt(c.message_count)), h("td", { class: "num" }, fmt((c.clients || []).length))))) : h("p", { class: "muted" }, "No channels."));
  }
  return out;
}

async function connectionsPage() {
  const c = await getJSON("/connz?subs=1");
  return [h("h1", {}, `Connections (${fmt(c.total)})`),
    c.connections.length ? table([["cid", 1], ["Address"], ["Name"], ["Client"], ["Uptime"], ["Idle"], ["Subs", 1], ["In msgs", 1], ["Out msgs", 1], ["Pending", 1]],
      c.connections.map((x) => h("tr", {}, h("td", { class: "num" }, x.cid), h("td", {}, `${x.ip}:${x.port}`), h("td", {}, x.name || ""),
        h("td", {}, [x.lang, x.version].filter(Boolean).join(" ")), h("td", {}, x.uptime), h("td", {}, x.idle),
        h("td", { class: "num" }, fmt(x.subscriptions)), h("td", { class: "num" }, fmt(x.in_msgs)),
        h("td", { class: "num" }, fmt(x.out_msgs)), h("td", { class: "num" }, bytes(x.pending_bytes))))) : h("p", { class: "muted" }, "No clients connected.")];
}

// -- routing ----------------------------------------------------------------------------------
function pageFor(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  switch (parts[0]) {
    case "": return ["overview", overview];
    case "streams": return ["streams", streams];
    case "stream": return ["streams", () => streamPage(parts[1])];
    case "consumer": return ["streams", () => consumerPage(parts[1], parts[2])];
    case "jobs": return ["jobs", jobsPage];
    case "nsq": return ["nsq", nsqPage];
    case "connections": return ["connections", connectionsPage];
    default: return ["overview", overview];
  }
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  const [name, build] = pageFor(location.hash);
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === name));
  try {
    const content = await build();
    // Keep what the user is typing: a refresh must not steal focus from an input.
    const focused = document.activeElement && document.activeElement.id;
    main.replaceChildren(...content.flat().filter((c) => c !== null && c !== undefined));
    main.dataset.page = name;
    main.dataset.updated = String(Date.now());
    if (focused) document.getElementById(focused)?.focus();
  } catch (e) {
    main.replaceChildren(h("p", { class: "muted" }, `Could not load: ${e.message}`));
  } finally {
    busy = false;
  }
}

async function start() {
  try { await loadSession(); } catch (e) { main.replaceChildren(h("p", {}, `Could not load: ${e.message}`)); return; }
  refresh();
}

window.addEventListener("hashchange", () => { route = location.hash; refresh(); });
clearInterval(timer);
timer = setInterval(() => {
  if (document.activeElement && document.activeElement.tagName === "INPUT") return;
  refresh();
}, 1000);
start();
