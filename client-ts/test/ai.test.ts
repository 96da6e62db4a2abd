// The AI SDK tools called through the SDK's own tool execution (generateText with a scripted model from
// `ai/test`, no network), against the real stack: what the model's calls stored and recalled.
import assert from "node:assert/strict";
import { test } from "node:test";

import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Engram } from "engram-episodic";
import { TOOL_SPECS, engramTools, type ToolResult } from "engram-episodic/ai";

const memory = Engram.fromEnv();
const run = Math.random().toString(36).slice(2, 8);
const agent = `ai-sdk-${run}`;

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

function call(toolName: string, input: unknown) {
  return {
    content: [{ type: "tool-call" as const, toolCallId: `${toolName}-${Math.random()}`, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: "tool-calls" as const, raw: undefined },
    usage,
    warnings: [],
  };
}

/** The text of the last tool result the model was given. */
function lastToolText(prompt: unknown): string {
  const messages = prompt as { role: string; content: { type: string; output?: { value?: unknown } }[] }[];
  const results = messages.filter((m) => m.role === "tool").flatMap((m) => m.content);
  return String(results.at(-1)?.output?.value ?? "");
}

test("the descriptions are the Python tools'; a model records, recalls, gets context and forgets", async () => {
  const tools = engramTools(memory, { agentId: agent });
  for (const name of Object.keys(tools) as (keyof typeof tools)[]) {
    assert.equal(tools[name].description, TOOL_SPECS.find((t) => t.name === name)!.description);
  }
  let step = 0;
  let recorded = "";
  const model = new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      step++;
      if (step === 1) return call("record_episode", { task: "deploy the api", outcome: "great" }); // refused by the schema
      if (step === 2) {
        return call("record_episode", {
          task: "rotate the signing key of the payments api",
          outcome: "success",
          solution: "generate a new key, publish the jwks, then retire the old one after an hour",
          reward: 0.9,
          strategy: "iterative",
          actions: [{ action_type: "shell", input: "openssl genpkey -algorithm ed25519", success: true }],
          category: "ops",
        });
      }
      if (step === 3) {
        recorded = /Recorded episode (\w+)/.exec(lastToolText(prompt))?.[1] ?? "";
        await memory.waitUntilRecallable(recorded, 10);
        return call("recall_experiences", { query: "rotate the payments signing key", top_k: 3, outcome: ["success"] });
      }
      if (step === 4) return call("get_context", { task: "rotate the payments signing key", max_chars: 1000 });
      if (step === 5) return call("forget_episode", { episode_id: recorded });
      return { content: [{ type: "text" as const, text: "done" }], finishReason: { unified: "stop" as const, raw: undefined }, usage, warnings: [] };
    },
  });

  const result = await generateText({ model, tools, stopWhen: stepCountIs(8), prompt: "rotate the payments signing key" });
  assert.equal(result.text, "done");
  const [refused, record, recall, context, forget] = result.steps;
  const output = (s: typeof record) => s!.toolResults[0]!.output as ToolResult;

  const error = refused!.content.find((p) => p.type === "tool-error");
  assert.ok(error, "an outcome outside the enum is refused before anything is sent");
  assert.match(String(error.error), /outcome/);

  assert.match(recorded, /^[0-9a-f]{32}$/);
  const stored = await memory.getEpisode(recorded).catch(() => null);
  assert.equal(stored, null, "forgotten by the last call");
  assert.equal(output(record).isError, false);

  const recalled = output(recall);
  assert.match(recalled.text, /1 past episode\(s\) for 'rotate the payments signing key', best first:/);
  assert.match(recalled.text, /\[success \| reward 0\.90 \| .* \| strategy iterative\] rotate the signing key of the payments api/);
  assert.match(recalled.text, new RegExp(`episode_id: ${recorded}`));
  const hits = (recalled.data as { results: { episode: { agent_id: string; actions: unknown[] } }[] }).results;
  assert.equal(hits[0]!.episode.agent_id, agent, "the bound agent is stamped on what the model records");
  assert.equal(hits[0]!.episode.actions.length, 1);

  assert.match(output(context).text, /rotate the signing key/);
  assert.equal(output(forget).data.status, "erased");

  // what the model read is the compact text, not the JSON
  const toolMessage = result.response.messages.find((m) => m.role === "tool" && JSON.stringify(m.content).includes("past episode"));
  assert.ok(toolMessage && !JSON.stringify(toolMessage.content).includes("replay_context"));
});

test("a service refusal reaches the model as an error result naming the tool's own argument", async () => {
  const tools = engramTools(memory, { agentId: agent, names: ["forget_episode"] });
  const result = await tools.forget_episode.execute!({ episode_id: `never-stored-${run}` }, { toolCallId: "t", messages: [] });
  const output = result as ToolResult;
  assert.equal(output.isError, true);
  assert.equal(output.data.error, "invalid_arguments");
  assert.match(output.text, /episode_id: no episode with this id/);
});
