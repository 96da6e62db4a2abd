// The TypeScript half of the cases both clients run (tests/cases/clients.json; the Python half is
// tests/integration/test_ts_client.py): the same operations, inputs and expected answers or errors.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { ApiError, Engram, EpisodeForgotten, InvalidRequest, ResourceNotFound, type EpisodeInput } from "engram-episodic";

type Step = Record<string, any>;
interface Case {
  name: string;
  steps: Step[];
}

const file = new URL("../../../tests/cases/clients.json", import.meta.url);
const { cases } = JSON.parse(readFileSync(file, "utf8")) as { cases: Case[] };
const memory = Engram.fromEnv();

function fill(value: unknown, run: string, saved: Record<string, unknown>): any {
  if (typeof value === "string") {
    if (value.startsWith("$") && value.slice(1) in saved) return saved[value.slice(1)];
    return value.replaceAll("$run", run);
  }
  if (Array.isArray(value)) return value.map((v) => fill(v, run, saved));
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, run, saved)]));
  return value;
}

async function step(s: Step): Promise<unknown> {
  const wait = s.wait === undefined ? {} : { wait: s.wait };
  switch (s.op) {
    case "record":
      return memory.record(s.episode as EpisodeInput, wait);
    case "publish":
      return memory.publish(s.episodes as EpisodeInput[], wait);
    case "list_episodes": {
      const ids: string[] = [];
      for await (const e of memory.listEpisodes(s.options ?? {})) ids.push(e.episode_id);
      return ids;
    }
    case "get_episode":
      return memory.getEpisode(s.id);
    case "recall":
      return memory.recall(s.query, s.options ?? {});
    case "context":
      return memory.context(s.task, s.options ?? {});
    case "update_episode":
      return memory.patchEpisode(s.id, s.changes, wait);
    case "forget_episode":
      return memory.forgetEpisode(s.id, wait);
    case "forget_user":
      return memory.forgetUser(s.id, wait);
    case "list_facts":
      return memory.listFacts(s.options ?? {});
    case "summary":
      return memory.summary();
    case "redrive_dead_letters":
      return memory.redriveDeadLetters(s.ids);
    case "discard_dead_letters":
      return memory.discardDeadLetters(s.ids);
  }
  throw new Error(`no operation ${s.op}`);
}

function at(answer: any, path: string): any {
  for (const part of path ? path.split(".") : []) answer = Array.isArray(answer) ? answer[Number(part)] : answer[part];
  return answer;
}

function checkError(expected: any, error: unknown): void {
  if (expected === "not_found") return assert.ok(error instanceof ResourceNotFound, String(error));
  if (expected === "forgotten") return assert.ok(error instanceof EpisodeForgotten, String(error));
  assert.ok(error instanceof InvalidRequest || error instanceof ApiError, String(error));
  assert.deepEqual([...new Set(error.errors.map((e) => e.field))].sort(), [...expected.fields].sort(), String(error));
}

describe("shared cases", () => {
  for (const c of cases) {
    test(c.name, async () => {
      const run = Math.random().toString(16).slice(2, 10);
      const saved: Record<string, unknown> = {};
      for (const raw of c.steps) {
        const s = fill(raw, run, saved);
        let answer: unknown;
        try {
          answer = await step(s);
        } catch (error) {
          assert.ok("error" in s, `${s.op} threw ${String(error)}`);
          checkError(s.error, error);
          continue;
        }
        assert.ok(!("error" in s), `${s.op} answered ${JSON.stringify(answer)}, expected ${JSON.stringify(s.error)}`);
        if (s.save) saved[s.save] = answer;
        for (const e of s.expect ?? []) {
          const got = at(answer, e.path);
          if ("equals" in e) assert.deepEqual(got, e.equals, e.path);
          if ("length" in e) assert.equal(got.length, e.length, e.path);
          if ("contains" in e) assert.ok(String(got).includes(e.contains), `${e.path}: ${got}`);
        }
      }
    });
  }
});
