// The operator page of the Terra controller (served at / of the REST address).
//
// Every POLL_MS it reads the controller's REST JSON (/status, /topology, /links, /tunnels,
// /coflows?finished=N) from the same origin and redraws: the WAN graph (SVG), the link
// table (allocated rate of the last round vs the rates measured from the receivers'
// acknowledged bytes and, with switches, from the ports' counters),
// the tunnels of the selected DC pair, the round-time history and the coflow table; the
// agents (/agents), the tenants (/tenants: weights, shares, rates and the round's isolation
// guarantee; the panel shows only with tenants) and the event log (/events?since=N, only
// new events each time). A click
// on a link lists the coflows on it; a click on a coflow opens its view (/coflows/{id}:
// flows, agents, tunnels, rates, and its bytes delivered over time as a chart).
// Without a client certificate the REST calls carry an operator token (Authorization:
// Bearer; `terra-controller ctl login` prints one), kept in this tab's sessionStorage.
// Text from the controller (ids, reasons) is only ever set as textContent.
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 10000; // a request not answered by then (the server allows 10 s) is given up
const FINISHED_ROWS = 200; // finished coflows shown besides every active one
const SVG = "http://www.w3.org/2000/svg";
const W = 800, H = 460, MARGIN = 50;

const state = {
  prevLinks: null,  // {key: [bytes delivered, time s]} from the previous poll
  prevCoflows: new Map(), // id -> [bytes delivered, time s]
  rates: new Map(), // id -> bytes/s measured
  measured: {}, // link key -> bytes/s
  layoutKey: "",
  pos: {},
  topology: null,
  tunnels: [],
  linkCoflows: {}, // link key -> coflow ids with rates on it
  selectedLink: null,
  selectedCoflow: null,
  history: new Map(), // coflow id -> [[time s, bytes delivered], ...] (HISTORY points)
  events: [], // newest last, EVENTS_SHOWN at most
  lastEvent: 0,
};
const HISTORY = 300, EVENTS_SHOWN = 200, LABEL_PX = 11;
const TOKEN_KEY = "terra-token";

// Field names: accept the REST names with or without unit suffixes.
function pick(obj, ...names) {
  for (const n of names) if (obj[n] !== undefined) return obj[n];
  return undefined;
}
const linkA = (l) => pick(l, "a", "src");
const linkB = (l) => pick(l, "b", "dst");
const linkCap = (l) => pick(l, "capacity_bytes_per_s", "capacity_Bps", "capacity");
const linkAlloc = (l) => pick(l, "allocated_bytes_per_s", "allocated_Bps", "allocated");
const linkBytes = (l) => pick(l, "bytes_delivered");

