// rda panel: the tab's WebSocket, the device tree, and the open views.
// The server pushes "tree" and "frames" messages; this module routes them.
import { PropertyView } from "/static/view.js";
import { StripChart } from "/static/chart.js";
import { formatTime, onTimeZone, setTimeZone, timeZone } from "/static/time.js";
import { checkLayout, download, layoutInLink, linkFor } from "/static/layout.js";

const state = {
  socket: null,
  hello: null,
  views: new Map(),        // view id -> PropertyView
  tree: [],
  nextSet: 1,
  pendingSets: new Map(),  // set id -> callback
  collapsed: new Set(),    // devices the operator folded: the 2 s tree refresh keeps them so
  columns: null,           // the views' grid columns (null: as many as fit)
  title: "",
  laidOut: false,          // the first hello's layout (link, else --layout) was applied
  alarms: { alarms: [], severities: {}, unwatched: 0 },
};
const RANK = { NONE: 0, MINOR: 1, MAJOR: 2, INVALID: 3 };
const query = new URLSearchParams(location.search);
const bench = query.has("bench");
window.rdaLatency = [];   // ms from the server's acquisition stamp to the painted value
window.rdaFrames = 0;     // view frames received (?bench): the benchmark's proof of updates
window.rdaViewsFed = new Set();  // views that received a frame (?bench)

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function send(message) {
  if (state.socket && state.socket.readyState === WebSocket.OPEN) {
    state.socket.send(JSON.stringify(message));
  }
}

const chart = new StripChart(document.getElementById("chart"), {
  open: (id, device, property, selector) =>
    send({ op: "open", view: id, device, property, selector, series: true }),
  close: (id) => send({ op: "close", view: id }),
  history: () => state.hello && state.hello.history,
});

const api = {
  send,
  set(device, property, selector, values, done) {
    const id = state.nextSet++;
    state.pendingSets.set(id, done);
    send({ op: "set", id, device, property, selector, values });
  },
  chart: (device, property, selector, field) => chart.add(device, property, selector, field),
  reopen(view) { send({ op: "close", view: view.id }); view.open(); },
  closed(view) {
    send({ op: "close", view: view.id });
    state.views.delete(view.id);
    onScreen.unobserve(view.root);
    showLanding();
  },
  allowSet: () => state.hello && state.hello.allow_set,
};

// Whether the tree lists DEVICE/PROPERTY with a setter (a layout may open a view before the
// tree arrives: the view learns it when the tree does).
function writableOf(device, property) {
  for (const server of state.tree) {
    for (const d of server.devices) {
      if (d.name !== device) continue;
      const p = d.properties.find((q) => q.name === property);
      if (p) return Boolean(p.writable);
    }
  }
  return false;
}

function openView(device, property, writable, options = {}) {
  const id = `${device}/${property}`;
  if (state.views.has(id)) { state.views.get(id).root.scrollIntoView(); return; }
  const view = new PropertyView(id, device, property, writable, api);
  if (options.selector) { view.selector = options.selector; view.selectorInput.value = options.selector; }
  for (const [name, mode] of Object.entries(options.images || {})) view.imageModes.set(name, mode);
  state.views.set(id, view);
  document.getElementById("views").append(view.root);
  onScreen.observe(view.root);
  view.open();
  showLanding();
}

// -- layouts ---------------------------------------------------------------------------------

function currentLayout() {
  const views = [];
  for (const article of document.querySelectorAll("#views article[data-view]")) {
    const view = state.views.get(article.dataset.view);
    if (!view) continue;
    views.push({ device: view.device, property: view.property, selector: view.selector,
                 images: Object.fromEntries(view.imageModes) });
  }
  return {
    version: 1, title: state.title, time_zone: timeZone(), columns: state.columns, views,
    chart: { window: Number(document.getElementById("chart-window").value),
             series: chart.layoutSeries() },
  };
}

