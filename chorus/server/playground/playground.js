// The Chorus playground (docs/server.md, "Playground"). It uses only the public API: GET
// /v1/models and /v1/voices, POST /v1/voices, the WebSocket /v1/audio/speech/stream (pcm: 16-bit
// little-endian mono at 24 kHz, decoded into AudioBuffers and scheduled back to back as frames
// arrive; with Word timestamps ticked, the config asks for the `timestamps` event after each
// piece's audio, and words.js shows its words), and /ready and /metrics for the server's load
// (load.js). Every URL is relative to the page.
import { pollLoad } from "./load.js";
import { WordTrack } from "./words.js";

const $ = (id) => document.getElementById(id);
const RATE = 24000; // the pcm format's sample rate
const LEAD_S = 0.05; // the first buffer of a turn starts this far ahead of the clock
const FINAL = new Set(["done", "cancelled", "error", "closed"]);
let audio = null; // the AudioContext, made by the first Speak (browsers want a user gesture)
let turn = null; // the turn being spoken: one connection, one turn
let turns = 0;

// -- messages to the user ---------------------------------------------------------------------
function showError(text) {
  $("error").textContent = text;
  $("error").hidden = false;
}
function clearError() {
  $("error").textContent = "";
  $("error").hidden = true;
}
function say(text) {
  $("status").textContent = text;
}

// -- HTTP --------------------------------------------------------------------------------------
function apiKey() {
  return $("api-key").value.trim();
}

// An HTTP error in the server's shape {"error": {"message", "code"}}, else its status line.
async function httpError(response) {
  let detail = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) detail = `${response.status} ${body.error.code}: ${body.error.message}`;
  } catch (_) {
    // not JSON: the status line says what there is to say
  }
  return new Error(detail);
}

async function api(path, options = {}) {
  const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) throw await httpError(response);
  return response.json();
}

function fill(select, items, label, wanted) {
  const previous = wanted || select.value;
  select.replaceChildren(...items.map((item) => new Option(label(item), item.id)));
  if (items.some((item) => item.id === previous)) select.value = previous;
}

function voiceLabel(voice) {
  const name = voice.name && voice.name !== voice.id ? `${voice.name} (${voice.id})` : voice.id;
  return voice.duration_s ? `${name}, ${voice.duration_s.toFixed(1)} s` : name;
}

async function refresh(wantedVoice) {
  clearError();
  try {
    const [models, voices] = await Promise.all([api("v1/models"), api("v1/voices")]);
    fill($("model"), models.data, (model) => model.id);
    fill($("voice"), voices.data, voiceLabel, wantedVoice);
    say(`${models.data.length} models, ${voices.data.length} voices.`);
  } catch (error) {
    showError(`Could not load models and voices: ${error.message}`);
  }
}

async function upload() {
  clearError();
  const file = $("clip").files[0];
  if (!file) {
    showError("Choose a voice clip to upload first.");
    return;
  }
  const form = new FormData();
  form.append("file", file);
  if ($("clip-name").value.trim()) form.append("name", $("clip-name").value.trim());
  $("upload").disabled = true;
  say(`Uploading ${file.name}...`);
  try {
    const voice = await api("v1/voices", { method: "POST", body: form });
    await refresh(voice.id);
    say(`Voice ${voice.name || voice.id} added and selected.`);
  } catch (error) {
    say("");
    showError(`Upload failed: ${error.message}`);
  } finally {
    $("upload").disabled = false;
  }
}

// -- speech over the WebSocket -------------------------------------------------------------------
function socketUrl() {
  const url = new URL("v1/audio/speech/stream", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey()) url.searchParams.set("api_key", apiKey()); // browsers cannot set headers here
  return url.href;
}

function setState(t, state) {
  t.state = state;
  $("turn").dataset.state = state;
  $("turn").textContent = `${t.id}: ${state}`;
  $("stop").disabled = FINAL.has(state) && t.sources.size === 0;
}

