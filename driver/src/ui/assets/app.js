// The ringflow driver's page: polls the JSON API under /api/v1 once a second and redraws the
// jobs and executors tables and the selected job's charts (SVG, so every point is in the DOM).
"use strict";

const PHASES = ["data", "forward", "backward", "allreduce", "optimizer"];
let selected = null;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

function duration(s) {
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  return m + " min " + Math.round(s - 60 * m) + " s";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i + 1 < units.length) { n /= 1024; i++; }
  return i === 0 ? n + " B" : n.toFixed(1) + " " + units[i];
}

// "memory per executor: about 170.2 MiB (read-ahead 52.6 MiB, …)", from a job's estimate.
function memoryLine(m) {
  if (!m) return "";
  const parts = m.parts.map(p => p.what + " " + bytes(p.bytes)).join(", ");
  return "memory per executor: about " + bytes(m.bytes) + " (" + parts + ")" + (m.note ? "; " + m.note : "");
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// Cancels a job. A driver with a shared secret answers 401 until the request carries it: the
// page then asks for it once and keeps it for this tab only (sessionStorage).
async function cancelJob(id) {
  if (!confirm("Cancel job " + id + "?")) return;
  for (let attempt = 0; attempt < 2; attempt++) {
    const secret = sessionStorage.getItem("ringflow-secret");
    const headers = secret ? { Authorization: "Bearer " + secret } : {};
    const r = await fetch("/api/v1/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST", headers });
    if (r.status !== 401) {
      if (!r.ok) alert((await r.json()).error);
      refresh();
      return;
    }
    sessionStorage.removeItem("ringflow-secret");
    const given = prompt("The driver requires the cluster's shared secret to cancel a job:");
    if (!given) return;
    sessionStorage.setItem("ringflow-secret", given.trim());
  }
  alert("The driver refused the secret.");
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  for (const j of jobs) {
    const tr = el("tr", { "data-job": j.id });
    if (j.id === selected) tr.className = "selected";
    tr.onclick = () => { selected = j.id; refresh(); };
    const p = j.progress;
    const bar = el("span", { class: "bar" });
    bar.appendChild(el("span", { style: "width:" + Math.round(100 * (p ? p.fraction : 0)) + "%" }));
    const progress = el("td");
    progress.appendChild(bar);
    if (p) progress.appendChild(document.createTextNode(" epoch " + p.epoch + "/" + p.epochs + ", step " + p.step + "/" + p.steps));
    tr.append(
      el("td", {}, j.id), el("td", {}, j.name),
      el("td", { class: "state-" + j.state, title: j.error || "" }, j.state),
      el("td", {}, String(j.executors)), progress,
      el("td", {}, p ? fmt(p.loss, 4) : "–"), el("td", {}, p ? fmt(p.samples_per_s, 0) : "–"),
      el("td", {}, duration(j.duration_s)));
    const action = el("td");
    if (["queued", "waiting", "running"].includes(j.state)) {
      const b = el("button", { class: "cancel", title: "cancel this job" }, "cancel");
      b.onclick = (ev) => { ev.stopPropagation(); cancelJob(j.id); };
      action.appendChild(b);
    }
    tr.appendChild(action);
    body.appendChild(tr);
  }
}

function renderExecutors(executors) {
  const body = document.querySelector("#executors tbody");
  body.replaceChildren();
  for (const x of executors) {
    const split = el("span", { class: "split" });
    if (x.phases) {
      for (const ph of PHASES) {
        split.appendChild(el("span", { class: ph, style: "width:" + (100 * x.phases[ph]).toFixed(1) + "%", title: ph + " " + (100 * x.phases[ph]).toFixed(0) + "%" }));
      }
    }
    const td = el("td");
    td.appendChild(split);
    body.appendChild(el("tr", { "data-executor": x.id }));
    body.lastChild.append(
      el("td", {}, x.id), el("td", {}, x.host), el("td", {}, x.devices.join(" ")),
      el("td", {}, x.state), el("td", {}, x.job_id || "–"),
      el("td", {}, x.rank === null ? "–" : String(x.rank)),
      el("td", {}, fmt(x.last_heartbeat_s, 1) + " s ago"),
      el("td", { title: x.memory_source || "" }, x.memory_bytes ? bytes(x.memory_bytes) : "–"),
      el("td", {}, fmt(x.samples_per_s, 0)), td);
  }
}

