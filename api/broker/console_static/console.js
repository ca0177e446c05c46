// kraftlog's web console: one page, no framework, no build step. Every view
// reads the broker's JSON endpoints (the same the CLI uses), so what it shows
// and may change is what the caller's credentials allow. Routes live in the
// URL's hash, so every view is a link: #/, #/topics, #/topics/NAME,
// #/topics/NAME/messages, #/groups, #/groups/ID.
"use strict";

const POLL_MS = 2000;
const SAMPLES = 60;
let timers = [];
// Bumped on every navigation: a view or a tick of an older one stops
// instead of drawing over the page now shown.
let generation = 0;
const history = { rates: [], lag: {}, topics: {} };

// -- helpers -----------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

class BrokerError extends Error {}
class LoginNeeded extends BrokerError {}

// A SASL_SSL cluster: a user's name and password (HTTP Basic, inside TLS)
// or a delegation token (Bearer), sent with each call and kept for this tab
// only. A browser holding a client certificate the cluster trusts needs
// neither: the TLS handshake names it.
const LOGIN_KEY = "kraftlog-login";

function loginView(main, why) {
  const user = el("input", { id: "login-user", autocomplete: "username", required: true });
  const password = el("input", { id: "login-password", type: "password",
                                 autocomplete: "current-password", required: true });
  const token = el("input", { id: "login-token", type: "password", required: true,
                              placeholder: "id.hmac, as kraftlog tokens create prints it" });
  const done = (header) => { sessionStorage.setItem(LOGIN_KEY, header); route(); };
  main.replaceChildren(el("h1", {}, "Log in"),
    el("p", { class: "muted" }, "This cluster asks who you are: a user made with " +
       "`kraftlog users create`. What you see is what its ACLs allow."),
    el("form", { class: "inline", id: "login", on: { submit: (ev) => {
      ev.preventDefault();
      const pair = new TextEncoder().encode(`${user.value}:${password.value}`);
      done(`Basic ${btoa(String.fromCharCode(...pair))}`);
    } } }, el("label", {}, "User", user), el("label", {}, "Password", password),
      el("button", { type: "submit" }, "Log in")),
    el("p", { class: "muted" }, "Or with a delegation token, as its owner:"),
    el("form", { class: "inline", id: "login-with-token", on: { submit: (ev) => {
      ev.preventDefault();
      const text = token.value.trim();
      if (!/^[\x21-\x7e]+$/.test(text)) {
        notice("a token is its id and HMAC as `kraftlog tokens create` prints them: " +
               "letters, digits and punctuation, no spaces");
        return;
      }
      done(`Bearer ${text}`);
    } } }, el("label", {}, "Token", token), el("button", { type: "submit" }, "Log in")));
  notice(why);
}

