// Draws /api/overview every two seconds. Read-only; every value goes into the page as text (never as
// HTML), and the plots are SVG drawn here, so the page needs nothing from outside this server.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const COLORS = { put: "#0969da", get: "#1a7f37", putSlow: "#54aeff", getSlow: "#4ac26b" };
const STATUS_COLORS = { active: "#0969da", idle: "#8c959f", lock: "#9a6700", normal: "#1a7f37", broken: "#cf222e",
  repairing: "#bf8700", repaired: "#8250df", dropping: "#bc4c00", dropped: "#57606a" };

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.setAttribute("class", value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i > 0 ? 1 : 0)} ${units[i]}`;
}

function badge(text, kind) { return el("span", { class: `badge ${kind}`, text }); }

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

function renderHeader(o) {
  const health = document.getElementById("health");
  health.textContent = o.healthy ? "healthy" : `${o.problems.length} problem${o.problems.length === 1 ? "" : "s"}`;
  health.className = `badge ${o.healthy ? "ok" : "bad"}`;
  document.getElementById("raft-summary").textContent =
    `leader: ${o.leader ?? "none"} · term ${o.term}`;
  const age = o.updated ? Math.max(0, Date.now() / 1000 - o.updated) : null;
  document.getElementById("updated").textContent =
    age === null ? "waiting for the first scrape" : `scraped ${age.toFixed(0)} s ago, every ${o.scrape_interval} s`;
  const insecure = document.getElementById("insecure");  // services that run every route open: never quietly
  insecure.hidden = !o.insecure.length;
  insecure.textContent = o.insecure.length ? `INSECURE: ${o.insecure.join(", ")}` : "";
  insecure.title = "these processes run without auth (insecure: true): every route open, nothing signed";
  const box = document.getElementById("problems");
  box.hidden = o.healthy;
  document.getElementById("problem-list").replaceChildren(...o.problems.map((p) => el("li", { text: p })));
}

function progressBar(done, total) {
  const share = total > 0 ? Math.min(1, done / total) : 0;
  return el("div", { class: "progress", title: `${bytes(done)} of ${bytes(total)}` },
    el("div", { class: "progress-fill", style: `width: ${(100 * share).toFixed(1)}%` }),
    el("span", { text: total > 0 ? `${(100 * share).toFixed(0)} %  ${bytes(done)} / ${bytes(total)}` : "-" }));
}

function renderTasks(o) {
  document.getElementById("open-tasks").textContent = o.open_tasks ? `(${o.open_tasks} open)` : "(none)";
  fill(document.querySelector("#tasks tbody"), o.tasks.map((t) => el("tr", { "data-task": t.task_id },
    el("td", { text: t.task_id }), el("td", { text: t.task_type }), el("td", {}, badge(t.state, "warn")),
    el("td", { text: String(t.disk_id) }), el("td", { text: String(t.vid) }),
    el("td", {}, progressBar(t.done_bytes, t.total_bytes)),
    el("td", { text: `${t.age_s.toFixed(0)} s` }), el("td", { text: `${t.idle_s.toFixed(0)} s ago` }))));
}

function renderProcesses(o) {
  fill(document.querySelector("#processes tbody"), o.processes.map((p) => el("tr", { "data-process": p.name },
    el("td", { text: p.name }), el("td", { text: p.role }),
    el("td", {}, p.up ? badge("up", "ok") : badge("down", "bad"), p.insecure ? badge("INSECURE", "bad") : null),
    el("td", { text: p.up ? p.requests_per_s.toFixed(1) : "-" }),
    el("td", { text: p.up ? String(p.in_flight) : "-" }),
    el("td", { text: p.cpu_percent === null ? "-" : `${p.cpu_percent.toFixed(0)} %` }),
    el("td", { text: p.url }),
    el("td", { class: "error", title: p.error, text: p.error }))));
}

function ago(seconds) {
  const [n, unit] = seconds < 120 ? [seconds, "s"] : seconds < 7200 ? [seconds / 60, "min"]
    : seconds < 172800 ? [seconds / 3600, "h"] : [seconds / 86400, "d"];
  return `${n.toFixed(0)} ${unit}`;
}

// A disk's scrub: its current pass, how long since the last full one, what it found, and whether its cap keeps
// the period.
function scrubCell(s) {
  if (!s) return el("td", { class: "scrub", text: "no scrub" });
  const last = s.last_pass_age_s === null ? "no full pass yet" : `last pass ${ago(s.last_pass_age_s)} ago`;
  const owed = s.repairs_owed ? `, ${s.repairs_owed} repairs not yet queued` : "";
  return el("td", { class: "scrub" }, `scrub ${(100 * s.progress).toFixed(0)} % · ${last}`,
    s.corrupt ? " · " : null, s.corrupt ? badge(`${s.corrupt} corrupt${owed}`, s.repairs_owed ? "bad" : "warn") : null,
    s.late_s > 0 ? " · " : null, s.late_s > 0 ? badge(`pass ${ago(s.late_s)} late at the cap`, "warn") : null);
}

// A disk at reduced redundancy: how long until its unattended repair starts, or how much of it is left.
function repairCell(r) {
  if (!r) return el("td", { class: "repair" });
  if (r.silent_s !== null) {
    const when = r.starts_in_s === null ? "unattended repair off" : `repair starts in ${ago(r.starts_in_s)}`;
    return el("td", { class: "repair" }, badge(`silent ${ago(r.silent_s)}`, "warn"), ` ${when}`);
  }
  const eta = r.eta_s === null ? "ETA unknown yet" : `ETA ${ago(r.eta_s)}`;
  return el("td", { class: "repair" }, badge(`${r.units_left} units to rebuild`, "bad"), ` ${eta}`);
}

function renderBlobnodes(o) {
  const cards = o.blobnodes.map((node) => {
    const rows = node.disks.map((d) => {
      const used = d.size ? (d.size - d.free) / d.size : 0;
      const bad = d.status !== "normal" || !d.alive;
      return el("tr", { "data-disk-id": String(d.disk_id), class: bad ? "disk-bad" : "" },
        el("td", { text: `disk ${d.disk_id}` }),
        el("td", { class: "status" }, badge(d.status, d.status === "normal" ? "ok" : "bad")),
        el("td", {}, d.alive ? badge("alive", "ok") : badge("silent", "bad")),
        el("td", { title: `${bytes(d.size - d.free)} used of ${bytes(d.size)}, ${bytes(d.trash_bytes)} of it in trash` },
          el("span", { class: "space" }, el("span", { style: `width:${(used * 100).toFixed(1)}%` })),
          ` ${bytes(d.free)} free`, d.trash_bytes ? ` · ${bytes(d.trash_bytes)} in trash` : null),
        el("td", { text: `${d.chunks} chunks${d.readonly ? ", read-only" : ""}` }), scrubCell(d.scrub),
        repairCell(d.repair));
    });
    const table = rows.length ? el("table", {}, el("tbody", {}, ...rows))
      : el("div", { class: "host", text: "no disks registered" });
    return el("div", { class: `blobnode${node.up ? "" : " down"}`, "data-blobnode": node.name },
      el("h3", {}, el("span", { class: "name", text: node.name }), node.up ? badge("up", "ok") : badge("down", "bad"),
        el("span", { class: "host", text: node.host })), table);
  });
  document.getElementById("blobnodes").replaceChildren(...cards);
}

function stackedBar(counts) {
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const entries = Object.entries(counts).filter(([, n]) => n > 0);
  const bar = el("div", { class: "bar" }, ...entries.map(([status, n]) => el("span", {
    style: `width:${(100 * n / total).toFixed(2)}%;background:${STATUS_COLORS[status] ?? "#8c959f"}`, title: status })));
  const legend = el("div", { class: "legend" }, ...Object.entries(counts).map(([status, n]) => el("span",
    { "data-status": status }, el("i", { style: `background:${STATUS_COLORS[status] ?? "#8c959f"}` }), `${status} ${n}`)));
  return total ? [bar, legend] : [el("div", { text: "none" })];
}

function renderCounts(o) {
  const reduced = Object.entries(o.volumes_by_margin).filter(([, n]) => n > 0)
    .map(([margin, n]) => badge(`${n} at margin ${margin}`, Number(margin) <= 1 ? "bad" : "warn"));
  document.getElementById("volumes").replaceChildren(...stackedBar(o.volumes_by_status),
    el("div", { id: "reduced-redundancy" }, reduced.length ? "reduced redundancy: " : "full redundancy", ...reduced));
  document.getElementById("disk-summary").replaceChildren(...stackedBar(o.disks_by_status));
  fill(document.querySelector("#replicas tbody"), o.replicas.map((r) => el("tr", { "data-replica": r.name },
    el("td", { text: r.name }),
    el("td", {}, r.up ? badge(r.role, r.role === "leader" ? "ok" : "") : badge("down", "bad")),
    el("td", { text: String(r.term) }), el("td", { text: String(r.commit) }), el("td", { text: String(r.applied) }))));
}

function renderBacklog(o) {
  const tiles = o.backlog.map((p) => el("div", { class: "pipeline", "data-pipeline": p.name },
    el("div", { class: `backlog-number${p.backlog ? " busy" : ""}`, text: p.backlog === null ? "?" : String(p.backlog) }),
    el("div", { class: "name", text: p.name.replace("_", " ") }),
    el("div", { class: "counters", text: `in ${p.messages_in} · done ${p.done} · failed ${p.failed} · retried ${p.retried}` })));
  document.getElementById("backlog").replaceChildren(el("div", { class: "pipelines" }, ...tiles));
}

// A line chart of `lines` ({name, color, values: [number|null]}) over `times` (unix seconds), in an SVG
// with a 600x220 viewBox.
function lineChart(svg, times, lines, unit) {
  const W = 600, H = 220, left = 46, right = 10, top = 12, bottom = 40;
  const values = lines.flatMap((l) => l.values).filter((v) => v !== null);
  const children = [];
  if (times.length < 2 || !values.length) {
    children.push(el("svg:text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty",
      text: "no requests yet in the last minutes" }));
    svg.replaceChildren(...children);
    return;
  }
  const t0 = times[0], t1 = times[times.length - 1];
  const maxV = niceMax(Math.max(...values));
  const x = (t) => left + (W - left - right) * (t1 === t0 ? 1 : (t - t0) / (t1 - t0));
  const y = (v) => top + (H - top - bottom) * (1 - v / maxV);
  for (let i = 0; i <= 4; i++) {
    const v = maxV * i / 4;
    children.push(el("svg:line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: "grid" }));
    children.push(el("svg:text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", text: fmt(v) }));
  }
  children.push(el("svg:line", { x1: left, x2: left, y1: top, y2: H - bottom, class: "axis" }));
  const span = t1 - t0;
  for (let i = 0; i <= 4; i++) {
    const t = t0 + span * i / 4;
    children.push(el("svg:text", { x: x(t), y: H - bottom + 14, "text-anchor": "middle",
      text: `-${Math.round(t1 - t)} s` }));
  }
  lines.forEach((line, index) => {
    let d = "", pen = false;
    line.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(times[i]).toFixed(1)},${y(v).toFixed(1)} `;
      pen = true;
    });
    children.push(el("svg:path", { d, fill: "none", stroke: line.color, "stroke-width": 2,
      "stroke-dasharray": line.dashed ? "5 3" : "", "data-line": line.name }));
    const lx = left + index * 130;
    children.push(el("svg:rect", { x: lx, y: H - 16, width: 12, height: 4, fill: line.color }));
    children.push(el("svg:text", { x: lx + 16, y: H - 11, text: `${line.name}${unit}` }));
  });
  svg.replaceChildren(...children);
}

