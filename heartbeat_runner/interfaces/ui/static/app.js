// Heartbeat status page: overview, dependency graph, job page and ticks, drawn from /api/*.
// No framework and nothing from a CDN: the page works offline. Every value from the
// lakehouse is escaped before it goes into the DOM (job ids come from a config file).
"use strict";

let PHASES = [];  // the job phases the server names (JobPhase), set at start
const state = { meta: null, timer: null, notice: null, filter: { phase: "", q: "", sort: "attention", page: 1 },
  graph: { scale: 1, x: 0, y: 0, collapsed: new Set() } };
//: rows of the overview drawn at once: 5,000 jobs stay one page of DOM, whatever the refresh
const PAGE_SIZE = 100;
//: the phases that need someone, first when the overview sorts by attention (then PHASES' order)
const ATTENTION = ["FAILED", "TRIGGER_ERROR", "SENSING_ERROR"];
const COLORS = {
  RUNNING: "#1c7ed6", FAILED: "#e03131", READY: "#f08c00", WAITING: "#fab005", IDLE: "#adb5bd",
  PAUSED: "#868e96", ERROR: "#e03131", NEW_DATA: "#f08c00", QUIET: "#dee2e6", TRIGGER_ERROR: "#e03131",
  SENSING_ERROR: "#c2255c",
};
const STAGE_COLORS = ["#1c7ed6", "#f08c00", "#2f9e44", "#ae3ec9", "#e03131", "#0ca678", "#868e96", "#fab005", "#d6336c"];

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const badge = (s) => (s ? `<span class="badge ${esc(s)}">${esc(s)}</span>` : `<span class="muted">-</span>`);
const jobHref = (id) => `#/jobs/${encodeURIComponent(id)}`;
const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

function when(iso) {
  if (!iso) return "-";
  const t = new Date(iso.endsWith("Z") || iso.includes("+") ? iso : iso + "Z");
  const s = Math.round((Date.now() - t.getTime()) / 1000);
  const ago = s < 60 ? `${s}s` : s < 3600 ? `${Math.round(s / 60)}m` : s < 86400 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
  return `<span title="${esc(t.toISOString())}">${ago} ago</span>`;
}
const secs = (v) => (v == null ? "-" : v < 60 ? `${Number(v).toFixed(1)} s` : `${(v / 60).toFixed(1)} min`);
// A run's own duration (never the time Heartbeat took to notice its end); what is not known yet is said.
function runDuration(r) {
  if (r.outcome === "RUNNING") return '<span class="muted">running</span>';
  if (r.outcome === "REQUESTED") return '<span class="muted">not started</span>';
  if (r.outcome === "TRIGGER_ERROR") return '<span class="muted">never started</span>';
  const queued = r.queued_s ? ` <span class="muted">(queued ${secs(r.queued_s)})</span>` : "";
  return (r.duration_s == null ? '<span class="muted">unknown</span>' : secs(r.duration_s)) + queued;
}

function windowsText(windows) {
  if (!windows || !windows.length) return "-";
  return windows.map((w) => `${esc(w.sensor_source)}:${esc(w.sensor_id)} ${esc(w.from ?? "…")} → ${esc(w.to ?? "…")}`).join("<br>");
}

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// -- routing ---------------------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [page, ...rest] = hash.split("/");
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === (page === "jobs" ? "overview" : page || "overview")));
  if (page === "graph") return renderGraph;
  if (page === "ticks") return renderTicks;
  if (page === "jobs" && rest.length) return (view) => renderJob(view, decodeURIComponent(rest.join("/")));
  return renderOverview;
}