async function api(path, { method = "GET", body, contentType = "application/json",
                           accept = "application/json", raw = false } = {}) {
  const options = { method, headers: { Accept: accept } };
  const login = sessionStorage.getItem(LOGIN_KEY);
  if (login) options.headers.Authorization = login;
  if (body !== undefined) {
    options.headers["Content-Type"] = contentType;
    options.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (exc) {
    throw new BrokerError(`the broker did not answer (${exc.message}): is it running?`);
  }
  const text = await response.text();
  if (raw && response.ok) return text;
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (exc) { data = null; }
  if (!response.ok || (data && data.error && !Array.isArray(data))) {
    const error = data && data.error;
    if (error && error.code === "SASL_AUTHENTICATION_FAILED") {
      throw new LoginNeeded(`${error.code}: ${error.message}`);
    }
    if (error) throw new BrokerError(`${error.code}: ${error.message}`);
    throw new BrokerError(`HTTP ${response.status}: ${text.slice(0, 300)}`);
  }
  return data;
}

function notice(message, ok = false) {
  const box = document.getElementById("notice");
  box.textContent = message;
  box.className = ok ? "ok" : "";
  box.hidden = !message;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  return typeof n === "number" ? n.toLocaleString("en-US") : String(n);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// A table whose columns sort on a click. columns: [label, numeric?]; rows: arrays
// of cells (a cell is a value, or [sortValue, node]).
function table(columns, rows, attrs = {}) {
  let sortBy = -1, ascending = true;
  const body = el("tbody");
  const cellValue = (cell) => (Array.isArray(cell) ? cell[0] : cell);
  const draw = () => {
    const sorted = rows.slice();
    if (sortBy >= 0) {
      sorted.sort((a, b) => {
        const x = cellValue(a[sortBy]), y = cellValue(b[sortBy]);
        const order = typeof x === "number" && typeof y === "number" ? x - y
          : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      });
    }
    body.replaceChildren(...sorted.map((row) => el("tr", {}, row.map((cell, i) =>
      el("td", { class: columns[i][1] ? "num" : null },
         Array.isArray(cell) ? cell[1] : fmt(cell))))));
  };
  const head = el("tr", {}, columns.map(([label, numeric], i) => el("th", {
    class: numeric ? "num" : null, title: "sort",
    on: { click: () => { ascending = sortBy === i ? !ascending : true; sortBy = i; draw(); } },
  }, label)));
  draw();
  return el("div", { class: "table-wrap" }, el("table", attrs, el("thead", {}, head), body));
}

// A line chart of the last values of each series: {name: [numbers]}.
function chart(series, label) {
  const canvas = el("canvas", { width: 900, height: 140, "aria-label": label });
  const ctx = canvas.getContext("2d");
  const all = Object.values(series).flat();
  const top = Math.max(1, ...all);
  const colours = ["#2563eb", "#15803d", "#b45309", "#b91c1c"];
  ctx.font = "12px sans-serif";
  ctx.fillStyle = "#6b7280";
  ctx.fillText(`${label} (max ${fmt(Math.round(top))})`, 8, 14);
  Object.entries(series).forEach(([name, values], s) => {
    ctx.strokeStyle = colours[s % colours.length];
    ctx.beginPath();
    values.forEach((v, i) => {
      const x = (i / Math.max(1, SAMPLES - 1)) * canvas.width;
      const y = canvas.height - 4 - (v / top) * (canvas.height - 24);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = colours[s % colours.length];
    ctx.fillText(name, canvas.width - 160, 14 + 14 * s);
  });
  return canvas;
}

// Run fn now and then every ms after it finished (never two at once), for
// as long as the view that asked is shown.
function every(ms, fn) {
  const mine = generation;
  const tick = async () => {
    if (mine !== generation) return;
    try { await fn(); } catch (exc) {
      if (mine !== generation) return;
      if (exc instanceof LoginNeeded) { route(exc); return; }
      notice(exc.message);
    }
    if (mine === generation) timers.push(setTimeout(tick, ms));
  };
  tick();
}

// Replace the children of #id, if the view that owns it is still shown.
function fill(id, mine, ...children) {
  const node = document.getElementById(id);
  if (node && mine === generation) node.replaceChildren(...children);
}

function encode64(text) {
  const data = new TextEncoder().encode(text);
  let out = "";
  for (let i = 0; i < data.length; i += 0x8000) {  // in chunks: no argument-count limit
    out += String.fromCharCode(...data.subarray(i, i + 0x8000));
  }
  return btoa(out);
}

function when(ms) {
  const date = new Date(ms);
  return Number.isNaN(date.getTime()) ? String(ms) : date.toISOString();
}

function link(href, text) { return el("a", { href }, text); }

// A name as one URL path segment. Browsers drop "." and ".." segments even
// percent-encoded, so ids that may be called that (groups, transactional
// ids) are asked for with a query (?group_id=, ?transactional_id=) instead;
// topic names cannot be.
function seg(name) {
  return encodeURIComponent(name);
}

// A whole number typed in a form, or a clear error naming the field.
function integer(text, what) {
  const trimmed = String(text).trim();
  if (!/^-?[0-9]+$/.test(trimmed) || !Number.isSafeInteger(Number(trimmed))) {
    throw new BrokerError(`${what} must be a whole number, not ${JSON.stringify(trimmed)}`);
  }
  return Number(trimmed);
}

// JSON text laid out with indents, its numbers left exactly as written (a
// parse and re-encode would round integers beyond 2^53); null if not JSON,
// or nested deeper than PRETTY_DEPTH_MAX (its indents would outgrow it).
const PRETTY_DEPTH_MAX = 32;
function prettyJson(text) {
  try { JSON.parse(text); } catch (exc) { return null; }
  const space = " \t\n\r";
  let out = "", depth = 0;
  const newline = () => "\n" + "  ".repeat(depth);
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j;
    } else if (c === "{" || c === "[") {
      let j = i + 1;
      while (space.includes(text[j])) j++;
      if (text[j] === (c === "{" ? "}" : "]")) { out += c + text[j]; i = j; continue; }
      if (++depth > PRETTY_DEPTH_MAX) return null;
      out += c + newline();
    } else if (c === "}" || c === "]") {
      depth--;
      out += newline() + c;
    } else if (c === ",") out += "," + newline();
    else if (c === ":") out += ": ";
    else if (!space.includes(c)) out += c;
  }
  return out;
}

function parseConfigs(text) {
  const configs = {};
  for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
    const at = part.indexOf("=");
    if (at < 1) throw new BrokerError(`a config is NAME=VALUE, not ${JSON.stringify(part)}`);
    configs[part.slice(0, at).trim()] = part.slice(at + 1).trim();
  }
  return configs;
}

// -- throughput (every broker's per-topic counters) ----------------------------------
// Records and bytes in (produce) and out (fetch) per second, cluster-wide and
// per topic, from two readings of /v1/metrics/topics; null without DESCRIBE
// on the cluster. A broker is counted from its second reading on (a restart
// starts its counters again from zero).
const counterReadings = {};  // by caller: {at, brokers: {id: {topic: counters}}}

async function clusterRates(caller) {
  let answer;
  try {
    answer = await api("/v1/metrics/topics");
  } catch (exc) {
    if (exc instanceof LoginNeeded) throw exc;
    return null;
  }
  const now = Date.now() / 1000;
  const last = counterReadings[caller];
  const brokers = {};
  for (const b of answer.brokers) brokers[b.broker_id] = b.topics;
  counterReadings[caller] = { at: now, brokers };
  const total = { in: 0, out: 0, bytesIn: 0, bytesOut: 0 }, topics = {};
  if (!last) return { total: null, topics };
  const dt = Math.max(0.001, now - last.at);
  for (const [id, counters] of Object.entries(brokers)) {
    const before = last.brokers[id];
    if (!before) continue;
    for (const [topic, c] of Object.entries(counters)) {
      const b = before[topic] || { messages_in: 0, messages_out: 0, bytes_in: 0, bytes_out: 0 };
      const rate = (key) => Math.max(0, (c[key] - b[key]) / dt);
      const t = topics[topic] || (topics[topic] = { in: 0, out: 0 });
      t.in += rate("messages_in");
      t.out += rate("messages_out");
      total.in += rate("messages_in");
      total.out += rate("messages_out");
      total.bytesIn += rate("bytes_in");
      total.bytesOut += rate("bytes_out");
    }
  }
  return { total, topics };
}

// -- views ---------------------------------------------------------------------------------
// Every log directory of every live broker (/v1/log-dirs, Kafka's
// DescribeLogDirs), or null where the caller may not DESCRIBE the cluster.
async function logDirs(partitions = false) {
  try {
    return await api(`/v1/log-dirs${partitions ? "?partitions=true" : ""}`);
  } catch (exc) {
    if (exc instanceof LoginNeeded) throw exc;
    return null;
  }
}

// Partitions the caller may see with fewer in-sync replicas than replicas,
// and with no leader, over the whole cluster (from its metadata).
function partitionHealth(metadata) {
  let under = 0, offline = 0;
  for (const topic of metadata.topics) {
    for (const p of topic.partitions) {
      if (p.leader === null || p.leader < 0) offline++;
      if (p.isr.length < p.replicas.length) under++;
    }
  }
  return { under, offline };
}

async function overview(main) {
  const mine = generation;
  main.replaceChildren(el("h1", {}, "Overview"), el("div", { id: "overview" }, "Loading…"));
  let ticks = 0, slow = null;  // the heavier reads, every fifth tick
  every(POLL_MS, async () => {
    if (ticks++ % 5 === 0 || slow === null) {
      const [metadata, dirs] = await Promise.all([api("/v1/metadata"), logDirs()]);
      slow = { metadata, health: partitionHealth(metadata), dirs };
    }
    const [cluster, rates] = await Promise.all([api("/v1/cluster"), clusterRates("overview")]);
    if (rates && rates.total) {
      history.rates.push(rates.total);
      if (history.rates.length > SAMPLES) history.rates.shift();
    }
    const now = rates && rates.total;
    const topics = { topics: slow.metadata.topics };
    const disk = {};
    for (const b of (slow.dirs && slow.dirs.brokers) || []) {
      disk[b.broker_id] = b.log_dirs.reduce((sum, d) => sum + d.size_bytes, 0);
    }
    let quorum = null;
    try { quorum = await api("/v1/quorum"); } catch (exc) { quorum = { error: exc.message }; }
    document.getElementById("cluster-id").textContent = `cluster ${cluster.cluster_id}`;
    const up = cluster.brokers.filter((b) => !b.fenced).length;
    const cards = el("div", { class: "cards" },
      card("Brokers up", `${up} / ${cluster.brokers.length}`, up < cluster.brokers.length),
      card("Active controller", cluster.controller_id ?? "none", cluster.controller_id == null),
      card("Topics", topics.topics.length),
      card("Under-replicated partitions", slow.health.under, slow.health.under > 0,
           "under-replicated"),
      card("Offline partitions", slow.health.offline, slow.health.offline > 0, "offline"),
      card("Records in /s", now ? Math.round(now.in) : null, false, "rate-in"),
      card("Records out /s", now ? Math.round(now.out) : null, false, "rate-out"));
    const brokers = table(
      [["Broker", true], ["State"], ["Rack"], ["Partitions led", true], ["Disk used", true],
       ["URL"]],
      cluster.brokers.map((b) => [b.id, brokerState(b),
        b.rack ?? "–", b.leaders,
        [disk[b.id] ?? -1, b.id in disk ? bytes(disk[b.id]) : "–"], b.url ?? "–"]),
      { id: "brokers" });
    const voters = quorum && quorum.voters ? table(
      [["Voter", true], ["Role"], ["Connected"], ["Match index", true], ["Lag", true]],
      Object.values(quorum.voters).map((v) => [v.id,
        v.id === quorum.leader_id ? "leader" : "follower",
        v.connected === undefined ? "–" : [String(v.connected), el("span", {
          class: v.connected ? "state-up" : "state-down", "data-voter": v.id },
          v.connected ? "yes" : "no")],
        v.match_index ?? "–", v.lag ?? "–"])) : null;
    const quorumText = quorum.error ? quorum.error
      : `leader ${fmt(quorum.leader_id)}, term ${fmt(quorum.term)}, commit index ${fmt(quorum.commit_index)}`;
    fill("overview", mine,
      cards, el("h2", {}, "Brokers"), brokers,
      el("h2", {}, "Controller quorum"), el("p", { id: "quorum" }, quorumText), voters,
      el("h2", {}, "Throughput (every broker, produce in and fetch out)"),
      chart({ "in /s": history.rates.map((r) => r.in), "out /s": history.rates.map((r) => r.out) },
            "records per second"));
  });
}

// A broker's state cell: down when fenced; up, but warned about, when a
// disk error took some of its log directories offline.
function brokerState(b) {
  const offline = (b.offline_log_dirs || []).length;
  const [word, cls, text] = b.fenced ? ["down", "state-down", "down (fenced)"]
    : offline ? ["degraded", "state-warn",
                 `up, ${offline} log dir${offline > 1 ? "s" : ""} offline`]
    : ["up", "state-up", "up"];
  const span = el("span", { class: cls, "data-broker-state": b.id }, text);
  if (offline) span.title = `offline after disk errors: ${b.offline_log_dirs.join(", ")}`;
  return [word, span];
}

function card(title, value, bad = false, id = undefined) {
  return el("div", { class: "card" }, el("div", { class: "muted" }, title),
            el("div", { class: "value" + (bad ? " state-down" : ""), id }, fmt(value)));
}

async function topicsView(main) {
  const mine = generation;
  delete counterReadings.topics;  // rates from this visit's readings only
  const search = el("input", { id: "topic-search", placeholder: "search topics", type: "search" });
  const list = el("div", { id: "topic-list" }, "Loading…");
  const name = el("input", { id: "new-topic-name", placeholder: "name", required: true });
  const partitions = el("input", { id: "new-topic-partitions", type: "number", value: 3, min: 1 });
  const rf = el("input", { id: "new-topic-rf", type: "number", value: 1, min: 1 });
  const configs = el("input", { id: "new-topic-configs", placeholder: "retention.ms=86400000,…" });
  const form = el("form", { class: "inline", id: "create-topic", on: { submit: async (ev) => {
    ev.preventDefault();
    try {
      const answer = await api("/v1/admin/topics/create", { method: "POST", body: { topics: [{
        name: name.value.trim(), num_partitions: Number(partitions.value),
        replication_factor: Number(rf.value), configs: parseConfigs(configs.value) }] } });
      const entry = (answer.topics || [])[0] || {};
      if (entry.error) throw new BrokerError(`${entry.error.code}: ${entry.error.message}`);
      notice(`created topic ${name.value.trim()}`, true);
      name.value = "";
      await draw();
    } catch (exc) { notice(exc.message); }
  } } }, el("label", {}, "Name", name), el("label", {}, "Partitions", partitions),
    el("label", {}, "Replication factor", rf), el("label", {}, "Configs", configs),
    el("button", { type: "submit" }, "Create topic"));
  let topics = [], figures = null, rates = null, last = null;
  const render = () => {
    const wanted = search.value.trim().toLowerCase();
    const of = (t, key) => (figures && figures[t.name] ? figures[t.name][key] : null);
    const rate = (t, key) => (rates && rates.total ? Math.round((rates.topics[t.name] || {})[key] ?? 0)
      : null);
    list.replaceChildren(table([["Topic"], ["Partitions", true], ["Replication", true],
                                ["Messages", true], ["Size", true], ["In /s", true],
                                ["Out /s", true], [""]],
      topics.filter((t) => t.name.toLowerCase().includes(wanted)).map((t) => [
        [t.name, link(`#/topics/${seg(t.name)}`, t.name)], t.partitions,
        t.replication_factor, of(t, "messages"),
        [of(t, "size") ?? -1, of(t, "size") === null ? "–" : bytes(of(t, "size"))],
        rate(t, "in"), rate(t, "out"),
        ["", el("button", { class: "danger", "data-delete": t.name, on: { click: () => remove(t.name) } },
                "Delete")]]), { id: "topics" }));
  };
  // Messages and size from each partition's leader replica (log end minus log
  // start; the brokers' log directories), records in and out per second
  // between two reads of the brokers' counters: when the caller may DESCRIBE
  // the cluster.
  const measure = async () => {
    const now = Date.now() / 1000;
    if (last && now - last.at < 1) return;  // a rate over less than a second says little
    last = { at: now };
    const [dirs, measured] = await Promise.all([logDirs(true), clusterRates("topics")]);
    rates = measured;
    if (!dirs) return;
    const found = {};
    for (const b of dirs.brokers) {
      for (const d of b.log_dirs) {
        for (const r of d.replicas || []) {
          if (!r.leader) continue;
          const t = found[r.topic] || (found[r.topic] = { messages: 0, size: 0 });
          t.messages += r.log_end_offset - r.log_start_offset;
          t.size += r.size_bytes;
        }
      }
    }
    figures = found;
  };
  const draw = async () => {
    const [listed] = await Promise.all([api("/v1/topics"), measure()]);
    topics = listed.topics;
    render();
  };
  const remove = async (topic) => {
    if (!window.confirm(`Delete topic ${topic} and all its records?`)) return;
    try {
      const answer = await api("/v1/admin/topics/delete", { method: "POST", body: { topics: [topic] } });
      const entry = (answer.topics || [])[0] || {};
      if (entry.error) throw new BrokerError(`${entry.error.code}: ${entry.error.message}`);
      notice(`deleted topic ${topic}`, true);
      await draw();
    } catch (exc) { notice(exc.message); }
  };
  search.addEventListener("input", render);
  main.replaceChildren(el("h1", {}, "Topics"), form, search, list);
  await draw();
  if (mine !== generation) return;
  every(5 * POLL_MS, async () => { await measure(); if (mine === generation) render(); });
}

async function topicView(main, topic) {
  const mine = generation;
  const path = `/v1/topics/${seg(topic)}`;
  const described = await api(path);
  if (mine !== generation) return;
  const parts = described.partitions;
  const configs = described.configs;
  every(POLL_MS, async () => {
    const now = await api(path);
    fill("topic-live", mine, partitionsTable(now.partitions), topicChart(topic, now.partitions));
  });
  const count = el("input", { id: "partition-count", type: "number", min: parts.length + 1,
                              value: parts.length + 1 });
  const grow = el("form", { class: "inline", id: "add-partitions", on: { submit: async (ev) => {
    ev.preventDefault();
    try {
      const answer = await api("/v1/admin/partitions/create", { method: "POST", body: {
        topics: [{ name: topic, count: Number(count.value) }] } });
      const entry = (answer.topics || [])[0] || {};
      if (entry.error) throw new BrokerError(`${entry.error.code}: ${entry.error.message}`);
      await route();
      notice(`${topic} has ${count.value} partitions`, true);
    } catch (exc) { notice(exc.message); }
  } } }, el("label", {}, "Partitions", count), el("button", { type: "submit" }, "Add partitions"));
  const configName = el("input", { id: "config-name", placeholder: "retention.ms" });
  const configValue = el("input", { id: "config-value", placeholder: "value (empty: default)" });
  const alter = el("form", { class: "inline", id: "alter-config", on: { submit: async (ev) => {
    ev.preventDefault();
    const name = configName.value.trim();
    try {
      const op = configValue.value === "" ? { name, op: "delete" }
        : { name, op: "set", value: configValue.value };
      const answer = await api("/v1/admin/configs/alter", { method: "POST", body: {
        resources: [{ type: "topic", name: topic, ops: [op] }] } });
      const entry = (answer.resources || [])[0] || {};
      if (entry.error) throw new BrokerError(`${entry.error.code}: ${entry.error.message}`);
      await route();
      notice(configValue.value === "" ? `${name} is back to its default`
                                      : `${name} = ${configValue.value}`, true);
    } catch (exc) { notice(exc.message); }
  } } }, el("label", {}, "Config", configName), el("label", {}, "Value", configValue),
    el("button", { type: "submit" }, "Set config"));
  main.replaceChildren(
    el("h1", {}, `Topic ${topic}`),
    el("p", {}, link(`#/topics/${seg(topic)}/messages`, "Browse and produce messages")),
    el("div", { id: "topic-live" }, partitionsTable(parts), topicChart(topic, parts)),
    grow,
    el("h2", {}, "Configs set on this topic"),
    configs === null ? el("p", { class: "muted" }, "Not shown: DESCRIBE_CONFIGS is not allowed.")
      : table([["Config"], ["Value"]], Object.entries(configs).sort(), { id: "configs" }),
    alter);
}

// Each follower's records behind its leader, as the leader last saw its fetch.
function followersBehind(p) {
  return (p.replica_states || []).filter((r) => r.broker !== p.leader)
    .map((r) => `${r.broker}: ${r.lag === null ? "not fetching" : fmt(r.lag)}`).join(", ");
}

function partitionsTable(parts) {
  return table([["Partition", true], ["Leader", true], ["Replicas"], ["ISR"], ["Log start", true],
                ["High watermark", true], ["Last stable", true], ["Log end", true], ["Size"],
                ["Followers behind"]],
    parts.map((p) => [p.partition, p.leader ?? "none", p.replicas.join(", "), p.isr.join(", "),
      p.log_start_offset, p.high_watermark, p.last_stable_offset, p.log_end_offset,
      [p.size_bytes ?? 0, bytes(p.size_bytes)], followersBehind(p) || "–"]), { id: "partitions" });
}

// The topic's records and bytes in per second, from the growth of its
// partitions' log end offsets and sizes between two polls.
function topicChart(topic, parts) {
  const now = Date.now() / 1000;
  const total = (key) => parts.every((p) => p[key] !== null && p[key] !== undefined)
    ? parts.reduce((sum, p) => sum + p[key], 0) : null;
  const seen = history.topics[topic] || { samples: [] };
  const ends = total("log_end_offset"), size = total("size_bytes");
  const dt = now - (seen.at ?? 0);
  if (dt >= 1) {  // a rate over less than a second says little
    if (seen.at !== undefined && ends !== null && seen.ends !== null) {
      seen.samples.push({ records: Math.max(0, (ends - seen.ends) / dt),
                          bytes: size === null || seen.size === null ? 0
                            : Math.max(0, (size - seen.size) / dt) });
      if (seen.samples.length > SAMPLES) seen.samples.shift();
    }
    Object.assign(seen, { at: now, ends, size });
  }
  history.topics[topic] = seen;
  // Replication lag: records each broker's follower replicas are behind, summed.
  const behind = {};
  for (const p of parts) {
    for (const r of p.replica_states || []) {
      if (r.broker !== p.leader && r.lag !== null) behind[r.broker] = (behind[r.broker] || 0) + r.lag;
    }
  }
  seen.lag = seen.lag || {};
  for (const broker of new Set([...Object.keys(behind), ...Object.keys(seen.lag)])) {
    const series = seen.lag[broker] || (seen.lag[broker] = []);
    series.push(behind[broker] || 0);
    if (series.length > SAMPLES) series.shift();
  }
  const last = seen.samples[seen.samples.length - 1];
  return el("div", {}, el("h2", {}, "Throughput in"),
    el("p", { class: "muted", id: "topic-rate" }, last
      ? `${fmt(Math.round(last.records))} records/s, ${bytes(last.bytes)}/s`
      : "measured from the next refresh on"),
    chart({ "records /s": seen.samples.map((x) => x.records) }, "records per second"),
    el("h2", {}, "Replication lag"),
    chart(Object.fromEntries(Object.entries(seen.lag).map(([b, v]) => [`broker ${b}`, v])),
          "records followers are behind their leaders"));
}

function b64ToBytes(text) {
  if (text === null || text === undefined) return null;
  const raw = atob(text);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

function show(data, format) {
  if (data === null) return "null";
  if (format === "hex") return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join(" ");
  const text = new TextDecoder("utf-8", { fatal: false }).decode(data);
  if (format === "json") {
    try { return prettyJson(text) ?? text; } catch (exc) { return text; }
  }
  return text;
}

function headerLines(headers, format) {
  return (headers || []).map((h) => `${h.key}: ${show(h.value, format === "hex" ? "hex" : "text")}`)
    .join("\n");
}

// "name: value" per line, as the produce form takes headers.
function parseHeaders(text) {
  return text.split("\n").filter((line) => line.trim()).map((line) => {
    const at = line.indexOf(":");
    if (at < 1) throw new BrokerError(`a header is "name: value", not ${JSON.stringify(line)}`);
    return { key: line.slice(0, at).trim(), value: encode64(line.slice(at + 1).trim()) };
  });
}

async function messagesView(main, topic) {
  const mine = generation;
  const described = await api(`/v1/topics/${seg(topic)}`);
  if (mine !== generation) return;
  const partitionOptions = () => described.partitions.map((p) =>
    el("option", { value: p.partition }, `partition ${p.partition}`));
  const partition = el("select", { id: "partition" }, partitionOptions());
  const from = el("select", { id: "from" }, el("option", { value: "beginning" }, "from the beginning"),
                  el("option", { value: "offset" }, "from an offset"),
                  el("option", { value: "timestamp" }, "from a time"),
                  el("option", { value: "end" }, "the last 20"));
  const offset = el("input", { id: "offset", type: "number", value: 0, min: 0 });
  const moment = el("input", { id: "timestamp", type: "datetime-local", step: 1 });
  const format = el("select", { id: "format" }, ["json", "text", "hex"].map((f) => el("option", { value: f }, f)));
  const keyFilter = el("input", { id: "key-filter", placeholder: "key contains" });
  const tail = el("input", { id: "tail", type: "checkbox" });
  const list = el("div", { id: "messages" });
  let shown = [], next = 0, loads = 0;

  const render = () => {
    const wanted = keyFilter.value;
    list.replaceChildren(table([["Offset", true], ["Timestamp"], ["Key"], ["Headers"], ["Value"]],
      shown.filter((r) => !wanted || show(r.key, "text").includes(wanted)).map((r) => {
        const value = show(r.value, format.value);
        const cut = value.length > 500;
        const pre = el("pre", { class: "value" }, cut ? value.slice(0, 500) + "…" : value);
        const more = cut ? el("button", { class: "secondary", on: { click: (ev) => {
          pre.textContent = value; ev.target.remove(); } } }, "show all") : null;
        return [r.offset, when(r.timestamp), show(r.key, format.value === "hex" ? "hex" : "text"),
                ["", el("pre", { class: "value headers" }, headerLines(r.headers, format.value))],
                ["", el("div", {}, pre, more)]];
      }), { id: "records" }));
  };
  // Records from `where` (an offset, or {timestamp}) of the chosen partition.
  const read = async (where, waitMs = 0) => {
    const p = partition.value;
    const at = typeof where === "number" ? `offset=${where}` : `timestamp=${where.timestamp}`;
    const records = await api(`/topics/${seg(topic)}/partitions/${p}/records` +
                              `?${at}&max_bytes=1048576&timeout=${waitMs}`,
                              { accept: "application/vnd.kafka.binary.v2+json" });
    return records.map((r) => ({ ...r, key: b64ToBytes(r.key), value: b64ToBytes(r.value),
      headers: (r.headers || []).map((h) => ({ key: h.key, value: b64ToBytes(h.value) })) }));
  };
  const load = async (clear = true) => {
    const load = ++loads;  // a newer load, or tail read, wins over this one
    try {
      if (clear) notice("");
      const part = (await api(`/v1/topics/${seg(topic)}`)).partitions
        .find((x) => String(x.partition) === partition.value);
      if (!part) throw new BrokerError(`${topic} has no partition ${partition.value}`);
      if (from.value !== "offset" && (part.log_start_offset === null || part.high_watermark === null)) {
        throw new BrokerError(`the offsets of ${topic}-${part.partition} are not known right ` +
                              "now (its leader did not answer): retry, or read from an offset");
      }
      let start = from.value === "offset" ? integer(offset.value, "the offset")
        : part.log_start_offset;
      if (from.value === "end") start = Math.max(part.log_start_offset, part.high_watermark - 20);
      let where = start;
      if (from.value === "timestamp") {
        const ms = Date.parse(moment.value);
        if (Number.isNaN(ms)) throw new BrokerError("choose a date and time to read from");
        where = { timestamp: ms };
        start = part.high_watermark;  // nothing at or after that time yet: tail from the end
      }
      const records = (await read(where)).slice(0, 500);
      if (load !== loads || mine !== generation) return;
      shown = records;
      next = shown.length ? shown[shown.length - 1].offset + 1 : start;
      if (!shown.length) notice(`no records in ${topic}-${part.partition} from there yet` +
                                (tail.checked ? ": new ones will show as they arrive" : ""), true);
      render();
    } catch (exc) { if (mine === generation) notice(exc.message); }
  };
  every(POLL_MS, async () => {
    if (!tail.checked) return;
    const load = loads, from = next;
    const more = await read(from, 1000);
    if (load !== loads || from !== next || mine !== generation) return;  // a newer read won
    if (more.length) {
      shown = shown.concat(more).slice(-500);
      next = more[more.length - 1].offset + 1;
      render();
    }
  });

  const key = el("input", { id: "produce-key", placeholder: "key (text, optional)" });
  const value = el("textarea", { id: "produce-value", placeholder: "value" });
  const headers = el("textarea", { id: "produce-headers", placeholder: "name: value (one a line)" });
  const target = el("select", { id: "produce-partition" },
    el("option", { value: "" }, "by key (as Kafka's partitioner)"), partitionOptions());
  const asJson = el("input", { id: "produce-json", type: "checkbox", checked: true });
  const produce = el("form", { class: "inline", id: "produce", on: { submit: async (ev) => {
    ev.preventDefault();
    try {
      const text = value.value;
      if (asJson.checked) {
        // Checked here, stored as typed (re-encoding would round big numbers).
        try { JSON.parse(text); } catch (exc) {
          throw new BrokerError(`the value is not valid JSON (${exc.message}): fix it, or ` +
                                "untick \"Value is JSON\" to send it as text");
        }
      }
      const record = { key: key.value ? encode64(key.value) : null, value: encode64(text),
                       headers: parseHeaders(headers.value) };
      if (target.value !== "") record.partition = Number(target.value);
      const answer = await api(`/topics/${seg(topic)}`, { method: "POST",
        contentType: "application/vnd.kafka.binary.v2+json", body: { records: [record] } });
      const result = (answer.offsets || [])[0] || {};
      if (result.error) throw new BrokerError(`${result.error_code ?? ""} ${result.error}`);
      notice(`produced at ${topic}-${result.partition} offset ${result.offset}`, true);
      if (String(result.partition) === partition.value) await load(false);
    } catch (exc) { notice(exc.message); }
  } } }, el("label", {}, "Key", key), el("label", {}, "Value", value),
    el("label", {}, "Headers", headers), el("label", {}, "Partition", target),
    el("label", {}, "Value is JSON", asJson), el("button", { type: "submit" }, "Produce"));

  // Produced where it is browsed, unless the user picks a partition or the key's.
  target.value = partition.value;
  partition.addEventListener("change", () => { target.value = partition.value; });
  for (const control of [partition, from]) control.addEventListener("change", () => load());
  format.addEventListener("change", render);
  keyFilter.addEventListener("input", render);
  main.replaceChildren(
    el("h1", {}, "Messages of ", link(`#/topics/${seg(topic)}`, topic)),
    el("form", { class: "inline", on: { submit: (ev) => { ev.preventDefault(); load(); } } },
       el("label", {}, "Partition", partition), el("label", {}, "Read", from),
       el("label", {}, "Offset", offset), el("label", {}, "Time (local)", moment),
       el("label", {}, "Show as", format),
       el("label", {}, "Filter", keyFilter), el("label", {}, "Live tail", tail),
       el("button", { type: "submit", id: "read" }, "Read")),
    el("h2", {}, "Produce"), produce, el("h2", {}, "Records"), list);
  await load();
}

async function groupsView(main) {
  const mine = generation;
  main.replaceChildren(el("h1", {}, "Consumer groups"), el("div", { id: "groups" }, "Loading…"));
  every(POLL_MS, async () => {
    const answer = await api("/v1/groups");
    const missing = (answer.unreachable_brokers || []).map((b) => b.broker_id);
    fill("groups", mine, missing.length ? el("p", { class: "state-warn" },
      `Brokers ${missing.join(", ")} did not answer: their groups are not listed.`) : null, table(
      [["Group"], ["State"], ["Members", true], ["Coordinator", true]],
      answer.groups.map((g) => [[g.group_id, link(`#/groups/${seg(g.group_id)}`, g.group_id)],
        g.state, g.members, g.coordinator_id]), { id: "group-list" }));
  });
}

// An ISO 8601 time as `kraftlog groups reset-offsets --to-datetime` takes it
// (UTC unless it names a zone), in milliseconds since the epoch.
function isoMillis(text) {
  const match = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,3})?)?))?(Z|[+-]\d{2}:\d{2})?$/
    .exec(text.trim());
  const ms = match ? Date.parse(`${match[1]}T${match[2] ?? "00:00"}${match[3] ?? "Z"}`) : NaN;
  if (Number.isNaN(ms)) {
    throw new BrokerError(`${JSON.stringify(text)} is not an ISO 8601 time such as ` +
                          "2026-11-21T10:00:00Z (UTC unless a zone is given)");
  }
  return ms;
}