function setColumns(columns) {
  state.columns = columns;
  document.getElementById("columns").value = columns ? String(columns) : "";
  document.getElementById("views").style.gridTemplateColumns =
    columns ? `repeat(${columns}, minmax(0, 1fr))` : "";
}

function applyLayout(layout) {
  for (const view of [...state.views.values()]) { api.closed(view); view.root.remove(); }
  chart.clear();
  state.title = layout.title;
  document.title = layout.title ? `${layout.title} · rda panel` : "rda panel";
  document.getElementById("tz").value = layout.time_zone;
  setTimeZone(layout.time_zone);
  setColumns(layout.columns);
  for (const v of layout.views) {
    openView(v.device, v.property, writableOf(v.device, v.property),
             { selector: v.selector, images: v.images });
  }
  document.getElementById("chart-window").value = String(layout.chart.window);
  for (const s of layout.chart.series) chart.add(s.device, s.property, s.selector, s.field);
  showLanding();
}

function layoutStatus(text, bad = false) {
  const status = document.getElementById("layout-status");
  status.textContent = text;
  status.className = bad ? "layout-status bad" : "layout-status";
}

async function applyChecked(text, origin) {
  try {
    applyLayout(await checkLayout(text));
    layoutStatus(`layout from ${origin}`);
  } catch (err) {
    layoutStatus(`${origin}: ${err.message}`, true);
  }
}

// Once per page, on the first hello: the link's layout, else the panel's --layout.
function firstLayout(hello) {
  if (state.laidOut) return;
  state.laidOut = true;
  const linked = layoutInLink();
  if (linked !== null) applyChecked(linked, "the link");
  else if (hello.layout) { applyLayout(hello.layout); layoutStatus("layout from rda panel --layout"); }
}

// A link with another layout pasted into the address bar changes only the fragment: no reload.
window.addEventListener("hashchange", () => {
  const linked = layoutInLink();
  if (linked !== null && state.hello) applyChecked(linked, "the link");
});

function setKiosk(on) {
  document.body.classList.toggle("kiosk", on);
  document.body.dataset.kiosk = on ? "true" : "false";
}

function showLanding() {
  document.getElementById("landing").hidden = state.views.size > 0;
}

function renderTree() {
  const filter = document.getElementById("filter").value.trim().toLowerCase();
  const box = document.getElementById("tree");
  box.replaceChildren();
  for (const server of state.tree) {
    const facts = server.facts || {};
    const parts = [];
    if (facts.clients !== undefined) parts.push(`clients ${facts.clients}`);
    if (facts.subscriptions !== undefined) parts.push(`subscriptions ${facts.subscriptions}`);
    if (facts.request_rate !== undefined) parts.push(`${facts.request_rate} req/s`);
    const node = el("div", { class: "server", "data-server": server.name },
      el("div", { class: "server-head" },
        el("span", {}, server.name),
        server.role === "recorder"
          ? el("span", { class: "role", "data-testid": "server-role" }, "recorder") : "",
        el("span", { class: `badge state-${server.state}`, "data-testid": "server-state" },
          server.state)),
      el("div", { class: "facts" }, `${server.endpoint}${parts.length ? " · " : ""}${parts.join(" · ")}`));
    if (server.error) node.append(el("div", { class: "server-error" }, server.error));
    const recorded = server.devices.filter((d) => d.kind === "recorder").map((d) => d.records);
    if (recorded.length && (!filter || recorded.some((r) => r.toLowerCase().includes(filter)))) {
      // A recorder serves the history of these devices (the strip chart's past): no device
      // of its own to open.
      node.append(el("div", { class: "records", "data-testid": "records" },
        `records the history of ${recorded.join(", ")}`));
    }
    for (const device of server.devices) {
      if (device.kind === "recorder") continue;
      const props = device.properties.filter((p) =>
        !filter || `${device.name}/${p.name}`.toLowerCase().includes(filter));
      if (!props.length && !(filter && device.name.toLowerCase().includes(filter)) && filter) continue;
      const list = el("ul", { class: "props" });
      let worst = "NONE";
      for (const p of props) {
        const severity = state.alarms.severities[`${device.name}/${p.name}`] || "NONE";
        if (RANK[severity] > RANK[worst]) worst = severity;
        list.append(el("li", {},
          el("button", { type: "button", "data-prop": `${device.name}/${p.name}`,
                         "data-severity": severity,
                         onclick: () => openView(device.name, p.name, p.writable) }, p.name),
          p.writable ? el("span", { class: "rw" }, " rw") : ""));
      }
      const details = el("details", { class: "device", "data-device": device.name },
        el("summary", { "data-severity": worst }, device.name), list);
      details.open = filter !== "" || !state.collapsed.has(device.name);
      details.addEventListener("toggle", () => {
        if (details.open) state.collapsed.delete(device.name);
        else state.collapsed.add(device.name);
      });
      node.append(details);
    }
    box.append(node);
  }
}