async function refresh() {
  clearTimeout(state.timer);
  const view = document.getElementById("view");
  try {
    await route()(view);
    await showRunner();
    document.getElementById("meta").textContent = `v${state.meta.version} · ${state.meta.schema} · updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    view.insertAdjacentHTML("afterbegin", `<div class="notice error" id="load-error">Could not load: ${esc(err.message)}</div>`);
  }
  state.timer = setTimeout(refresh, (state.meta?.refresh_s || 5) * 1000);
}

// The runner's health (GET /api/runner), the same words as `status` and `check`: when its last tick
// ended, or "runner not ticking" once that is older than the limit. The page's own refresh time is not it.
async function showRunner() {
  const runner = await api("/api/runner");
  const el = document.getElementById("runner");
  el.classList.toggle("down", !runner.healthy);
  el.title = runner.message;
  el.textContent = runner.healthy
    ? `runner ticking · last tick ${new Date(runner.last_tick_at).toLocaleTimeString()}`
    : (runner.last_tick_at ? `runner not ticking since ${new Date(runner.last_tick_at).toLocaleString()}` : "runner not ticking: no tick recorded");
}

// -- overview --------------------------------------------------------------------------------

async function renderOverview(view) {
  const [overview, alerts] = await Promise.all([api("/api/overview"), api("/api/alerts")]);
  state.jobs = overview.jobs;
  state.alerts = alerts.alerts;
  if (!view.querySelector("#jobs-page")) {  // build the page once; refreshes and filters redraw its parts
    view.innerHTML = `<div id="jobs-page">
      <div id="alerts-panel"></div>
      <h2>Jobs <span class="muted" id="job-count"></span></h2>
      <div class="counts" id="counts"></div>
      <div class="toolbar" style="margin-top:12px">
        <input type="search" id="search" placeholder="Search job or source…" value="${esc(state.filter.q)}">
        <select id="phase"><option value="">every status</option>${PHASES.map((p) => `<option>${p}</option>`).join("")}</select>
        <select id="sort" title="order of the jobs"><option value="attention">needs attention first</option>
          <option value="job">by job id</option><option value="since">latest change first</option></select>
        <span class="muted" id="shown"></span>
        <span class="pager"><button type="button" id="prev-page">‹ prev</button> <span id="page-of"></span>
          <button type="button" id="next-page">next ›</button></span>
      </div>
      <table id="jobs"><thead><tr><th>Job</th><th>Status</th><th>Dependencies (hard ▭ / soft ┅)</th><th>Since</th>
        <th>Last run</th><th>Window consumed</th><th>Verdict</th></tr></thead><tbody></tbody></table></div>`;
    const refilter = (change) => { change(); state.filter.page = 1; drawOverview(); };
    document.getElementById("search").addEventListener("input", (e) => refilter(() => { state.filter.q = e.target.value; }));
    document.getElementById("phase").addEventListener("change", (e) => refilter(() => { state.filter.phase = e.target.value; }));
    document.getElementById("sort").addEventListener("change", (e) => refilter(() => { state.filter.sort = e.target.value; }));
    document.getElementById("prev-page").addEventListener("click", () => { state.filter.page -= 1; drawOverview(); });
    document.getElementById("next-page").addEventListener("click", () => { state.filter.page += 1; drawOverview(); });
    document.getElementById("counts").addEventListener("click", (e) => {
      const count = e.target.closest(".count");
      if (count) refilter(() => { state.filter.phase = state.filter.phase === count.dataset.phase ? "" : count.dataset.phase; });
    });
  }
  drawOverview();
}

function drawOverview() {
  const jobs = state.jobs, q = state.filter.q.toLowerCase();
  document.getElementById("alerts-panel").innerHTML = alertsTable(state.alerts, "open-alerts");
  const shown = jobs.filter((j) => (!state.filter.phase || j.phase === state.filter.phase)
    && (!q || [j.job_id, j.job_name, ...j.dependencies.map((d) => d.label)].some((t) => String(t ?? "").toLowerCase().includes(q))));
  document.getElementById("job-count").textContent = `(${jobs.length})`;
  document.getElementById("counts").innerHTML = PHASES.map((p) =>
    `<span class="count" data-phase="${p}"><b>${jobs.filter((j) => j.phase === p).length}</b>${badge(p)}</span>`).join("");
  document.getElementById("phase").value = state.filter.phase;
  document.getElementById("sort").value = state.filter.sort;
  shown.sort(JOB_ORDERS[state.filter.sort] || JOB_ORDERS.attention);
  const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
  state.filter.page = Math.min(Math.max(1, state.filter.page), pages);  // a refresh may have fewer pages
  const first = (state.filter.page - 1) * PAGE_SIZE, rows = shown.slice(first, first + PAGE_SIZE);
  document.getElementById("shown").textContent = shown.length > PAGE_SIZE
    ? `${shown.length} shown, ${first + 1}–${first + rows.length} here` : `${shown.length} shown`;
  document.getElementById("page-of").textContent = `page ${state.filter.page} of ${pages}`;
  document.getElementById("prev-page").disabled = state.filter.page <= 1;
  document.getElementById("next-page").disabled = state.filter.page >= pages;
  document.querySelector("#jobs tbody").innerHTML =
    rows.map(jobRow).join("") || `<tr><td colspan="7" class="muted">No job matches.</td></tr>`;
}

const byJobId = (a, b) => String(a.job_id).localeCompare(String(b.job_id), undefined, { numeric: true });
const attentionRank = (j) => (ATTENTION.includes(j.phase) ? ATTENTION.indexOf(j.phase) : ATTENTION.length + PHASES.indexOf(j.phase));
//: the overview's orders (the sort menu): each ends on the job id, so equal rows keep one order across refreshes
const JOB_ORDERS = {
  attention: (a, b) => attentionRank(a) - attentionRank(b) || byJobId(a, b),
  job: byJobId,
  since: (a, b) => String(b.since ?? "").localeCompare(String(a.since ?? "")) || byJobId(a, b),
};

// Open alerts (GET /api/alerts: the heartbeat_alerts view, as `alerts` shows them), newest first.
function alertsTable(alerts, id) {
  if (!alerts.length) return "";
  const delivered = (a) => a.raise_delivered_to
    || (a.failed_deliveries ? `not delivered yet (${a.failed_deliveries} failed attempt(s))` : "the lakehouse only");
  return `<div class="alerts" id="${id}"><h3>${alerts.length} open alert${alerts.length > 1 ? "s" : ""}</h3>
    <table><thead><tr><th>Kind</th><th>Subject</th><th>What</th><th>Since</th><th>Sent to</th></tr></thead><tbody>
    ${alerts.map((a) => `<tr data-alert="${esc(a.alert_key)}"><td><span class="badge alert">${esc(a.kind)}</span></td>
      <td>${esc(a.subject)}</td><td>${esc(a.summary)}${a.link ? ` <a target="_blank" rel="noopener" href="${esc(a.link)}">output</a>` : ""}</td>
      <td>${when(a.since_ts || a.raised_at)}</td><td>${esc(delivered(a))}</td></tr>`).join("")}
    </tbody></table></div>`;
}

function depChip(d) {
  const cls = ["dep", d.kind, d.met ? "met" : "", d.sensing_error ? "error" : ""].join(" ");
  return `<span class="${cls}" title="${esc(d.kind)}: ${esc(d.state)}">${d.met ? "✓" : "…"} ${esc(d.label)}</span>`;
}

function jobRow(j) {
  const run = j.last_run;
  const runCell = run ? `${badge(run.outcome)} ${runDuration(run)}<br><span class="muted">${when(run.ended_at || run.triggered_at || run.requested_at)}</span>` : `<span class="muted">never</span>`;
  return `<tr data-job="${esc(j.job_id)}">
    <td><a class="job-link" href="${jobHref(j.job_id)}">${esc(j.job_id)}</a><br><span class="muted">${esc(j.job_name)}</span></td>
    <td>${badge(j.phase)}</td>
    <td>${j.dependencies.map(depChip).join("")}</td>
    <td>${when(j.since)}</td>
    <td>${runCell}</td>
    <td class="windows">${windowsText(run?.windows)}</td>
    <td class="verdict">${esc(j.verdict)}</td></tr>`;
}

// -- job page --------------------------------------------------------------------------------

async function renderJob(view, jobId) {
  const job = await api(`/api/jobs/${encodeURIComponent(jobId)}`);
  const active = job.rows.filter((r) => r.is_active);
  view.innerHTML = `
    <p><a href="#/">← all jobs</a></p>
    <h2>${esc(job.job_id)} <span class="muted">${esc(job.job_name)}</span> ${badge(job.phase)}</h2>
    <div class="verdict-box" id="verdict">${esc(job.verdict)}</div>
    ${alertsTable(job.alerts, "job-alerts")}
    ${actionsBar(job)}
    <div id="action-result">${state.notice ? `<div class="notice ${state.notice.error ? "error" : ""}">${esc(state.notice.text)}</div>` : ""}</div>
    <h3>Dependencies</h3>
    <table id="dependencies"><thead><tr><th>Source</th><th>Kind</th><th>Status</th><th>State</th><th>Last sensed</th><th>Outcome</th></tr></thead><tbody>
    ${active.map((r) => `<tr><td>${esc(r.sensor_source)}:${esc(r.sensor_id)}</td><td>${esc(r.dependency)}</td><td>${badge(r.status)}</td>
      <td>${esc(r.row_state)}</td><td>${when(r.last_evaluated_at)}</td><td>${badge(r.last_outcome)}</td></tr>`).join("")}
    </tbody></table>
    <h3>Runs</h3>
    ${timeline(job.runs)}
    <table id="runs"><thead><tr><th>Run</th><th>Outcome</th><th>Requested</th><th>Duration</th><th>Windows consumed</th><th>Message</th><th>Output</th></tr></thead><tbody>
    ${job.runs.map((r) => `<tr><td>${esc(r.job_run_id ?? "-")}${r.is_retry ? ' <span class="muted">(retry)</span>' : ""}${r.catch_up ? ` <span class="muted">(catch-up ${esc(r.catch_up)})</span>` : ""}</td><td>${badge(r.outcome)}</td>
      <td>${when(r.requested_at)}</td><td>${runDuration(r)}</td><td class="windows">${windowsText(r.windows)}</td><td>${esc(r.message ?? "")}</td>
      <td>${r.job_run_id ? `<a target="_blank" rel="noopener" href="/api/jobs/${encodeURIComponent(job.job_id)}/runs/${encodeURIComponent(r.job_run_id)}/output">output</a>` : ""}</td></tr>`).join("")
      || `<tr><td colspan="7" class="muted">Not triggered yet.</td></tr>`}
    </tbody></table>
    ${job.late_data.length ? `<h3>Late data</h3>
    <table id="late"><thead><tr><th>Source</th><th>Window from</th><th>Rows that arrived after it was final</th></tr></thead><tbody>
    ${job.late_data.map((l) => `<tr><td>${esc(l.source_key)}</td><td>${esc(l.window_start)}</td><td>${esc(l.rows)}</td></tr>`).join("")}
    </tbody></table>` : ""}
    <h3>Recent events</h3>
    <table id="events"><thead><tr><th>When</th><th>Event</th><th>Source</th><th>Run</th><th>Rows</th><th>Message</th></tr></thead><tbody>
    ${job.events.map((e) => `<tr><td>${when(e.event_ts)}</td><td>${esc(e.event_type)}</td><td>${esc(e.source_key ?? "")}</td>
      <td>${esc(e.job_run_id ?? e.run_id ?? "")}</td><td>${esc(e.rows ?? "")}</td><td>${esc(e.message ?? "")}</td></tr>`).join("")}
    </tbody></table>`;
  view.querySelectorAll("[data-action]").forEach((b) => b.addEventListener("click", () => confirmAction(b.dataset.action, job.job_id)));
}

function actionsBar(job) {
  if (!state.meta.can_act) return "";
  const paused = job.phase === "PAUSED";
  return `<div class="actions" id="actions">
    ${paused ? `<button data-action="resume">Resume</button>` : `<button data-action="pause">Pause</button>`}
    ${job.phase === "FAILED" ? `<button data-action="retry">Retry…</button>` : ""}
    ${job.phase !== "FAILED" && job.phase !== "RUNNING" ? `<button data-action="trigger">Run now…</button>` : ""}
    <button data-action="complete">Mark run complete…</button>
    <button data-action="reset">Reset…</button></div>`;
}

function timeline(runs) {
  // a run spans its own start to its own end (now while it runs); a refused or unanswered request is a mark
  const spans = runs.filter((r) => r.requested_at).map((r) => {
    const start = Date.parse(r.started_at || r.triggered_at || r.requested_at);
    const end = r.ended_at ? Date.parse(r.ended_at) : r.outcome === "RUNNING" ? Date.now() : start;
    return { r, start, end: Math.max(start, end) };
  });
  if (!spans.length) return "";
  const lo = Math.min(...spans.map((s) => s.start)), hi = Math.max(...spans.map((s) => s.end), lo + 1000);
  const width = 900, x = (t) => 10 + ((t - lo) / (hi - lo)) * (width - 20);
  const bars = spans.map((s) => `<rect x="${x(s.start)}" y="14" height="18" width="${Math.max(3, x(s.end) - x(s.start))}"
      fill="${COLORS[s.r.outcome] || (s.r.outcome === "COMPLETED" ? "#2f9e44" : "#1c7ed6")}"><title>${esc(s.r.job_run_id ?? "request")} ${esc(s.r.outcome)}: ${s.r.duration_s == null ? "-" : secs(s.r.duration_s)}</title></rect>`).join("");
  return `<div class="chart"><svg id="timeline" viewBox="0 0 ${width} 50" width="100%" height="50">${bars}
    <text x="10" y="46" font-size="10" fill="#6b7385">${esc(new Date(lo).toLocaleString())}</text>
    <text x="${width - 10}" y="46" font-size="10" fill="#6b7385" text-anchor="end">${esc(new Date(hi).toLocaleString())}</text></svg></div>`;
}

function confirmAction(action, jobId) {
  const dialog = document.getElementById("confirm");
  const fields = {
    pause: "", resume: "",
    trigger: `<label>Reason (audit trail)<input name="reason"></label><p class="muted">The next tick runs the job once, over whatever data it has pending (or none).</p>`,
    retry: `<label>Reason (audit trail)<input name="reason"></label><p class="muted">The next tick runs the job again over the data its failed run had, with a new idempotency token.</p>`,
    complete: `<label>Message (audit trail)<input name="message"></label><label><input type="checkbox" name="failed" style="width:auto"> record a failure instead</label>`,
    reset: `<label>Reason (required)<input name="reason" required></label><label>Since (ISO date or timestamp; empty: from the beginning)<input name="since" placeholder="2026-05-01"></label>`,
  }[action];
  document.getElementById("confirm-title").textContent = `${action[0].toUpperCase()}${action.slice(1)} job ${jobId}?`;
  document.getElementById("confirm-text").textContent = `This is recorded in the audit trail as ${state.meta.user || "you"} (via the page).`;
  document.getElementById("confirm-fields").innerHTML = fields;
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    const form = document.getElementById("confirm-form");
    const body = { job_id: jobId };
    for (const input of form.querySelectorAll("input")) body[input.name] = input.type === "checkbox" ? input.checked : input.value;
    try {
      const done = await api(`/api/actions/${action}`, { method: "POST", headers: { "Content-Type": "application/json", "X-Heartbeat-Action": "confirm" }, body: JSON.stringify(body) });
      state.notice = { text: done.done };
    } catch (err) {
      state.notice = { text: err.message, error: true };
    }
    refresh();
  };
  dialog.showModal();
}

