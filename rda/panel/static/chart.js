// The strip chart: numeric scalar fields of any properties over the last minutes, on one
// uPlot chart (columnar arrays, capped window). Each charted property is a "series" view on
// the socket: its frames carry the points folded since the last frame. While a charted
// property is in error or disconnected, the chart draws an outage band over that time span
// (its line is broken there), so a frozen line is never mistaken for a steady value.
import uPlot from "/static/vendor/uplot/uPlot.esm.js";
import { formatClock, formatIso, formatTime, onTimeZone, zoneLabel } from "/static/time.js";

const COLOURS = ["#1d4ed8", "#b3261e", "#1b7f3b", "#a15c00", "#7c3aed", "#0e7490", "#be185d"];
const MAX_POINTS = 20000;  // per series: older points go first
const MAX_OUTAGES = 200;   // per view: older bands go first
const BAND = "rgba(179, 38, 30, 0.16)";

export class StripChart {
  constructor(section, io) {
    this.section = section;
    this.io = io;                 // open(id, device, property, selector), close(id), history()
    this.series = new Map();      // "DEV/PROP@SEL/field" -> {t: [], v: [], label, viewId}
    this.views = new Map();       // view id -> {device, property, selector, fields: Set,
                                  //   outages: [[start s, end s or null]], error: text}
    this.paused = false;
    this.zoomed = false;
    this.plot = null;
    this.dirty = false;
    this.box = section.querySelector("#chart-plot");
    this.chips = section.querySelector("#chart-series");
    this.windowSelect = section.querySelector("#chart-window");
    section.querySelector("#chart-pause").addEventListener("click", (e) => {
      this.paused = !this.paused;
      e.target.textContent = this.paused ? "Resume" : "Pause";
      if (!this.paused) this.redraw();
    });
    section.querySelector("#chart-csv").addEventListener("click", () => this.exportCsv());
    section.querySelector("#chart-clear").addEventListener("click", () => this.clear());
    const tick = () => { if (this.dirty && !this.paused) this.redraw(); requestAnimationFrame(tick); };
    requestAnimationFrame(tick);
    onTimeZone(() => this.rebuild());
  }

  // The time axis follows now, and an open outage band grows: redraw a few times a second
  // even when no point arrives.
  tick() {
    if (this.series.size) this.dirty = true;
  }

  // The panel's socket is gone: every charted property is in outage from now on.
  lost() {
    for (const viewId of this.views.keys()) this.outage(viewId, "the panel's WebSocket closed");
  }

  outage(viewId, error) {
    const view = this.views.get(viewId);
    const now = Date.now() / 1000;
    const last = view.outages[view.outages.length - 1];
    if (!last || last[1] !== null) {
      view.outages.push([now, null]);
      if (view.outages.length > MAX_OUTAGES) view.outages.shift();
      // A null point breaks each of the view's lines at the start of the outage.
      for (const field of view.fields) {
        const s = this.series.get(this.key(view, field));
        if (s) { s.t.push(now); s.v.push(null); }
      }
    }
    view.error = error;
    this.dirty = true;
    this.section.dataset.outages = String(this.outageCount());
  }

  recovered(viewId) {
    const view = this.views.get(viewId);
    const last = view.outages[view.outages.length - 1];
    if (last && last[1] === null) last[1] = Date.now() / 1000;
    view.error = null;
    this.section.dataset.outages = String(this.outageCount());
  }

  outageCount() {
    let n = 0, open = 0;
    for (const view of this.views.values()) {
      n += view.outages.length;
      if (view.outages.length && view.outages[view.outages.length - 1][1] === null) open++;
    }
    this.section.dataset.openOutages = String(open);
    return n;
  }

  key(view, field) {
    return `${view.device}/${view.property}${view.selector ? "@" + view.selector : ""}/${field}`;
  }

  // uPlot draw hook: a translucent band over each outage, the full height of the plot.
  drawBands(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const [xMin, xMax] = [u.scales.x.min, u.scales.x.max];
    const now = Date.now() / 1000;
    let drawn = 0;
    ctx.save();
    ctx.fillStyle = BAND;
    for (const view of this.views.values()) {
      for (const [start, end] of view.outages) {
        const a = Math.max(start, xMin);
        const b = Math.min(end === null ? now : end, xMax);
        if (b <= a) continue;
        const x0 = u.valToPos(a, "x", true);
        const x1 = u.valToPos(b, "x", true);
        ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
        drawn++;
      }
    }
    ctx.restore();
    this.section.dataset.bandsDrawn = String(drawn);
  }

  owns(viewId) { return this.views.has(viewId); }

  // The charted fields, for a saved layout.
  layoutSeries() {
    return [...this.series.values()].map((s) =>
      ({ device: s.device, property: s.property, selector: s.selector, field: s.field }));
  }

  async add(device, property, selector, field) {
    const viewId = `series:${device}/${property}@${selector}`;
    const key = `${device}/${property}${selector ? "@" + selector : ""}/${field}`;
    if (this.series.has(key)) return;
    this.section.hidden = false;
    this.series.set(key, { t: [], v: [], label: key, viewId, field, device, property, selector });
    if (this.io.history()) await this.fill(key, device, property, selector, field);
    let view = this.views.get(viewId);
    if (!view) {
      view = { device, property, selector, fields: new Set(), outages: [], error: null };
      this.views.set(viewId, view);
      this.io.open(viewId, device, property, selector);
    }
    view.fields.add(field);
    this.rebuild();
  }