// Frames are drawn once per animation frame, and only for views on screen (or near it): a
// view off screen keeps its newest frame (its counts merged) and draws it when scrolled in.
// 200 views at 10 Hz on one page stay responsive this way (benchmarks/panel.py).
const pending = new Map();  // view id -> merged frame waiting for the next animation frame
let flushScheduled = false;

function merge(older, newer) {
  if (!older) return newer;
  newer.folded += older.folded;
  newer.gap += older.gap;
  newer.first = newer.first || older.first;
  if (!newer.fields && older.fields && newer.status === older.status) newer.fields = older.fields;
  if (!newer.context && newer.status === "ok") newer.context = older.context;
  return newer;
}

function scheduleFlush() {
  if (flushScheduled) return;
  flushScheduled = true;
  requestAnimationFrame(flush);
}

function flush() {
  flushScheduled = false;
  const now = performance.timeOrigin + performance.now();
  for (const [id, frame] of pending) {
    const view = state.views.get(id);
    if (!view) { pending.delete(id); continue; }
    if (!view.visible) continue;
    pending.delete(id);
    view.frame(frame);
    if (bench && frame.context && frame.context.acq_stamp) {
      window.rdaLatency.push(now - frame.context.acq_stamp / 1e6);
    }
  }
}

const onScreen = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    const view = state.views.get(entry.target.dataset.view);
    if (!view) continue;
    if (view.visible !== entry.isIntersecting) {
      view.visible = entry.isIntersecting;
      if (view.visible) view.shownAt = performance.now();
      // The panel holds an off-screen view's frames (folding them) until it shows again.
      send({ op: "show", view: view.id, visible: view.visible });
    }
    if (view.visible && pending.has(view.id)) scheduleFlush();
  }
}, { rootMargin: "300px" });

function onFrames(frames) {
  for (const frame of frames) {
    if (chart.owns(frame.view)) { chart.frame(frame); continue; }
    if (state.views.has(frame.view)) pending.set(frame.view, merge(pending.get(frame.view), frame));
  }
  if (bench) {
    window.rdaFrames += frames.length;
    for (const frame of frames) window.rdaViewsFed.add(frame.view);
  }
  scheduleFlush();
}

// The alarm summary: every property in alarm, in error or disconnected, newest first.
function renderAlarms() {
  const rows = state.alarms.alarms;
  const body = document.getElementById("alarm-rows");
  body.replaceChildren(...rows.map((r) => {
    const address = `${r.device}/${r.property}`;
    return el("tr", { "data-alarm-row": address, "data-severity": r.severity, "data-state": r.state },
      el("td", { class: "when" }, formatTime(r.since * 1000)),
      el("td", {}, el("span", { class: `sev sev-${r.severity}` },
        r.state === "alarm" ? r.severity : r.state)),
      el("td", {}, el("button", { type: "button", class: "link",
        onclick: () => openView(r.device, r.property, writableOf(r.device, r.property)) }, address)),
      el("td", { class: "muted" }, r.server),
      el("td", { class: "message" }, r.message));
  }));
  document.getElementById("alarm-count").textContent = String(rows.length);
  const section = document.getElementById("alarms");
  section.dataset.count = String(rows.length);
  section.dataset.worst = rows.reduce((w, r) => (RANK[r.severity] > RANK[w] ? r.severity : w), "NONE");
  document.getElementById("alarm-note").textContent = state.alarms.unwatched
    ? `${state.alarms.unwatched} properties not watched (limit reached)` : "";
}
onTimeZone(() => renderAlarms());

