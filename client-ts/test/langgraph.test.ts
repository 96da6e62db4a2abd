// The LangChain tools run by LangGraph.js's own tool execution (the prebuilt ToolNode, as an agent graph
// runs it), against the real stack: what the calls stored, recalled and forgot.
import assert from "node:assert/strict";
import { test } from "node:test";

import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { Engram, ResourceNotFound } from "engram-episodic";
import { TOOL_SPECS, engramLangChainTools } from "engram-episodic/langchain";

const memory = Engram.fromEnv();
const run = Math.random().toString(36).slice(2, 8);
const agent = `langgraph-${run}`;

async function calls(node: ToolNode, ...toolCalls: { name: string; args: Record<string, unknown> }[]): Promise<ToolMessage[]> {
  const message = new AIMessage({ content: "", tool_calls: toolCalls.map((c, i) => ({ ...c, id: `call-${i}`, type: "tool_call" as const })) });
  const out = (await node.invoke({ messages: [message] })) as { messages: ToolMessage[] };
  return out.messages;
}

test("a LangGraph ToolNode records, recalls and forgets through the Engram tools", async () => {
  const tools = engramLangChainTools(memory, { agentId: agent });
  assert.deepEqual(
    tools.map((t) => [t.name, t.description]),
    tools.map((t) => [t.name, TOOL_SPECS.find((s) => s.name === t.name)!.description]),
  );
  const node = new ToolNode(tools);

  const [recorded] = await calls(node, {
    name: "record_episode",
    args: { task: "shard the events table by month", outcome: "success", reward: 1, strategy: "conservative", category: "architecture" },
  });
  const episodeId = (recorded!.artifact as { episode_id: string }).episode_id;
  assert.match(String(recorded!.content), new RegExp(`Recorded episode ${episodeId} \\(success\\)`));
  await memory.waitUntilRecallable(episodeId, 10);

  const [recalled, context] = await calls(
    node,
    { name: "recall_experiences", args: { query: "partition the events table", top_k: 2 } },
    { name: "get_context", args: { task: "partition the events table" } },
  );
  assert.match(String(recalled!.content), new RegExp(`episode_id: ${episodeId}`));
  assert.match(String(recalled!.content), /strategy conservative/);
  assert.match(String(context!.content), /shard the events table by month/);

  const [suggested, facts, skills, curve] = await calls(
    node,
    { name: "suggest_approach", args: { task: "partition the events table", category: "architecture" } },
    { name: "search_facts", args: { query: "partition the events table" } },
    { name: "get_skills", args: {} },
    { name: "get_learning_curve", args: { window: 1 } },
  );
  assert.match(String(suggested!.content), /^Confidence: \w+ \(1 success\(es\) and 0 failure\(s\) among 1 similar past episode\(s\)\)\.\nRecommended strategy: /);
  assert.match(String(suggested!.content), /Strategies that succeeded: conservative \(1x\)/);
  assert.match(String(facts!.content), /^No facts about 'partition the events table' yet/);
  assert.equal(String(skills!.content), "Skills by category (weak: success rate below 50%):\n- architecture: 1 episode(s), 1 success(es) (100%), avg reward 1.00");
  assert.match(String(curve!.content), /^Learning curve over 1 episode\(s\) \(rolling window 1\): success rate 100% -> 100% \(steady\)/);

  const [forgot] = await calls(node, { name: "forget_episode", args: { episode_id: episodeId } });
  assert.equal((forgot!.artifact as { status: string }).status, "erased");
  await assert.rejects(memory.getEpisode(episodeId), ResourceNotFound);

  const [refused] = await calls(node, { name: "recall_experiences", args: { query: "x", top_k: 0 } });
  assert.match(String(refused!.content), /top_k/, "the schema refuses top_k 0 before anything is sent");
});