// -- graph -----------------------------------------------------------------------------------

async function renderGraph(view) {
  state.graphData = await api("/api/graph");
  if (!view.querySelector("#graph-page")) {  // build the page once; refreshes and filters redraw the drawing
    view.innerHTML = `<div id="graph-page">
      <h2>Dependency graph <span class="muted" id="graph-count"></span></h2>
      <div class="toolbar">
        <input type="search" id="search" placeholder="Filter by job or source…" value="${esc(state.filter.q)}">
        <select id="phase"><option value="">every status</option>${PHASES.map((p) => `<option>${p}</option>`).join("")}</select>
        <button id="zoom-in">+</button><button id="zoom-out">−</button><button id="zoom-fit">fit</button>
        <button id="collapse-all" title="draw each group of sources as one node, or every source again">collapse groups</button>
        <span class="muted">drag to pan, wheel to zoom, click a node to highlight its edges, double-click a job to open it,
          click a group's name to fold it into one node</span>
      </div>
      <div class="graph-legend">
        <span><svg width="30" height="8"><line x1="0" y1="4" x2="30" y2="4" stroke="#9aa3b5" stroke-width="2"/></svg> hard</span>
        <span><svg width="30" height="8"><line x1="0" y1="4" x2="30" y2="4" stroke="#9aa3b5" stroke-width="2" stroke-dasharray="5 4"/></svg> soft</span>
        ${PHASES.map((p) => `<span><span class="legend-swatch" style="background:${COLORS[p]}"></span>${p}</span>`).join("")}
        <span><span class="legend-swatch" style="background:${COLORS.NEW_DATA}"></span>source with new data</span>
        <span><span class="legend-swatch" style="background:${COLORS.ERROR}"></span>sensing error</span>
      </div>
      <div class="graph-wrap"><svg id="graph"><g id="viewport"></g></svg></div></div>`;
    document.getElementById("search").addEventListener("input", (e) => { state.filter.q = e.target.value; drawGraph(); });
    document.getElementById("phase").addEventListener("change", (e) => { state.filter.phase = e.target.value; drawGraph(); });
    document.getElementById("collapse-all").addEventListener("click", () => {
      const groups = [...new Set(state.graphData.nodes.filter((n) => n.kind === "source").map((n) => n.group))];
      const all = groups.every((group) => state.graph.collapsed.has(group));
      state.graph.collapsed = new Set(all ? [] : groups);
      drawGraph();
    });
    panZoom();
  }
  drawGraph();
}

