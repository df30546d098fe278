// loip's dashboard (docs/dashboard.md): GET /v1/cluster once, then the event stream
// GET /v1/cluster/events read with fetch (not EventSource, which cannot send a header): with
// --api-key both carry "Authorization: Bearer KEY". The key comes from the page's address after
// '#' (/#key=KEY: a fragment never reaches the server or its logs) or from the form shown after
// a 401, and is kept in this tab's sessionStorage.
"use strict";

const state = { snap: null, events: 0, finished: [], lastRate: null };
const $ = (id) => document.getElementById(id);

function key() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {
    sessionStorage.setItem("loip-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("loip-key");
}

function headers() {
  const k = key();
  return k ? { Authorization: "Bearer " + k } : {};
}

function askKey() {
  const f = $("keyform");
  f.hidden = false;
  $("status").textContent = "API key needed";
  f.onsubmit = (e) => {
    e.preventDefault();
    sessionStorage.setItem("loip-key", $("key").value);
    f.hidden = true;
    start();
  };
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of kids) e.append(c);
  return e;
}

function bytes(n) {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function rate(bps) {
  if (bps == null) return "–";
  const bits = bps * 8;
  return bits >= 1e9 ? (bits / 1e9).toFixed(2) + " Gbit/s" : bits >= 1e6 ? (bits / 1e6).toFixed(1) + " Mbit/s"
    : (bits / 1e3).toFixed(0) + " kbit/s";
}

const ACCOUNTS = ["weights", "slots", "kv", "activations"];

function budgetBar(d) {
  const acc = d.accounts || {};
  const used = Object.values(acc).reduce((a, b) => a + b, 0) || d.memory_bytes || 0;
  const whole = d.budget_bytes > 0 ? d.budget_bytes : Math.max(used, 1);
  const bar = el("div", { class: "budget", "data-budget": d.budget_bytes || 0, "data-used": used,
    title: d.budget_bytes > 0 ? "budget " + bytes(d.budget_bytes) : "no budget (unlimited)" });
  const names = Object.keys(acc).sort((a, b) => (ACCOUNTS.indexOf(a) + 9) % 9 - (ACCOUNTS.indexOf(b) + 9) % 9);
  for (const a of names) {
    const cls = ACCOUNTS.includes(a) ? "a-" + a : "a-other";
    bar.append(el("span", { class: cls, style: "width:" + (100 * acc[a] / whole).toFixed(2) + "%",
      title: a + " " + bytes(acc[a]) }));
  }
  const words = names.map((a) => a + " " + bytes(acc[a])).join(", ");
  return [bar, el("div", { class: "mem" }, bytes(used) + " of " + (d.budget_bytes > 0 ? bytes(d.budget_bytes) : "no budget")
    + (words ? " (" + words + ")" : ""))];
}

// A link's measured figures: what went over it in the last interval, its latency, and the
// bandwidth its socket measured (once large messages were timed).
// Before its first interval a link has no figures: it says so rather than "– now".
function linkWords(l) {
  if (l.bytes_per_s == null && l.latency_ms == null && !l.bandwidth_Bps) return ["not measured yet"];
  const w = [l.bytes_per_s != null ? rate(l.bytes_per_s) + " now" : "rate not measured yet"];
  if (l.latency_ms != null) w.push(l.latency_ms.toFixed(2) + " ms");
  if (l.bandwidth_Bps) w.push("measured " + rate(l.bandwidth_Bps));
  return w;
}

function stageText(s) {
  const [a, b] = s.blocks;
  return "stage " + s.stage + ": " + (a === b ? "block " + a : "blocks " + a + "–" + b) + (s.offloaded > 0 ? " (" + s.offloaded + " re-read each step)" : "");
}

function renderRing() {
  const s = state.snap;
  const ring = $("ring");
  ring.replaceChildren();
  const links = s.links || [];
  s.devices.forEach((d, i) => {
    const card = el("div", { class: "device", "data-device": d.device },
      el("h3", {}, "device " + d.device), el("div", { class: "where" }, (d.endpoint || "") + (d.pid ? " · pid " + d.pid : "")));
    for (const st of Array.isArray(d.stages) ? d.stages : []) card.append(el("div", { class: "stage", "data-stage": st.stage }, stageText(st)));
    card.append(...budgetBar(d));
    if (d.kv_free_tokens != null) card.append(el("div", { class: "mem" }, "KV free: " + d.kv_free_tokens + " positions"));
    ring.append(card);
    const l = links[i];
    if (l && i < s.devices.length - 1) {
      ring.append(el("div", { class: "link", "data-from": l.from, "data-to": l.to }, el("span", { class: "arrow" }, "→"),
        ...linkWords(l).map((w) => el("span", {}, w))));
    }
  });
  const back = links[s.devices.length - 1];
  if (back && s.devices.length > 1) {
    ring.append(el("div", { class: "link back", "data-from": back.from, "data-to": back.to },
      el("span", { class: "arrow" }, "↺"), "device " + back.from + " → device " + back.to + ": " + linkWords(back).join(", ")));
  }
}

function renderTimeline() {
  const s = state.snap;
  const tl = $("timeline");
  tl.replaceChildren();
  const rows = s.timeline || [];
  // each bar is one interval: how much of its time the device computed, loaded, stalled, sent
  s.devices.forEach((dev, i) => {
    const lane = el("div", { class: "lane" });
    for (const r of rows) {
      const d = (Array.isArray(r.devices) && r.devices[i]) || {};
      let top = r.ms || 1;
      // (loads run beside compute: their sum may pass the interval, then the bar is the sum)
      const sum = (d.compute_ms || 0) + (d.load_ms || 0) + (d.stall_ms || 0) + (d.send_ms || 0);
      if (sum > top) top = sum;
      const bar = el("div", { class: "bar", title: "step " + r.step + ": compute " + (d.compute_ms || 0).toFixed(1) + " ms, load "
        + (d.load_ms || 0).toFixed(1) + " ms, stall " + (d.stall_ms || 0).toFixed(1) + " ms, send " + (d.send_ms || 0).toFixed(1) + " ms" });
      for (const k of ["compute", "load", "stall", "send"]) {
        bar.append(el("span", { class: k, style: "height:" + (100 * (d[k + "_ms"] || 0) / top).toFixed(2) + "%" }));
      }
      lane.append(bar);
    }
    tl.append(el("div", { class: "lane-row", "data-device": dev.device }, el("span", { class: "lane-name" }, "device " + dev.device), lane));
  });
}

function renderRequests() {
  const body = $("requests").tBodies[0];
  body.replaceChildren();
  for (const r of state.snap.requests || []) {
    body.append(el("tr", { class: "request" }, el("td", {}, r.id + (r.choice ? " #" + r.choice : "")), el("td", {}, r.state),
      el("td", {}, String(r.prompt_tokens)), el("td", {}, String(r.tokens)),
      el("td", {}, r.tokens_per_s != null ? r.tokens_per_s.toFixed(1) : "–")));
  }
  if (!body.rows.length) body.append(el("tr", {}, el("td", { colspan: 5, class: "none" }, "none")));
  list("finished", state.finished.slice(-20).reverse().map((r) => r.id + ": " + r.tokens + " tokens"
    + (r.tokens_per_s != null ? ", " + r.tokens_per_s.toFixed(1) + " tokens/s" : "") + (r.finish ? " (" + r.finish + ")" : "")),
    "none since this page opened");
}

function list(id, items, none) {
  $(id).replaceChildren(...(items.length ? items.map((t) => el("li", {}, t)) : [el("li", { class: "none" }, none)]));
}

function renderLogs() {
  const s = state.snap;
  list("adaptations", s.adaptations.map((a) => "step " + a.step + ": " + a.text), "none: the plan runs as it was made");
  list("losses", s.losses.map((l) => {
    const devs = Array.isArray(l.devices) ? l.devices : [];
    return "step " + (l.step != null ? l.step : "?") + ": device" + (devs.length > 1 ? "s " : " ") + devs.join(", ") + " lost: "
      + (l.why || "") + (l.replanned ? "; the " + l.devices_left + " left took over" : "; not re-planned");
  }), "no device lost");
  list("membership", s.membership.map((m) => "step " + (m.step != null ? m.step : "?") + ": device " + m.device + " ("
    + (m.endpoint || "") + ") " + ({ join: "joined", leave: "left", loss: "lost" }[m.kind] || m.kind)
    + (m.by ? " (" + m.by + ")" : "") + (m.replan_ms != null ? ", re-planned in " + Math.round(m.replan_ms) + " ms" : "")),
    "no join or leave");
}

function renderFigures() {
  const s = state.snap;
  $("model").textContent = s.model + (s.cluster ? " on " + s.devices.length + " devices" : " on one device");
  $("status").textContent = s.status;
  $("steps").textContent = s.steps;
  $("tokens").textContent = s.tokens;
  $("running").textContent = s.running;
  $("queued").textContent = s.queued;
  $("rate").textContent = state.lastRate != null ? state.lastRate.toFixed(1) : "–";
  const ev = $("events");
  ev.dataset.count = state.events;
  ev.textContent = "events " + state.events;
}

function render() {
  if (!state.snap) return;
  renderFigures();
  renderRing();
  renderTimeline();
  renderRequests();
  renderLogs();
}

const on = {
  plan(e) {
    const old = new Map(state.snap.devices.map((d) => [d.device, d]));
    state.snap.devices = (Array.isArray(e.devices) ? e.devices : []).map((d) => Object.assign({}, old.get(d.device) || {}, d));
  },
  step(e) {
    const s = state.snap;
    s.steps = e.step; s.tokens = e.tokens; s.running = e.running; s.queued = e.queued;
    s.links = Array.isArray(e.links) ? e.links : [];
    s.requests = Array.isArray(e.requests) ? e.requests : [];
    if (e.interval && e.interval.ms > 0) state.lastRate = 1000 * e.interval.tokens / e.interval.ms;
    (Array.isArray(e.devices) ? e.devices : []).forEach((d, i) => { if (s.devices[i]) Object.assign(s.devices[i], d, { links: undefined }); });
    if (e.interval && e.interval.ms > 0) {
      s.timeline.push(e.interval);
      if (s.timeline.length > 60) s.timeline.shift();
    }
  },
  adaptation(e) { state.snap.adaptations.push(e); },
  loss(e) { state.snap.losses.push(e); },
  member(e) { state.snap.membership.push(e); },
  request(e) {
    if (e.state === "done") state.finished.push(e);
  },
};

// Every event received counts, whatever its kind; one the page cannot read (or whose handler
// fails) is logged and skipped, and the stream goes on.
function dispatch(kind, data) {
  state.events++;
  try {
    if (on[kind]) on[kind](JSON.parse(data));
  } catch (err) {
    console.error("dashboard: the " + kind + " event: " + err.message);
  }
  render();
}

async function stream() {
  const res = await fetch("/v1/cluster/events", { headers: headers() });
  if (res.status === 401) { askKey(); return false; }
  if (!res.ok || !res.body) throw new Error("events: HTTP " + res.status);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let kind = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) kind = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) dispatch(kind, data);
      }
    }
  } finally {
    // (a stream left for a new one is closed: the server holds at most 16, and an abandoned
    // one would count until it filled)
    reader.cancel().catch(() => {});
  }
}

async function start() {
  for (;;) {
    try {
      const res = await fetch("/v1/cluster", { headers: headers() });
      if (res.status === 401) { askKey(); return; }
      state.snap = await res.json();
      // (an empty list comes as {} from the server's JSON encoder)
      for (const k of ["devices", "links", "timeline", "adaptations", "losses", "membership", "requests"]) {
        if (!Array.isArray(state.snap[k])) state.snap[k] = [];
      }
      const last = state.snap.timeline[state.snap.timeline.length - 1];
      if (last && last.ms > 0) state.lastRate = 1000 * last.tokens / last.ms;
      render();
      if ((await stream()) === false) return;
    } catch (err) {
      $("status").textContent = "disconnected (" + err.message + ")";
    }
    await new Promise((r) => setTimeout(r, 1000)); // the stream ended (or the server is away): again
  }
}

start();