// The new offsets of a reset, worked out as `kraftlog groups reset-offsets`
// does: {partition, current, target}, clamped into the log.
async function resetPlan(group, topic, partitionText, to, value) {
  const described = await api(`/v1/topics/${seg(topic)}`);
  let parts = described.partitions;
  if (partitionText.trim() !== "") {
    const wanted = integer(partitionText, "the partition");
    parts = parts.filter((p) => p.partition === wanted);
    if (!parts.length) {
      throw new BrokerError(`${topic} has partitions 0 to ${described.partitions.length - 1}, ` +
                            `not ${wanted}`);
    }
  }
  const g = await api(`/v1/groups?group_id=${encodeURIComponent(group)}`);
  const committed = new Map(g.offsets.filter((o) => o.topic === topic)
    .map((o) => [o.partition, o.offset]));
  const plan = [];
  for (const p of parts) {
    const start = p.log_start_offset, end = p.high_watermark;
    if (start === null || end === null) {
      throw new BrokerError(`the offsets of ${topic}-${p.partition} are not known right now ` +
                            "(its leader did not answer): retry");
    }
    let target;
    if (to === "earliest") target = start;
    else if (to === "latest") target = end;
    else if (to === "offset") {
      target = integer(value, "the offset");
      if (target < 0) throw new BrokerError("the offset must be 0 or more (earliest: the log start)");
    } else if (to === "datetime") {
      const found = await api(`/topics/${seg(topic)}/partitions/${p.partition}/offsets` +
                              `?timestamp=${isoMillis(value)}`);
      target = found.offset ?? end;  // nothing at or after it: the end, as the CLI
    } else target = (committed.get(p.partition) ?? start) + integer(value, "the shift");
    plan.push({ partition: p.partition, current: committed.get(p.partition) ?? null,
                target: Math.min(Math.max(target, start), end) });
  }
  return plan;
}