function fmtBytes(x) {
  if (x === null || x === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(x) >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return (i === 0 ? x.toFixed(0) : x.toFixed(x < 10 ? 2 : 1)) + " " + units[i];
}
const fmtRate = (x) => (x === null || x === undefined ? "–" : fmtBytes(x) + "/s");
const fmtS = (x) => (x === null || x === undefined ? "–" : x.toFixed(x < 10 ? 3 : 1) + " s");

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function row(cells, attrs) {
  const tr = el("tr", attrs);
  for (const c of cells) {
    const td = el("td", c.cls ? { class: c.cls } : {}, c.text);
    tr.appendChild(td);
  }
  return tr;
}
function replaceBody(table, rows) {
  const body = document.querySelector(table + " tbody");
  body.replaceChildren(...rows);
}

async function getJson(path) {
  const headers = {}, token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  // A request the controller never answers must not freeze the page: polls run one at a
  // time, so one hung request would stop every later poll.
  const signal = AbortSignal.timeout(FETCH_TIMEOUT_MS);
  try {
    const reply = await fetch(path, { cache: "no-store", headers, signal });
    // (a refusal of a request sent before the token changed does not ask again)
    const refused = reply.status === 401 || reply.status === 403;
    if (refused && token === sessionStorage.getItem(TOKEN_KEY)) showLogin(reply.status, path);
    if (!reply.ok) throw new Error(path + ": HTTP " + reply.status);
    return await reply.json();
  } catch (err) {
    if (err.name !== "TimeoutError") throw err;
    throw new Error(`${path}: no answer within ${FETCH_TIMEOUT_MS / 1000} s`);
  }
}

function showLogin(code, path) {
  const box = document.getElementById("login");
  box.hidden = false;
  document.getElementById("login-note").textContent = sessionStorage.getItem(TOKEN_KEY)
    ? `token refused (HTTP ${code} on ${path}): expired or not an operator's`
    : "this page needs an operator token (or an operator client certificate)";
}

function signIn() {
  const token = document.getElementById("login-token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("login").hidden = true;
  poll();
}

// ---- layout: positions from the topology ([x, y], e.g. longitude/latitude), else a circle
function layout(topo) {
  const dcs = topo.dcs, given = topo.positions || {};
  const placed = dcs.filter((d) => given[d]);
  const pos = {};
  if (placed.length >= 2) {
    const xs = placed.map((d) => given[d][0]), ys = placed.map((d) => given[d][1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = (W - 2 * MARGIN) / Math.max(x1 - x0, 1e-9), sy = (H - 2 * MARGIN) / Math.max(y1 - y0, 1e-9);
    for (const d of placed) {
      // y grows downwards in SVG, upwards in latitude
      pos[d] = [MARGIN + (given[d][0] - x0) * sx, H - MARGIN - (given[d][1] - y0) * sy];
    }
  }
  const rest = dcs.filter((d) => !pos[d]);
  rest.forEach((d, i) => { // on an ellipse filling the view: more room between DCs
    const t = (2 * Math.PI * i) / rest.length - Math.PI / 2;
    pos[d] = [W / 2 + (W / 2 - MARGIN) * Math.cos(t), H / 2 + (H / 2 - MARGIN) * Math.sin(t)];
  });
  return pos;
}

function selectedPair() {
  return [document.getElementById("tunnel-src").value, document.getElementById("tunnel-dst").value];
}

function tunnelLinks() {
  const [src, dst] = selectedPair();
  const out = new Set();
  for (const t of state.tunnels) {
    if (t.src !== src || t.dst !== dst) continue;
    for (let i = 0; i + 1 < t.path.length; i++) out.add(t.path[i] + ">" + t.path[i + 1]);
  }
  return out;
}

// Screen px -> viewBox units of the WAN graph (labels keep LABEL_PX on screen).
function unitsPerPx() {
  const w = document.getElementById("wan").getBoundingClientRect().width;
  return w > 0 ? W / w : 1;
}

function overlaps(box, boxes) {
  return boxes.some((o) => box[0] < o[2] && o[0] < box[2] && box[1] < o[3] && o[1] < box[3]);
}

// Greedy label placement: each label tries a few spots along its line (its own side) and
// takes the first that overlaps no node and no label placed before; one that fits nowhere
// is left out (its line's tooltip has the figure).
function placeLabels(cands, nodeBoxes) {
  const u = unitsPerPx(), fs = LABEL_PX * u, placed = [...nodeBoxes], out = [];
  cands.sort((p, q) => q.weight - p.weight);
  for (const c of cands) {
    const w = c.text.length * fs * 0.62 + 6 * u, h = fs * 1.3;
    for (const t of [0.3, 0.5, 0.7, 0.2, 0.8, 0.4, 0.6]) {
      const x = c.x1 + (c.x2 - c.x1) * t + c.nx * (h * 0.7), y = c.y1 + (c.y2 - c.y1) * t + c.ny * (h * 0.7);
      const box = [x - w / 2, y - h / 2, x + w / 2, y + h / 2];
      if (box[0] < 0 || box[2] > W || box[1] < 0 || box[3] > H || overlaps(box, placed)) continue;
      placed.push(box);
      out.push(svg("text", { class: "load", x, y, "font-size": fs.toFixed(2), "data-link": c.key }, c.text));
      break;
    }
  }
  return out;
}

function linkLine(l, pos, hl, labels) {
  const a = linkA(l), b = linkB(l), cap = linkCap(l) || 1, alloc = linkAlloc(l) || 0;
  const [x1, y1] = pos[a], [x2, y2] = pos[b];
  const len = Math.hypot(x2 - x1, y2 - y1) || 1;
  // offset each direction to its right-hand side so a->b and b->a are both visible
  const nx = (y2 - y1) / len, ny = -(x2 - x1) / len, ox = nx * 4, oy = ny * 4;
  const k = a + ">" + b, sel = state.selectedLink === k ? " selected" : "";
  const g = svg("g", { class: "edge", "data-link": k });
  const coords = { x1: x1 + ox, y1: y1 + oy, x2: x2 + ox, y2: y2 + oy };
  g.appendChild(svg("line", {
    class: "link " + l.state + (hl.has(k) ? " hl" : "") + sel, ...coords,
    "stroke-width": 2 + 8 * Math.min(1, alloc / cap), "data-link": k, "data-state": l.state,
  }));
  g.appendChild(svg("line", { class: "hit", ...coords, "data-link": k }));
  g.appendChild(svg("title", {}, `${a} → ${b}: ${l.state}, allocated ${fmtRate(alloc)} of ` +
    `${fmtRate(cap)}, acknowledged ${fmtRate(state.measured[k])}; click for its coflows`));
  g.addEventListener("click", () => selectLink(k));
  if (alloc >= 1) {
    labels.push({ key: k, text: fmtRate(alloc), weight: alloc, nx, ny,
      x1: x1 + ox, y1: y1 + oy, x2: x2 + ox, y2: y2 + oy });
  }
  return g;
}

function drawWan(topo) {
  const key = topo.dcs.join(",") + JSON.stringify(topo.positions || {});
  if (key !== state.layoutKey) {
    state.pos = layout(topo);
    state.layoutKey = key;
  }
  const pos = state.pos, g = document.getElementById("wan"), hl = tunnelLinks();
  const items = [], labels = [], nodeBoxes = [], nodes = [];
  for (const l of topo.links) items.push(linkLine(l, pos, hl, labels));
  const u = unitsPerPx(), r = 14 * u; // DCs keep 28 px circles and LABEL_PX names on screen
  for (const d of topo.dcs) {
    const [x, y] = pos[d];
    const node = svg("g", { class: "node", "data-dc": d });
    node.appendChild(svg("circle", { cx: x, cy: y, r }));
    node.appendChild(svg("text", { x, y, "font-size": (LABEL_PX * u).toFixed(2) },
      d.length > 5 ? d.slice(0, 5) : d));
    node.appendChild(svg("title", {}, d));
    nodes.push(node);
    nodeBoxes.push([x - r, y - r, x + r, y + r]);
  }
  g.replaceChildren(...items, ...nodes, ...placeLabels(labels, nodeBoxes));
}

function selectLink(k) {
  state.selectedLink = state.selectedLink === k ? null : k;
  if (state.topology) drawWan(state.topology);
  drawLinkDetail();
}

function drawLinkDetail() {
  const box = document.getElementById("link-detail"), k = state.selectedLink;
  box.hidden = !k;
  if (!k) return;
  const ids = state.linkCoflows[k] || [];
  document.getElementById("link-title").textContent =
    `Link ${k.replace(">", " → ")}: ` + (ids.length === 1 ? "1 coflow with a rate on it"
      : ids.length ? ids.length + " coflows with rates on it" : "no coflow on it now");
  document.getElementById("link-coflows").replaceChildren(...ids.map((id) => {
    const b = el("button", { type: "button", "data-coflow": String(id) }, "coflow " + id);
    b.addEventListener("click", () => selectCoflow(id));
    const li = el("li");
    li.appendChild(b);
    return li;
  }));
}

function drawLinks(topo, now) {
  const prev = state.prevLinks, cur = {};
  for (const l of topo.links) {
    const k = linkA(l) + ">" + linkB(l), b = linkBytes(l);
    if (b === undefined) continue;
    cur[k] = [b, now];
    if (prev && prev[k] && now > prev[k][1]) state.measured[k] = (b - prev[k][0]) / (now - prev[k][1]);
  }
  state.prevLinks = cur;
  const rows = topo.links.map((l) => {
    const k = linkA(l) + ">" + linkB(l), cap = linkCap(l), alloc = linkAlloc(l);
    return row([
      { text: `${linkA(l)} → ${linkB(l)}` },
      { text: l.state, cls: l.state === "down" ? "down" : "" },
      { text: fmtRate(cap), cls: "num" },
      { text: fmtRate(alloc), cls: "num" },
      { text: fmtRate(state.measured[k]), cls: "num" },
      { text: fmtRate(pick(l, "measured_bytes_per_s")), cls: "num" },
      { text: cap ? ((100 * alloc) / cap).toFixed(1) + " %" : "–", cls: "num" },
    ], { "data-link": k, "data-state": l.state, class: l.state });
  });
  replaceBody("#links", rows);
}

function fillSelect(id, dcs, fallback) {
  const sel = document.getElementById(id);
  if (sel.options.length === dcs.length) return;
  sel.replaceChildren(...dcs.map((d) => el("option", { value: d }, d)));
  sel.value = fallback;
}

function drawTunnels() {
  const [src, dst] = selectedPair();
  const rows = state.tunnels
    .filter((t) => t.src === src && t.dst === dst)
    .map((t) => row([
      { text: String(t.tunnel) },
      { text: t.path.join(" → ") },
      { text: t.up ? "up" : "down", cls: t.up ? "" : "down" },
    ], { "data-tunnel": String(t.tunnel) }));
  if (!rows.length) rows.push(row([{ text: src === dst ? "same DC" : "no tunnels" }, { text: "" }, { text: "" }]));
  replaceBody("#tunnels", rows);
}

function drawRounds(status) {
  const round = status.recent_round_ms || [], alloc = status.recent_allocate_ms || [];
  const g = document.getElementById("rounds"), top = Math.max(1e-3, ...round);
  const line = (vals, cls) => svg("polyline", {
    class: cls,
    points: vals.map((v, i) => `${30 + (i * 365) / Math.max(1, vals.length - 1)},${110 - (v / top) * 100}`).join(" "),
  });
  g.replaceChildren(
    svg("text", { x: 2, y: 12 }, top.toFixed(top < 10 ? 2 : 0) + " ms"),
    svg("text", { x: 2, y: 110 }, "0"),
    line(round, "round"), line(alloc, "allocate"));
  const sorted = [...round].sort((x, y) => x - y);
  const med = sorted.length ? sorted[Math.floor(sorted.length / 2)] : 0;
  document.getElementById("round-stats").textContent =
    `blue: whole round, orange: policy.allocate; ${status.rounds} rounds, last ` +
    `${(status.last_round_ms || 0).toFixed(2)} ms, median ${med.toFixed(2)} ms, ` +
    `max ${top.toFixed(2)} ms`;
}

function drawCoflows(coflows, now) {
  const rows = [];
  const seen = new Map();
  for (const c of coflows) {
    const prev = state.prevCoflows.get(c.id);
    let rate = state.rates.get(c.id);
    if (prev && now > prev[1]) rate = (c.bytes_delivered - prev[0]) / (now - prev[1]);
    const final = ["done", "failed", "cancelled", "rejected"].includes(c.state);
    if (final) rate = 0;
    seen.set(c.id, [c.bytes_delivered, now]);
    remember(c, now);
    if (rate !== undefined) state.rates.set(c.id, rate);
    const pct = c.bytes_total ? ((100 * c.bytes_delivered) / c.bytes_total).toFixed(1) : "0";
    rows.push(row([
      { text: String(c.id) },
      { text: c.state, cls: "state-" + c.state },
      { text: `${fmtBytes(c.bytes_delivered)} / ${fmtBytes(c.bytes_total)} (${pct} %)`, cls: "num" },
      { text: fmtRate(rate), cls: "num" },
      { text: fmtS(c.cct_s), cls: "num" },
      { text: fmtS(c.deadline_s), cls: "num" },
      { text: c.reason || "" },
    ], { "data-coflow": String(c.id), "data-state": c.state,
      class: "clickable" + (state.selectedCoflow === c.id ? " selected" : "") }));
    rows[rows.length - 1].addEventListener("click", () => selectCoflow(c.id));
  }
  state.prevCoflows = seen;
  for (const id of [...state.history.keys()]) {
    if (!seen.has(id) && id !== state.selectedCoflow) state.history.delete(id);
  }
  for (const id of [...state.rates.keys()]) if (!seen.has(id)) state.rates.delete(id);
  replaceBody("#coflows", rows);
  document.getElementById("coflow-note").textContent =
    `(${coflows.length} shown: every active one and the last ${FINISHED_ROWS} finished)`;
}

// ---- one coflow: flows, agents, tunnels, rates, progress over time
function remember(c, now) {
  const h = state.history.get(c.id) || [];
  const last = h[h.length - 1];
  if (!last || last[1] !== c.bytes_delivered || now - last[0] > 5) h.push([now, c.bytes_delivered]);
  if (h.length > HISTORY) h.splice(0, h.length - HISTORY);
  state.history.set(c.id, h);
}

function selectCoflow(id) {
  state.selectedCoflow = id;
  document.getElementById("panel-coflow").hidden = false;
  document.getElementById("coflow-title").textContent = String(id);
  document.querySelectorAll("#coflows tbody tr").forEach((r) =>
    r.classList.toggle("selected", r.dataset.coflow === String(id)));
  refreshCoflow();
}

async function refreshCoflow() {
  const id = state.selectedCoflow;
  if (id === null) return;
  try {
    drawCoflow(await getJson("/coflows/" + id));
  } catch (err) {
    document.getElementById("coflow-summary").textContent = "coflow " + id + ": " + err.message;
  }
}

function pathText(p) {
  return (p.tunnel === null || p.tunnel === undefined ? "" : `#${p.tunnel} `) +
    p.path.join("→") + ": " + fmtRate(p.rate_bytes_per_s);
}

function drawCoflow(c) {
  if (c.id !== state.selectedCoflow) return;
  remember(c, performance.now() / 1000);
  const pct = c.bytes_total ? ((100 * c.bytes_delivered) / c.bytes_total).toFixed(1) : "0";
  document.getElementById("coflow-summary").textContent =
    `${c.name ? c.name + " · " : ""}${c.tenant ? "tenant " + c.tenant + " · " : ""}${c.state} · ${fmtBytes(c.bytes_delivered)} of ` +
    `${fmtBytes(c.bytes_total)} (${pct} %) · ${c.flows.length} flows · CCT ${fmtS(c.cct_s)}` +
    (c.reason ? " · " + c.reason : "");
  const rows = c.flows.map((f) => row([
    { text: f.id },
    { text: `${f.src} (${f.src_dc}) → ${f.dst} (${f.dst_dc})` },
    { text: (f.paths || []).map(pathText).join("; ") || (f.src_dc === f.dst_dc ? "intra-DC" : "none now") },
    { text: fmtRate(f.rate_bytes_per_s), cls: "num" },
    { text: `${fmtBytes(f.bytes_delivered)} / ${fmtBytes(f.bytes)}`, cls: "num" },
    { text: f.state + (f.reason ? ": " + f.reason : ""), cls: "state-" + f.state },
  ], { "data-flow": f.id, "data-state": f.state,
    "data-tunnels": (f.paths || []).map((p) => p.tunnel).join(",") }));
  replaceBody("#coflow-flows", rows);
  drawProgress(state.history.get(c.id) || [], c.bytes_total);
}

function drawProgress(h, total) {
  const g = document.getElementById("coflow-progress");
  if (!h.length) return g.replaceChildren();
  const t0 = h[0][0], span = Math.max(1, h[h.length - 1][0] - t0), top = Math.max(1, total);
  const pts = h.map(([t, b]) => `${40 + ((t - t0) * 350) / span},${90 - (b / top) * 80}`);
  g.replaceChildren(
    svg("text", { x: 2, y: 14 }, fmtBytes(total)), svg("text", { x: 2, y: 92 }, "0"),
    svg("text", { x: 300, y: 99 }, span.toFixed(0) + " s shown"),
    svg("line", { class: "axis", x1: 40, y1: 10, x2: 390, y2: 10 }),
    svg("polyline", { class: "progress", points: pts.join(" "), "data-points": String(h.length) }));
}

// ---- agents and events
function ago(s) {
  if (s === null || s === undefined) return "never";
  return s < 1 ? "now" : s < 120 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago";
}

function drawAgents(reply) {
  const rows = (reply.agents || []).map((a) => row([
    { text: a.id }, { text: a.dc },
    { text: a.connected ? "connected" : "disconnected", cls: a.connected ? "" : "down" },
    { text: ago(a.last_seen_s) },
    { text: String(a.sending), cls: "num" }, { text: String(a.receiving), cls: "num" },
    { text: a.coflows.join(", ") },
  ], { "data-agent": a.id, "data-connected": String(a.connected) }));
  replaceBody("#agents", rows);
}

function tenantLimits(t) {
  const out = [];
  if (t.max_coflows !== null && t.max_coflows !== undefined) out.push(`${t.max_coflows} coflows`);
  if (t.max_bytes !== null && t.max_bytes !== undefined) out.push(fmtBytes(t.max_bytes));
  if (t.max_reserved_bytes_per_s) out.push(`${fmtRate(t.max_reserved_bytes_per_s)} reserved`);
  const text = out.length ? "at most " + out.join(", ") : "none";
  const held = (t.reservations || []).map((r) => `${r.src}→${r.dst} ${fmtRate(r.rate_bytes_per_s)}` +
    (r.ceil_bytes_per_s ? ` (ceiling ${fmtRate(r.ceil_bytes_per_s)})` : ""));
  return held.length ? `${text}; guaranteed ${held.join(", ")}` : text;
}

function drawTenants(reply) {
  const panel = document.getElementById("panel-tenants");
  panel.hidden = reply.isolation !== "tenants";
  if (panel.hidden) return;
  const fixed = (x) => (typeof x === "number" ? x.toFixed(3) : "–");
  document.getElementById("tenant-note").textContent = `(${reply.sharing} sharing · ` +
    `isolation guarantee ${fixed(reply.guarantee)}, reached ${fixed(reply.achieved)})`;
  const rows = reply.tenants.map((t) => row([
    { text: t.name }, { text: String(t.weight), cls: "num" },
    { text: (100 * t.share).toFixed(1) + " %", cls: "num" },
    { text: String(t.active_coflows), cls: "num" },
    { text: fmtBytes(t.bytes_in_flight), cls: "num" },
    { text: fmtRate(t.allocated_bytes_per_s), cls: "num" },
    { text: tenantLimits(t) },
  ], { "data-tenant": t.name }));
  replaceBody("#tenants", rows);
}

function eventText(e) {
  const skip = new Set(["seq", "t", "kind"]);
  return Object.entries(e).filter(([k, v]) => !skip.has(k) && v !== null)
    .map(([k, v]) => k + " " + (typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : v))
    .join(" · ");
}

function drawEvents(reply) {
  state.events.push(...reply.events);
  state.events.splice(0, Math.max(0, state.events.length - EVENTS_SHOWN));
  if (reply.events.length) state.lastEvent = reply.events[reply.events.length - 1].seq;
  else state.lastEvent = Math.min(state.lastEvent, reply.last);
  const rows = [...state.events].reverse().map((e) => row([
    { text: new Date(e.t * 1000).toLocaleTimeString() },
    { text: e.kind, cls: "ev-" + e.kind },
    { text: eventText(e) },
  ], { "data-kind": e.kind, "data-seq": String(e.seq) }));
  replaceBody("#events", rows);
}

function drawSummary(status) {
  document.getElementById("topology-name").textContent = status.topology;
  const agents = status.agents || [];
  const up = agents.filter((a) => a.connected).length;
  const states = Object.entries(status.coflows || {}).map(([s, n]) => `${n} ${s}`).join(", ");
  document.getElementById("summary").textContent =
    `up ${Math.round(status.uptime_s)} s · agents ${up}/${agents.length} connected · ` +
    `${status.rounds} rounds · coflows in memory: ${states || "none"}` +
    ` · ${status.openflow ? "OpenFlow switches" : "logical tunnels"}`;
}

let polling = false; // one poll at a time: a slow controller is not piled up on

async function poll() {
  if (polling) return;
  polling = true;
  const conn = document.getElementById("conn");
  try {
    const [status, topology, links, tunnels, coflows, agents, tenants, events] =
      await Promise.all([
        getJson("/status"), getJson("/topology"), getJson("/links"), getJson("/tunnels"),
        getJson("/coflows?finished=" + FINISHED_ROWS), getJson("/agents"),
        getJson("/tenants"), getJson("/events?since=" + state.lastEvent),
      ]);
    const now = performance.now() / 1000;
    const topo = { dcs: topology.dcs, positions: topology.positions, links: links.links };
    state.topology = topo;
    state.tunnels = tunnels.tunnels || [];
    state.linkCoflows = {};
    for (const l of links.links) state.linkCoflows[linkA(l) + ">" + linkB(l)] = l.coflows || [];
    fillSelect("tunnel-src", topo.dcs, topo.dcs[0]);
    fillSelect("tunnel-dst", topo.dcs, topo.dcs[1] || topo.dcs[0]);
    drawSummary(status);
    drawLinks(topo, now);
    drawWan(topo);
    drawTunnels();
    drawRounds(status);
    drawCoflows(coflows, now);
    drawAgents(agents);
    drawTenants(tenants);
    drawEvents(events);
    drawLinkDetail();
    await refreshCoflow();
    conn.textContent = "updated " + new Date().toLocaleTimeString();
    conn.className = "conn";
    document.body.dataset.updated = String((Number(document.body.dataset.updated) || 0) + 1);
  } catch (err) {
    conn.textContent = "controller unreachable: " + err.message;
    conn.className = "conn stale";
  } finally {
    polling = false;
  }
}

function redrawSelection() {
  if (state.topology) drawWan(state.topology);
  drawTunnels();
}

document.getElementById("tunnel-src").addEventListener("change", redrawSelection);
document.getElementById("tunnel-dst").addEventListener("change", redrawSelection);
document.getElementById("login-button").addEventListener("click", signIn);
document.getElementById("coflow-close").addEventListener("click", () => {
  state.selectedCoflow = null;
  document.getElementById("panel-coflow").hidden = true;
});
poll();
setInterval(poll, POLL_MS);
