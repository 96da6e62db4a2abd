import { Engram } from "engram-episodic";

const memory = Engram.fromEnv(); // ENGRAM_URL, ENGRAM_API_KEY
await memory.record(
  { task: "fix the flaky login test", outcome: "success", solution: "freeze the clock", feedback: { reward: 1 }, agent_id: "coder-1" },
  { wait: 5 },
);
const { results } = await memory.recall("the login test fails at night", { top_k: 3 });
for (const hit of results) console.log(hit.priority.toFixed(2), hit.episode.outcome, hit.episode.task.description);