function resetForm(group) {
  const topic = el("input", { id: "reset-topic", placeholder: "topic", required: true });
  const partition = el("input", { id: "reset-partition", placeholder: "all", size: 6 });
  const to = el("select", { id: "reset-to" }, [["earliest", "to the earliest"],
    ["latest", "to the latest"], ["offset", "to an offset"], ["datetime", "to a time (ISO 8601)"],
    ["shift", "shift by N"]].map(([v, label]) => el("option", { value: v }, label)));
  const value = el("input", { id: "reset-value",
                              placeholder: "offset, N, or a time: 2026-11-21T10:00:00Z" });
  const plan = el("div", { id: "reset-plan" });
  const run = async (execute) => {
    try {
      notice("");
      const steps = await resetPlan(group, topic.value.trim(), partition.value, to.value,
                                    value.value.trim());
      if (execute) {
        await api("/v1/admin/groups/offsets/reset", { method: "POST", body: {
          group_id: group, offsets: steps.map((x) => ({ topic: topic.value.trim(),
            partition: x.partition, offset: x.target })) } });
        notice(`reset ${steps.length} offsets of ${group}`, true);
      }
      const since = to.value === "datetime"
        ? ` (from ${new Date(isoMillis(value.value)).toISOString()})` : "";
      plan.replaceChildren(el("p", { class: "muted" }, (execute ? "Applied" : "The plan " +
        "(nothing changed yet)") + since + ":"),
        table([["Partition", true], ["Committed", true], ["New", true]],
              steps.map((x) => [x.partition, x.current, x.target]), { id: "reset-steps" }));
    } catch (exc) { notice(exc.message); }
  };
  return el("div", {},
    el("h2", {}, "Reset offsets"),
    el("p", { class: "muted" }, "Only while the group has no members: stop its consumers " +
       "first (a member would overwrite the offsets with its next commit)."),
    el("form", { class: "inline", id: "reset", on: { submit: (ev) => { ev.preventDefault(); run(true); } } },
       el("label", {}, "Topic", topic), el("label", {}, "Partition", partition),
       el("label", {}, "Move", to), el("label", {}, "Value", value),
       el("button", { type: "button", class: "secondary", id: "reset-preview",
                      on: { click: () => run(false) } }, "Preview"),
       el("button", { type: "submit", class: "danger" }, "Reset offsets")),
    plan);
}

