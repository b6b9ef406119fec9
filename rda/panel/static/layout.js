// Layouts: what an operator keeps. A layout is JSON (rda/panel/layout.py's Layout says what
// it may hold); it travels in a file (Save / Load) or in a link, base64url-encoded in the URL
// fragment (#layout=...), which never reaches a server log. Every layout the page did not
// make itself is validated by the panel (POST /api/layout) before it is applied.

export function encodeLayout(layout) {
  const bytes = new TextEncoder().encode(JSON.stringify(layout));
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function decodeLayout(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const binary = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4));
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);  // JSON text, checked by the panel
}

// The layout in this page's link, as JSON text, or null.
export function layoutInLink() {
  const match = /(?:^#|&)layout=([A-Za-z0-9_-]+)/.exec(location.hash);
  if (!match) return null;
  try { return decodeLayout(match[1]); } catch (err) { return "not base64url"; }
}

export function linkFor(layout, kiosk = false) {
  return `${location.origin}/${kiosk ? "?kiosk" : ""}#layout=${encodeLayout(layout)}`;
}

// JSON text -> the panel's normalised layout, or throws an Error with the panel's reason.
export async function checkLayout(text) {
  const reply = await fetch("/api/layout", {
    method: "POST", headers: { "content-type": "application/json" }, body: text,
  });
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || `HTTP ${reply.status}`);
  return body;
}

export function download(name, text, type = "application/json") {
  const blob = new Blob([text], { type });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}
