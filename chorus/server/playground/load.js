// The playground's "Server load" panel: /ready and /metrics, polled every 2 s while the page is
// visible (docs/server.md, "Playground").
const $ = (id) => document.getElementById(id);
const LOAD_EVERY_MS = 2000;

// The sum of a metric's samples over its labels in Prometheus text, or null when absent.
function metric(text, name) {
  let sum = null;
  for (const line of text.split("\n")) {
    const next = line.charAt(name.length);
    if (line.startsWith(name) && (next === " " || next === "{")) {
      sum = (sum || 0) + Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return sum;
}

export async function pollLoad() {
  if (!document.hidden) {
    try {
      const ready = await (await fetch("ready")).json();
      $("ready").textContent = ready.ready ? "ready" : `no: ${ready.state}${ready.reason ? ` (${ready.reason})` : ""}`;
      $("degradation").textContent = `${ready.degradation_level} of 3`;
      const text = await (await fetch("metrics")).text();
      const shown = (value, format) => (value === null ? "not reported" : format(value));
      $("in-flight").textContent = shown(metric(text, "chorus_requests_in_flight"), String);
      $("ws-open").textContent = shown(metric(text, "chorus_ws_connections_open"), String);
      $("kv").textContent = shown(metric(text, "chorus_kv_usage"), (v) => `${(100 * v).toFixed(0)} %`);
    } catch (_) {
      $("ready").textContent = "the server does not answer";
    }
  }
  setTimeout(pollLoad, LOAD_EVERY_MS);
}