async function groupView(main, group) {
  const mine = generation;
  main.replaceChildren(el("h1", {}, `Group ${group}`), el("div", { id: "group" }, "Loading…"),
                       resetForm(group));
  history.lag[group] = history.lag[group] || [];
  every(POLL_MS, async () => {
    const g = await api(`/v1/groups?group_id=${encodeURIComponent(group)}`);
    const total = g.offsets.reduce((sum, o) => sum + (o.lag ?? 0), 0);
    const lag = history.lag[group];
    lag.push(total);
    if (lag.length > SAMPLES) lag.shift();
    fill("group", mine,
      el("div", { class: "cards" }, card("State", g.state), card("Members", g.members.length),
         el("div", { class: "card" }, el("div", { class: "muted" }, "Total lag"),
            el("div", { class: "value", id: "total-lag" }, fmt(total)))),
      el("h2", {}, "Members"),
      table([["Member"], ["Client"], ["Host"], ["Assigned"]], g.members.map((m) => [
        m.member_id, m.client_id ?? "–", m.client_host ?? "–",
        (m.assigned || []).map(([t, p]) => `${t}-${p}`).join(", ") || "–"])),
      el("h2", {}, "Offsets"),
      table([["Topic"], ["Partition", true], ["Committed", true], ["Log end", true], ["Lag", true]],
        g.offsets.map((o) => [o.topic, o.partition, o.offset, o.log_end_offset, o.lag]),
        { id: "offsets" }),
      el("h2", {}, "Lag over time"), chart({ lag }, "records behind"));
  });
}

