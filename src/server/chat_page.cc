// The chat page served at "/": plain HTML + JS, no build step, embedded in the binary. It
// streams /v1/chat/completions and shows reasoning_content apart from the answer.
#include "server/service_core.h"

namespace dsinfer::server {

std::string_view ChatPageHtml() {
  static constexpr std::string_view kPage = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dsinfer chat</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 860px; margin: 0 auto; padding: 1rem; }
  header { display: flex; gap: .75rem; align-items: center; flex-wrap: wrap; }
  #log { margin-top: 1rem; }
  .turn { border-radius: 8px; padding: .6rem .8rem; margin: .5rem 0; white-space: pre-wrap; }
  .user { background: #e8f0fe; }
  .assistant { background: #f4f4f4; }
  .reasoning { color: #666; font-size: .9em; border-left: 3px solid #bbb; padding-left: .6rem;
               margin-bottom: .4rem; white-space: pre-wrap; }
  .error { color: #b00020; }
  form { display: flex; gap: .5rem; margin-top: 1rem; }
  textarea { flex: 1; min-height: 3.5rem; }
  .meta { color: #888; font-size: .8em; }
</style>
</head>
<body>
<header>
  <strong>dsinfer</strong>
  <label>API key <input id="key" type="password" autocomplete="off" size="16"></label>
  <label><input id="thinking" type="checkbox" checked> thinking</label>
  <label>max tokens <input id="max" type="number" value="128" min="1" max="32768" style="width:6em"></label>
  <span id="model" class="meta"></span>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="prompt" placeholder="Ask something..."></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
"use strict";
const messages = [];
let controller = null;
const $ = (id) => document.getElementById(id);

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    if (r.ok) { const j = await r.json(); $("model").textContent = j.data[0].id; return j.data[0].id; }
  } catch (e) {}
  return "";
}

function addTurn(role) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  if (role === "assistant") {
    const reasoning = document.createElement("div");
    reasoning.className = "reasoning";
    reasoning.hidden = true;
    const answer = document.createElement("div");
    answer.className = "answer";
    const meta = document.createElement("div");
    meta.className = "meta";
    div.append(reasoning, answer, meta);
  }
  $("log").appendChild(div);
  return div;
}

async function send(text) {
  messages.push({role: "user", content: text});
  addTurn("user").textContent = text;
  const turn = addTurn("assistant");
  const reasoningEl = turn.querySelector(".reasoning");
  const answerEl = turn.querySelector(".answer");
  const metaEl = turn.querySelector(".meta");
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  let answer = "", reasoning = "";
  try {
    const body = {
      model: $("model").textContent || (await loadModel()),
      messages, stream: true, stream_options: {include_usage: true},
      max_tokens: parseInt($("max").value, 10) || 128,
      thinking: {type: $("thinking").checked ? "enabled" : "disabled"},
    };
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(),
                                                   body: JSON.stringify(body), signal: controller.signal});
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) metaEl.textContent = chunk.usage.prompt_tokens + " prompt / " +
              chunk.usage.completion_tokens + " completion tokens";
          for (const choice of chunk.choices || []) {
            const d = choice.delta || {};
            if (d.reasoning_content) { reasoning += d.reasoning_content; reasoningEl.hidden = false;
                                       reasoningEl.textContent = reasoning; }
            if (d.content) { answer += d.content; answerEl.textContent = answer; }
            if (choice.finish_reason) turn.dataset.finish = choice.finish_reason;
          }
        }
      }
    }
    messages.push({role: "assistant", content: answer});
  } catch (e) {
    if (e.name !== "AbortError") {
      const err = document.createElement("div");
      err.className = "error";
      err.textContent = String(e.message || e);
      turn.appendChild(err);
    }
    messages.pop();
  } finally {
    turn.dataset.done = "1";
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("stop").addEventListener("click", () => controller && controller.abort());
// "/?q=question&max=N#key=KEY" asks at once (links, headless tests). The key rides in the
// fragment, which browsers never send to the server, so it stays out of access logs.
(async () => {
  const hashKey = new URLSearchParams(location.hash.slice(1)).get("key");
  if (hashKey) $("key").value = hashKey;
  const params = new URLSearchParams(location.search);
  if (params.get("max")) $("max").value = params.get("max");
  if (params.get("thinking") === "0") $("thinking").checked = false;
  await loadModel();
  if (params.get("q")) send(params.get("q"));
})();
</script>
</body>
</html>
)html";
  return kPage;
}

}  // namespace dsinfer::server