function setLink(text, cls) {
  const link = document.getElementById("link");
  link.textContent = text;
  link.className = `badge state-${cls}`;
}

function connect() {
  const socket = new WebSocket(`ws://${location.host}/ws`);
  state.socket = socket;
  socket.onopen = () => {
    setLink("panel connected", "connected");
    for (const view of state.views.values()) view.open();
    chart.reopen();
  };
  socket.onmessage = (event) => {
    const msg = JSON.parse(event.data);
    if (msg.type === "hello") {
      state.hello = msg;
      setKiosk(msg.kiosk || query.has("kiosk"));
      firstLayout(msg);
      document.getElementById("mode").textContent =
        `${msg.kiosk ? "kiosk (read-only)" : msg.allow_set ? "sets allowed" : "read-only"} · ` +
        `heartbeat timeout ${msg.heartbeat_timeout} s · at most ${msg.max_fps} frames/s per view` +
        (msg.history ? ` · history from the ${msg.history}` : "");
    } else if (msg.type === "tree") {
      state.tree = msg.servers;
      renderTree();
      for (const view of state.views.values()) {
        if (!view.writable && writableOf(view.device, view.property)) view.writable = true;
      }
    } else if (msg.type === "frames") {
      onFrames(msg.frames);
    } else if (msg.type === "describe") {
      const view = state.views.get(msg.view);
      if (view) view.describe(msg.description);
    } else if (msg.type === "alarms") {
      state.alarms = msg;
      renderAlarms();
      renderTree();
    } else if (msg.type === "set_result") {
      const done = state.pendingSets.get(msg.id);
      state.pendingSets.delete(msg.id);
      if (done) done(msg);
    } else if (msg.type === "error") {
      console.warn("panel:", msg.error);
    }
  };
  socket.onclose = () => {
    setLink("panel connection lost: retrying", "disconnected");
    for (const view of state.views.values()) view.lost("the panel's WebSocket closed");
    chart.lost();
    setTimeout(connect, 1000);
  };
}

// Ages count up and staleness is judged a few times a second, for every view at once.
const TICK_MS = 250;
setInterval(() => {
  const now = performance.now();
  for (const view of state.views.values()) if (view.visible) view.tick(now);
  chart.tick();
}, TICK_MS);

document.getElementById("filter").addEventListener("input", renderTree);
document.getElementById("layout-save").addEventListener("click", () => {
  download("rda-panel-layout.json", JSON.stringify(currentLayout(), null, 1) + "\n");
  layoutStatus("layout saved");
});
const loadInput = document.getElementById("layout-file");
document.getElementById("layout-load").addEventListener("click", () => loadInput.click());
loadInput.addEventListener("change", async () => {
  const file = loadInput.files[0];
  if (file) await applyChecked(await file.text(), file.name);
  loadInput.value = "";
});
document.getElementById("layout-share").addEventListener("click", () => {
  const link = linkFor(currentLayout());
  history.replaceState(null, "", link);  // the address bar holds it: copy, bookmark, send
  const shown = document.getElementById("share-link");
  shown.value = link;
  shown.hidden = false;
  shown.select();
  if (navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {});
  layoutStatus("link to this layout: in the address bar and below");
});
document.getElementById("columns").addEventListener("change", (e) =>
  setColumns(e.target.value ? Number(e.target.value) : null));
document.getElementById("tz").addEventListener("change", (e) => setTimeZone(e.target.value));
connect();