async function transactionsView(main) {
  const mine = generation;
  main.replaceChildren(el("h1", {}, "Transactions"), el("div", { id: "transactions" }, "Loading…"));
  every(POLL_MS, async () => {
    const found = (await api("/v1/transactions")).transactions;
    fill("transactions", mine, found.length ? table(
      [["Transactional id"], ["Producer id", true], ["State"], ["Coordinator", true]],
      found.map((t) => [[t.transactional_id, link(`#/transactions/${seg(t.transactional_id)}`,
                                                   t.transactional_id)],
        t.producer_id, t.state, t.coordinator_id ?? "–"]), { id: "transaction-list" })
      : el("p", { class: "muted" }, "No transactional ids: a producer with a transactional_id " +
           "makes one when it calls init_transactions()."));
  });
}

async function transactionView(main, id) {
  const mine = generation;
  main.replaceChildren(el("h1", {}, `Transaction ${id}`), el("div", { id: "transaction" }, "Loading…"));
  every(POLL_MS, async () => {
    const t = await api(`/v1/transactions?transactional_id=${encodeURIComponent(id)}`);
    const running = t.txn_start_ms >= 0 && t.state === "Ongoing"
      ? `${((Date.now() - t.txn_start_ms) / 1000).toFixed(1)} s` : "–";
    fill("transaction", mine,
      el("div", { class: "cards" }, card("State", t.state), card("Producer id", t.producer_id),
         card("Epoch", t.producer_epoch), card("Coordinator", t.coordinator_id),
         card("Timeout", `${fmt(t.timeout_ms)} ms`), card("Running for", running)),
      el("h2", {}, ["Ongoing", "PrepareCommit", "PrepareAbort"].includes(t.state)
        ? "Partitions in the transaction" : "Partitions of its last transaction"),
      t.partitions.length ? table([["Topic"], ["Partition", true]],
        t.partitions.map((p) => [[p.topic, link(`#/topics/${seg(p.topic)}`, p.topic)], p.partition]),
        { id: "transaction-partitions" }) : el("p", { class: "muted" }, "None."));
  });
}

