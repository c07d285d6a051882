#pragma once
// The chat page served at GET /: one self-contained HTML file (no build step, no CDN).
// It streams replies from /v1/chat/completions, shows thinking folded apart from the
// answer, and has a thinking switch, the sampling settings and the token speed.
#include <string_view>

namespace dsa::server {

inline constexpr std::string_view kChatPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>dsa chat</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:8px 12px;background:#223;color:#fff;display:flex;gap:12px;align-items:center;flex-wrap:wrap;font-size:14px}
header input{width:56px}
#log{flex:1;overflow:auto;padding:12px}
.msg{max-width:800px;margin:8px auto;padding:8px 12px;border-radius:8px;white-space:pre-wrap}
.user{background:#dde6ff}.assistant{background:#fff;border:1px solid #ddd}
details{color:#666;margin-bottom:6px}
form{display:flex;gap:8px;padding:12px;max-width:824px;margin:0 auto;width:100%;box-sizing:border-box}
textarea{flex:1;height:60px}
#speed{margin-left:auto}
</style></head><body>
<header><b>dsa</b><span id="model"></span>
<label><input type="checkbox" id="thinking"> thinking</label>
<label>temperature <input id="temperature" value="0.7"></label>
<label>top_p <input id="top_p" value="0.95"></label>
<label>max tokens <input id="max_tokens" value="256"></label>
<label>API key <input id="key" type="password" style="width:90px"></label>
<span id="speed"></span></header>
<div id="log"></div>
<form id="f"><textarea id="input" placeholder="Message"></textarea><button id="send">Send</button></form>
<script>
const log = document.getElementById('log'), history = [];
fetch('/v1/models').then(r => r.json()).then(j => { document.getElementById('model').textContent = j.data[0].id; }).catch(() => {});
function add(role) {
  const d = document.createElement('div'); d.className = 'msg ' + role; log.appendChild(d); return d;
}
document.getElementById('f').onsubmit = async (e) => {
  e.preventDefault();
  const input = document.getElementById('input'), text = input.value.trim();
  if (!text) return;
  input.value = '';
  add('user').textContent = text;
  history.push({role: 'user', content: text});
  const box = add('assistant'), think = document.createElement('details'), sum = document.createElement('summary');
  const thought = document.createElement('div'), answer = document.createElement('div');
  sum.textContent = 'thinking'; think.appendChild(sum); think.appendChild(thought);
  const thinking = document.getElementById('thinking').checked;
  if (thinking) box.appendChild(think);
  box.appendChild(answer);
  const headers = {'Content-Type': 'application/json'}, key = document.getElementById('key').value;
  if (key) headers['Authorization'] = 'Bearer ' + key;
  const body = {messages: history, stream: true, chat_template_kwargs: {thinking},
    temperature: parseFloat(document.getElementById('temperature').value),
    top_p: parseFloat(document.getElementById('top_p').value),
    max_tokens: parseInt(document.getElementById('max_tokens').value)};
  const t0 = performance.now(); let n = 0, reply = '';
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers, body: JSON.stringify(body)});
    if (!r.ok) { answer.textContent = 'error: ' + (await r.text()); return; }
    const reader = r.body.getReader(), dec = new TextDecoder(); let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at); buf = buf.slice(at + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6));
        if (j.error) { answer.textContent += '\nerror: ' + j.error.message; continue; }
        const d = j.choices[0].delta || {};
        if (d.reasoning_content) { thought.textContent += d.reasoning_content; n++; }
        if (d.content) { answer.textContent += d.content; reply += d.content; n++; }
        document.getElementById('speed').textContent = (n / ((performance.now() - t0) / 1000)).toFixed(1) + ' tok/s';
        log.scrollTop = log.scrollHeight;
      }
    }
  } catch (err) { answer.textContent += '\nerror: ' + err; }
  history.push({role: 'assistant', content: reply});
};
</script></body></html>
)HTML";

}  // namespace dsa::server
