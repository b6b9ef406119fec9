// One time format everywhere (views, chart axis and legend, CSV, alarm summary): ISO 8601
// with milliseconds, in UTC or in the browser's local time as the operator chooses; the
// zone is always written next to the time ("UTC" or the local offset such as "+01:00").
const listeners = new Set();
let zone = "utc";  // "utc" or "local"

export function timeZone() { return zone; }

export function setTimeZone(value) {
  zone = value === "local" ? "local" : "utc";
  for (const listener of listeners) listener(zone);
}

export function onTimeZone(listener) { listeners.add(listener); }

const pad = (n, width = 2) => String(n).padStart(width, "0");

function parts(ms) {
  const d = new Date(ms);
  if (zone === "utc") {
    return [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(),
            d.getUTCMinutes(), d.getUTCSeconds(), d.getUTCMilliseconds()];
  }
  return [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(),
          d.getMinutes(), d.getSeconds(), d.getMilliseconds()];
}

// "+01:00" for the local zone at that instant, "UTC" for UTC.
export function zoneLabel(ms = Date.now()) {
  if (zone === "utc") return "UTC";
  const offset = -new Date(ms).getTimezoneOffset();
  const sign = offset < 0 ? "-" : "+";
  return `${sign}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
}

// "2026-11-27 23:50:01.123 UTC"
export function formatTime(ms) {
  if (!ms) return "-";
  const [y, mo, d, h, mi, s, milli] = parts(ms);
  return `${y}-${pad(mo)}-${pad(d)} ${pad(h)}:${pad(mi)}:${pad(s)}.${pad(milli, 3)} ${zoneLabel(ms)}`;
}

// "23:50:01" (axis ticks; the zone is in the axis label)
export function formatClock(ms, withMillis = false) {
  const [, , , h, mi, s, milli] = parts(ms);
  return `${pad(h)}:${pad(mi)}:${pad(s)}${withMillis ? "." + pad(milli, 3) : ""}`;
}

// "2026-11-27T23:50:01.123Z" or "2026-11-28T00:50:01.123+01:00": the CSV's column
export function formatIso(ms) {
  const [y, mo, d, h, mi, s, milli] = parts(ms);
  const z = zone === "utc" ? "Z" : zoneLabel(ms);
  return `${y}-${pad(mo)}-${pad(d)}T${pad(h)}:${pad(mi)}:${pad(s)}.${pad(milli, 3)}${z}`;
}

// A duration in seconds as the operator reads it: "0.4 s", "12 s", "3 min 05 s", "2 h 01 min".
export function formatAge(seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${pad(Math.floor(seconds % 60))} s`;
  return `${Math.floor(seconds / 3600)} h ${pad(Math.floor((seconds % 3600) / 60))} min`;
}