function drawGraph() {
  const g = state.graphData, q = state.filter.q.toLowerCase();
  const jobs = g.nodes.filter((n) => n.kind === "job" && (!state.filter.phase || n.phase === state.filter.phase));
  const matchSources = new Set(g.nodes.filter((n) => n.kind === "source" && q && n.label.toLowerCase().includes(q)).map((n) => n.id));
  const keepJobs = new Set(jobs.filter((j) => !q || j.label.toLowerCase().includes(q) || j.job_id.toLowerCase().includes(q)
    || g.edges.some((e) => e.to === j.id && matchSources.has(e.from))).map((j) => j.id));
  const edges = g.edges.filter((e) => keepJobs.has(e.to));
  const keepSources = new Set(edges.map((e) => e.from));
  const sources = g.nodes.filter((n) => n.kind === "source" && keepSources.has(n.id));
  const layout = layoutGraph(sources, jobs.filter((j) => keepJobs.has(j.id)), edges);
  const svg = document.getElementById("graph");
  document.getElementById("graph-count").textContent = `(${plural(sources.length, "source")} → ${plural(keepJobs.size, "job")})`;
  document.getElementById("viewport").innerHTML = layout.svg;
  svg.dataset.nodes = layout.nodes.length;
  svg.dataset.edges = layout.edges;
  state.layout = layout;
  const folded = state.graph.collapsed;
  document.getElementById("collapse-all").textContent = sources.length && sources.every((n) => folded.has(n.group)) ? "expand groups" : "collapse groups";
  svg.querySelectorAll(".group-label").forEach((label) => label.addEventListener("click", () => {
    const group = label.dataset.group;
    if (!folded.delete(group)) folded.add(group);
    drawGraph();
  }));
  if (!state.graph.fitted) { fitGraph(); state.graph.fitted = true; }
  svg.querySelectorAll(".node").forEach((node) => node.addEventListener("click", () => highlight(svg, node.dataset.id)));
  svg.querySelectorAll(".node.job").forEach((node) => node.addEventListener("dblclick", () => { location.hash = jobHref(node.dataset.id.slice(4)); }));
}

