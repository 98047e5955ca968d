// moet chat page: keeps the conversation in memory, streams each answer from
// /v1/chat/completions (Server-Sent Events), shows reasoning_content in its own collapsible box
// apart from the answer, and can be stopped mid-stream. Settings live in localStorage.
// URL parameters fill the form for links and tests: ?q=MESSAGE (sent at once), system,
// temperature, max_tokens, extra (a JSON object merged into the request).
"use strict";

const $ = (id) => document.getElementById(id);
const messages = [];
let model = null;
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function status(text) { $("status").textContent = text; }

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (e) {
    return response.statusText || String(response.status);
  }
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const data = await r.json();
    model = data.data[0].id;
    $("model").textContent = model + " · context " + data.data[0].max_model_len;
  } catch (e) {
    $("model").textContent = "cannot list models: " + e.message;
  }
}

function bubble(role) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  div.appendChild(label);
  $("messages").appendChild(div);
  return div;
}

function addUser(text) {
  const div = bubble("user");
  div.appendChild(document.createTextNode(text));
}

function assistantView() {
  const div = bubble("assistant");
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  reasoning.hidden = true;
  reasoning.open = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const thought = document.createElement("div");
  thought.className = "reasoning-text";
  reasoning.append(summary, thought);
  const content = document.createElement("div");
  content.className = "content";
  const meta = document.createElement("div");
  meta.className = "meta";
  div.append(reasoning, content, meta);
  return { div, reasoning, thought, content, meta };
}

function requestBody() {
  const body = { model, messages: [], stream: true, stream_options: { include_usage: true } };
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...messages);
  const temperature = parseFloat($("temperature").value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  const extra = $("extra").value.trim();
  if (extra) Object.assign(body, JSON.parse(extra));
  return body;
}

// Calls onEvent with each SSE data payload (parsed JSON) of the response body.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  if (!model) await loadModel();
  messages.push({ role: "user", content: text });
  addUser(text);
  const view = assistantView();
  view.div.dataset.state = "streaming";
  let answer = "", tokens = 0, finish = null, firstAt = 0;
  const start = performance.now();
  controller = new AbortController();
  $("send").hidden = true;
  $("stop").hidden = false;
  status("generating…");
  try {
    const body = requestBody();
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                     signal: controller.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (event) => {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) tokens = event.usage.completion_tokens;
      for (const choice of event.choices || []) {
        const delta = choice.delta || {};
        if (!firstAt && (delta.content || delta.reasoning_content)) firstAt = performance.now();
        if (delta.reasoning_content) {
          view.reasoning.hidden = false;
          view.thought.textContent += delta.reasoning_content;
        }
        if (delta.content) {
          answer += delta.content;
          view.content.textContent = answer;
        }
        for (const call of delta.tool_calls || []) {
          view.content.textContent += "\n[tool call] " + call.function.name + "(" + call.function.arguments + ")";
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      $("messages").scrollTop = $("messages").scrollHeight;
    });
    if (view.reasoning.hidden === false) view.reasoning.open = false;
    const seconds = (performance.now() - (firstAt || start)) / 1000;
    const rate = tokens > 1 && seconds > 0 ? " · " + (tokens / seconds).toFixed(1) + " tokens/s" : "";
    view.meta.textContent = tokens + (tokens === 1 ? " token" : " tokens") + rate + " · " + (finish || "no finish reason");
    view.div.dataset.state = "done";
    view.div.dataset.finish = finish || "";
    messages.push({ role: "assistant", content: answer });
    status("");
  } catch (e) {
    const err = document.createElement("div");
    err.className = "error";
    err.textContent = e.name === "AbortError" ? "stopped" : "error: " + e.message;
    view.div.appendChild(err);
    view.div.dataset.state = e.name === "AbortError" ? "stopped" : "error";
    if (answer) messages.push({ role: "assistant", content: answer });
    status("");
  } finally {
    controller = null;
    $("send").hidden = false;
    $("stop").hidden = true;
  }
}

function restoreSettings() {
  for (const id of ["system", "temperature", "max-tokens", "api-key", "extra"]) {
    const saved = localStorage.getItem("moet." + id);
    if (saved !== null) $(id).value = saved;
    $(id).addEventListener("change", () => localStorage.setItem("moet." + id, $(id).value));
  }
  const params = new URLSearchParams(location.search);
  const map = { system: "system", temperature: "temperature", max_tokens: "max-tokens", extra: "extra" };
  for (const [param, id] of Object.entries(map)) if (params.has(param)) $(id).value = params.get(param);
  return params.get("q");
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  messages.length = 0;
  $("messages").textContent = "";
});
$("settings-toggle").addEventListener("click", () => {
  const panel = $("settings");
  panel.hidden = !panel.hidden;
  $("settings-toggle").setAttribute("aria-expanded", String(!panel.hidden));
});

const first = restoreSettings();
loadModel().then(() => { if (first) send(first); });
