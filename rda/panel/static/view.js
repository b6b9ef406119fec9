// One property view: a header that is green, red or grey; the value rendered from its fields;
// the data context; update type, rate, folded updates and gaps; a set form with --allow-set.
// It never hides staleness: the value's age counts up live, the view greys out ("stale")
// when no update came within a bound derived from its measured rate, and on a disconnection
// it turns red keeping the last acquisition stamp, with its set form disabled.
import uPlot from "/static/vendor/uplot/uPlot.esm.js";
import { formatAge, formatTime } from "/static/time.js";

// A view is stale when no update came for STALE_PERIODS periods of its measured rate (at
// least STALE_MIN_S). Only a property seen updating steadily is judged: at least
// STEADY_UPDATES received at STEADY_RATE Hz or more; one that changes only on a set is not.
export const STALE_PERIODS = 5;
export const STALE_MIN_S = 1.0;
const STEADY_UPDATES = 10;
const STEADY_RATE = 0.2;

export function staleAfter(rate, received) {
  if (received < STEADY_UPDATES || !(rate >= STEADY_RATE)) return null;
  return Math.max(STALE_MIN_S, STALE_PERIODS / rate);
}

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

function stamp(ns) {
  return ns ? formatTime(ns / 1e6) : "-";
}

// Grey level (0..255) -> the blue-to-yellow colour map of images and of their colour scale.
function colour(level) {
  const g = level / 255;
  return [Math.round(255 * Math.min(1, 2 * g)), Math.round(255 * g), Math.round(255 * (1 - g))];
}