function layoutGraph(sources, jobs, edges) {
  // Two columns: sources grouped by kind on the left, jobs on the right ordered by the mean
  // position of their sources (fewer crossings). Each source appears once however many jobs read it;
  // a collapsed group (state.graph.collapsed) is one node, its members' edges drawn from it once per job.
  const rowH = 26, colX = { source: 20, job: 520 }, nodeW = 260;
  const groups = {};
  sources.forEach((s) => (groups[s.group] ||= []).push(s));
  const pos = {}, parts = [], drawn = [], alias = {};
  let y = 10;
  for (const [group, members] of Object.entries(groups).sort()) {
    const folded = state.graph.collapsed.has(group);
    parts.push(`<text class="group-label" data-group="${esc(group)}" x="${colX.source}" y="${y + 12}">${folded ? "▸" : "▾"} ${esc(group)} (${members.length})</text>`);
    y += 20;
    if (folded) {
      const node = groupNode(group, members);
      members.forEach((s) => { alias[s.id] = node.id; });
      pos[node.id] = { x: colX.source, y }; drawn.push(node); y += rowH;
    } else {
      members.sort((a, b) => a.label.localeCompare(b.label)).forEach((s) => { pos[s.id] = { x: colX.source, y }; drawn.push(s); y += rowH; });
    }
    y += 8;
  }
  const seen = new Set();
  edges = edges.map((e) => ({ ...e, from: alias[e.from] || e.from }))
    .filter((e) => { const key = `${e.from}|${e.to}|${e.kind}`; return !seen.has(key) && seen.add(key); });
  const sourcesOf = {};
  edges.forEach((e) => (sourcesOf[e.to] ||= []).push(pos[e.from]?.y ?? 0));
  const mean = (a) => (a && a.length ? a.reduce((x, v) => x + v, 0) / a.length : 0);
  let jy = 30;
  [...jobs].sort((a, b) => mean(sourcesOf[a.id]) - mean(sourcesOf[b.id]) || a.label.localeCompare(b.label))
    .forEach((j) => { pos[j.id] = { x: colX.job, y: jy }; jy += rowH; });
  const edgeSvg = edges.map((e) => {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) return "";
    const x1 = a.x + nodeW, y1 = a.y + 10, x2 = b.x, y2 = b.y + 10, mx = (x1 + x2) / 2;
    return `<path class="edge ${esc(e.kind)}" data-from="${esc(e.from)}" data-to="${esc(e.to)}" d="M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}"/>`;
  }).join("");
  const clip = (t) => (t.length > 38 ? `${t.slice(0, 37)}…` : t);
  const nodeSvg = [...drawn, ...jobs].map((n) => {
    const p = pos[n.id], fill = n.kind === "job" ? COLORS[n.phase] : COLORS[n.health];
    const text = n.kind === "job" ? `${n.job_id}${n.label !== n.job_id ? ` · ${n.label}` : ""}` : `${n.label}${n.jobs > 1 ? ` (${n.jobs} jobs)` : ""}`;
    return `<g class="node ${n.kind}${n.members ? " group" : ""}" data-id="${esc(n.id)}" data-kind="${n.kind}" data-status="${esc(n.phase || n.health)}" transform="translate(${p.x},${p.y})">
      <rect width="${nodeW}" height="20" fill="${fill}"></rect><text x="8" y="14">${esc(clip(text))}</text><title>${esc(text)}</title></g>`;
  }).join("");
  return { svg: parts.join("") + edgeSvg + nodeSvg, nodes: [...drawn, ...jobs], edges: edges.length,
    width: colX.job + nodeW + 20, height: Math.max(y, jy) + 10 };
}

