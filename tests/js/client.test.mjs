// The official OpenAI JS SDK against dsv41-serve: streaming chat, non-streaming chat, a tools
// round trip, usage, and an error case. DSV41_TEST_URL points at the server's /v1.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.DSV41_TEST_URL;
assert.ok(baseURL, 'DSV41_TEST_URL must be set');
const client = new OpenAI({ baseURL, apiKey: 'js-test-key', maxRetries: 0 });
const model = 'tiny-scripted';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

test('models list', async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

test('non-streaming chat with reasoning and usage', async () => {
  const r = await client.chat.completions.create({
    model, temperature: 0, messages: [{ role: 'user', content: 'Say hello' }],
  });
  assert.equal(r.object, 'chat.completion');
  const m = r.choices[0].message;
  assert.equal(m.content, 'Hello from dsv41-serve!');
  assert.equal(m.reasoning_content, 'A greeting is asked for.');
  assert.equal(m.reasoning, 'A greeting is asked for.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);
});

test('streaming chat with include_usage', async () => {
  const stream = await client.chat.completions.create({
    model, temperature: 0, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: 'Say hello' }],
  });
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.content) content += c.delta.content;
      if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2);
  assert.equal(content, 'Hello from dsv41-serve!');
  assert.equal(reasoning, 'A greeting is asked for.');
  assert.equal(finish, 'stop');
  assert.ok(usage && usage.completion_tokens > 0);
});

test('tools round trip', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({ model, temperature: 0, messages, tools });
  const call = first.choices[0].message.tool_calls?.[0];
  assert.ok(call, 'expected a tool call');
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });

  // The same call, streamed: the SDK's stream helper assembles the arguments.
  const runner = client.chat.completions.stream({ model, temperature: 0, messages, tools });
  const final = await runner.finalChatCompletion();
  const streamedCall = final.choices[0].message.tool_calls[0];
  assert.equal(streamedCall.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(streamedCall.function.arguments), { city: 'Paris' });

  messages.push(first.choices[0].message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '18 degrees, sunny' });
  const second = await client.chat.completions.create({ model, temperature: 0, messages, tools });
  assert.equal(second.choices[0].message.content, 'It is 18 degrees in Paris.');
  assert.equal(second.choices[0].finish_reason, 'stop');
});

test('errors surface as SDK errors', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found',
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: -5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400,
  );
  const unauthorized = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(unauthorized.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});