// A line chart of points [x, y] with axis labels; every point is a <circle>.
function chart(id, points) {
  const root = document.getElementById(id);
  root.replaceChildren();
  const W = 420, H = 200, L = 46, R = 10, T = 10, B = 22;
  if (points.length === 0) {
    root.appendChild(svg("text", { x: L, y: H / 2 })).textContent = "no data yet";
    return;
  }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 + 1e-9; y1 += Math.abs(y1) * 0.1 + 1e-9; }
  const sx = x => L + (W - L - R) * (x - x0) / (x1 - x0);
  const sy = y => H - B - (H - T - B) * (y - y0) / (y1 - y0);
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    root.appendChild(svg("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
    root.appendChild(svg("text", { x: 2, y: sy(y) + 3 })).textContent = Math.abs(y) >= 100 ? y.toFixed(0) : y.toPrecision(3);
  }
  root.appendChild(svg("text", { x: L, y: H - 6 })).textContent = String(Math.round(x0));
  root.appendChild(svg("text", { x: W - R - 30, y: H - 6 })).textContent = String(Math.round(x1));
  root.appendChild(svg("polyline", { points: points.map(p => sx(p[0]) + "," + sy(p[1])).join(" ") }));
  const every = Math.max(1, Math.ceil(points.length / 120));
  points.forEach((p, i) => {
    if (i % every === 0 || i === points.length - 1) {
      root.appendChild(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2, "data-x": p[0], "data-y": p[1] }));
    }
  });
}

// A token-sequence job's figures: "epoch 3: 5210 tokens/s, padding 4.2%; test after epoch 3:
// entity F1 0.7123 (precision 0.70, recall 0.72)", from its latest epoch and tagger test.
function sequenceLine(epochs, tests) {
  const parts = [];
  const e = epochs[epochs.length - 1];
  if (e) parts.push("epoch " + e.epoch + ": " + fmt(e.tokens_per_s, 0) + " tokens/s, padding " + fmt(100 * e.padding_fraction, 1) + "%");
  const t = tests[tests.length - 1];
  if (t) parts.push("test after epoch " + t.epoch + ": entity F1 " + fmt(t.entity_f1, 4) + " (precision " + fmt(t.entity_precision, 2) + ", recall " + fmt(t.entity_recall, 2) + ")");
  return parts.join("; ");
}

async function renderCharts(jobs) {
  document.getElementById("chart-job").textContent = selected || "(none yet)";
  const job = jobs.find(j => j.id === selected);
  document.getElementById("job-memory").textContent = job ? memoryLine(job.memory) : "";
  if (!selected) return;
  const m = await get("/api/v1/jobs/" + encodeURIComponent(selected) + "/metrics");
  // Progress reports (about once a second) and each epoch's mean, by step: epochs shorter than
  // a second still draw their points.
  const byStep = m.steps.concat(m.epochs).sort((a, b) => a.step - b.step);
  chart("loss-chart", byStep.map(p => [p.step, p.loss]));
  chart("throughput-chart", byStep.map(p => [p.step, p.samples_per_s]));
  // Test figures by epoch: accuracy for classifiers, mean squared error for regressions.
  const tests = m.tests.filter(p => p.accuracy !== null || p.mse !== null);
  const regression = tests.length > 0 && tests[0].accuracy === null;
  const perToken = tests.length > 0 && tests[0].per_token;
  document.getElementById("test-title").textContent = regression ? "test MSE (by epoch)" : (perToken ? "test token accuracy (by epoch)" : "test accuracy (by epoch)");
  chart("accuracy-chart", tests.map(p => [p.epoch, regression ? p.mse : p.accuracy]));
  // Token sequences: real tokens/s by epoch, and an IOB2 tagger's entity F1 by epoch.
  const sequences = m.epochs.filter(p => p.tokens_per_s !== null);
  const entities = m.tests.filter(p => p.entity_f1 !== null);
  document.getElementById("tokens-figure").hidden = sequences.length === 0;
  document.getElementById("entity-figure").hidden = entities.length === 0;
  if (sequences.length > 0) chart("tokens-chart", sequences.map(p => [p.epoch, p.tokens_per_s]));
  if (entities.length > 0) chart("entity-chart", entities.map(p => [p.epoch, p.entity_f1]));
  document.getElementById("job-figures").textContent = sequenceLine(sequences, entities);
}

async function refresh() {
  try {
    const [jobs, executors] = await Promise.all([get("/api/v1/jobs"), get("/api/v1/executors")]);
    if (!selected || !jobs.some(j => j.id === selected)) {
      const running = jobs.find(j => j.state === "running");
      selected = running ? running.id : (jobs[0] ? jobs[0].id : null);
    }
    renderJobs(jobs);
    renderExecutors(executors);
    await renderCharts(jobs);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the driver: " + e.message;
  }
}

refresh();
setInterval(refresh, 1000);
