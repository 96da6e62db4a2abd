// The TypeScript half of tests/cases/tool_arguments.json (the Python half: tests/unit/test_ts_tools.py):
// the zod schemas built from the Python tool definitions accept and refuse the same arguments.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { toolSpec, zodOf, type ToolName } from "engram-episodic/ai";

interface Case {
  tool: ToolName;
  arguments: Record<string, unknown>;
  fields: string[];
}

const file = new URL("../../../tests/cases/tool_arguments.json", import.meta.url);
const { cases } = JSON.parse(readFileSync(file, "utf8")) as { cases: Case[] };

/** A zod issue's path as the Python tools write a field: `actions[0].action_type`. */
function field(path: PropertyKey[]): string {
  return path.reduce<string>((out, p) => (typeof p === "number" ? `${out}[${p}]` : out ? `${out}.${String(p)}` : String(p)), "");
}

describe("tool arguments", () => {
  for (const c of cases) {
    test(`${c.tool} ${JSON.stringify(c.arguments)}`, () => {
      const parsed = zodOf(toolSpec(c.tool).parameters).safeParse(c.arguments);
      const fields = parsed.success
        ? []
        : parsed.error.issues.flatMap((i) => (i.code === "unrecognized_keys" ? i.keys.map((k) => field([...i.path, k])) : [field(i.path)]));
      assert.deepEqual([...new Set(fields)].sort(), [...c.fields].sort(), JSON.stringify(parsed.error?.issues ?? []));
    });
  }
});