//: a collapsed group's one node: coloured by its worst member (a sensing error, then new data)
const HEALTH_ORDER = ["ERROR", "NEW_DATA", "QUIET"];
function groupNode(group, members) {
  const worst = members.map((s) => s.health).sort((a, b) => HEALTH_ORDER.indexOf(a) - HEALTH_ORDER.indexOf(b))[0];
  return { id: `group:${group}`, kind: "source", group, health: worst, members: members.length,
    label: `${plural(members.length, "source")} of ${group}`, jobs: 0 };
}

function applyZoom() {
  const gs = state.graph;
  document.getElementById("viewport").setAttribute("transform", `translate(${gs.x},${gs.y}) scale(${gs.scale})`);
}

function fitGraph() {
  const box = document.getElementById("graph").getBoundingClientRect(), gs = state.graph;
  gs.scale = Math.min(1, box.width / state.layout.width) || 1; gs.x = 0; gs.y = 0;  // fit the width; pan for the rest
  applyZoom();
}

function panZoom() {
  const svg = document.getElementById("graph"), gs = state.graph;
  document.getElementById("zoom-in").onclick = () => { gs.scale *= 1.25; applyZoom(); };
  document.getElementById("zoom-out").onclick = () => { gs.scale /= 1.25; applyZoom(); };
  document.getElementById("zoom-fit").onclick = fitGraph;
  svg.addEventListener("wheel", (e) => { e.preventDefault(); gs.scale *= e.deltaY < 0 ? 1.1 : 1 / 1.1; applyZoom(); }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX - gs.x, y: e.clientY - gs.y }; });
  window.onmouseup = () => { drag = null; };
  svg.addEventListener("mousemove", (e) => { if (drag) { gs.x = e.clientX - drag.x; gs.y = e.clientY - drag.y; applyZoom(); } });
}