function niceMax(v) {
  if (v <= 0) return 1;
  const step = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * step).find((m) => m >= v);
}

function fmt(v) { return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2); }

function renderCharts(o) {
  const times = o.series.map((p) => p.time);
  const pick = (key) => o.series.map((p) => p[key]);
  lineChart(document.getElementById("rate-chart"), times, [
    { name: "PUT", color: COLORS.put, values: pick("put_per_s") },
    { name: "GET", color: COLORS.get, values: pick("get_per_s") }], "/s");
  lineChart(document.getElementById("latency-chart"), times, [
    { name: "PUT p50", color: COLORS.put, values: pick("put_p50_ms") },
    { name: "PUT p99", color: COLORS.putSlow, values: pick("put_p99_ms"), dashed: true },
    { name: "GET p50", color: COLORS.get, values: pick("get_p50_ms") },
    { name: "GET p99", color: COLORS.getSlow, values: pick("get_p99_ms"), dashed: true }], "");
}

async function refresh() {
  try {
    const response = await fetch("/api/overview", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const o = await response.json();
    renderHeader(o);
    renderCharts(o);
    renderBacklog(o);
    renderCounts(o);
    renderBlobnodes(o);
    renderProcesses(o);
    renderTasks(o);
    document.body.dataset.rendered = String(o.updated);
  } catch (error) {
    const health = document.getElementById("health");
    health.textContent = `dashboard unreachable: ${error.message}`;
    health.className = "badge bad";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
