// Drives `meshtensor serve` with the official OpenAI client (the npm package `openai`).
// Usage: node openai_client.mjs <openai module dir> <base url> <api key> <expected.json> [other url]
//   expected.json: `meshtensor generate --json` of one prompt, with the request that made it:
//   {"request": {...completion fields...}, "tokens": [...], "logprobs": [...]}
//   other url: a server of the same checkpoint on another tensor-parallel layout.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const [moduleDir, url, apiKey, expectedFile, otherUrl] = process.argv.slice(2);
const require = createRequire(path.resolve(moduleDir) + '/');
const OpenAI = require('openai').default ?? require('openai');

const client = new OpenAI({ apiKey, baseURL: url + '/v1', maxRetries: 0 });
const model = 'meshtensor-gpt';
let failures = 0;
function check(condition, what) {
  console.log((condition ? 'ok: ' : 'FAILED: ') + what);
  if (!condition) failures++;
}

/// A completion's generated token ids and log-probabilities, streamed or not.
async function run(target, request, stream) {
  if (!stream) {
    const r = await target.completions.create({ model, ...request });
    const choice = r.choices[0];
    return { ids: choice.token_ids, logprobs: choice.logprobs?.token_logprobs ?? [],
             text: choice.text, step: r.weights_step, finish: choice.finish_reason };
  }
  const s = await target.completions.create({ model, ...request, stream: true });
  const out = { ids: [], logprobs: [], text: '', step: undefined, finish: null };
  for await (const chunk of s) {
    for (const choice of chunk.choices) {
      out.ids.push(...choice.token_ids);
      out.logprobs.push(...(choice.logprobs?.token_logprobs ?? []));
      out.text += choice.text;
      if (choice.finish_reason) out.finish = choice.finish_reason;
    }
    out.step = chunk.weights_step ?? out.step;
  }
  return out;
}

function sameBits(a, b) {
  return a.ids.length === b.ids.length && a.ids.every((t, i) => t === b.ids[i]) &&
         a.logprobs.length === b.logprobs.length &&
         a.logprobs.every((l, i) => Object.is(l, b.logprobs[i]));
}

const expected = JSON.parse(fs.readFileSync(expectedFile, 'utf8'));
const probe = { ...expected.request, logprobs: 0 };

// Models.
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'models.list names the model');

// A completion with log-probabilities: the bits `meshtensor generate --json` prints.
const alone = await run(client, probe, false);
check(alone.ids.join() === expected.tokens.join(), 'completion tokens are generate\'s');
check(alone.logprobs.every((l, i) => Object.is(l, expected.logprobs[i])) &&
      alone.logprobs.length === expected.logprobs.length,
      'completion log-probabilities are generate\'s bits');
check(alone.finish === 'length', 'finish_reason length');

// Streaming gives the same bits.
const streamed = await run(client, probe, true);
check(sameBits(alone, streamed), 'a streamed completion has the same bits');

// Under load: the probe among 64 concurrent requests of other lengths, streamed or not.
const others = [];
for (let i = 0; i < 64; i++) {
  const request = { prompt: 'x'.repeat(1 + (i * 7) % 19) + String(i), max_tokens: 1 + (i * 5) % 17,
                    temperature: (i % 3) * 0.6, seed: 1000 + i, logprobs: i % 2 === 0 ? 0 : null };
  others.push(run(client, request, i % 2 === 0));
}
const underLoad = [run(client, probe, false), run(client, probe, true)];
const results = await Promise.all([...underLoad, ...others]);
check(sameBits(alone, results[0]), 'the same bits among 64 concurrent requests (not streamed)');
check(sameBits(alone, results[1]), 'the same bits among 64 concurrent requests (streamed)');
check(results.slice(2).every((r, i) => r.ids.length === 1 + (i * 5) % 17),
      'every concurrent request got its tokens');

// Several choices, a list of prompts, stop sequences, echo.
const many = await client.completions.create({ model, prompt: ['ab', 'cd'], n: 2, max_tokens: 3,
                                               seed: 5, temperature: 1 });
check(many.choices.length === 4 && many.choices.map((c) => c.index).join() === '0,1,2,3',
      'prompts x n choices, indexed in order');
check(many.usage.prompt_tokens === 4 && many.usage.completion_tokens === 12, 'usage counts');
const stopAt = alone.text.length > 3 ? alone.text.slice(2, 3) : null;
if (stopAt !== null && /^[\x20-\x7e]$/.test(stopAt)) {
  const stopped = await run(client, { ...probe, stop: [stopAt] }, false);
  check(stopped.finish === 'stop' && !stopped.text.includes(stopAt), 'a stop sequence ends the text');
}
const echoed = await client.completions.create({ model, ...probe, echo: true, max_tokens: 2 });
check(echoed.choices[0].text.startsWith(probe.prompt), 'echo puts the prompt first');

// Errors come back as OpenAI errors.
async function expectError(request, status, word, target = client) {
  try {
    await target.completions.create({ model, ...request });
    check(false, `status ${status} for ${JSON.stringify(request).slice(0, 60)}`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status && e.message.includes(word),
          `status ${status} naming '${word}' (${e.status}: ${e.message})`);
  }
}
await expectError({ prompt: 'a', max_tokens: 0 }, 400, 'max_tokens');
await expectError({ prompt: 'a', max_tokenz: 3 }, 400, 'max_tokenz');
await expectError({ prompt: 'a', temperature: 'hot' }, 400, 'temperature');
await expectError({ prompt: 'a', n: 100000 }, 400, 'n');
await expectError({ prompt: 'a'.repeat(100000) }, 400, 'context');
await expectError({ prompt: 'a', model: 'gpt-4' }, 404, 'gpt-4');
const wrongKey = new OpenAI({ apiKey: 'not-the-key', baseURL: url + '/v1', maxRetries: 0 });
try {
  await wrongKey.models.list();
  check(false, 'a wrong API key is refused');
} catch (e) {
  check(e.status === 401, `a wrong API key gets 401 (${e.status})`);
}
const after = await run(client, probe, false);
check(sameBits(alone, after), 'the server goes on serving the same bits after the errors');

// Another tensor-parallel layout of the server: the same bits.
if (otherUrl) {
  const other = new OpenAI({ apiKey, baseURL: otherUrl + '/v1', maxRetries: 0 });
  check(sameBits(alone, await run(other, probe, true)), 'the same bits on the other layout');
}

console.log(failures === 0 ? 'all checks passed' : `${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