const ACL_FIELDS = ["resource_type", "resource_name", "pattern_type", "principal", "host",
                    "operation", "permission_type"];

async function aclsView(main) {
  const choice = (id, values) => el("select", { id }, values.map((v) => el("option", { value: v }, v)));
  const fields = {
    resource_type: choice("acl-resource-type", ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]),
    resource_name: el("input", { id: "acl-resource-name", placeholder: "name, or *", required: true }),
    pattern_type: choice("acl-pattern-type", ["LITERAL", "PREFIXED"]),
    principal: el("input", { id: "acl-principal", placeholder: "User:alice", required: true }),
    host: el("input", { id: "acl-host", value: "*", size: 8 }),
    operation: choice("acl-operation", ["READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE",
      "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALL"]),
    permission_type: choice("acl-permission", ["ALLOW", "DENY"]),
  };
  const list = el("div", { id: "acl-list" }, "Loading…");
  const results = (answer, key) => {
    for (const entry of answer[key] || []) {
      if (entry.error) throw new BrokerError(`${entry.error.code}: ${entry.error.message}`);
    }
  };
  const draw = async () => {
    const acls = (await api("/v1/admin/acls/describe", { method: "POST", body: { filter: {} } })).acls;
    list.replaceChildren(acls.length ? table(
      [["Resource"], ["Name"], ["Pattern"], ["Principal"], ["Host"], ["Operation"], ["Permission"], [""]],
      acls.map((b) => [...ACL_FIELDS.map((f) => b[f]), ["", el("button", { class: "danger",
        "data-delete-acl": `${b.principal} ${b.operation} ${b.resource_type}:${b.resource_name}`,
        on: { click: () => remove(b) } }, "Delete")]]), { id: "acls" })
      : el("p", { class: "muted" }, "No ACLs: only super users may do anything."));
  };
  const remove = async (binding) => {
    if (!window.confirm(`Delete the ACL ${binding.permission_type} ${binding.principal} ` +
                        `${binding.operation} on ${binding.resource_type} ${binding.resource_name}?`)) return;
    try {
      results(await api("/v1/admin/acls/delete", { method: "POST", body: { filters: [binding] } }),
              "filter_results");
      notice("ACL deleted", true);
      await draw();
    } catch (exc) { notice(exc.message); }
  };
  const form = el("form", { class: "inline", id: "create-acl", on: { submit: async (ev) => {
    ev.preventDefault();
    try {
      const binding = Object.fromEntries(ACL_FIELDS.map((f) => [f, fields[f].value.trim()]));
      results(await api("/v1/admin/acls/create", { method: "POST", body: { creations: [binding] } }),
              "results");
      notice(`ACL created: ${binding.permission_type} ${binding.principal} ${binding.operation}`, true);
      await draw();
    } catch (exc) { notice(exc.message); }
  } } }, ...ACL_FIELDS.map((f) => el("label", {}, f.replace("_type", "").replace("_", " "), fields[f])),
    el("button", { type: "submit" }, "Create ACL"));
  main.replaceChildren(el("h1", {}, "ACLs"), form, list);
  await draw();
}

