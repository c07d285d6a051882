// The official `openai` npm client against `dsa serve`: a streaming chat, a tool-call
// exchange, a completion and structured output, end to end. Greedy output must equal `dsa run`'s.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startServer, dsaArg } from './serve_fixture.mjs';

const dsa = dsaArg();
const srv = await startServer(dsa, ['--api-key', 'test-key']);
let failed = false;
try {
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'test-key' });
  const models = await client.models.list();
  const model = models.data[0].id;
  assert.deepEqual(await client.models.retrieve(model), models.data[0]);

  // Streaming chat: the deltas add up to the non-streamed reply, which is `dsa run --chat`'s.
  const messages = [{ role: 'user', content: 'Say something about foxes' }];
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
  const run = execFileSync(dsa, ['run', '--model', srv.model, '--chat', '--greedy', '-n', '20', '-p', messages[0].content],
    { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
  assert.equal(whole.choices[0].message.content + '\n', run);
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let text = '', role = null, finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, 20);

  // A tool-call exchange: tools offered, the assistant's call and the tool's result sent back.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const exchange = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
  ];
  const after = await client.chat.completions.create({ model, messages: exchange, tools, max_tokens: 8, temperature: 0 });
  assert.equal(after.object, 'chat.completion');
  assert.ok(['stop', 'length', 'tool_calls'].includes(after.choices[0].finish_reason));
  await assert.rejects(client.chat.completions.create({ model, messages: exchange, tools,
    tool_choice: { type: 'function', function: { name: 'missing' } } }), (e) => e.status === 400);

  // A completion: greedy text equals `dsa run -p`.
  const prompt = 'Once upon a time';
  const comp = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0 });
  const runp = execFileSync(dsa, ['run', '--model', srv.model, '--greedy', '-n', '16', '-p', prompt],
    { stdio: ['ignore', 'pipe', 'ignore'] }).toString();
  assert.equal(comp.choices[0].text + '\n', runp);

  // Structured output: replies that end on their own parse as JSON the schema admits, keys in
  // the schema's order, bounds kept (what pydantic writes for conint(ge=1, le=12)).
  const schema = { type: 'object', properties: { size: { enum: ['small', 'big'] }, count: { type: 'integer', minimum: 1, maximum: 12 },
    ok: { type: 'boolean' } }, required: ['size', 'ok'], additionalProperties: false };
  let closed = 0;
  for (let seed = 0; seed < 4; ++seed) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 120, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'fox', schema, strict: true } } });
    if (r.choices[0].finish_reason !== 'stop') continue;
    const v = JSON.parse(r.choices[0].message.content);
    assert.ok(['small', 'big'].includes(v.size) && typeof v.ok === 'boolean', r.choices[0].message.content);
    assert.ok(v.count === undefined || (Number.isInteger(v.count) && v.count >= 1 && v.count <= 12), r.choices[0].message.content);
    assert.deepEqual(Object.keys(v), ['size', 'count', 'ok'].filter((k) => k in v));
    ++closed;
  }
  assert.ok(closed > 0, 'no structured reply ended on its own');

  // vLLM's guided_choice, passed as vLLM's docs pass it through this client: the reply is one
  // of the strings.
  const choices = ['positive', 'negative', 'neutral'];
  for (let seed = 0; seed < 2; ++seed) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 16, seed, guided_choice: choices });
    assert.ok(choices.includes(r.choices[0].message.content), r.choices[0].message.content);
  }

  // vLLM's guided_regex the same way: the whole reply matches the pattern (JavaScript's own
  // RegExp checks it).
  for (let seed = 0; seed < 2; ++seed) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 32, seed, guided_regex: '[A-Z][a-z]{2,5} \\d{1,2}(\\.\\d)?' });
    assert.match(r.choices[0].message.content, /^[A-Z][a-z]{2,5} \d{1,2}(\.\d)?$/);
  }

  // A wrong key is refused with the API's error.
  const bad = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
  console.log('openai client: streaming chat, tool exchange, completion, structured output: ok');
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  const code = await srv.stop();
  if (code !== 0) { console.error('dsa serve exited with ' + code + ' after SIGTERM'); failed = true; }
}
process.exit(failed ? 1 : 0);