function highlight(svg, id) {
  const linked = new Set([id]);
  svg.querySelectorAll(".edge").forEach((e) => { if (e.dataset.from === id || e.dataset.to === id) { linked.add(e.dataset.from); linked.add(e.dataset.to); } });
  const on = svg.dataset.highlight !== id;
  svg.dataset.highlight = on ? id : "";
  svg.querySelectorAll(".node").forEach((n) => n.classList.toggle("dim", on && !linked.has(n.dataset.id)));
  svg.querySelectorAll(".edge").forEach((e) => e.classList.toggle("dim", on && e.dataset.from !== id && e.dataset.to !== id));
}

// -- ticks -----------------------------------------------------------------------------------

async function renderTicks(view) {
  const { runs, problems } = await api("/api/ticks");
  const stages = [...new Set(runs.flatMap((r) => Object.keys(r.stages || {})))];
  view.innerHTML = `
    <h2>Ticks <span class="muted">(latest ${runs.length})</span></h2>
    <div class="chart">${stageChart(runs, stages)}</div>
    <h3>Sensing errors and skipped sources</h3>
    <table id="problems"><thead><tr><th>When</th><th>Tick</th><th>Source</th><th>Outcome</th><th>Why</th><th>Jobs</th></tr></thead><tbody>
    ${problems.map((p) => `<tr><td>${when(p.snapshot_ts)}</td><td>${esc(p.run_id)}</td><td>${esc(p.source_key)}</td><td>${badge(p.outcome)}</td>
      <td>${esc(p.error ?? "")}</td><td>${esc(p.trigger_job_ids ?? "")}</td></tr>`).join("") || `<tr><td colspan="6" class="muted">None in these ticks.</td></tr>`}
    </tbody></table>
    <h3>Recent ticks</h3>
    <table id="ticks"><thead><tr><th>Tick</th><th>When</th><th>Status</th><th>Duration</th><th>Sensed</th><th>New data</th><th>Skipped</th>
      <th>Errors</th><th>Triggered</th><th>Completed</th><th>Failed</th><th>Message</th></tr></thead><tbody>
    ${runs.map((r) => `<tr><td>${esc(r.run_id)}</td><td>${when(r.snapshot_ts)}</td><td>${badge(r.status)}</td><td>${secs(r.duration_s)}</td>
      <td>${esc(r.sources_sensed ?? "-")}</td><td>${esc(r.sources_with_new_data ?? "-")}</td><td>${esc(r.sources_skipped ?? "-")}</td>
      <td>${esc(r.sensor_errors ?? "-")}</td><td>${esc(r.jobs_triggered ?? "-")}</td><td>${esc(r.jobs_completed ?? "-")}</td><td>${esc(r.jobs_failed ?? "-")}</td>
      <td>${esc(r.message ?? "")}</td></tr>`).join("")}
    </tbody></table>`;
}

