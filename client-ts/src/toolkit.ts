/**
 * Engram's memory tools, framework-neutral: the Python tools' definitions (`./tools.ts`, generated from
 * `client/engram_episodic/tools.json`) as zod schemas, and their execution with an `Engram` client into a
 * `ToolResult` (`text` for the model, `data` for programs, `isError`). `engram-episodic/ai` (Vercel AI
 * SDK) and `engram-episodic/langchain` (LangChain.js / LangGraph.js) wrap them for their framework.
 *
 * Scope: `agentId` / `userId` bound here are used whenever the model passes none; a bound
 * `sessionId` is stamped on recorded episodes only. The namespace comes from the client's API key.
 */
import { z } from "zod";

import {
  ApiError,
  ConnectionFailed,
  Engram,
  EngramError,
  RateLimited,
  ServiceUnavailable,
  Unauthorized,
  type ContextAnswer,
  type EpisodeForgetting,
  type Fact,
  type LearningCurveAnswer,
  type SkillsAnswer,
  type StrategyAnswer,
  type SuggestAnswer,
  type EpisodeInput,
  type RecallAnswer,
  type RecallOptions,
} from "./index.js";
import { TAG_ARGUMENTS, TOOL_NAMES, TOOL_SPECS, type JsonSchema, type ToolSpec } from "./tools.js";

export { TOOL_NAMES, TOOL_SPECS, type JsonSchema, type ToolSpec } from "./tools.js";

/** What a tool call gives back: `text` for the model, `data` for programs, `isError` for failures. */
export interface ToolResult {
  text: string;
  data: Record<string, unknown>;
  isError: boolean;
}

export interface ToolScope {
  agentId?: string;
  userId?: string;
  sessionId?: string;
}

export type ToolName = (typeof TOOL_NAMES)[number];

/** Arguments checked with the service's rule for tag values besides the schema. */
const TAG_ARGS = new Set(TAG_ARGUMENTS);
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
/** A UTF-16 surrogate without its other half: JSON decodes it, but no request can carry it. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * A zod schema of the subset of JSON Schema the tool definitions use (objects without extra keys,
 * bounded strings and numbers, enums, lists), with the service's rule for tag values (ids,
 * categories, strategies, action types: not blank, no padding, no control characters).
 */
export function zodOf(schema: JsonSchema, name = ""): z.ZodType {
  let out: z.ZodType;
  if (schema.enum) {
    out = z.enum(schema.enum as [string, ...string[]]);
  } else if (schema.type === "object") {
    const shape: Record<string, z.ZodType> = {};
    const required = new Set(schema.required ?? []);
    for (const [key, sub] of Object.entries(schema.properties ?? {})) {
      const field = zodOf(sub, key);
      // a null optional argument means "not given", as the Python tools read it
      shape[key] = required.has(key) ? field : field.nullish();
    }
    out = schema.additionalProperties === false ? z.strictObject(shape) : z.object(shape);
  } else if (schema.type === "array") {
    let list = z.array(zodOf(schema.items ?? {}));
    if (schema.minItems !== undefined) list = list.min(schema.minItems);
    if (schema.maxItems !== undefined) list = list.max(schema.maxItems);
    out = schema.uniqueItems
      ? list.refine((v) => new Set(v.map((x) => JSON.stringify(x))).size === v.length, "must not repeat a value")
      : list;
  } else if (schema.type === "string") {
    let text = schema.format === "date-time" ? z.iso.datetime({ offset: true }) : z.string();
    if (schema.minLength !== undefined) text = text.min(schema.minLength);
    if (schema.maxLength !== undefined) text = text.max(schema.maxLength);
    const whole = text.refine((v) => !LONE_SURROGATE.test(v), "must be valid Unicode text (it holds a lone surrogate)");
    out = TAG_ARGS.has(name)
      ? whole
          .refine((v) => v.trim() !== "", "must not be empty or blank")
          .refine((v) => v === v.trim(), "must not start or end with whitespace")
          .refine((v) => !CONTROL.test(v), "must not contain control characters")
      : whole;
  } else if (schema.type === "integer" || schema.type === "number") {
    let num = schema.type === "integer" ? z.number().int() : z.number();
    if (schema.minimum !== undefined) num = num.min(schema.minimum);
    if (schema.maximum !== undefined) num = num.max(schema.maximum);
    out = num;
  } else if (schema.type === "boolean") {
    out = z.boolean();
  } else {
    out = z.unknown();
  }
  return schema.description ? out.describe(schema.description) : out;
}