async function quotasView(main) {
  const mine = generation;
  const answer = await api("/v1/admin/quotas/describe", { method: "POST", body: {} });
  if (mine !== generation) return;
  const entries = answer.entries || [];
  const entity = (e) => Object.entries(e).map(([k, v]) => `${k}=${v ?? "<default>"}`).join(", ");
  main.replaceChildren(el("h1", {}, "Quotas"),
    el("p", { class: "muted" }, "Set with `kraftlog quotas alter` (an administrator with a " +
       "client certificate on a secure cluster)."),
    entries.length ? table([["Entity"], ["Quota"], ["Value", true]],
      entries.flatMap((e) => Object.entries(e.quotas).map(([name, value]) =>
        [entity(e.entity), name, value])), { id: "quotas" })
      : el("p", { class: "muted" }, "No quotas: clients are not throttled."));
}

// -- routing -----------------------------------------------------------------------------
async function route(loginError) {
  const mine = ++generation;
  for (const timer of timers) clearTimeout(timer);
  timers = [];
  notice("");
  const main = document.getElementById("main");
  if (loginError instanceof LoginNeeded) sessionStorage.removeItem(LOGIN_KEY);
  document.getElementById("logout").hidden = !sessionStorage.getItem(LOGIN_KEY);
  if (loginError instanceof LoginNeeded) {
    loginView(main, loginError.message);
    return;
  }
  let parts;
  try {
    parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  } catch (exc) {
    parts = ["not-a-page"];
  }
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] || "overview"));
  }
  try {
    if (!parts[0]) await overview(main);
    else if (parts[0] === "topics" && parts.length === 1) await topicsView(main);
    else if (parts[0] === "topics" && parts[2] === "messages") await messagesView(main, parts[1]);
    else if (parts[0] === "topics") await topicView(main, parts[1]);
    else if (parts[0] === "groups" && parts.length === 1) await groupsView(main);
    else if (parts[0] === "groups") await groupView(main, parts[1]);
    else if (parts[0] === "transactions" && parts.length === 1) await transactionsView(main);
    else if (parts[0] === "transactions") await transactionView(main, parts[1]);
    else if (parts[0] === "acls") await aclsView(main);
    else if (parts[0] === "quotas") await quotasView(main);
    else main.replaceChildren(el("p", {}, "No such page. ", link("#/", "Overview")));
  } catch (exc) {
    if (mine !== generation) return;  // a newer page is shown: this one's error is moot
    if (exc instanceof LoginNeeded) {
      generation += 1;
      for (const timer of timers) clearTimeout(timer);
      timers = [];
      sessionStorage.removeItem(LOGIN_KEY);
      document.getElementById("logout").hidden = true;
      loginView(main, exc.message);
      return;
    }
    main.replaceChildren(el("h1", {}, "Not shown"), el("p", {}, link("#/", "Back to the overview")));
    notice(exc.message);
  }
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(LOGIN_KEY);
  route(new LoginNeeded("logged out"));
});
window.addEventListener("hashchange", route);
route();
