// Serving benchmark: a fixed set of streamed completion requests (token-id prompts, greedy,
// EOS ignored, fixed output length) at one concurrency against an OpenAI-compatible server
// (`dsa serve` or llama.cpp's `llama-server`). Prints one JSON line: requests/s, output
// tokens/s and p50 / p99 of time to first token and time per output token.
//   node bench/serve.mjs --url http://127.0.0.1:8080 --concurrency 16 [--requests 32]
//        [--prompt-tokens 128] [--max-tokens 64] [--label dsa] [--vocab 1000] [--first 1000*C]
//   node bench/serve.mjs --url ... --prefix-ttft 2048   (TTFT of a cached vs an uncached prefix)
const arg = (k, d) => { const i = process.argv.indexOf('--' + k); return i >= 0 ? process.argv[i + 1] : d; };
const url = arg('url', 'http://127.0.0.1:8080');
const C = Number(arg('concurrency', 1)), N = Number(arg('requests', Math.max(2 * C, 8)));
const P = Number(arg('prompt-tokens', 128)), T = Number(arg('max-tokens', 64)), V = Number(arg('vocab', 1000));
const label = arg('label', url);
// Requests use prompts first, first+1, ...: by default a range of its own per concurrency, so
// that a server run at several levels never meets a prompt it has cached from an earlier one.
const first = Number(arg('first', 1000 * C));

// Prompt i: deterministic ids, different for every request (no prefix shared past the first).
const prompt = (i, n = P, salt = 0) => Array.from({ length: n }, (_, k) => 100 + ((i * 7919 + k * 104729 + salt) % (V - 100)));

async function one(ids, maxTokens) {
  const t0 = performance.now();
  const r = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: ids, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
  });
  if (!r.ok) throw new Error('HTTP ' + r.status + ': ' + await r.text());
  const reader = r.body.getReader();
  let first = 0, buf = '';
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    if (!first && /data: \{/.test(buf)) first = performance.now();
  }
  const end = performance.now();
  return { ttft: (first - t0) / 1000, tpot: maxTokens > 1 ? (end - first) / 1000 / (maxTokens - 1) : 0, e2e: (end - t0) / 1000 };
}

const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

async function load() {
  let next = 0;
  const res = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: C }, async () => {
    while (next < N) { const i = next++; res.push(await one(prompt(first + i), T)); }
  }));
  const s = (performance.now() - t0) / 1000;
  return { label, concurrency: C, requests: N, prompt_tokens: P, max_tokens: T, seconds: +s.toFixed(2),
    req_s: +(N / s).toFixed(3), out_tok_s: +(N * T / s).toFixed(2),
    ttft_p50: +pct(res.map((r) => r.ttft), 0.5).toFixed(3), ttft_p99: +pct(res.map((r) => r.ttft), 0.99).toFixed(3),
    tpot_p50: +pct(res.map((r) => r.tpot), 0.5).toFixed(4), tpot_p99: +pct(res.map((r) => r.tpot), 0.99).toFixed(4) };
}

async function prefixTtft(n) {
  // Uncached: a fresh prefix; cached: the same prefix again with another last token.
  const base = prompt(99991, n, 17);
  const miss = await one(base, 1);
  const hit = await one([...base.slice(0, n - 1), base[n - 1] === 101 ? 102 : 101], 1);
  return { label, prefix_tokens: n, ttft_uncached: +miss.ttft.toFixed(3), ttft_cached: +hit.ttft.toFixed(3),
    ratio: +(hit.ttft / miss.ttft).toFixed(3) };
}

const pre = arg('prefix-ttft', null);
console.log(JSON.stringify(pre ? await prefixTtft(Number(pre)) : await load()));
