/**
 * Engram's memory tools for the Vercel AI SDK (`ai`'s `tool()` with zod schemas): `engram-episodic/ai`.
 *
 *     import { generateText, stepCountIs } from "ai";
 *     import { Engram } from "engram-episodic";
 *     import { engramTools } from "engram-episodic/ai";
 *
 *     const tools = engramTools(Engram.fromEnv(), { agentId: "coder-1" });
 *     await generateText({ model, tools, stopWhen: stepCountIs(5), prompt: "..." });
 *
 * The tools are the Python client's (`engram_episodic.tools`): the same names, descriptions and
 * argument rules. A tool returns `{ text, data, isError }`; the model reads `text` (compact, written
 * for it; `error-text` for a failure it can act on, as the Python tools' `errors="result"`), a program
 * `data`. The SDK checks the arguments against the zod schema before anything is sent.
 */
import { tool, type Tool } from "ai";
import type { z } from "zod";

import type { Engram } from "./index.js";
import { TOOL_NAMES, runTool, toolSpec, zodOf, type ToolName, type ToolResult, type ToolScope } from "./toolkit.js";

export * from "./toolkit.js";

type Args = Record<string, unknown>; // checked by the zod schema

/**
 * The memory tools for `generateText` / `streamText` (`tools: engramTools(memory, { agentId })`):
 * every Engram tool (`TOOL_NAMES`, as the Python `Toolset`), or those in `names`.
 */
export function engramTools(
  memory: Engram,
  options: ToolScope & { names?: readonly ToolName[] } = {},
): Record<ToolName, Tool<Args, ToolResult>> {
  const { names = TOOL_NAMES, ...scope } = options;
  const out = {} as Record<ToolName, Tool<Args, ToolResult>>;
  for (const name of names) {
    const definition = toolSpec(name);
    out[name] = tool<Args, ToolResult>({
      description: definition.description,
      inputSchema: zodOf(definition.parameters) as z.ZodType<Args>,
      execute: (args) => runTool(memory, name, args, scope),
      toModelOutput: ({ output }) => (output.isError ? { type: "error-text", value: output.text } : { type: "text", value: output.text }),
    });
  }
  return out;
}
