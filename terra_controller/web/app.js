// The operator page of the Terra controller (served at / of the REST address).
//
// Every POLL_MS it reads the controller's REST JSON (/status, /topology, /links, /tunnels,
// /coflows?finished=N) from the same origin and redraws: the WAN graph (SVG), the link
// table (allocated rate of the last round vs the rates measured from the receivers'
// acknowledged bytes and, with switches, from the ports' counters),
// the tunnels of the selected DC pair, the round-time history and the coflow table.
// Text from the controller (ids, reasons) is only ever set as textContent.
"use strict";

const POLL_MS = 1000;
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
};

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
  const reply = await fetch(path, { cache: "no-store" });
  if (!reply.ok) throw new Error(path + ": HTTP " + reply.status);
  return reply.json();
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
  rest.forEach((d, i) => {
    const t = (2 * Math.PI * i) / rest.length - Math.PI / 2;
    const r = Math.min(W, H) / 2 - MARGIN;
    pos[d] = [W / 2 + r * Math.cos(t), H / 2 + r * Math.sin(t)];
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

function drawWan(topo) {
  const key = topo.dcs.join(",") + JSON.stringify(topo.positions || {});
  if (key !== state.layoutKey) {
    state.pos = layout(topo);
    state.layoutKey = key;
  }
  const pos = state.pos, g = document.getElementById("wan"), hl = tunnelLinks();
  const items = [];
  for (const l of topo.links) {
    const a = linkA(l), b = linkB(l), cap = linkCap(l) || 1, alloc = linkAlloc(l) || 0;
    const [x1, y1] = pos[a], [x2, y2] = pos[b];
    const len = Math.hypot(x2 - x1, y2 - y1) || 1;
    // offset each direction to its right-hand side so a->b and b->a are both visible
    const ox = ((y2 - y1) / len) * 4, oy = (-(x2 - x1) / len) * 4;
    const k = a + ">" + b;
    const cls = "link " + l.state + (hl.has(k) ? " hl" : "");
    const line = svg("line", {
      class: cls, x1: x1 + ox, y1: y1 + oy, x2: x2 + ox, y2: y2 + oy,
      "stroke-width": 2 + 8 * Math.min(1, alloc / cap), "data-link": k, "data-state": l.state,
    });
    line.appendChild(svg("title", {}, `${a} → ${b}: ${l.state}, allocated ${fmtRate(alloc)} of ` +
      `${fmtRate(cap)}, acknowledged ${fmtRate(state.measured[k])}`));
    items.push(line);
    if (alloc > 0) {
      const mx = x1 + (x2 - x1) * 0.35 + ox * 3, my = y1 + (y2 - y1) * 0.35 + oy * 3;
      items.push(svg("text", { class: "load", x: mx, y: my }, fmtRate(alloc)));
    }
  }
  for (const d of topo.dcs) {
    const node = svg("g", { class: "node", "data-dc": d });
    node.appendChild(svg("circle", { cx: pos[d][0], cy: pos[d][1], r: 16 }));
    node.appendChild(svg("text", { x: pos[d][0], y: pos[d][1] }, d.length > 5 ? d.slice(0, 5) : d));
    node.appendChild(svg("title", {}, d));
    items.push(node);
  }
  g.replaceChildren(...items);
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
    ], { "data-coflow": String(c.id), "data-state": c.state }));
  }
  state.prevCoflows = seen;
  for (const id of [...state.rates.keys()]) if (!seen.has(id)) state.rates.delete(id);
  replaceBody("#coflows", rows);
  document.getElementById("coflow-note").textContent =
    `(${coflows.length} shown: every active one and the last ${FINISHED_ROWS} finished)`;
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
    const [status, topology, links, tunnels, coflows] = await Promise.all([
      getJson("/status"), getJson("/topology"), getJson("/links"), getJson("/tunnels"),
      getJson("/coflows?finished=" + FINISHED_ROWS),
    ]);
    const now = performance.now() / 1000;
    const topo = { dcs: topology.dcs, positions: topology.positions, links: links.links };
    state.topology = topo;
    state.tunnels = tunnels.tunnels || [];
    fillSelect("tunnel-src", topo.dcs, topo.dcs[0]);
    fillSelect("tunnel-dst", topo.dcs, topo.dcs[1] || topo.dcs[0]);
    drawSummary(status);
    drawLinks(topo, now);
    drawWan(topo);
    drawTunnels();
    drawRounds(status);
    drawCoflows(coflows, now);
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
poll();
setInterval(poll, POLL_MS);