  async fill(key, device, property, selector, field) {
    const minutes = Number(this.windowSelect.value) / 60;
    const q = new URLSearchParams({ device, property, field, minutes, selector });
    try {
      const reply = await fetch(`/api/history?${q}`);
      if (!reply.ok) return;
      const past = await reply.json();
      const s = this.series.get(key);
      s.t.push(...past.t);
      s.v.push(...past.v);
      s.history = past.t.length;
    } catch (err) {
      console.warn("history:", err);
    }
  }

  reopen() {
    for (const [viewId, view] of this.views) {
      this.io.open(viewId, view.device, view.property, view.selector);
    }
  }

  frame(f) {
    const view = this.views.get(f.view);
    if (!view) return;
    if (f.status === "error") this.outage(f.view, f.error);
    else if (f.status === "ok" && view.error !== null) this.recovered(f.view);
    if (!f.points) return;
    for (const field of view.fields) {
      const points = f.points[field];
      if (!points) continue;
      const s = this.series.get(this.key(view, field));
      for (const [t, v] of points) { s.t.push(t); s.v.push(v); }
      if (s.t.length > MAX_POINTS) { s.t.splice(0, s.t.length - MAX_POINTS); s.v.splice(0, s.v.length - MAX_POINTS); }
    }
    this.dirty = true;
  }

  table() {
    // uPlot wants one x array: join the series on their time stamps (null where absent).
    const span = Number(this.windowSelect.value);
    const now = Date.now() / 1000;
    const tables = [];
    for (const s of this.series.values()) {
      let first = 0;
      while (first < s.t.length && s.t[first] < now - span) first++;
      tables.push([s.t.slice(first), s.v.slice(first)]);
    }
    return tables.length ? uPlot.join(tables) : [[]];
  }

  rebuild() {
    if (this.plot) { this.plot.destroy(); this.plot = null; }
    this.chips.replaceChildren();
    let i = 0;
    const series = [{}];
    for (const [key, s] of this.series) {
      const colour = COLOURS[i++ % COLOURS.length];
      series.push({ label: s.label, stroke: colour, spanGaps: false, width: 1.5 });
      const chip = document.createElement("span");
      chip.className = "chip";
      chip.dataset.series = key;
      chip.style.borderColor = colour;
      chip.textContent = s.history ? `${key} (${s.history} recorded)` : key;
      const remove = document.createElement("button");
      remove.textContent = "✕";
      remove.addEventListener("click", () => this.remove(key));
      chip.append(remove);
      this.chips.append(chip);
    }
    if (!this.series.size) { this.section.hidden = true; return; }
    series[0] = { label: `time (${zoneLabel()})`, value: (u, v) => (v == null ? "-" : formatTime(v * 1000)) };
    this.plot = new uPlot({
      width: Math.max(400, this.box.clientWidth || 800), height: 260,
      series,
      axes: [
        { label: `time (${zoneLabel()})`,
          values: (u, splits) => splits.map((v) => formatClock(v * 1000)) },
        { size: 70 },
      ],
      cursor: { drag: { x: true, y: false } },
      hooks: {
        setSelect: [() => { this.zoomed = true; }],
        draw: [(u) => this.drawBands(u)],
      },
    }, this.table(), this.box);
    this.plot.over.addEventListener("dblclick", () => { this.zoomed = false; this.redraw(); });
    this.followNow();
    this.dirty = false;
  }

  // Unless zoomed, the time axis ends now (not at the last point): a property that stopped
  // updating leaves a visible empty stretch, and an open outage band reaches the right edge.
  followNow() {
    if (this.zoomed) return;
    const now = Date.now() / 1000;
    this.plot.setScale("x", { min: now - Number(this.windowSelect.value), max: now });
  }

  redraw() {
    if (!this.plot) return;
    this.plot.setData(this.table(), !this.zoomed);
    this.followNow();
    this.dirty = false;
  }

  remove(key) {
    const s = this.series.get(key);
    this.series.delete(key);
    const view = this.views.get(s.viewId);
    view.fields.delete(s.field);
    if (!view.fields.size) { this.views.delete(s.viewId); this.io.close(s.viewId); }
    this.rebuild();
  }

  clear() {
    for (const key of [...this.series.keys()]) this.remove(key);
  }

  exportCsv() {
    const data = this.table();
    const labels = [`time_${zoneLabel() === "UTC" ? "utc" : "local"}`, ...[...this.series.values()].map((s) => s.label)];
    const lines = [labels.join(",")];
    for (let i = 0; i < data[0].length; i++) {
      const row = [formatIso(data[0][i] * 1000)];
      for (let j = 1; j < data.length; j++) row.push(data[j][i] ?? "");
      lines.push(row.join(","));
    }
    const blob = new Blob([lines.join("\n") + "\n"], { type: "text/csv" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = "rda-strip-chart.csv";
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  }
}
