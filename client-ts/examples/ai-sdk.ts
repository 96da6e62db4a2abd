import { generateText, stepCountIs } from "ai";
import { Engram } from "engram-episodic";
import { engramTools } from "engram-episodic/ai";

const memory = Engram.fromEnv();
const { text, steps } = await generateText({
  model: "openai/gpt-4o-mini", // any AI SDK model; this one through the AI Gateway
  tools: engramTools(memory, { agentId: "coder-1", userId: "alice" }),
  stopWhen: stepCountIs(6),
  system: "Before a task, call get_context or recall_experiences; when done, call record_episode.",
  prompt: "The login test fails at night. Fix it.",
});
console.log(text, steps.flatMap((s) => s.toolCalls.map((c) => c.toolName)));
