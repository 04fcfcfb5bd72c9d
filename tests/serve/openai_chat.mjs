// Drives `meshtensor serve`'s /v1/chat/completions with the official OpenAI client.
// Usage: node openai_chat.mjs <openai module dir> <base url> <expected.json>
//   expected.json: {"messages": [...], "request": {...sampling fields...}, "generated":
//   `meshtensor generate --chat --json` of the same conversation, "prompt_tokens": N,
//   "model": the served model's id}
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const [moduleDir, url, expectedFile] = process.argv.slice(2);
const require = createRequire(path.resolve(moduleDir) + '/');
const OpenAI = require('openai').default ?? require('openai');
const client = new OpenAI({ apiKey: 'none', baseURL: url + '/v1', maxRetries: 0 });
const expected = JSON.parse(fs.readFileSync(expectedFile, 'utf8'));
const { model, messages, request, generated } = expected;
let failures = 0;
function check(condition, what) {
  console.log((condition ? 'ok: ' : 'FAILED: ') + what);
  if (!condition) failures++;
}

/// A chat choice's token ids, log-probabilities, text and finish reason, streamed or not.
async function chat(extra, stream) {
  const body = { model, messages, ...request, logprobs: true, top_logprobs: 2, ...extra };
  if (!stream) {
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    return { object: r.object, role: c.message.role, text: c.message.content, ids: c.token_ids,
             logprobs: c.logprobs.content.map((e) => e.logprob), tops: c.logprobs.content,
             finish: c.finish_reason, usage: r.usage, choices: r.choices.length };
  }
  const s = await client.chat.completions.create({ ...body, stream: true,
                                                   stream_options: { include_usage: true } });
  const out = { object: null, role: null, text: '', ids: [], logprobs: [], tops: [],
                finish: null, usage: null, choices: 0 };
  for await (const chunk of s) {
    out.object = chunk.object;
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      out.choices = Math.max(out.choices, c.index + 1);
      if (c.delta.role) out.role = c.delta.role;
      out.text += c.delta.content ?? '';
      out.ids.push(...c.token_ids);
      for (const e of c.logprobs?.content ?? []) {
        out.logprobs.push(e.logprob);
        out.tops.push(e);
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

const shown = generated.finish_reason === 'stop' ? generated.tokens.slice(0, -1) : generated.tokens;
for (const stream of [false, true]) {
  const r = await chat({}, stream);
  const how = stream ? 'streamed' : 'not streamed';
  check(r.object === (stream ? 'chat.completion.chunk' : 'chat.completion') &&
        r.role === 'assistant', `${how}: an assistant message of a ${r.object}`);
  check(JSON.stringify(r.ids) === JSON.stringify(shown) &&
        r.logprobs.every((l, i) => Object.is(l, generated.logprobs[i])),
        `${how}: generate --chat's tokens and log-probabilities, bit for bit (${r.ids.length})`);
  check(r.text === generated.text, `${how}: the content is generate's text`);
  check(r.finish === generated.finish_reason, `${how}: finish_reason ${r.finish}`);
  check(r.usage.prompt_tokens === expected.prompt_tokens &&
        r.usage.completion_tokens === r.ids.length,
        `${how}: usage counts the rendered conversation's ${r.usage.prompt_tokens} tokens`);
  check(r.tops.every((e) => e.top_logprobs.length === 2 && Array.isArray(e.bytes)),
        `${how}: each token has its bytes and 2 top log-probabilities`);
}
const two = await chat({ n: 2 }, false);
check(two.choices === 2, 'n 2: two choices');
try {
  await client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] });
  check(false, 'a message of an unknown role is refused');
} catch (e) {
  check(e.status === 400 && /messages\[0\]\.role/.test(e.message),
        `a message of an unknown role is refused: ${e.status} ${e.message}`);
}
if (failures > 0) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