function paintImage(canvas, field) {
  canvas.width = field.width;
  canvas.height = field.height;
  const grey = Uint8Array.from(atob(field.pixels), (c) => c.charCodeAt(0));
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(field.width, field.height);
  for (let i = 0; i < grey.length; i++) {
    const [r, g, b] = colour(grey[i]);
    img.data[4 * i] = r;
    img.data[4 * i + 1] = g;
    img.data[4 * i + 2] = b;
    img.data[4 * i + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

function number(value) {
  if (value === null || value === undefined) return "NaN";
  const magnitude = Math.abs(value);
  return magnitude !== 0 && (magnitude >= 1e5 || magnitude < 1e-3)
    ? value.toExponential(3) : String(Number(value.toPrecision(4)));
}

// A scalar as the property declares it: its precision (digits after the point) and units.
// Without a declared precision a float shows 6 significant digits (as EPICS displays do
// without PREC), not the 17 of its repr; the full value is the cell's tooltip.
export function formatScalar(value, type, meta) {
  if (value === null || value === undefined) return "NaN";
  if (typeof value === "boolean") return String(value);
  const float = type.startsWith("FLOAT");
  const precision = meta && meta.precision !== undefined && meta.precision !== null ? meta.precision : null;
  let text = !float ? String(value)
    : precision !== null ? value.toFixed(precision) : String(Number(value.toPrecision(6)));
  if (meta && meta.units) text += ` ${meta.units}`;
  return text;
}

// "-10 … 10 A", "… 50 A", "-5 …": a declared pair as the operator reads it.
function range(pair, units) {
  if (!pair) return "";
  const [low, high] = pair;
  const u = units ? ` ${units}` : "";
  if (low === null || low === undefined) return `… ${high}${u}`;
  if (high === null || high === undefined) return `${low}${u} …`;
  return `${low} … ${high}${u}`;
}

const LINE_COLOURS = ["#1d4ed8", "#b3261e", "#1b7f3b", "#a15c00", "#7c3aed", "#0e7490", "#be185d"];

// A 2-D numeric array: an image with its colour scale, row labels and column axis, or (for a
// few rows, "rows as lines") one line per row on a plot, x from the column positions.
class ImageView {
  constructor(name, onMode) {
    this.name = name;
    this.mode = "image";
    this.onMode = onMode;
    this.canvas = el("canvas", { class: "image", "data-image": name });
    this.rowLabels = el("div", { class: "row-labels", "data-testid": "row-labels" });
    this.scale = el("canvas", { class: "colour-scale", width: "12", height: "256",
                                "data-testid": "colour-scale" });
    this.scaleMax = el("span", { "data-testid": "scale-max" });
    this.scaleMin = el("span", { "data-testid": "scale-min" });
    this.xAxis = el("div", { class: "x-axis", "data-testid": "x-axis" });
    this.toggle = el("button", { type: "button", class: "mode", "data-testid": "rows-as-lines",
                                 hidden: "", onclick: () => this.setMode(this.mode === "image" ? "lines" : "image") },
                     "rows as lines");
    this.imageBox = el("div", { class: "image-box" },
      this.rowLabels,
      el("div", { class: "image-main" }, this.canvas, this.xAxis),
      el("div", { class: "scale-box" }, this.scaleMax, this.scale, this.scaleMin));
    this.linesBox = el("div", { class: "lines", "data-lines": name, hidden: "" });
    this.box = el("div", { class: "image-view", "data-image-view": name },
      el("div", { class: "image-bar" }, this.toggle), this.imageBox, this.linesBox);
    this.plot = null;
    this.plotShape = "";
    this.field = null;
    const ctx = this.scale.getContext("2d");
    for (let y = 0; y < 256; y++) {
      const [r, g, b] = colour(255 - y);
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(0, y, 12, 1);
    }
  }

  setMode(mode) {
    this.mode = mode === "lines" && this.field && this.field.rows ? "lines" : "image";
    this.box.dataset.mode = this.mode;
    this.toggle.textContent = this.mode === "image" ? "rows as lines" : "as image";
    if (this.onMode) this.onMode(this.name, this.mode);
    if (this.field) this.update(this.field);
  }

  update(field) {
    this.field = field;
    this.toggle.hidden = !field.rows;
    if (this.mode === "lines" && !field.rows) this.mode = "image";
    this.box.dataset.mode = this.mode;
    this.imageBox.hidden = this.mode !== "image";
    this.linesBox.hidden = this.mode !== "lines";
    const labels = field.row_labels || null;
    if (this.mode === "image") {
      paintImage(this.canvas, field);
      this.scaleMax.textContent = number(field.max);
      this.scaleMin.textContent = number(field.min);
      const rows = field.shape[0];
      const names = labels || (rows <= 16 ? [...Array(rows).keys()].map(String) : ["0", String(rows - 1)]);
      if (this.rowLabels.dataset.names !== names.join("\u0000")) {
        this.rowLabels.dataset.names = names.join("\u0000");
        this.rowLabels.replaceChildren(...names.map((n) => el("span", {}, n)));
      }
      const cols = field.shape[1];
      const first = field.x ? field.x[0] : 0;
      const last = field.x ? field.x[field.x.length - 1] : cols - 1;
      const axis = `${field.x_name || "column"}: ${number(first)} … ${number(last)}`;
      if (this.xAxis.textContent !== axis) this.xAxis.textContent = axis;
    } else {
      this.drawLines(field, labels);
    }
  }

  drawLines(field, labels) {
    const rows = field.rows;
    const length = rows[0].length;
    const x = rows[0].x ? rows[0].x.map((i) => (field.x ? field.x[i] : i))
      : field.x || [...Array(length).keys()];
    const series = [];
    const data = [x];
    rows.forEach((row, i) => {
      const label = labels ? labels[i] : `row ${i}`;
      const stroke = LINE_COLOURS[i % LINE_COLOURS.length];
      if (row.x) {  // decimated: min and max per column, one colour
        series.push({ label: `${label} min`, stroke }, { label: `${label} max`, stroke });
        data.push(row.min, row.max);
      } else {
        series.push({ label, stroke, width: 1.5 });
        data.push(row.y);
      }
    });
    const shape = series.map((s) => s.label).join("|");
    if (!this.plot || this.plotShape !== shape) {
      if (this.plot) this.plot.destroy();
      this.plotShape = shape;
      this.plot = new uPlot({
        width: Math.max(300, this.linesBox.clientWidth || this.box.clientWidth || 420), height: 180,
        scales: { x: { time: false } },
        axes: [{ label: field.x_name || "column" }, {}],
        series: [{ label: field.x_name || "column" }, ...series],
      }, data, this.linesBox);
    } else {
      this.plot.setData(data);
    }
    this.linesBox.dataset.series = String(series.length);
  }
}

// A 1-D array as a line plot; decimated arrays come as min/max per pixel column.
class ArrayPlot {
  constructor(box) {
    this.box = box;
    this.plot = null;
    this.shape = "";
  }
  update(field) {
    const x = field.x || field.y.map((_, i) => i);
    const series = field.x ? [field.min, field.max] : [field.y];
    const shape = `${series.length}`;
    const data = [x, ...series];
    if (!this.plot || this.shape !== shape) {
      if (this.plot) this.plot.destroy();
      this.shape = shape;
      const lines = field.x
        ? [{ label: "min", stroke: "#1d4ed8" }, { label: "max", stroke: "#b3261e" }]
        : [{ label: field.name, stroke: "#1d4ed8" }];
      this.plot = new uPlot({
        width: Math.max(300, this.box.clientWidth || 420), height: 140,
        scales: { x: { time: false } }, legend: { show: false },
        series: [{ label: "index" }, ...lines],
      }, data, this.box);
    } else {
      this.plot.setData(data);
    }
  }
}

export class PropertyView {
  constructor(id, device, property, writable, api) {
    this.id = id;
    this.device = device;
    this.property = property;
    this.writable = writable;
    this.api = api;
    this.selector = "";
    this.cycles = new Set();
    this.plots = new Map();
    this.images = new Map();      // field name -> ImageView
    this.imageModes = new Map();  // field name -> "image" or "lines" (kept in layouts)
    this.lastFields = null;
    this.formBuilt = false;
    this.description = null;   // the property's declared metadata (describe), null: none
    this.alarm = null;         // the newest value's alarm, null: none
    this.status = "waiting";
    this.disconnected = false;
    this.lastContext = null;   // of the last good value: kept through outages
    this.lastGoodWall = 0;     // ms since the epoch the last good value arrived
    this.lastGoodMono = 0;     // performance.now() then: staleness is judged on this clock
    this.rate = 0;
    this.received = 0;
    this.stale = false;
    this.visible = true;       // on screen or near it (main.js): off screen, frames wait
    this.shownAt = 0;          // performance.now() when it last came into sight
    this.silent = 0;           // seconds since the last good value, at the last tick
    this.bound = null;         // the staleness bound then (null: not judged)
    this.build();
  }

  build() {
    this.head = el("div", { class: "view-head status-waiting", "data-testid": "view-head" });
    this.title = el("h2", {}, this.id);
    this.selectorInput = el("input", { placeholder: "cycle selector", list: `${this.id}-cycles`,
                                       "aria-label": "selector", "data-testid": "selector" });
    this.cycleList = el("datalist", { id: `${this.id}-cycles` });
    this.selectorInput.addEventListener("change", () => {
      this.selector = this.selectorInput.value.trim();
      this.api.reopen(this);
    });
    const close = el("button", { type: "button", title: "close",
                                 onclick: () => { this.api.closed(this); this.root.remove(); } }, "✕");
    this.alarmBadge = el("span", { class: "alarm-badge", "data-testid": "alarm-badge", hidden: "" });
    this.head.append(this.title, this.alarmBadge, this.selectorInput, this.cycleList, close);
    this.alarmLine = el("div", { class: "view-alarm", "data-testid": "alarm", hidden: "" });
    this.error = el("div", { class: "view-error", "data-testid": "view-error" });
    this.staleLine = el("div", { class: "view-stale", "data-testid": "stale", hidden: "" });
    this.meta = el("div", { class: "meta" });
    this.items = {};
    const item = (key, label, testid) => {
      const label_ = el("span", { class: "label" }, label);
      const value = el("b", testid ? { "data-testid": testid } : {}, "-");
      this.items[key] = { label: label_, value };
      this.meta.append(el("span", {}, label_, " ", value));
    };
    item("age", "age", "age");
    item("update", "update", "update-type");
    item("rate", "rate", "rate");
    item("folded", "folded", "folded");
    item("gap", "gap", "gap");
    item("received", "received", "received");
    item("cycle", "cycle", "cycle");
    item("acquired", "acquired", "acquired");
    item("selector", "selector", "selector-shown");
    this.value = el("div", { class: "value", "data-testid": "value" });
    this.form = el("div", { class: "setform", hidden: "" });
    this.root = el("article", { class: "view", "data-view": this.id, "data-stale": "false",
                                "data-disconnected": "false", "data-alarm": "NONE" },
      this.head, this.error, this.alarmLine, this.staleLine, this.meta, this.value, this.form);
  }

  open() {
    this.api.send({ op: "open", view: this.id, device: this.device, property: this.property,
                    selector: this.selector, columns: 600 });
    if (!this.visible) this.api.send({ op: "show", view: this.id, visible: false });
  }

  // The panel's own WebSocket is gone: nothing this view shows is live any more.
  lost(text) {
    this.setStatus("error", text, true);
  }

  setStatus(status, error, disconnected = false) {
    this.status = status;
    this.disconnected = status === "error" && disconnected;
    this.head.className = `view-head status-${status}`;
    this.error.textContent = error || "";
    this.root.dataset.disconnected = this.disconnected ? "true" : "false";
    this.setFormEnabled(!this.disconnected);
    this.showTimes();
  }

  frame(f) {
    // What ended the last outage: the tests and the operator both want it to be FIRST.
    if (f.status === "ok" && this.status === "error") {
      this.root.dataset.recoveredWith = f.first ? "FIRST" : f.update_type;
    }
    if (f.status === "error") this.root.dataset.lostWith = f.error;
    this.rate = f.rate;
    this.received = f.received;
    if (f.status === "ok") {
      this.lastGoodWall = Date.now();
      this.lastGoodMono = performance.now();
      if (f.context) this.lastContext = f.context;
    }
    this.setStatus(f.status, f.error, f.disconnected);
    if (f.status === "ok") this.setAlarm(f.alarm || null);
    const ctx = this.lastContext || {};
    if (ctx.cycle_name && !this.cycles.has(ctx.cycle_name) && this.cycles.size < 64) {
      this.cycles.add(ctx.cycle_name);
      this.cycleList.append(el("option", { value: ctx.cycle_name }));
    }
    const set = (key, text) => { this.items[key].value.textContent = String(text); };
    set("update", (f.first && f.update_type !== "FIRST" ? "FIRST, " : "") + (f.update_type || "-"));
    set("folded", f.folded);
    set("gap", f.gap);
    set("received", f.received);
    set("cycle", ctx.cycle_name || "-");
    set("selector", this.selector || "none");
    if (f.fields) {
      this.lastFields = f.fields;
      this.renderFields(f.fields);
      if (this.writable && this.api.allowSet() && !this.formBuilt) this.buildForm(f.fields);
    }
  }

  // The time since the last good value's acquisition (or its arrival, for a value without an
  // acquisition stamp), in seconds; null before the first value.
  age() {
    if (this.lastContext && this.lastContext.acq_stamp) {
      return (Date.now() - this.lastContext.acq_stamp / 1e6) / 1000;
    }
    return this.lastGoodWall ? (Date.now() - this.lastGoodWall) / 1000 : null;
  }

  // Called by the page a few times a second: the age counts up, staleness is judged.
  tick(now) {
    const bound = staleAfter(this.rate, this.received);
    // A view scrolled back into sight gets its held frame a moment later: its silence counts
    // from then at the earliest (its age, from the stamp, is shown all along).
    const since = Math.max(this.lastGoodMono, this.shownAt);
    const silent = this.lastGoodMono ? (now - since) / 1000 : 0;
    const stale = this.status === "ok" && bound !== null && silent > bound;
    if (stale !== this.stale) {
      this.stale = stale;
      this.root.classList.toggle("stale", stale);
      this.root.dataset.stale = stale ? "true" : "false";
    }
    this.silent = silent;
    this.bound = bound;
    this.showTimes();
  }

  showTimes() {
    if (!this.items) return;
    const silent = this.silent || 0;
    const bound = this.bound || 0;
    const age = this.age();
    this.items.age.value.textContent = age === null ? "-" : formatAge(age);
    const ctx = this.lastContext || {};
    const lost = this.status === "error";
    this.items.acquired.label.textContent = lost ? "last acquired" : "acquired";
    this.items.acquired.value.textContent = stamp(ctx.acq_stamp);
    if (lost) {
      this.items.rate.value.textContent = "-";
    } else if (this.stale) {
      this.items.rate.value.textContent = `none for ${formatAge(silent)} (was ${this.rate} Hz)`;
    } else {
      this.items.rate.value.textContent = `${this.rate} Hz`;
    }
    if (this.stale) {
      const last = ctx.acq_stamp ? stamp(ctx.acq_stamp) : formatTime(this.lastGoodWall);
      this.staleLine.textContent =
        `stale: no update for ${formatAge(silent)} (expected within ${formatAge(bound)}); ` +
        `last good value ${last}`;
      this.staleLine.hidden = false;
    } else if (!this.staleLine.hidden) {
      this.staleLine.hidden = true;
      this.staleLine.textContent = "";
    }
  }

  setFormEnabled(enabled) {
    if (!this.formBuilt) return;
    for (const control of this.form.querySelectorAll("input, button")) control.disabled = !enabled;
    this.form.dataset.disabled = enabled ? "false" : "true";
    this.formNote.textContent = enabled ? "" : "disconnected: sets are disabled until it is back";
  }

  fieldMeta(name) {
    return this.description && this.description.fields ? this.description.fields[name] : undefined;
  }

  // The property's declared metadata arrived (or null: none): values are formatted with it,
  // the set form shows its limits.
  describe(description) {
    this.description = description;
    this.root.dataset.described = description ? "true" : "none";
    this.tableShape = null;
    if (this.lastFields) this.renderFields(this.lastFields);
    if (this.formBuilt) this.showLimits();
  }

  // The server's alarm for the newest value (null: none): the header, the field's row and a
  // line saying why. MINOR, MAJOR, INVALID as EPICS colours them.
  setAlarm(alarm) {
    this.alarm = alarm;
    const severity = alarm ? alarm.severity : "NONE";
    if (this.root.dataset.alarm !== severity) this.root.dataset.alarm = severity;
    const text = alarm ? `${alarm.severity}: ${alarm.message}` : "";
    if (this.alarmLine.textContent !== text) this.alarmLine.textContent = text;
    this.alarmLine.hidden = !alarm;
    this.alarmBadge.textContent = alarm ? alarm.severity : "";
    this.alarmBadge.hidden = !alarm;
  }

  showLimits() {
    for (const [name, [input, hint]] of this.formInputs || []) {
      const meta = this.fieldMeta(name);
      const limits = meta && meta.limits;
      if (limits) {
        if (limits[0] !== null) input.min = String(limits[0]);
        if (limits[1] !== null) input.max = String(limits[1]);
      }
      hint.textContent = limits ? `limits ${range(limits, meta.units)}` : meta && meta.units ? meta.units : "";
    }
  }

  renderFields(fields) {
    // A value of the same shape as the last one (same names, kinds and types, only scalars
    // and strings) only has its cells' text replaced: 200 views at 10 Hz each stay cheap.
    const shape = fields.map((f) => `${f.name}:${f.kind}:${f.type}`).join("|");
    const simple = fields.every((f) => f.kind === "scalar" || f.kind === "string" || f.kind === "strings");
    if (simple && shape === this.tableShape && this.cells) {
      for (const field of fields) {
        const [row, cell] = this.cells.get(field.name);
        const text = field.kind === "scalar"
          ? formatScalar(field.value, field.type, this.fieldMeta(field.name))
          : JSON.stringify(field.kind === "string" ? field.value : field.items);
        if (cell.firstChild.nodeValue !== text) {
          cell.firstChild.nodeValue = text;
          if (field.kind === "scalar") cell.title = String(field.value);
        }
        const alarm = this.alarm && this.alarm.field === field.name ? this.alarm.severity : null;
        if ((row.dataset.alarm || null) !== alarm) {
          if (alarm) row.dataset.alarm = alarm; else delete row.dataset.alarm;
        }
      }
      return;
    }
    this.tableShape = shape;
    this.cells = new Map();
    // Plots and canvases are kept across frames (uPlot setData, repaint).
    const table = el("table", { class: "fields" });
    const extra = [];
    for (const field of fields) {
      const row = el("tr", { "data-field": field.name });
      if (this.alarm && this.alarm.field === field.name) row.dataset.alarm = this.alarm.severity;
      const valueCell = el("td", { class: "fvalue" });
      row.append(el("td", { class: "fname" }, field.name), valueCell,
                 el("td", { class: "ftype" }, field.type.toLowerCase()));
      this.cells.set(field.name, [row, valueCell]);
      if (field.kind === "scalar") {
        const meta = this.fieldMeta(field.name);
        valueCell.textContent = formatScalar(field.value, field.type, meta);
        valueCell.title = String(field.value);
        if (field.type !== "BOOL") {
          valueCell.append(" ", el("button", { class: "chart-add", type: "button",
            title: "add to the strip chart", "data-chart": `${this.id}/${field.name}`,
            onclick: () => this.api.chart(this.device, this.property, this.selector, field.name) },
            "+chart"));
        }
      } else if (field.kind === "string") {
        valueCell.textContent = JSON.stringify(field.value);
      } else if (field.kind === "strings") {
        valueCell.textContent = JSON.stringify(field.items);
      } else if (field.kind === "data" || field.kind === "records") {
        valueCell.append(this.tree(field));
      } else if (field.kind === "array") {
        valueCell.textContent = `${field.length} values` + (field.x ? " (min/max per column)" : "");
        extra.push(["plot", field]);
      } else if (field.kind === "image") {
        valueCell.textContent = `${field.shape[0]} × ${field.shape[1]}, ${number(field.min)} .. ${number(field.max)}`;
        extra.push(["image", field]);
      }
      table.append(row);
    }
    const keep = [];
    for (const [kind, field] of extra) {
      if (kind === "plot") {
        let plot = this.plots.get(field.name);
        if (!plot) {
          plot = new ArrayPlot(el("div", { class: "array", "data-plot": field.name }));
          this.plots.set(field.name, plot);
        }
        keep.push(plot.box);
        plot.update(field);
      } else {
        let image = this.images.get(field.name);
        if (!image) {
          image = new ImageView(field.name, (name, mode) => this.imageModes.set(name, mode));
          this.images.set(field.name, image);
          if (this.imageModes.get(field.name) === "lines") image.mode = "lines";
        }
        keep.push(image.box);
        image.update(field);
      }
    }
    this.value.replaceChildren(table, ...keep);
  }

  tree(field) {
    const details = el("details", {}, el("summary", {},
      field.kind === "records" ? `${field.length} records` : `${field.fields.length} fields`));
    const items = field.kind === "records" ? field.items : [field.fields];
    for (const fields of items) {
      const list = el("ul");
      for (const f of fields) {
        const shown = f.kind === "scalar" || f.kind === "string" ? JSON.stringify(f.value)
          : f.kind === "data" || f.kind === "records" ? "" : `${f.kind} ${f.length || ""}`;
        const li = el("li", {}, `${f.name} (${f.type.toLowerCase()}): ${shown}`);
        if (f.kind === "data" || f.kind === "records") li.append(this.tree(f));
        list.append(li);
      }
      details.append(list);
    }
    return details;
  }

  buildForm(fields) {
    const editable = fields.filter((f) => f.kind === "scalar" || f.kind === "string");
    if (!editable.length) return;
    this.formBuilt = true;
    this.form.hidden = false;
    this.formInputs = new Map();  // name -> [input, limits hint]
    const inputs = new Map();
    const errors = new Map();
    const row = el("div");
    for (const f of editable) {
      const input = f.type === "BOOL"
        ? el("input", { type: "checkbox", name: f.name })
        : el("input", { name: f.name, type: f.kind === "scalar" ? "number" : "text",
                        step: "any", value: String(f.value ?? "") });
      if (f.type === "BOOL") input.checked = f.value;
      inputs.set(f.name, [input, f]);
      const err = el("span", { class: "field-error", "data-testid": `field-error-${f.name}` });
      errors.set(f.name, err);
      const hint = el("span", { class: "limits", "data-testid": `limits-${f.name}` });
      this.formInputs.set(f.name, [input, hint]);
      row.append(el("label", {}, `${f.name} (${f.type.toLowerCase()})`, input, hint, err));
    }
    const status = el("span", { class: "set-status", "data-testid": "set-status" });
    const confirmBox = el("div", { class: "confirm", hidden: "" });
    const values = () => {
      const out = {};
      for (const [name, [input, f]] of inputs) {
        out[name] = f.type === "BOOL" ? input.checked : input.value;
      }
      return out;
    };
    const submit = () => {
      confirmBox.hidden = true;
      for (const e of errors.values()) e.textContent = "";
      status.textContent = "setting…";
      status.className = "set-status";
      this.api.set(this.device, this.property, this.selector, values(), (reply) => {
        if (reply.ok) {
          status.textContent = "set: done";
          status.className = "set-status good";
        } else {
          status.className = "set-status bad";
          if (reply.field && errors.has(reply.field)) {
            errors.get(reply.field).textContent = reply.error;
            status.textContent = "refused";
          } else {
            status.textContent = reply.error;
          }
        }
      });
    };
    const ask = () => {
      const text = Object.entries(values()).map(([k, v]) => `${k}=${v}`).join(", ");
      confirmBox.replaceChildren(
        `Set ${this.id}${this.selector ? "@" + this.selector : ""}: ${text}? `,
        el("button", { type: "button", "data-testid": "confirm-set", onclick: submit }, "Confirm"),
        " ",
        el("button", { type: "button", onclick: () => { confirmBox.hidden = true; } }, "Cancel"));
      confirmBox.hidden = false;
    };
    row.append(el("button", { type: "button", "data-testid": "set", onclick: ask }, "Set…"), status);
    this.formNote = el("div", { class: "form-note", "data-testid": "form-note" });
    this.form.replaceChildren(row, confirmBox, this.formNote);
    this.setFormEnabled(!this.disconnected);
    this.showLimits();
  }
}