function showCounts(t) {
  const out = $("decoded");
  out.dataset.samples = t.samples;
  out.dataset.bytes = t.bytes;
  out.dataset.frames = t.frames;
  out.textContent = `${t.frames} frames, ${t.bytes} bytes, ${t.samples} samples (${(t.samples / RATE).toFixed(2)} s)`;
}

function send(t, message) {
  if (t.ws.readyState === WebSocket.OPEN) t.ws.send(JSON.stringify(message));
}

function speak() {
  clearError();
  const text = $("text").value;
  if (!text.trim()) {
    showError("Type a text to speak first.");
    return;
  }
  if (!$("model").value) {
    showError("No model to speak with: load the models and voices first.");
    return;
  }
  if (audio === null) audio = new AudioContext();
  audio.resume(); // within the click, so the browser lets it play
  if (turn !== null) { // one turn at a time: a new one interrupts the last (closing its connection cancels it)
    silence(turn);
    turn.ws.close(1000);
  }
  const timed = $("timestamps").checked;
  const t = {
    id: `turn-${++turns}`, text, ws: new WebSocket(socketUrl()), state: "connecting", failed: false,
    textSentAt: null, firstAudioAt: null, seq: 0, odd: null, frames: 0, bytes: 0, samples: 0,
    playAt: 0, sources: new Set(),
    track: timed ? new WordTrack($("words"), $("timing-method"), () => audio.currentTime) : null,
  };
  turn = t;
  t.ws.binaryType = "arraybuffer";
  $("timed").hidden = !timed;
  $("ttfa").textContent = "waiting";
  delete $("decoded").dataset.audioSeconds;
  showCounts(t);
  setState(t, "connecting");
  const config = {
    type: "config", model: $("model").value, voice: $("voice").value || "default", response_format: "pcm",
    ...(timed ? { timestamps: "word" } : {}),
  };
  t.ws.onopen = () => send(t, config);
  t.ws.onmessage = (message) => {
    if (t !== turn) return; // a turn that was replaced: nothing of it is shown or played
    if (typeof message.data === "string") onEvent(t, JSON.parse(message.data));
    else onAudio(t, message.data);
  };
  t.ws.onclose = (event) => onClose(t, event);
}

function onEvent(t, event) {
  switch (event.type) {
    case "ready":
      if (!event.response_format.startsWith("pcm") || event.sample_rate !== RATE) {
        fail(t, `the server streams ${event.response_format} at ${event.sample_rate} Hz; this page plays pcm at ${RATE} Hz`);
        return;
      }
      t.textSentAt = performance.now();
      send(t, { type: "text", turn_id: t.id, text: t.text });
      send(t, { type: "flush", turn_id: t.id });
      setState(t, "speaking");
      break;
    case "done": {
      const server = event.timings && event.timings.first_text_to_first_audio_s;
      $("decoded").dataset.audioSeconds = event.audio_seconds;
      const words = t.track !== null ? `, ${t.track.words.length} words timed` : "";
      say(`Done: ${event.audio_seconds.toFixed(2)} s of audio${words}` +
          (server != null ? `; the server measured ${(1000 * server).toFixed(0)} ms from text to first audio.` : "."));
      setState(t, "done");
      send(t, { type: "close" });
      break;
    }
    case "timestamps": // a piece's words, after its audio, in seconds of the turn's audio
      if (t.state === "speaking" && t.track !== null) t.track.add(event);
      break;
    case "cancelled":
      setState(t, "cancelled");
      send(t, { type: "close" });
      break;
    case "error": {
      if (event.turn_id === t.id && t.state === "error") return; // the turn's first error is its cause
      t.failed = true;
      const retry = event.retry_after_s != null ? ` Retry in ${event.retry_after_s} s.` : "";
      showError(`Server error ${event.status} ${event.code}: ${event.message}${retry}`);
      if (event.turn_id === t.id) {
        setState(t, "error");
        send(t, { type: "close" });
      } // a connection-level error: the server closes the connection next
      break;
    }
    default: // "piece" and events a newer server may add: nothing to show
  }
}

