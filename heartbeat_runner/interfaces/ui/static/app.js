// Heartbeat status page: overview, dependency graph, job page and ticks, drawn from /api/*.
// No framework and nothing from a CDN: the page works offline. Every value from the
// lakehouse is escaped before it goes into the DOM (job ids come from a config file).
// A refresh patches the page in place (rows and parts whose HTML changed, matched by key): focus,
// selected text and scroll stay, and a polite live region says in one line what changed.
// The filters, search, sort and page are in the address (#/path?q=…&phase=…&sort=…&page=…).
"use strict";

let PHASES = [];  // the job phases the server names (JobPhase), set at start
const state = { meta: null, timer: null, notice: null, path: null, filter: { phase: "", q: "", sort: "attention", page: 1 },
  graph: { scale: 1, x: 0, y: 0, collapsed: new Set() }, outputs: {}, openLog: null, seen: null };
//: rows of the overview drawn at once: 5,000 jobs stay one page of DOM, whatever the refresh
const PAGE_SIZE = 100;
//: the phases that need someone, first when the overview sorts by attention (then PHASES' order)
const ATTENTION = ["FAILED", "REFUSED", "TRIGGER_ERROR", "SENSING_ERROR"];
//: fills of the graph's nodes; the error states differ in hue AND carry a mark of their own (ICONS)
const COLORS = {
  RUNNING: "#1c7ed6", FAILED: "#c92a2a", REFUSED: "#c92a2a", READY: "#f08c00", WAITING: "#fab005", IDLE: "#adb5bd",
  PAUSED: "#868e96", ERROR: "#7048e8", NEW_DATA: "#f08c00", QUIET: "#dee2e6", TRIGGER_ERROR: "#5c3d10",
  SENSING_ERROR: "#7048e8", OVERDUE: "#0b7285",
};
//: the mark of each error state, beside its colour (the same marks as the badges' in app.css)
const ICONS = { FAILED: "✖", REFUSED: "⊘", TRIGGER_ERROR: "⚠", SENSING_ERROR: "◆", ERROR: "◆", OVERDUE: "◷" };
//: the words of the tab title's counts
const TITLE_COUNTS = [["FAILED", "failed"], ["REFUSED", "refused"], ["TRIGGER_ERROR", "trigger error"],
  ["SENSING_ERROR", "sensing error"], ["OVERDUE", "overdue"]];
const STAGE_COLORS = ["#1c7ed6", "#f08c00", "#2f9e44", "#ae3ec9", "#e03131", "#0ca678", "#868e96", "#fab005", "#d6336c"];
//: how many lines of a failed run's output the failure box shows
const TAIL_LINES = 20;
//: a notice of an action that starts no run (pause, resume, complete, reset) goes after this long
const NOTICE_MS = 30000;
const ENDED = ["COMPLETED", "FAILED", "REFUSED", "TRIGGER_ERROR"];
//: the outcomes (and phases) of a run that did not succeed: its reason is shown, its row marked
const UNSUCCESSFUL = ["FAILED", "REFUSED", "TRIGGER_ERROR"];

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
//: a name that may break after its separators (a long source name wraps instead of widening the page)
const breakable = (v) => esc(v).replace(/([.:/_])/g, "$1<wbr>");
const badge = (s) => (s ? `<span class="badge ${esc(s)}">${esc(s)}</span>` : `<span class="muted">-</span>`);
const jobHref = (id) => `#/jobs/${encodeURIComponent(id)}`;
const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

// -- times: every one in the deployment's zone (GET /api/meta "timezone", UTC by default), with its name --

