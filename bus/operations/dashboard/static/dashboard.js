// The dashboard's behaviour: Alpine.js components (x-data="...Page()") that fetch the JSON API.
// Loaded before Alpine itself, so the components exist when Alpine starts.
"use strict";

const API = () => document.querySelector('meta[name="api-base"]').content;
const ROOT = () => API().replace(/\/api$/, "");

async function api(path, options = {}) {
  const init = { headers: { Accept: "application/json" }, ...options };
  if (options.body !== undefined) {
    init.method = init.method || "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  const response = await fetch(API() + path, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text }; }
  if (!response.ok) {
    let detail = data && data.detail;
    if (Array.isArray(detail)) detail = detail.map((d) => d.msg).join("; ");
    throw new Error(`${response.status}: ${detail || response.statusText}`);
  }
  return data;
}

function post(path, body = {}) { return api(path, { method: "POST", body }); }

function fmtTime(epoch) {
  if (epoch === null || epoch === undefined) return "–";
  const d = new Date(epoch * 1000);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function num(value) { return value === null || value === undefined ? "?" : String(value); }
function ms(value) {
  if (value === null || value === undefined) return "–";
  return value < 10 ? value.toFixed(1) : String(Math.round(value));
}

// Shared by every page: the settings (actions allowed?) and the formatting helpers.
function base() {
  return {
    settings: { allow_actions: false, endpoints: [], depth_seconds: 30 },
    root: ROOT(), error: "", message: "",
    fmtTime, fmtAge, num, ms,
    async loadSettings() {
      try { this.settings = await api("/settings"); } catch (e) { this.error = e.message; }
    },
  };
}

function modeBadge() {
  return {
    allow: null, how: "",
    async load() {
      try {
        const s = await api("/settings");
        this.allow = s.allow_actions; this.how = s.how_to_allow;
      } catch (e) { this.how = e.message; }
    },
  };
}

function endpointsPage() {
  return {
    ...base(), data: null, instances: null, period: 3600, pausing: null, minutes: 15,
    reason: "", timer: null, chosen: null,
    async init() {
      await this.loadSettings();
      await this.load();
      const every = Math.max(5, this.settings.depth_seconds) * 1000;
      this.timer = setInterval(() => this.load(), every);
    },
    async load() {
      try {
        this.data = await api(`/endpoints?period=${this.period}`);
        this.instances = await api("/instances");
        this.error = "";
      } catch (e) { this.error = e.message; }
    },
    oldestRead() { return Math.min(...this.data.endpoints.map((e) => e.read_at)); },
    rate(stats) { return (stats.processed / (stats.seconds / 60)).toFixed(1); },
    row(name) { return this.data ? this.data.endpoints.find((e) => e.name === name) : null; },
    pct(p, show) { return p ? [p.p50, p.p95, p.p99].map((v) => show(v)).join(" / ") : "–"; },
    drain(e) {
      if (!e.stats || !e.stats.depth || !e.stats.depth.length) return "–";  // no length known
      if (e.stats.drain_seconds === null || e.stats.drain_seconds === undefined) {
        return "not draining";
      }
      return e.stats.drain_seconds === 0 ? "empty" : fmtAge(e.stats.drain_seconds);
    },
    // A chart of (epoch seconds, value) points over the period: bars or a line, with its
    // largest value labelled. Plain SVG: no chart library to vendor for three small charts.
    chart(points, kind) {
      const w = 320, h = 90, top = 12;
      if (!points || !points.length) return `<text x="4" y="${h / 2}" class="muted">no data</text>`;
      const end = this.data.now, start = end - this.data.period;
      const most = Math.max(...points.map((p) => p[1]), 0) || 1;
      const x = (t) => ((t - start) / (end - start)) * (w - 2) + 1;
      const y = (v) => h - 1 - (v / most) * (h - top - 2);
      const label = `<text x="2" y="10">max ${Number.isInteger(most) ? most : most.toFixed(2)}</text>`;
      if (kind === "bars") {
        const bw = Math.max(1, (w / (this.data.period / 60)) - 1);
        return label + points.map((p) => `<rect x="${x(p[0]).toFixed(1)}" y="${y(p[1]).toFixed(1)}" width="${bw.toFixed(1)}" height="${(h - 1 - y(p[1])).toFixed(1)}"></rect>`).join("");
      }
      const path = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
      return label + `<path d="${path}" fill="none" stroke="currentColor" stroke-width="1.5"></path>` +
        points.map((p) => `<circle cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="1.5"></circle>`).join("");
    },
    spark(points) {
      if (!points || !points.length) return "";
      const top = Math.max(1, ...points.map((p) => p[1]));
      const w = 120 / points.length;
      return points.map((p, i) => {
        const h = Math.max(1, Math.round((p[1] / top) * 22));
        return `<rect x="${(i * w).toFixed(1)}" y="${24 - h}" width="${Math.max(1, w - 1).toFixed(1)}" height="${h}"></rect>`;
      }).join("");
    },
    async pause() {
      const name = this.pausing;
      try {
        await post(`/endpoints/${encodeURIComponent(name)}/pause`,
                   { seconds: this.minutes * 60, reason: this.reason });
        this.message = `${name} paused for ${this.minutes} min`;
        this.pausing = null; this.reason = "";
      } catch (e) { this.message = e.message; }
      await this.load();
    },
    async resume(name) {
      try {
        await post(`/endpoints/${encodeURIComponent(name)}/resume`);
        this.message = `${name} resumed`;
      } catch (e) { this.message = e.message; }
      await this.load();
    },
  };
}

function poisonedPage() {
  return {
    ...base(), data: null, selected: {}, detail: null, pending: null, dropExpiry: false,
    filter: { endpoint: "", message_type: "", exception: "", reason: "", since: "", until: "" },
    async init() {
      // ?endpoint=E&entry=ID (a stuck session's link): open that entry's detail.
      const asked = new URLSearchParams(window.location.search);
      await this.loadSettings();
      await this.load();
      if (asked.get("endpoint") && asked.get("entry")) await this.show(asked.get("endpoint"), asked.get("entry"));
    },
    async load() {
      try {
        this.data = await api("/poisoned" + this.query());
        const errors = Object.entries(this.data.errors).map(([k, v]) => `${k}: ${v}`);
        this.error = errors.join("; ");
        this.prune();
      } catch (e) { this.error = e.message; }
    },
    // The filters as a query string: times typed in the browser's zone, sent as epoch seconds.
    query() {
      const params = new URLSearchParams();
      for (const name of ["endpoint", "message_type", "exception", "reason"]) {
        if (this.filter[name]) params.set(name, this.filter[name]);
      }
      for (const name of ["since", "until"]) {
        if (this.filter[name]) params.set(name, String(new Date(this.filter[name]).getTime() / 1000));
      }
      const text = params.toString();
      return text ? "?" + text : "";
    },
    async clearFilter() {
      this.filter = { endpoint: "", message_type: "", exception: "", reason: "", since: "", until: "" };
      await this.load();
    },
    groupKey(g) { return [g.endpoint, g.message_type, g.exception_type].join("|"); },
    prune() {  // forget selected entries that are gone
      const present = new Set(this.data.groups.flatMap((g) => g.ids.map((id) => `${g.endpoint}/${id}`)));
      for (const key of Object.keys(this.selected)) if (!present.has(key)) delete this.selected[key];
    },
    isSelected(endpoint, id) { return !!this.selected[`${endpoint}/${id}`]; },
    toggle(endpoint, id, on) {
      if (on) this.selected[`${endpoint}/${id}`] = true; else delete this.selected[`${endpoint}/${id}`];
    },
    groupSelected(g) { return g.ids.every((id) => this.isSelected(g.endpoint, id)); },
    selectGroup(g, on) { g.ids.forEach((id) => this.toggle(g.endpoint, id, on)); },
    selectedCount() { return Object.keys(this.selected).length; },
    selection() {  // {endpoint: [ids]}
      const out = {};
      for (const key of Object.keys(this.selected)) {
        const at = key.indexOf("/");
        (out[key.slice(0, at)] = out[key.slice(0, at)] || []).push(key.slice(at + 1));
      }
      return out;
    },
    replayableIds(group) {
      return group.entries.filter((x) => x.replayable).map((x) => x.id);
    },
    ask(action, byEndpoint) {
      const count = Object.values(byEndpoint).reduce((n, ids) => n + ids.length, 0);
      if (!count) return;
      this.pending = { action, byEndpoint, count };
      this.dropExpiry = false;
      document.getElementById("confirm-dialog").showModal();
    },
    confirmText() {
      if (!this.pending) return "";
      const where = Object.entries(this.pending.byEndpoint).map(([e, ids]) => `${ids.length} at ${e}`).join(", ");
      const what = this.pending.action === "replay"
        ? "Replay %n poisoned message(s)? Each is processed once." : "Purge %n poisoned message(s) for good?";
      return `${what.replace("%n", this.pending.count)} (${where})`;
    },
    cancel() { this.pending = null; document.getElementById("confirm-dialog").close(); },
    async confirm() {
      const { action, byEndpoint } = this.pending;
      document.getElementById("confirm-dialog").close();
      this.pending = null;
      const lines = [];
      for (const [endpoint, ids] of Object.entries(byEndpoint)) {
        const body = { ids, count: ids.length };
        if (action === "replay") body.drop_expiry = this.dropExpiry;
        try {
          const result = await post(`/poisoned/${encodeURIComponent(endpoint)}/${action}`, body);
          const done = action === "replay" ? result.replayed : result.purged.length;
          const kept = Object.values(result.kept || {});
          lines.push(`${endpoint}: ${done} ${action === "replay" ? "replayed" : "purged"}` +
                     (result.missing.length ? `, ${result.missing.length} no longer there` : "") +
                     (kept.length ? `, ${kept.length} ${kept[0]}` : ""));
          ids.forEach((id) => this.toggle(endpoint, id, false));
        } catch (e) { lines.push(`${endpoint}: ${e.message}`); }
      }
      this.message = lines.join("; ");
      this.detail = null;
      await this.load();
    },
    async show(endpoint, id) {
      try {
        this.detail = await api(`/poisoned/${encodeURIComponent(endpoint)}/${encodeURIComponent(id)}`);
        // The detail is drawn below the groups: bring it into view, not below the fold.
        await this.$nextTick();
        requestAnimationFrame(() => document.getElementById("poisoned-detail").scrollIntoView({ block: "start" }));
      } catch (e) { this.error = e.message; }
    },
  };
}

function waitingPage() {
  return {
    ...base(), endpoint: "", sessions: [], deferred: [], scheduled: [], errors: {},
    async init() { await this.loadSettings(); await this.load(); },
    async load() {
      const q = this.endpoint ? `?endpoint=${encodeURIComponent(this.endpoint)}` : "";
      const errors = {};
      const get = async (what) => {
        try { return await api(`/${what}${q}`); } catch (e) { errors[what] = e.message; return []; }
      };
      [this.sessions, this.deferred, this.scheduled] =
        await Promise.all([get("sessions"), get("deferred"), get("scheduled")]);
      this.errors = errors;
    },
    async act(action, s) {
      const text = action === "close"
        ? `Close session ${s.session} of ${s.endpoint}? Its ${s.waiting} waiting message(s) and any later ones go to the poison queue.`
        : `Skip the gap of session ${s.session} of ${s.endpoint}? Its waiting messages go on without the missing ones.`;
      if (!window.confirm(text)) return;
      try {
        const r = await post(`/sessions/${encodeURIComponent(s.endpoint)}/${encodeURIComponent(s.session)}/${action}` +
                             `?partition=${encodeURIComponent(s.partition)}`);
        this.message = `${s.session}: ${action === "close" ? "closed" : "skipped"}, ${r.released} waiting message(s) released`;
      } catch (e) { this.message = e.message; }
      await this.load();
    },
    async release(d) {
      try {
        const r = await post(`/deferred/${encodeURIComponent(d.endpoint)}/${encodeURIComponent(d.message_id)}/release`,
                             { deferrals: d.deferrals });
        this.message = r.released ? `${d.message_id} released` : `${d.message_id} was not deferred any more`;
      } catch (e) { this.message = e.message; }
      await this.load();
    },
  };
}

const STATES = ["queued", "scheduled", "deferred", "poisoned", "processed", "unknown"];

function conversationPage() {
  return {
    ...base(), id: "", data: null, states: STATES,
    async init() {
      // Read the address's id before waiting for the settings: an id typed meanwhile stays.
      const asked = new URLSearchParams(window.location.search).get("id");
      if (asked) this.id = asked;
      await this.loadSettings();
      if (asked) await this.load();
    },
    async go() {
      const url = new URL(window.location.href);
      url.searchParams.set("id", this.id);
      window.history.replaceState(null, "", url);
      await this.load();
    },
    async load() {
      this.error = "";
      try {
        this.data = await api(`/conversation?id=${encodeURIComponent(this.id)}`);
        if (!this.data.messages.length) this.error = `nothing found for ${this.id}`;
      } catch (e) { this.data = null; this.error = e.message; }
      drawConversation(document.getElementById("conversation-picture"), this.data);
    },
  };
}

// The flow picture: one box per message, in columns by causation depth (a message caused by
// none of the others starts a column 0), arrows from cause to effect, coloured by state.
const SVG = "http://www.w3.org/2000/svg";

function svg(name, attributes, parent) {
  const element = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) element.setAttribute(k, v);
  if (parent) parent.appendChild(element);
  return element;
}

function layout(messages) {
  const byId = new Map();
  messages.forEach((m) => { if (!byId.has(m.message_id)) byId.set(m.message_id, m); });
  const depth = new Map();
  const depthOf = (m, seen = new Set()) => {
    if (depth.has(m)) return depth.get(m);
    const cause = m.causation_id && byId.get(m.causation_id);
    let d = 0;
    if (cause && cause !== m && !seen.has(cause)) { seen.add(m); d = depthOf(cause, seen) + 1; }
    depth.set(m, d);
    return d;
  };
  const columns = [];
  messages.forEach((m) => { const d = depthOf(m); (columns[d] = columns[d] || []).push(m); });
  return { columns, byId };
}

function drawConversation(container, data) {
  container.replaceChildren();
  if (!data || !data.messages.length) return;
  const W = 190, H = 58, GX = 60, GY = 18, PAD = 10;
  const { columns, byId } = layout(data.messages);
  const rows = Math.max(...columns.map((c) => (c ? c.length : 0)));
  const root = svg("svg", { id: "conversation-svg", "data-testid": "conversation-svg",
                            width: PAD * 2 + columns.length * (W + GX) - GX,
                            height: PAD * 2 + rows * (H + GY) - GY, role: "img",
                            "aria-label": `conversation ${data.id}` }, container);
  const defs = svg("defs", {}, root);
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
                                 markerWidth: 8, markerHeight: 8, orient: "auto-start-reverse" }, defs);
  svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }, marker);
  const at = new Map();
  columns.forEach((column, c) => (column || []).forEach((m, r) => {
    at.set(m, { x: PAD + c * (W + GX), y: PAD + r * (H + GY) });
  }));
  for (const [m, p] of at) {  // arrows first, boxes over them
    const cause = m.causation_id && byId.get(m.causation_id);
    if (!cause || cause === m || !at.has(cause)) continue;
    const q = at.get(cause);
    const x1 = q.x + W, y1 = q.y + H / 2, x2 = p.x, y2 = p.y + H / 2;
    svg("path", { d: `M ${x1} ${y1} C ${x1 + GX / 2} ${y1}, ${x2 - GX / 2} ${y2}, ${x2} ${y2}`,
                  class: "edge", "marker-end": "url(#arrow)",
                  "data-from": cause.message_id, "data-to": m.message_id }, root);
  }
  for (const [m, p] of at) {
    const g = svg("g", { class: `node state-${m.state}`, "data-testid": `node-${m.message_id}`,
                         "data-state": m.state, transform: `translate(${p.x} ${p.y})` }, root);
    svg("rect", { width: W, height: H, rx: 6 }, g);
    const lines = [m.message_type || "(unknown type)",
                   `${m.source || "?"} → ${m.destination || "?"}`,
                   `${m.state}${m.since ? " · " + fmtTime(m.since).slice(11) : ""}`];
    lines.forEach((line, i) => {
      const t = svg("text", { x: 8, y: 17 + i * 16, class: i === 0 ? "title" : "" }, g);
      t.textContent = line.length > 30 ? line.slice(0, 29) + "…" : line;
    });
    const title = svg("title", {}, g);
    title.textContent = `${m.message_id}\n${m.message_type || ""}\n${m.state}`;
  }
}

function auditPage() {
  return {
    ...base(), records: [], limit: 100,
    async init() { await this.load(); },
    async load() {
      try { this.records = await api(`/audit?limit=${this.limit}`); this.error = ""; }
      catch (e) { this.error = e.message; }
    },
    what(r) { return JSON.stringify(r.target); },
  };
}
