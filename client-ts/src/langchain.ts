/**
 * Engram's memory tools for LangChain.js and LangGraph.js (`@langchain/core/tools`'s `tool()` with zod
 * schemas): `engram-episodic/langchain`.
 *
 *     import { createReactAgent } from "@langchain/langgraph/prebuilt";
 *     import { Engram } from "engram-episodic";
 *     import { engramLangChainTools } from "engram-episodic/langchain";
 *
 *     const agent = createReactAgent({ llm, tools: engramLangChainTools(Engram.fromEnv(), { agentId: "coder-1" }) });
 *
 * The same tools as `engram-episodic/ai` (the Python tools' names, descriptions and argument rules).
 * Each answers `content_and_artifact`: the ToolMessage's content is the text for the model, its
 * artifact the service's JSON answer; a failure is a text the model can act on, its artifact
 * `{ error: kind, ... }` (invalid_arguments, unavailable, unreachable, ...).
 */
import { tool, type DynamicStructuredTool } from "@langchain/core/tools";
import type { z } from "zod";

import type { Engram } from "./index.js";
import { TOOL_NAMES, runTool, toolSpec, zodOf, type Args, type ToolName, type ToolScope } from "./toolkit.js";

export * from "./toolkit.js";

/** Every Engram tool (`TOOL_NAMES`, as the Python `Toolset`), or those in `names`, as LangChain tools. */
export function engramLangChainTools(
  memory: Engram,
  options: ToolScope & { names?: readonly ToolName[] } = {},
): DynamicStructuredTool[] {
  const { names = TOOL_NAMES, ...scope } = options;
  return names.map((name) => {
    const definition = toolSpec(name);
    return tool(
      async (args: Args): Promise<[string, Record<string, unknown>]> => {
        const result = await runTool(memory, name, args, scope);
        return [result.text, result.data];
      },
      {
        name,
        description: definition.description,
        schema: zodOf(definition.parameters) as z.ZodObject<Record<string, z.ZodType>>,
        responseFormat: "content_and_artifact",
      },
    ) as unknown as DynamicStructuredTool;
  });
}