const zone = () => state.meta?.timezone || "UTC";
let clock = null;
function zoneFormat() {
  if (clock?.zone === zone()) return clock;
  const options = { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };
  let format, name = zone();
  try {
    format = new Intl.DateTimeFormat("en-CA", { ...options, timeZone: name });
  } catch (err) {  // a zone this browser does not know: UTC, said so
    name = "UTC";
    format = new Intl.DateTimeFormat("en-CA", { ...options, timeZone: name });
  }
  clock = { zone: zone(), name, format };
  return clock;
}
const parseTs = (iso) => new Date(/Z$|[+-]\d\d:?\d\d$/.test(iso) ? iso : iso + "Z");
//: "2026-11-27 21:08:03 UTC": a timestamp in the deployment's zone, named
function fmtTime(value) {
  if (value == null || value === "") return "-";
  const t = value instanceof Date ? value : parseTs(String(value));
  if (Number.isNaN(t.getTime())) return String(value);
  const { format, name } = zoneFormat();
  const p = Object.fromEntries(format.formatToParts(t).map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${name}`;
}
function ago(t) {
  const s = Math.round((Date.now() - t.getTime()) / 1000);
  return s < 60 ? `${s}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : s < 86400 ? `${Math.round(s / 3600)}h ago` : `${Math.round(s / 86400)}d ago`;
}
// A time cell: the absolute time (stable from one refresh to the next, so an unchanged row stays
// untouched); how long ago is its title, set by agoTitles() after each patch.
const when = (iso) => (iso ? `<time datetime="${esc(iso)}">${esc(fmtTime(iso))}</time>` : "-");
function agoTitles(root = document) {
  root.querySelectorAll("time[datetime]").forEach((t) => { t.title = ago(parseTs(t.getAttribute("datetime"))); });
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
// Why a run failed: the reason the server derived (failure_reason), else the run's own message.
const failureReason = (r) => (r && UNSUCCESSFUL.includes(r.outcome) ? r.failure_reason || r.message || "" : "");
// What kind of run it was: a retry, a manual run (who asked and why: beside it, or with ``brief`` in its
// title), a catch-up step.
function runKind(r, brief = false) {
  const kinds = [];
  if (r.is_retry) kinds.push('<span class="tag">retry</span>');
  if (r.manual && brief) kinds.push(`<span class="tag" title="${esc(r.manual)}">manual</span>`);
  else if (r.manual) kinds.push(`<span class="tag">manual</span> <span class="muted">${esc(r.manual)}</span>`);
  if (r.catch_up) kinds.push(`<span class="tag">catch-up ${esc(r.catch_up)}</span>`);
  return kinds.join(" ");
}

function windowsText(windows) {
  if (!windows || !windows.length) return "-";
  return windows.map((w) => `${breakable(`${w.sensor_source}:${w.sensor_id}`)} ${esc(w.from ?? "…")} → ${esc(w.to ?? "…")}`).join("<br>");
}

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// -- patching in place -------------------------------------------------------------------------

// Set an element's HTML only when it differs from what was set last: an unchanged part keeps its
// nodes (focus, selection). Returns whether it changed.
function patch(target, html) {
  const el = typeof target === "string" ? document.querySelector(target) : target;
  if (!el || el._html === html) return false;
  el.innerHTML = html;
  el._html = html;
  agoTitles(el);
  return true;
}

// Make ``parent``'s children the elements of ``items`` ({key, html}, in order; html is one element,
// e.g. a <tr> or <tbody>; after any children without a key): an element whose key and HTML are unchanged is kept (moved if the order
// changed), a changed one is replaced, a gone one removed. Returns the keys added, changed and removed.
function patchList(parent, items) {
  const old = new Map(), keyed = [...parent.children].filter((el) => el.dataset.key !== undefined);
  keyed.forEach((el) => old.set(el.dataset.key, el));  // children without a key (a <thead>) are left alone
  const diff = { added: [], changed: [], removed: [] };
  let cursor = keyed[0] || null;
  const seen = new Map();
  for (const item of items) {
    const n = seen.get(item.key) || 0, key = n ? `${item.key}#${n}` : item.key, html = item.html;  // a repeated key gets a suffix
    seen.set(item.key, n + 1);
    let el = old.get(key);
    old.delete(key);
    if (!el || el._html !== html) {
      const made = document.createElement("template");
      made.innerHTML = html;
      const fresh = made.content.firstElementChild;
      fresh.dataset.key = key;
      fresh._html = html;
      agoTitles(fresh);
      (el ? diff.changed : diff.added).push(key);
      if (el) { if (el === cursor) cursor = cursor.nextElementSibling; el.remove(); }
      el = fresh;
    }
    if (el === cursor) cursor = cursor.nextElementSibling;
    else parent.insertBefore(el, cursor);
  }
  old.forEach((el, key) => { el.remove(); diff.removed.push(key); });
  return diff;
}

// On a narrow screen a table turns into cards: each cell is labelled by its column's heading.
function labelCells(table) {
  if (!table) return;
  const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  table.querySelectorAll("tbody tr").forEach((tr) => {
    [...tr.children].forEach((td, i) => { if (!td.hasAttribute("colspan") && heads[i] && !td.dataset.label) td.dataset.label = heads[i]; });
  });
}

// The polite live region: one line of what changed, never the whole page.
function announce(text) {
  if (text) document.getElementById("live").textContent = text;
}

// -- the address: #/<path>?q=&phase=&sort=&page= ------------------------------------------------

function address() {
  const raw = location.hash.replace(/^#\/?/, "");
  const at = raw.indexOf("?");
  return { path: at < 0 ? raw : raw.slice(0, at), params: new URLSearchParams(at < 0 ? "" : raw.slice(at + 1)) };
}

function readFilter() {
  const { params } = address();
  state.filter = { q: params.get("q") || "", phase: params.get("phase") || "", sort: params.get("sort") || "attention",
    page: Math.max(1, parseInt(params.get("page"), 10) || 1) };
}

// Write the filter into the address: a new history entry for a choice (back undoes it), the same
// entry while typing a search.
function writeFilter(push) {
  const f = state.filter, params = new URLSearchParams();
  if (f.q) params.set("q", f.q);
  if (f.phase) params.set("phase", f.phase);
  if (f.sort && f.sort !== "attention") params.set("sort", f.sort);
  if (f.page > 1) params.set("page", f.page);
  const query = params.toString(), hash = `#/${address().path}${query ? `?${query}` : ""}`;
  if (hash !== location.hash) history[push ? "pushState" : "replaceState"](null, "", hash);
  state.hash = location.hash;
}

// The filter's inputs show the filter (a box being typed in is left alone).
function showFilter() {
  const search = document.getElementById("search");
  if (search && document.activeElement !== search && search.value !== state.filter.q) search.value = state.filter.q;
  const phase = document.getElementById("phase");
  if (phase) phase.value = state.filter.phase;
  const sort = document.getElementById("sort");
  if (sort) sort.value = state.filter.sort;
}

// -- routing ---------------------------------------------------------------------------------

function route() {
  const [page, ...rest] = address().path.split("/");
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
    document.getElementById("meta").textContent = `v${state.meta.version} · ${state.meta.schema} · updated ${fmtTime(new Date())}`;
    document.getElementById("load-error")?.remove();
    agoTitles(view);  // "how long ago" moves on in rows that did not change
  } catch (err) {
    document.getElementById("load-error")?.remove();
    view.insertAdjacentHTML("afterbegin", `<div class="notice error" id="load-error">Could not load: ${esc(err.message)}</div>`);
  }
  state.timer = setTimeout(refresh, (state.meta?.refresh_s || 5) * 1000);
}

// The address changed (a link, back or forward): another page is drawn afresh; the same page with
// another filter is redrawn from what it holds.
function onAddress() {
  if (location.hash === state.hash) return;
  state.hash = location.hash;
  const path = address().path;
  readFilter();
  if (path === state.path) {
    showFilter();
    if (document.getElementById("jobs-page")) drawOverview();
    if (document.getElementById("graph-page")) drawGraph();
    return;
  }
  state.path = path;
  state.graph.fitted = false;
  state.notice = null;
  state.openLog = null;
  refresh();
}

// The tab's title counts what needs someone: "(2 failed, 1 sensing error) Heartbeat".
function showTitle(phases) {
  const counts = TITLE_COUNTS.map(([phase, word]) => [phases.filter((p) => p === phase).length, word]).filter(([n]) => n);
  document.title = counts.length ? `(${counts.map(([n, word]) => `${n} ${word}`).join(", ")}) Heartbeat` : "Heartbeat";
}

// The runner's health (GET /api/runner), the same words as `status` and `check`: when its last tick
// ended, or "runner not ticking" once that is older than the limit. The page's own refresh time is not it.
async function showRunner() {
  const runner = await api("/api/runner");
  const el = document.getElementById("runner");
  if (el.classList.contains("down") === runner.healthy && el.textContent) announce(runner.healthy ? "the runner is ticking again" : "the runner is not ticking");
  el.classList.toggle("down", !runner.healthy);
  el.title = runner.message;
  const text = runner.healthy
    ? `runner ticking · last tick ${fmtTime(runner.last_tick_at)}`
    : (runner.last_tick_at ? `runner not ticking since ${fmtTime(runner.last_tick_at)}` : "runner not ticking: no tick recorded");
  if (el.textContent !== text) el.textContent = text;
}

// -- overview --------------------------------------------------------------------------------

async function renderOverview(view) {
  const [overview, alerts] = await Promise.all([api("/api/overview"), api("/api/alerts")]);
  state.jobs = overview.jobs;
  state.alerts = alerts.alerts;
  if (view.dataset.page !== "overview") {  // build the page once; refreshes and filters patch its parts
    view.dataset.page = "overview";
    view.innerHTML = `<div id="jobs-page">
      <div id="alerts-panel"></div>
      <h2>Jobs <span class="muted" id="job-count"></span></h2>
      <div class="counts" id="counts"></div>
      <div class="toolbar">
        <input type="search" id="search" aria-label="Search job or source" placeholder="Search job or source…" value="${esc(state.filter.q)}">
        <select id="phase" aria-label="Status"><option value="">every status</option>${PHASES.map((p) => `<option>${p}</option>`).join("")}</select>
        <select id="sort" aria-label="Order" title="order of the jobs"><option value="attention">needs attention first</option>
          <option value="job">by job id</option><option value="since">latest change first</option></select>
        <span class="muted" id="shown"></span>
        <span class="pager"><button type="button" id="prev-page">‹ prev</button> <span id="page-of"></span>
          <button type="button" id="next-page">next ›</button></span>
      </div>
      <table id="jobs" class="cards"><thead><tr><th class="c-job">Job</th><th class="c-status">Status</th>
        <th class="c-deps">Dependencies (hard ▭ / soft ┅)</th><th class="c-since">Since</th>
        <th class="c-run">Last run</th><th class="c-windows">Window consumed</th><th class="c-verdict">Verdict</th></tr></thead></table></div>`;
    const refilter = (change, push) => { change(); state.filter.page = 1; writeFilter(push); drawOverview(); };
    document.getElementById("search").addEventListener("input", (e) => refilter(() => { state.filter.q = e.target.value; }, false));
    document.getElementById("phase").addEventListener("change", (e) => refilter(() => { state.filter.phase = e.target.value; }, true));
    document.getElementById("sort").addEventListener("change", (e) => refilter(() => { state.filter.sort = e.target.value; }, true));
    const turn = (by) => { state.filter.page += by; writeFilter(true); drawOverview(); };
    document.getElementById("prev-page").addEventListener("click", () => turn(-1));
    document.getElementById("next-page").addEventListener("click", () => turn(1));
    document.getElementById("counts").addEventListener("click", (e) => {
      const count = e.target.closest(".count");
      if (count) refilter(() => { state.filter.phase = state.filter.phase === count.dataset.phase ? "" : count.dataset.phase; }, true);
    });
    state.seen = null;
  }
  showFilter();
  announce(overviewChanges(state.jobs));
  drawOverview();
}

// One line of what changed since the last refresh: jobs that changed phase, jobs added or gone.
function overviewChanges(jobs) {
  const now = new Map(jobs.map((j) => [j.job_id, j.phase])), before = state.seen;
  state.seen = now;
  if (!before) return "";
  const moved = jobs.filter((j) => before.has(j.job_id) && before.get(j.job_id) !== j.phase);
  const added = jobs.filter((j) => !before.has(j.job_id)).length, gone = [...before.keys()].filter((id) => !now.has(id)).length;
  const parts = moved.slice(0, 3).map((j) => `${j.job_id} is ${j.phase} (was ${before.get(j.job_id)})`);
  if (moved.length > 3) parts.push(`${moved.length - 3} more changed`);
  if (added) parts.push(`${plural(added, "job")} added`);
  if (gone) parts.push(`${plural(gone, "job")} gone`);
  return parts.join("; ");
}

const overdue = (j) => Boolean(j.overdue);
const titlePhases = (jobs) => jobs.flatMap((j) => [j.phase, ...(overdue(j) ? ["OVERDUE"] : [])]);

function drawOverview() {
  const jobs = state.jobs, q = state.filter.q.toLowerCase();
  if (!jobs || !document.getElementById("jobs")) return;
  patch("#alerts-panel", alertsTable(state.alerts, "open-alerts"));
  labelCells(document.querySelector("#open-alerts table"));
  const shown = jobs.filter((j) => (!state.filter.phase || j.phase === state.filter.phase)
    && (!q || [j.job_id, j.job_name, ...j.dependencies.map((d) => d.label)].some((t) => String(t ?? "").toLowerCase().includes(q))));
  patch("#job-count", `(${jobs.length})`);
  patch("#counts", PHASES.map((p) =>
    `<button type="button" class="count${state.filter.phase === p ? " on" : ""}" data-phase="${p}" aria-pressed="${state.filter.phase === p}"><b>${jobs.filter((j) => j.phase === p).length}</b>${badge(p)}</button>`).join(""));
  showTitle(titlePhases(jobs));
  shown.sort(JOB_ORDERS[state.filter.sort] || JOB_ORDERS.attention);
  const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
  state.filter.page = Math.min(Math.max(1, state.filter.page), pages);  // a refresh may have fewer pages
  const first = (state.filter.page - 1) * PAGE_SIZE, rows = shown.slice(first, first + PAGE_SIZE);
  patch("#shown", shown.length > PAGE_SIZE ? `${shown.length} shown, ${first + 1}–${first + rows.length} here` : `${shown.length} shown`);
  patch("#page-of", `page ${state.filter.page} of ${pages}`);
  document.getElementById("prev-page").disabled = state.filter.page <= 1;
  document.getElementById("next-page").disabled = state.filter.page >= pages;
  const items = rows.map((j) => ({ key: `job:${j.job_id}`, html: jobRow(j) }));
  patchList(document.getElementById("jobs"),
    items.length ? items : [{ key: "none", html: `<tbody><tr><td colspan="7" class="muted">No job matches.</td></tr></tbody>` }]);
  labelCells(document.getElementById("jobs"));
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
  if (!alerts || !alerts.length) return "";
  const delivered = (a) => a.raise_delivered_to
    || (a.failed_deliveries ? `not delivered yet (${a.failed_deliveries} failed attempt(s))` : "the lakehouse only");
  return `<div class="alerts" id="${id}"><h3>${alerts.length} open alert${alerts.length > 1 ? "s" : ""}</h3>
    <table class="cards"><thead><tr><th>Kind</th><th>Subject</th><th>What</th><th>Since</th><th>Sent to</th></tr></thead><tbody>
    ${alerts.map((a) => `<tr data-alert="${esc(a.alert_key)}"><td><span class="badge alert ${esc(a.kind)}">${esc(a.kind)}</span></td>
      <td>${esc(a.subject)}</td><td>${esc(a.summary)}${a.link ? ` <a target="_blank" rel="noopener" href="${esc(a.link)}">output</a>` : ""}</td>
      <td>${when(a.since_ts || a.raised_at)}</td><td>${esc(delivered(a))}</td></tr>`).join("")}
    </tbody></table></div>`;
}

function depChip(d) {
  const cls = ["dep", d.kind, d.met ? "met" : "", d.sensing_error ? "error" : ""].join(" ");
  return `<span class="${cls}" title="${esc(d.kind)}: ${esc(d.state)}${d.sensing_error ? ` — ${esc(d.sensing_error)}` : ""}">${d.sensing_error ? ICONS.ERROR : d.met ? "✓" : "…"} ${breakable(d.label)}</span>`;
}

// A job's verdict, and why its last run failed when it did (the run's failure_reason).
function verdictHtml(j) {
  const failed = failureReason(j.last_run), reason = failed && !String(j.verdict).includes(failed) ? failed : "";
  return `${esc(j.verdict)}${reason ? `<div class="reason"><span aria-hidden="true">${ICONS.FAILED}</span> ${esc(reason)}</div>` : ""}`;
}

// One job: its row, and under it (on a screen too narrow for the Verdict column) the verdict.
function jobRow(j) {
  const run = j.last_run;
  const runCell = run ? `${badge(run.outcome)} ${runKind(run, true)} ${runDuration(run)}<br><span class="muted">${when(run.ended_at || run.triggered_at || run.requested_at)}</span>` : `<span class="muted">never</span>`;
  return `<tbody class="job"><tr data-job="${esc(j.job_id)}">
    <td class="c-job"><a class="job-link" href="${jobHref(j.job_id)}">${breakable(j.job_id)}</a><br><span class="muted">${esc(j.job_name)}</span></td>
    <td class="c-status">${badge(j.phase)}${overdue(j) ? ` ${badge("OVERDUE")}` : ""}</td>
    <td class="c-deps">${j.dependencies.map(depChip).join("")}</td>
    <td class="c-since">${when(j.since)}</td>
    <td class="c-run">${runCell}</td>
    <td class="c-windows windows">${windowsText(run?.windows)}</td>
    <td class="c-verdict verdict">${verdictHtml(j)}</td></tr>
    <tr class="why" data-why="${esc(j.job_id)}"><td colspan="6" class="verdict">${verdictHtml(j)}</td></tr></tbody>`;
}

// -- job page --------------------------------------------------------------------------------

async function renderJob(view, jobId) {
  const job = await api(`/api/jobs/${encodeURIComponent(jobId)}`);
  const key = `job:${jobId}`;
  if (view.dataset.page !== key) {  // build the page once; refreshes patch its parts
    view.dataset.page = key;
    state.seen = null;
    view.innerHTML = `<div id="job-page">
      <p><a href="#/">← all jobs</a></p>
      <h2 id="job-title"></h2>
      <div class="verdict-box" id="verdict"></div>
      <div id="failure"></div>
      <div id="job-alerts-slot"></div>
      <div id="actions-slot"></div>
      <div id="action-result"></div>
      <h3>Dependencies</h3>
      <table id="dependencies" class="cards"><thead><tr><th>Source</th><th>Kind</th><th>Status</th><th>State</th><th>Last sensed</th><th>Outcome</th></tr></thead><tbody></tbody></table>
      <h3>Runs</h3>
      <div id="timeline-slot"></div>
      <table id="runs" class="cards"><thead><tr><th>Run</th><th>Outcome</th><th>Requested</th><th>Duration</th><th>Windows consumed</th><th>Message</th><th>Output</th></tr></thead><tbody></tbody></table>
      <div id="run-log"></div>
      <div id="late-slot"></div>
      <h3>Recent events</h3>
      <table id="events" class="cards"><thead><tr><th>When</th><th>Event</th><th>Source</th><th>Run</th><th>Rows</th><th>Message</th></tr></thead><tbody></tbody></table></div>`;
  }
  state.job = job;
  forgetNotice(job);
  announce(jobChanges(job));
  const active = job.rows.filter((r) => r.is_active);
  patch("#job-title", `${esc(job.job_id)} <span class="muted">${esc(job.job_name)}</span> ${badge(job.phase)}`);
  patch("#verdict", esc(job.verdict));
  patch("#failure", failureBox(job));
  patch("#job-alerts-slot", alertsTable(job.alerts, "job-alerts"));
  patch("#actions-slot", actionsBar(job));
  patch("#action-result", state.notice ? `<div class="notice ${state.notice.error ? "error" : ""}">${esc(state.notice.text)}</div>` : "");
  patchList(document.querySelector("#dependencies tbody"), active.map((r) => ({ key: r.source_key, html:
    `<tr><td>${esc(r.sensor_source)}:${esc(r.sensor_id)}</td><td>${esc(r.dependency)}</td><td>${badge(r.status)}</td>
      <td>${esc(r.row_state)}</td><td>${when(r.last_evaluated_at)}</td><td>${badge(r.last_outcome)}</td></tr>` })));
  patch("#timeline-slot", timeline(job.runs));
  patchList(document.querySelector("#runs tbody"), job.runs.length ? job.runs.map((r) => ({ key: runKey(r), html: runRow(job, r) }))
    : [{ key: "none", html: `<tr><td colspan="7" class="muted">Not triggered yet.</td></tr>` }]);
  patch("#run-log", runLog());
  patch("#late-slot", job.late_data.length ? `<h3>Late data</h3>
    <table id="late" class="cards"><thead><tr><th>Source</th><th>Window from</th><th>Rows that arrived after it was final</th></tr></thead><tbody>
    ${job.late_data.map((l) => `<tr><td>${esc(l.source_key)}</td><td>${esc(l.window_start)}</td><td>${esc(l.rows)}</td></tr>`).join("")}
    </tbody></table>` : "");
  patchList(document.querySelector("#events tbody"), job.events.map((e) => ({ key: `${e.event_ts}|${e.event_type}|${e.source_key ?? ""}|${e.job_run_id ?? e.run_id ?? ""}`, html:
    `<tr><td>${when(e.event_ts)}</td><td>${esc(e.event_type)}</td><td>${esc(e.source_key ?? "")}</td>
      <td>${eventRun(e)}</td><td>${esc(e.rows ?? "")}</td><td>${esc(e.message ?? "")}</td></tr>` })));
  view.querySelectorAll("table.cards").forEach(labelCells);
  tailFromOutput(job);
}

const runKey = (r) => `${r.requested_at ?? ""}|${r.job_run_id ?? ""}`;
const outputUrl = (jobId, runId) => `/api/jobs/${encodeURIComponent(jobId)}/runs/${encodeURIComponent(runId)}/output`;

function runRow(job, r) {
  const reason = failureReason(r);
  return `<tr class="${UNSUCCESSFUL.includes(r.outcome) ? "failed-run" : ""}">
    <td>${esc(r.job_run_id ?? "-")} ${runKind(r)}</td><td>${badge(r.outcome)}</td>
    <td>${when(r.requested_at)}</td><td>${runDuration(r)}</td><td class="windows">${windowsText(r.windows)}</td>
    <td>${reason ? `<span class="reason">${esc(reason)}</span>` : esc(r.message ?? "")}</td>
    <td>${r.job_run_id ? `<button type="button" class="link" data-output="${esc(r.job_run_id)}" aria-controls="run-log">show output</button>` : ""}</td></tr>`;
}

// The Run column of an event: the job's run, else the tick that wrote it; an operator's event
// (its run_id is its own kind, e.g. "retry_asked") says who acted, not a run.
function eventRun(e) {
  if (e.job_run_id) return esc(e.job_run_id);
  if (!e.run_id) return "";
  if (e.run_id === String(e.event_type).toLowerCase()) return '<span class="muted">operator</span>';
  return `<span class="muted">tick</span> ${esc(e.run_id)}`;
}

// One line of what changed on this job since the last refresh: its phase, a run that ended.
function jobChanges(job) {
  const latest = job.runs[0], before = state.seen;
  const now = { job: job.job_id, phase: job.phase, run: latest ? `${runKey(latest)}:${latest.outcome}` : "" };
  state.seen = now;
  if (!before || before.job !== job.job_id) return "";
  const parts = [];
  if (before.phase !== now.phase) parts.push(`${job.job_id} is ${job.phase} (was ${before.phase})`);
  if (before.run !== now.run && latest) parts.push(`run ${latest.job_run_id ?? "request"}: ${latest.outcome}`);
  return parts.join("; ");
}

// The notice of an action goes once its effect is over: for a run (trigger, retry), when a run
// requested after the action has ended; for another action, after NOTICE_MS.
function forgetNotice(job) {
  const notice = state.notice;
  if (!notice || notice.error) return;
  if (notice.job !== job.job_id) { state.notice = null; return; }
  if (notice.startsRun) {
    const latest = job.runs[0];
    if (latest && runKey(latest) !== notice.runBefore && ENDED.includes(latest.outcome)) state.notice = null;
  } else if (Date.now() - notice.at > NOTICE_MS) {
    state.notice = null;
  }
}

// Why the job is failed, at the top of its page: the reason of the run that failed and the end of
// its output (output_tail; else fetched from the run's output).
function failureBox(job) {
  const run = job.runs[0];
  if (!run || !UNSUCCESSFUL.includes(run.outcome) || !UNSUCCESSFUL.includes(job.phase)) return "";
  const fetched = run.job_run_id ? state.outputs[`${job.job_id}/${run.job_run_id}`] : null;
  const lines = run.output_tail?.length ? run.output_tail : fetched?.text != null ? fetched.text.replace(/\n+$/, "").split("\n").slice(-TAIL_LINES) : null;
  const tail = lines ? `<pre class="tail" id="failure-tail">${esc(lines.join("\n"))}</pre>`
    : fetched?.error ? `<p class="muted">${esc(fetched.error)}</p>` : run.job_run_id ? `<p class="muted">reading the run's output…</p>` : "";
  return `<section class="failure" id="failure-box" aria-label="Why the last run failed">
    <h3><span aria-hidden="true">${ICONS[run.outcome] || ICONS.FAILED}</span> Run ${esc(run.job_run_id ?? "request")} ${{ FAILED: "failed", REFUSED: "was refused by the jobs service (it never ran)" }[run.outcome] || "was refused"}${run.ended_at ? ` at ${when(run.ended_at)}` : ""}</h3>
    <p class="reason" id="failure-reason">${esc(failureReason(run) || "no reason recorded")}</p>
    ${tail}
    ${run.job_run_id ? `<button type="button" data-output="${esc(run.job_run_id)}" aria-controls="run-log">show the whole output</button>` : ""}</section>`;
}

// Without output_tail (an older server), the failure box reads the end of the run's output once.
function tailFromOutput(job) {
  const run = job.runs[0];
  if (!run?.job_run_id || run.output_tail?.length || !document.getElementById("failure-box")) return;
  const key = `${job.job_id}/${run.job_run_id}`;
  if (state.outputs[key]) return;
  loadOutput(job.job_id, run.job_run_id).then(() => { if (state.job === job) patch("#failure", failureBox(job)); });
}

// Read a run's output into state.outputs (text; a page elsewhere, e.g. the Databricks run page; or why not).
async function loadOutput(jobId, runId) {
  const key = `${jobId}/${runId}`;
  state.outputs[key] = { loading: true };
  try {
    const response = await fetch(outputUrl(jobId, runId), { redirect: "manual" });
    if (response.type === "opaqueredirect") state.outputs[key] = { elsewhere: true };
    else if (!response.ok) state.outputs[key] = { error: (await response.json().catch(() => ({}))).error || `HTTP ${response.status}` };
    else state.outputs[key] = { text: await response.text() };
  } catch (err) {
    state.outputs[key] = { error: err.message };
  }
  return state.outputs[key];
}

// The output a "show output" button opened, under the runs.
function runLog() {
  const open = state.openLog;
  if (!open || open.job !== state.job?.job_id) return "";
  const found = state.outputs[`${open.job}/${open.run}`] || { loading: true }, url = outputUrl(open.job, open.run);
  const body = found.loading ? `<p class="muted">reading…</p>`
    : found.elsewhere ? `<p>This run's output is on its own page: <a target="_blank" rel="noopener" href="${esc(url)}">open the run's page</a>.</p>`
    : found.error ? `<p class="notice error">${esc(found.error)}</p>`
    : `<pre id="run-output" tabindex="0">${esc(found.text || "(no output)")}</pre>`;
  return `<section class="panel log"><h3>Output of run ${esc(open.run)} <button type="button" data-close-log>close</button>
    <a class="muted" target="_blank" rel="noopener" href="${esc(url)}">as text</a></h3>${body}</section>`;
}

function onJobClick(e) {
  const job = state.job;
  if (!job || !document.getElementById("job-page")) return;
  const action = e.target.closest("[data-action]");
  if (action) return confirmAction(action.dataset.action, job);
  const output = e.target.closest("[data-output]");
  if (output) {
    const run = output.dataset.output;
    state.openLog = { job: job.job_id, run };
    patch("#run-log", runLog());
    loadOutput(job.job_id, run).then(() => {
      patch("#run-log", runLog());
      document.getElementById("run-log").scrollIntoView({ block: "nearest" });
    });
    return;
  }
  if (e.target.closest("[data-close-log]")) { state.openLog = null; patch("#run-log", ""); }
}

function actionsBar(job) {
  if (!state.meta.can_act) return "";
  const paused = job.phase === "PAUSED";
  return `<div class="actions" id="actions">
    ${paused ? `<button data-action="resume">Resume…</button>` : `<button data-action="pause">Pause…</button>`}
    ${["FAILED", "REFUSED"].includes(job.phase) ? `<button data-action="retry">Retry…</button>` : ""}
    ${!["FAILED", "REFUSED", "RUNNING"].includes(job.phase) ? `<button data-action="trigger">Run now…</button>` : ""}
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
    <text x="10" y="46" font-size="10" fill="#6b7385">${esc(fmtTime(new Date(lo)))}</text>
    <text x="${width - 10}" y="46" font-size="10" fill="#6b7385" text-anchor="end">${esc(fmtTime(new Date(hi)))}</text></svg></div>`;
}

//: what each action's dialog asks (every field goes into the audit trail)
const ACTION_FIELDS = {
  pause: `<label>Reason (audit trail)<input name="reason" placeholder="why it is paused"></label><p class="muted">The runner triggers no run of the job until it is resumed.</p>`,
  resume: `<label>Reason (audit trail)<input name="reason"></label>`,
  trigger: `<label>Reason (audit trail)<input name="reason"></label><p class="muted">The next tick runs the job once, over whatever data it has pending (or none).</p>`,
  retry: `<label>Reason (audit trail)<input name="reason"></label><p class="muted">The next tick runs the job again over the data its failed run had, with a new idempotency token.</p>`,
  complete: `<label>Message (audit trail)<input name="message"></label><label><input type="checkbox" name="failed" style="width:auto"> record a failure instead</label>`,
  reset: `<label>Reason (required)<input name="reason" required></label><label>Since (ISO date or timestamp; empty: from the beginning)<input name="since" placeholder="2026-05-01"></label>`,
};

function confirmAction(action, job) {
  const dialog = document.getElementById("confirm"), jobId = job.job_id;
  document.getElementById("confirm-title").textContent = `${action[0].toUpperCase()}${action.slice(1)} job ${jobId}?`;
  document.getElementById("confirm-text").textContent = `This is recorded in the audit trail as ${state.meta.user || "you"} (via the page).`;
  document.getElementById("confirm-fields").innerHTML = ACTION_FIELDS[action] || "";
  dialog.returnValue = "";
  const runBefore = job.runs[0] ? runKey(job.runs[0]) : "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    const form = document.getElementById("confirm-form");
    const body = { job_id: jobId };
    for (const input of form.querySelectorAll("input")) body[input.name] = input.type === "checkbox" ? input.checked : input.value;
    try {
      const done = await api(`/api/actions/${action}`, { method: "POST", headers: { "Content-Type": "application/json", "X-Heartbeat-Action": "confirm" }, body: JSON.stringify(body) });
      state.notice = { text: done.done, job: jobId, at: Date.now(), startsRun: action === "trigger" || action === "retry", runBefore };
    } catch (err) {
      state.notice = { text: err.message, error: true, job: jobId, at: Date.now() };
    }
    refresh();
  };
  dialog.showModal();
  dialog.querySelector("input")?.focus();
}

// -- graph -----------------------------------------------------------------------------------

async function renderGraph(view) {
  state.graphData = await api("/api/graph");
  if (view.dataset.page !== "graph") {  // build the page once; refreshes and filters redraw the drawing
    view.dataset.page = "graph";
    view.innerHTML = `<div id="graph-page">
      <h2>Dependency graph <span class="muted" id="graph-count"></span></h2>
      <div class="toolbar">
        <input type="search" id="search" aria-label="Filter by job or source" placeholder="Filter by job or source…" value="${esc(state.filter.q)}">
        <select id="phase" aria-label="Status"><option value="">every status</option>${PHASES.map((p) => `<option>${p}</option>`).join("")}</select>
        <button id="zoom-in">+</button><button id="zoom-out">−</button><button id="zoom-fit" title="show every node">fit</button>
        <button id="collapse-all" title="draw each group of sources as one node, or every source again">collapse groups</button>
        <span class="muted">drag to pan, wheel to zoom, click a node to highlight its edges, double-click a job to open it,
          click a group's name to fold it into one node</span>
      </div>
      <div class="graph-legend">
        <span><svg width="30" height="8"><line x1="0" y1="4" x2="30" y2="4" stroke="#9aa3b5" stroke-width="2"/></svg> hard</span>
        <span><svg width="30" height="8"><line x1="0" y1="4" x2="30" y2="4" stroke="#9aa3b5" stroke-width="2" stroke-dasharray="5 4"/></svg> soft</span>
        ${PHASES.map((p) => `<span>${swatch(p)}${p}</span>`).join("")}
        <span>${swatch("NEW_DATA")}source with new data</span>
        <span>${swatch("ERROR")}source failing sensing</span>
      </div>
      <div class="graph-wrap"><svg id="graph"><g id="viewport"></g></svg></div></div>`;
    document.getElementById("search").addEventListener("input", (e) => { state.filter.q = e.target.value; writeFilter(false); drawGraph(); });
    document.getElementById("phase").addEventListener("change", (e) => { state.filter.phase = e.target.value; writeFilter(true); drawGraph(); });
    const svg = document.getElementById("graph");
    svg.addEventListener("click", (e) => {
      const label = e.target.closest(".group-label");
      if (label) {
        const folded = state.graph.collapsed, group = label.dataset.group;
        if (!folded.delete(group)) folded.add(group);
        return drawGraph();
      }
      const node = e.target.closest(".node");
      if (node) highlight(svg, node.dataset.id);
    });
    svg.addEventListener("dblclick", (e) => {
      const node = e.target.closest(".node.job");
      if (node) location.hash = jobHref(node.dataset.id.slice(4));
    });
    document.getElementById("collapse-all").addEventListener("click", () => {
      const groups = [...new Set(state.graphData.nodes.filter((n) => n.kind === "source").map((n) => n.group))];
      const all = groups.every((group) => state.graph.collapsed.has(group));
      state.graph.collapsed = new Set(all ? [] : groups);
      drawGraph();
    });
    panZoom();
  }
  showFilter();
  drawGraph();
}

// A legend's colour with the state's mark (an error state is never told by its colour alone).
const swatch = (s) => `<span class="legend-swatch" style="background:${COLORS[s]}">${ICONS[s] ? `<span aria-hidden="true">${ICONS[s]}</span>` : ""}</span>`;

function drawGraph() {
  const g = state.graphData, q = state.filter.q.toLowerCase();
  if (!g || !document.getElementById("graph")) return;
  showTitle(titlePhases(g.nodes.filter((n) => n.kind === "job")));
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
  const changed = patch("#viewport", layout.svg);
  svg.dataset.nodes = layout.nodes.length;
  svg.dataset.edges = layout.edges;
  state.layout = layout;
  const folded = state.graph.collapsed;
  document.getElementById("collapse-all").textContent = sources.length && sources.every((n) => folded.has(n.group)) ? "expand groups" : "collapse groups";
  if (!state.graph.fitted) { fitGraph(false); state.graph.fitted = true; }
  if (changed && svg.dataset.highlight) { const id = svg.dataset.highlight; svg.dataset.highlight = ""; highlight(svg, id); }
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

  const nodeSvg = [...drawn, ...jobs].map((n) => {
    const p = pos[n.id], fill = n.kind === "job" ? COLORS[n.phase] : COLORS[n.health];
    const status = n.phase || n.health, mark = ICONS[status] ? `${ICONS[status]} ` : "";
    const text = n.kind === "job" ? `${n.job_id}${n.label !== n.job_id ? ` · ${n.label}` : ""}` : `${n.label}${n.jobs > 1 ? ` (${n.jobs} jobs)` : ""}`;
    return `<g class="node ${n.kind}${n.members ? " group" : ""}" data-id="${esc(n.id)}" data-kind="${n.kind}" data-status="${esc(n.phase || n.health)}" transform="translate(${p.x},${p.y})">
      <rect width="${nodeW}" height="20" fill="${fill}"></rect><text x="8" y="14">${esc(mark + midClip(text, LABEL_CHARS))}</text><title>${esc(text)}</title></g>`;
  }).join("");
  return { svg: parts.join("") + edgeSvg + nodeSvg, nodes: [...drawn, ...jobs], edges: edges.length,
    width: colX.job + nodeW + 20, height: Math.max(y, jy) + 10 };
}

//: characters of a node's label; a longer one loses its middle (its end tells sources of one prefix apart)
const LABEL_CHARS = 38;
function midClip(text, n) {
  if (text.length <= n) return text;
  const head = Math.ceil((n - 1) * 0.4);
  return `${text.slice(0, head)}…${text.slice(text.length - (n - 1 - head))}`;
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

// The `fit` button: the whole drawing, width and height, in the view (never above its natural size),
// centred. A page opens fitting the width only (readable labels; pan down for the rest).
function fitGraph(whole = true) {
  const box = document.getElementById("graph").getBoundingClientRect(), gs = state.graph, layout = state.layout;
  if (!layout || !box.width || !box.height) return;
  gs.scale = Math.min(1, box.width / layout.width, whole ? box.height / layout.height : 1);
  gs.x = Math.max(0, (box.width - layout.width * gs.scale) / 2);
  gs.y = whole ? Math.max(0, (box.height - layout.height * gs.scale) / 2) : 0;
  applyZoom();
}

function panZoom() {
  const svg = document.getElementById("graph"), gs = state.graph;
  document.getElementById("zoom-in").onclick = () => { gs.scale *= 1.25; applyZoom(); };
  document.getElementById("zoom-out").onclick = () => { gs.scale /= 1.25; applyZoom(); };
  document.getElementById("zoom-fit").onclick = () => fitGraph(true);
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
  const { runs, rows, problems } = await api("/api/ticks");
  const stages = [...new Set(runs.flatMap((r) => Object.keys(r.stages || {})))];
  if (view.dataset.page !== "ticks") {
    view.dataset.page = "ticks";
    view.innerHTML = `<div id="ticks-page">
      <h2>Ticks <span class="muted" id="tick-count"></span></h2>
      <div class="chart" id="chart-slot"></div>
      <h3>Sensing errors and skipped sources</h3>
      <table id="problems" class="cards"><thead><tr><th>When</th><th>Tick</th><th>Source</th><th>Outcome</th><th>Why</th><th>Jobs</th></tr></thead><tbody></tbody></table>
      <h3>Recent ticks</h3>
      <div class="table-wrap"><table id="ticks"><thead><tr><th>Tick</th><th>When</th><th>Status</th><th>Duration</th><th>Sensed</th><th>New data</th><th>Skipped</th>
        <th>Errors</th><th>Triggered</th><th>Completed</th><th>Failed</th><th>Message</th></tr></thead><tbody></tbody></table></div></div>`;
  }
  patch("#tick-count", `(latest ${runs.length})`);
  patch("#chart-slot", stageChart(runs, stages));
  patchList(document.querySelector("#problems tbody"), problems.length ? problems.map((p) => ({ key: `${p.source_key}|${p.since}`, html:
    `<tr${p.ticks > 1 ? ' class="streak"' : ""}><td>${when(p.latest)}${streak(p.ticks, p.since)}</td><td>${esc(p.latest_run_id)}</td><td>${esc(p.source_key)}</td>
      <td>${badge(p.outcome)}</td><td>${esc(p.error ?? "")}</td><td>${esc(p.trigger_job_ids ?? "")}</td></tr>` }))
    : [{ key: "none", html: `<tr><td colspan="6" class="muted">None in these ticks.</td></tr>` }]);
  labelCells(document.getElementById("problems"));
  patchList(document.querySelector("#ticks tbody"), (rows || runs.map((r) => ({ tick: r, repeats: 1, since: r.snapshot_ts }))).map(({ tick: r, repeats, since }) => ({
    key: `${r.run_id}|${since}`, html: `<tr${repeats > 1 ? ' class="streak"' : ""}><td>${esc(r.run_id)}</td><td>${when(r.snapshot_ts)}${streak(repeats, since)}</td>
      <td>${badge(r.status)}</td><td>${secs(r.duration_s)}</td>
      <td>${esc(r.sources_sensed ?? "-")}</td><td>${esc(r.sources_with_new_data ?? "-")}</td><td>${esc(r.sources_skipped ?? "-")}</td>
      <td>${esc(r.sensor_errors ?? "-")}</td><td>${esc(r.jobs_triggered ?? "-")}</td><td>${esc(r.jobs_completed ?? "-")}</td><td>${esc(r.jobs_failed ?? "-")}</td>
      <td>${esc(r.message ?? "")}</td></tr>` })));
}

// "× 12 since 2026-11-27 21:08:03 UTC": a row that stands for consecutive ticks failing the same way.
const streak = (n, since) => (n > 1 ? `<div class="repeats">× ${n} since ${when(since)}</div>` : "");

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
  readFilter();
  state.path = address().path;
  state.hash = location.hash;
  document.getElementById("view").addEventListener("click", onJobClick);
  window.addEventListener("hashchange", onAddress);
  window.addEventListener("popstate", onAddress);
  refresh();
}
start().catch((err) => { document.getElementById("view").innerHTML = `<div class="notice error">${esc(err.message)}</div>`; });
