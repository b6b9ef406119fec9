// The strip chart: numeric scalar fields of any properties over the last minutes, on one
// uPlot chart (columnar arrays, capped window). Each charted property is a "series" view on
// the socket: its frames carry the points folded since the last frame.
import uPlot from "/static/vendor/uplot/uPlot.esm.js";

const COLOURS = ["#1d4ed8", "#b3261e", "#1b7f3b", "#a15c00", "#7c3aed", "#0e7490", "#be185d"];
const MAX_POINTS = 20000;  // per series: older points go first

export class StripChart {
  constructor(section, io) {
    this.section = section;
    this.io = io;                 // open(id, device, property, selector), close(id), history()
    this.series = new Map();      // "DEV/PROP@SEL/field" -> {t: [], v: [], label, viewId}
    this.views = new Map();       // view id -> {device, property, selector, fields: Set}
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
  }

  owns(viewId) { return this.views.has(viewId); }

  async add(device, property, selector, field) {
    const viewId = `series:${device}/${property}@${selector}`;
    const key = `${device}/${property}${selector ? "@" + selector : ""}/${field}`;
    if (this.series.has(key)) return;
    this.section.hidden = false;
    this.series.set(key, { t: [], v: [], label: key, viewId, field });
    if (this.io.history()) await this.fill(key, device, property, selector, field);
    let view = this.views.get(viewId);
    if (!view) {
      view = { device, property, selector, fields: new Set() };
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
    if (!view || !f.points) return;
    for (const field of view.fields) {
      const points = f.points[field];
      if (!points) continue;
      const key = `${view.device}/${view.property}${view.selector ? "@" + view.selector : ""}/${field}`;
      const s = this.series.get(key);
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
      series.push({ label: s.label, stroke: colour, spanGaps: true, width: 1.5 });
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
    this.plot = new uPlot({
      width: Math.max(400, this.box.clientWidth || 800), height: 260,
      series,
      cursor: { drag: { x: true, y: false } },
      hooks: { setSelect: [() => { this.zoomed = true; }] },
    }, this.table(), this.box);
    this.plot.over.addEventListener("dblclick", () => { this.zoomed = false; this.redraw(); });
    this.dirty = false;
  }

  redraw() {
    if (!this.plot) return;
    this.plot.setData(this.table(), !this.zoomed);
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
    const labels = ["time_utc", ...[...this.series.values()].map((s) => s.label)];
    const lines = [labels.join(",")];
    for (let i = 0; i < data[0].length; i++) {
      const row = [new Date(data[0][i] * 1000).toISOString()];
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