function onAudio(t, data) {
  if (t.state !== "speaking" && t.state !== "done") return; // stopped: nothing more is played
  const view = new DataView(data);
  const length = view.getUint16(0, false);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 2, length)));
  if (header.turn_id !== t.id || header.seq !== t.seq) {
    fail(t, `audio frame ${header.turn_id} #${header.seq} arrived where ${t.id} #${t.seq} was due`);
    return;
  }
  t.seq += 1;
  let bytes = new Uint8Array(data, 2 + length);
  t.frames += 1;
  t.bytes += bytes.length;
  if (t.firstAudioAt === null) {
    t.firstAudioAt = performance.now();
    $("ttfa").textContent = `${(t.firstAudioAt - t.textSentAt).toFixed(0)} ms after the text was sent`;
  }
  if (t.odd !== null) { // a sample split across two frames
    const joined = new Uint8Array(bytes.length + 1);
    joined[0] = t.odd;
    joined.set(bytes, 1);
    bytes = joined;
    t.odd = null;
  }
  if (bytes.length % 2 === 1) {
    t.odd = bytes[bytes.length - 1];
    bytes = bytes.subarray(0, bytes.length - 1);
  }
  if (bytes.length > 0) play(t, decode(bytes));
  showCounts(t);
}

function decode(bytes) {
  const pcm = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const samples = new Float32Array(bytes.length / 2);
  for (let i = 0; i < samples.length; i++) samples[i] = pcm.getInt16(2 * i, true) / 32768;
  const buffer = audio.createBuffer(1, samples.length, RATE);
  buffer.copyToChannel(samples, 0);
  return buffer;
}

function play(t, buffer) {
  const source = audio.createBufferSource();
  source.buffer = buffer;
  source.connect(audio.destination);
  t.playAt = Math.max(t.playAt, audio.currentTime + LEAD_S); // back to back, or a little ahead after a gap
  source.start(t.playAt);
  if (t.track !== null) t.track.scheduled(t.playAt, t.samples / RATE, buffer.duration);
  t.playAt += buffer.duration;
  t.samples += buffer.length;
  t.sources.add(source);
  source.onended = () => {
    t.sources.delete(source);
    if (t === turn) setState(t, t.state);
  };
}

function silence(t) {
  for (const source of t.sources) source.stop();
  t.sources.clear();
  if (t.track !== null) t.track.stop();
}

function fail(t, message) {
  t.failed = true;
  showError(message);
  silence(t);
  setState(t, "error");
  t.ws.close(1000);
}

function stop() {
  const t = turn;
  if (t === null) return;
  silence(t);
  if (t.state === "speaking") { // barge-in: the server drops the turn's text and work
    send(t, { type: "cancel", turn_id: t.id });
    setState(t, "cancelling");
  } else if (t.state === "connecting") {
    t.ws.close(1000);
    setState(t, "cancelled");
  } else {
    setState(t, t.state);
  }
}

function onClose(t, event) {
  if (t !== turn || FINAL.has(t.state)) return;
  if (!t.failed && t.state === "connecting") {
    showError(`The speech WebSocket was refused or closed before it was ready (code ${event.code}` +
              `${event.reason ? `: ${event.reason}` : ""}): check the API key, or the server's log.`);
  } else if (!t.failed && t.state !== "cancelling") {
    showError(`The connection closed before the turn ended (code ${event.code}${event.reason ? `: ${event.reason}` : ""}).`);
  }
  setState(t, "closed"); // "cancelled" only when the server said so
}

$("refresh").addEventListener("click", () => refresh());
$("api-key").addEventListener("keydown", (event) => {
  if (event.key === "Enter") refresh();
});
$("upload").addEventListener("click", upload);
$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", stop);
refresh();
pollLoad();
