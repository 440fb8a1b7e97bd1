// openai-client.cjs — drives `cinfer serve` with the official `openai` npm
// client (installed by tests/test-serve.c). Usage: node openai-client.cjs
// PORT KEY EXPECTED, where EXPECTED is `cinfer generate`'s 20 greedy tokens
// after "Once upon a time". Prints "ok ..." / "not ok ..." lines (TAP-like);
// exits non-zero on any failure.
const OpenAI = require('openai');
const [port, key, expected] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });
let failed = 0;
const check = (cond, name) => { console.log(`${cond ? 'ok' : 'not ok'} ${name}`); if (!cond) failed++; };

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'stories260k', 'models.list names the served model');

  const c = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 20, temperature: 0 });
  check(c.choices[0].text === expected, 'completions.create: greedy text equals cinfer generate');
  check(c.usage.prompt_tokens > 0 && c.usage.completion_tokens === 20, 'completions usage');

  let streamed = '';
  const s = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 20, stream: true });
  for await (const ch of s) streamed += ch.choices[0]?.text ?? '';
  check(streamed === expected, 'completions stream joins to the same text');

  const st = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 20, stop: ['Lily'] });
  check(st.choices[0].finish_reason === 'stop' && !st.choices[0].text.includes('Lily') &&
        expected.startsWith(st.choices[0].text), 'completions stop string');

  const lp = await client.completions.create({ model: 'stories260k', prompt: 'Once upon a time', max_tokens: 5, logprobs: 2 });
  check(lp.choices[0].logprobs.tokens.length === 5 && lp.choices[0].logprobs.tokens.join('') === lp.choices[0].text &&
        Object.keys(lp.choices[0].logprobs.top_logprobs[0]).length === 2, 'completions logprobs shape');

  const msgs = [{ role: 'user', content: 'Tell me a story' }];
  const chat = await client.chat.completions.create({ model: 'stories260k', messages: msgs, max_tokens: 12, logprobs: true, top_logprobs: 2 });
  check(chat.choices[0].message.role === 'assistant' && typeof chat.choices[0].message.content === 'string', 'chat.completions.create');
  check(chat.choices[0].logprobs.content.length === 12 && chat.choices[0].logprobs.content[0].top_logprobs.length === 2 &&
        Array.isArray(chat.choices[0].logprobs.content[0].bytes), 'chat logprobs shape');

  let chatText = '', usage = null;
  const cs = await client.chat.completions.create({ model: 'stories260k', messages: msgs, max_tokens: 12, stream: true,
                                                    stream_options: { include_usage: true } });
  for await (const ch of cs) { chatText += ch.choices[0]?.delta?.content ?? ''; if (ch.usage) usage = ch.usage; }
  check(chatText === chat.choices[0].message.content, 'chat stream joins to the non-streamed content');
  check(usage && usage.completion_tokens === 12, 'chat stream include_usage');

  const chatStop = await client.chat.completions.create({ model: 'stories260k', messages: msgs, max_tokens: 12,
                                                          stop: chat.choices[0].message.content.slice(3, 7) });
  check(chatStop.choices[0].finish_reason === 'stop' &&
        chatStop.choices[0].message.content === chat.choices[0].message.content.slice(0, 3), 'chat stop string');

  try {
    await client.completions.create({ model: 'nope', prompt: 'x' });
    check(false, 'unknown model is an error');
  } catch (e) { check(e.status === 404, 'unknown model: the client sees a 404 NotFoundError'); }
  try {
    await client.completions.create({ model: 'stories260k', prompt: 'x', temperature: 'hot' });
    check(false, 'a bad field is an error');
  } catch (e) { check(e.status === 400 && /temperature/.test(e.message), 'a bad field: 400 naming it'); }
}

main().then(() => process.exit(failed ? 1 : 0), (e) => { console.log(`not ok exception: ${e}`); process.exit(1); });