/** The definition of tool `name`. */
export function toolSpec(name: ToolName): ToolSpec {
  const found = TOOL_SPECS.find((t) => t.name === name);
  if (!found) throw new Error(`no tool definition named ${name}`);
  return found;
}

export type Args = Record<string, unknown>;

/** The named arguments that are set (not null or undefined). */
function pick(args: Args, ...names: string[]): Args {
  const out: Args = {};
  for (const n of names) if (args[n] != null) out[n] = args[n];
  return out;
}

function scoped(args: Args, scope: ToolScope, keys: ("agent_id" | "user_id" | "session_id")[]): Args {
  const bound = { agent_id: scope.agentId, user_id: scope.userId, session_id: scope.sessionId };
  const out = { ...args };
  for (const key of keys) if (out[key] == null && bound[key]) out[key] = bound[key];
  return out;
}

// --- rendering (as engram_episodic.tools renders for a model) --------------------------------------------
function clip(text: string | null | undefined, n: number): string {
  const flat = (text ?? "").split(/\s+/).filter(Boolean).join(" ");
  return flat.length <= n ? flat : `${flat.slice(0, n - 1)}…`;
}

function quoted(text: string): string {
  return `'${text.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'`;
}

function when(instant: string | number | null | undefined): string {
  if (instant == null) return "unknown time";
  const ms = typeof instant === "number" ? instant * 1000 : Date.parse(instant);
  if (Number.isNaN(ms)) return "unknown time";
  return `${new Date(ms).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function ago(seconds: number): string {
  const s = Math.max(0, seconds);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]] as const) {
    if (s >= size) return `${Math.round(s / size)} ${unit} ago`;
  }
  return "just now";
}

const pct = (x: number | null | undefined) => (x == null ? "n/a" : `${Math.round(x * 100)}%`);
const num = (x: number | null | undefined) => (x == null ? "n/a" : x.toFixed(2));

/** recall_experiences: a numbered list, best first, and the strategies that worked. */
export function renderRecall(recall: RecallAnswer, query: string): ToolResult {
  const data = recall as unknown as Record<string, unknown>;
  if (!recall.results.length) return { text: `No past episodes match ${quoted(clip(query, 80))} yet.`, data, isError: false };
  const lines = [`${recall.results.length} past episode(s) for ${quoted(clip(query, 80))}, best first:`];
  recall.results.forEach((hit, i) => {
    const ep = hit.episode;
    const head = [ep.outcome, `reward ${num(ep.feedback?.reward)}`, `${when(ep.completed_at)} (${ago(hit.age_s)})`];
    if (ep.strategy_used) head.push(`strategy ${ep.strategy_used}`);
    lines.push(`${i + 1}. [${head.join(" | ")}] ${clip(ep.task.description, 160)}`);
    if (ep.solution) lines.push(`   solution: ${clip(ep.solution, 240)}`);
    const why = ep.feedback?.message || ep.outcome_details;
    const failed = (ep.actions ?? []).find((a) => a.error)?.error;
    if (why || failed) lines.push(`   feedback: ${clip(why || failed, 200)}`);
    lines.push(`   episode_id: ${ep.episode_id}`);
  });
  const worked = recall.replay_context.strategies.filter((s) => (s.success_rate ?? 0) > 0);
  if (worked.length) {
    lines.push(
      "Strategies that worked: " +
        worked
          .slice(0, 3)
          .map((s) => `${s.strategy} (${s.episodes} episode(s), success ${pct(s.success_rate)}, avg reward ${num(s.avg_reward)})`)
          .join("; "),
    );
  }
  return { text: lines.join("\n"), data, isError: false };
}

/** forget_episode: erased, accepted (the wait ran out) or forgotten before. */
export function renderForgotten(f: EpisodeForgetting): ToolResult {
  if (f.already_forgotten) {
    return { text: `Episode ${f.episode_id} was already forgotten.`, data: { episode_id: f.episode_id, event_id: null, status: "already_forgotten" }, isError: false };
  }
  if (f.forgotten) {
    return {
      text: `Episode ${f.episode_id} is erased from memory; the facts built on it are rebuilt without it.`,
      data: { episode_id: f.episode_id, event_id: f.event_id, status: "erased" },
      isError: false,
    };
  }
  return {
    text: `Episode ${f.episode_id} will be erased from memory (and from the facts built on it) within seconds.`,
    data: { episode_id: f.episode_id, event_id: f.event_id, status: "accepted" },
    isError: false,
  };
}

const counted = <T extends { count: number }>(items: T[], name: (item: T) => string) =>
  items.map((i) => `${name(i)} (${i.count}x)`);

/** suggest_approach: confidence, the strategy and its reason, what failed before. */
export function renderSuggestion(suggestion: SuggestAnswer, choice: StrategyAnswer): ToolResult {
  const basis = suggestion.similar
    ? `${suggestion.successes} success(es) and ${suggestion.failures} failure(s) among ${suggestion.similar} similar past episode(s)`
    : "no similar past episodes";
  const lines = [`Confidence: ${suggestion.confidence} (${basis}).`, `Recommended strategy: ${choice.strategy} (${choice.reason}).`];
  if (suggestion.successful_strategies.length) {
    lines.push(`Strategies that succeeded: ${counted(suggestion.successful_strategies, (s) => s.strategy).join(", ")}`);
  }
  if (suggestion.common_failures.length) {
    lines.push(`Common failures to avoid: ${counted(suggestion.common_failures, (f) => quoted(clip(f.message, 160))).join("; ")}`);
  }
  if (suggestion.failed_action_types.length) {
    lines.push(`Steps that failed before: ${counted(suggestion.failed_action_types, (a) => a.action_type).join(", ")}`);
  }
  return { text: lines.join("\n"), data: { suggestion, strategy: choice }, isError: false };
}

/** search_facts: one line per fact with its kind, confidence and support. */
export function renderFacts(facts: Fact[], query: string | null): ToolResult {
  const data = { results: facts };
  if (!facts.length) {
    const about = query ? ` about ${quoted(clip(query, 80))}` : "";
    return { text: `No facts${about} yet (facts are distilled once enough similar episodes exist).`, data, isError: false };
  }
  const lines = [`${facts.length} fact(s), best first:`];
  facts.forEach((f, i) => {
    const tail = f.status === "current" ? "" : `, ${f.status}`;
    const scope = f.agent_id ? `agent ${f.agent_id}` : "all agents";
    lines.push(
      `${i + 1}. [${f.kind} | ${scope} | confidence ${num(f.confidence)} | ${f.support} episode(s), success ${pct(f.success_rate)}${tail}] ${clip(f.text, 500)} (fact_id ${f.fact_id})`,
    );
  });
  return { text: lines.join("\n"), data, isError: false };
}

/** get_skills: one line per category; the weak ones marked. */
export function renderSkills(skills: SkillsAnswer): ToolResult {
  const data = skills as unknown as Record<string, unknown>;
  if (!skills.results.length) return { text: "No completed episodes yet, so no skill profile.", data, isError: false };
  const lines = [`Skills by category (weak: success rate below ${pct(skills.threshold)}):`];
  for (const p of [...skills.results].sort((a, b) => b.episodes - a.episodes)) {
    const iters = p.avg_iterations != null ? `, avg iterations ${p.avg_iterations.toFixed(1)}` : "";
    lines.push(`- ${p.category}: ${p.episodes} episode(s), ${p.successes} success(es) (${pct(p.success_rate)}), avg reward ${num(p.avg_reward)}${iters}${p.weak ? " - WEAK" : ""}`);
  }
  if (skills.weak.length) lines.push(`Weak categories: ${skills.weak.join(", ")}.`);
  return { text: lines.join("\n"), data, isError: false };
}

/** get_learning_curve: first vs latest rolling figures, the trend, the last few episodes. */
export function renderCurve(curve: LearningCurveAnswer): ToolResult {
  const data = curve as unknown as Record<string, unknown>;
  const points = curve.results;
  if (!points.length) return { text: "No completed episodes yet, so no learning curve.", data, isError: false };
  const first = points[Math.min(points.length, curve.window) - 1]!;
  const last = points[points.length - 1]!;
  const delta = (last.success_rate ?? 0) - (first.success_rate ?? 0);
  const trend = delta > 0.1 ? "improving" : delta < -0.1 ? "declining" : "steady";
  const lines = [
    `Learning curve over ${points.length} episode(s) (rolling window ${curve.window}): success rate ${pct(first.success_rate)} -> ${pct(last.success_rate)} (${trend}); avg reward ${num(first.avg_reward)} -> ${num(last.avg_reward)}; total reward ${(last.cumulative_reward ?? 0).toFixed(2)}.`,
    `Latest: ${points
      .slice(-5)
      .map((p) => `#${p.episode} ${p.outcome || "?"} ${num(p.reward)}`)
      .join(", ")}.`,
  ];
  return { text: lines.join("\n"), data, isError: false };
}

/** The service's field names → the tool's arguments, so a refusal names what the model sent. */
const RECORD_FIELDS: Record<string, string> = {
  "task.description": "task",
  "task.category": "category",
  "task.complexity": "complexity",
  task: "task",
  "feedback.reward": "reward",
  "feedback.message": "feedback",
  "feedback.tests_passed": "tests_passed",
  "feedback.tests_total": "tests_total",
  strategy_used: "strategy",
};
const RECALL_FIELDS: Record<string, string> = { "reward.gte": "min_reward", reward: "min_reward" };

function toolField(path: string, fields: Record<string, string>): string {
  for (const [server, name] of Object.entries(fields).sort((a, b) => b[0].length - a[0].length)) {
    if (path === server || path.startsWith(`${server}.`) || path.startsWith(`${server}[`)) {
      return server !== name ? name + path.slice(server.length) : path;
    }
  }
  return path;
}

/**
 * Any error of a tool call as a result for the model, with a sentence saying what to do (as the
 * Python tools' `error_result`): invalid_arguments, unauthorized, unavailable, service_error,
 * unreachable or internal in `data.error`.
 */
export function errorResult(tool: string, error: unknown, fields: Record<string, string> = {}, missing?: [string, string]): ToolResult {
  const invalid = (errors: { field: string; reason: string }[]): ToolResult => ({
    text: `Invalid arguments for ${tool}: ${errors.map((e) => `${e.field}: ${e.reason}`).join("; ")}. Fix them and call again.`,
    data: { error: "invalid_arguments", tool, errors },
    isError: true,
  });
  if (error instanceof ApiError && error.status === 422 && error.errors.length) {
    return invalid(error.errors.map((e) => ({ field: toolField(e.field, fields), reason: e.reason })));
  }
  if (error instanceof ApiError && error.status === 413) return invalid([{ field: "arguments", reason: "are too large for the memory service (413)" }]);
  if (error instanceof ApiError && error.status === 404 && missing) return invalid([{ field: missing[0], reason: missing[1] }]);
  if (error instanceof EngramError && "errors" in error && !(error instanceof ApiError)) {
    return invalid((error as EngramError & { errors: { field: string; reason: string }[] }).errors.map((e) => ({ field: toolField(e.field, fields), reason: e.reason })));
  }
  if (error instanceof Unauthorized) {
    return { text: "The memory service refused this client's API key; memory is unavailable until it is fixed.", data: { error: "unauthorized", status: error.status }, isError: true };
  }
  if (error instanceof RateLimited || error instanceof ServiceUnavailable) {
    const after = error.retryAfter !== null ? ` in ${error.retryAfter} s` : " later";
    return {
      text: `Memory is busy or unavailable right now (${error.status}); try again${after}.`,
      data: { error: "unavailable", status: error.status, retry_after: error.retryAfter },
      isError: true,
    };
  }
  if (error instanceof ApiError) {
    return { text: `The memory service refused the call: ${error.message}`, data: { error: "service_error", status: error.status, detail: error.detail }, isError: true };
  }
  if (error instanceof ConnectionFailed) {
    return { text: `The memory service is unreachable: ${error.message}. Continue without memory.`, data: { error: "unreachable", maybe_applied: error.maybeApplied }, isError: true };
  }
  const what = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return { text: `Memory failed: ${what}`, data: { error: "internal" }, isError: true };
}

/** Seconds forget_episode waits for the erase, so its answer can say the episode is gone from every read. */
export const FORGET_WAIT = 5;

type Execute = (memory: Engram, args: Args, scope: ToolScope) => Promise<ToolResult>;

const EXECUTE: Record<ToolName, Execute> = {
  async recall_experiences(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    const options = pick(args, "top_k", "category", "outcome", "strategy", "since", "until", "mode", "agent_id", "user_id", "session_id");
    if (args.min_reward != null) options.reward = { gte: args.min_reward };
    const query = String(args.query);
    return renderRecall(await memory.recall(query, options as RecallOptions), query);
  },
  async get_context(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    const answer: ContextAnswer = await memory.context(String(args.task), pick(args, "category", "top_k", "max_chars", "agent_id", "user_id", "session_id"));
    return { text: answer.prompt, data: answer as unknown as Record<string, unknown>, isError: false };
  },
  async record_episode(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id", "session_id"]);
    const episode: Args = {
      task: { description: args.task, ...pick(args, "category", "complexity") },
      outcome: args.outcome,
      ...pick(args, "solution", "importance", "iterations", "outcome_details", "agent_id", "user_id", "session_id"),
    };
    if (args.strategy != null) episode.strategy_used = args.strategy;
    const feedback = pick({ reward: args.reward, message: args.feedback, tests_passed: args.tests_passed, tests_total: args.tests_total }, "reward", "message", "tests_passed", "tests_total");
    if (Object.keys(feedback).length) episode.feedback = feedback;
    if (Array.isArray(args.actions) && args.actions.length) {
      episode.actions = args.actions.map((a: Args) => pick(a, ...Object.keys(a)));
    }
    const result = await memory.publish([episode as EpisodeInput]);
    const accepted = result.results[0];
    const episodeId = accepted?.episode_id ?? "";
    return {
      text: `Recorded episode ${episodeId} (${String(args.outcome)}). It will be recallable within seconds.`,
      data: { episode_id: episodeId, event_id: accepted?.event_id ?? null, outcome: args.outcome, accepted: result.accepted },
      isError: false,
    };
  },
  async forget_episode(memory, args) {
    return renderForgotten(await memory.forgetEpisode(String(args.episode_id), { wait: FORGET_WAIT }));
  },
  async suggest_approach(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    const common = pick(args, "agent_id", "user_id", "session_id");
    // the category picks strategy's skill profile; suggest would filter by it (a guessed category
    // found nothing where strategy, on every similar episode, found evidence)
    const task = String(args.task);
    const [suggestion, choice] = await Promise.all([
      memory.suggest(task, common),
      memory.strategy(task, { ...common, ...pick(args, "category", "complexity") }),
    ]);
    return renderSuggestion(suggestion, choice);
  },
  async search_facts(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    const options = pick(args, "category", "kind", "top_k", "min_confidence", "include_superseded", "agent_id", "user_id");
    const query = args.query == null ? null : String(args.query);
    return renderFacts(await memory.searchFacts(query, options), query);
  },
  async get_skills(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    return renderSkills(await memory.skills(pick(args, "threshold", "agent_id", "user_id", "session_id")));
  },
  async get_learning_curve(memory, raw, scope) {
    const args = scoped(raw, scope, ["agent_id", "user_id"]);
    return renderCurve(await memory.learningCurve(pick(args, "category", "window", "limit", "agent_id", "user_id", "session_id")));
  },
};

const FIELDS: Partial<Record<ToolName, Record<string, string>>> = { record_episode: RECORD_FIELDS, recall_experiences: RECALL_FIELDS };
const MISSING: Partial<Record<ToolName, [string, string]>> = {
  forget_episode: ["episode_id", "no episode with this id in this memory (a forgotten one would answer already forgotten)"],
};

/** Run one tool call with `memory` (arguments already checked); every failure becomes an error result. */
export async function runTool(memory: Engram, name: ToolName, args: Args, scope: ToolScope = {}): Promise<ToolResult> {
  try {
    return await EXECUTE[name](memory, args, scope);
  } catch (error) {
    return errorResult(name, error, FIELDS[name], MISSING[name]);
  }
}