function stageChart(runs, stages) {
  if (!runs.length) return `<p class="muted">No tick yet.</p>`;
  const ordered = [...runs].reverse(), width = 900, height = 180, barW = Math.min(40, Math.max(4, (width - 60) / ordered.length - 3));
  const total = (r) => stages.reduce((s, k) => s + (r.stages?.[k] || 0), 0);
  const max = Math.max(...ordered.map(total), 0.001);
  const bars = ordered.map((r, i) => {
    let y = height - 20;
    return stages.map((k, si) => {
      const v = r.stages?.[k] || 0, h = (v / max) * (height - 40);
      y -= h;
      return v ? `<rect class="stage" data-stage="${esc(k)}" x="${50 + i * (barW + 3)}" y="${y}" width="${barW}" height="${h}" fill="${STAGE_COLORS[si % STAGE_COLORS.length]}"><title>${esc(r.run_id)} ${esc(k)}: ${v.toFixed(2)} s</title></rect>` : "";
    }).join("");
  }).join("");
  const legend = stages.map((k, si) => `<span><span class="legend-swatch" style="background:${STAGE_COLORS[si % STAGE_COLORS.length]}"></span>${esc(k)}</span>`).join(" ");
  return `<div class="graph-legend">seconds per stage, oldest → newest: ${legend}</div>
    <svg id="stage-chart" viewBox="0 0 ${width} ${height}" width="100%" height="${height}">
      <line x1="48" y1="${height - 20}" x2="${width}" y2="${height - 20}" stroke="#ccc"/>
      <text x="44" y="24" font-size="10" text-anchor="end" fill="#6b7385">${max.toFixed(1)} s</text>
      <text x="44" y="${height - 20}" font-size="10" text-anchor="end" fill="#6b7385">0</text>${bars}</svg>`;
}

// -- start -----------------------------------------------------------------------------------

async function start() {
  state.meta = await api("/api/meta");
  PHASES = state.meta.phases;  // ui/data.py JobPhase, in its order
  window.addEventListener("hashchange", () => { state.graph.fitted = false; state.notice = null; refresh(); });
  refresh();
}
start().catch((err) => { document.getElementById("view").innerHTML = `<div class="notice error">${esc(err.message)}</div>`; });
