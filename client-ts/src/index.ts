/**
 * The TypeScript client of Engram's query service: the operations of the Python client
 * (`engram_episodic.Engram`) over `fetch` only, so it runs in Node >= 20, Deno, Bun, browsers and edge
 * runtimes.
 *
 *     import { Engram } from "engram-episodic";
 *     const memory = Engram.fromEnv();            // ENGRAM_URL, ENGRAM_API_KEY
 *     await memory.record({ task: "fix the flaky login test", outcome: "success", solution: "freeze the clock" }, { wait: 5 });
 *     for (const hit of (await memory.recall("the login test fails at night", { top_k: 3 })).results)
 *       console.log(hit.priority.toFixed(2), hit.episode.outcome, hit.episode.task.description);
 *
 * Request and answer types are generated from the service's OpenAPI document (`./openapi.ts`); field
 * names are the API's (snake_case), durations and waits are seconds, as in the API and the Python client.
 *
 * Retries. 429 and 503 answers (the service says nothing was applied) are retried after their
 * `Retry-After`, as are requests that never reached the service. A request whose answer was lost
 * (timeout, dropped connection) is retried only when a repeat is harmless: reads, forgets,
 * consolidation, and `record`/episode completions, whose episodes get their `episode_id` and
 * `completed_at` here before the first attempt, so a repeat is the same episode, never a copy. A
 * recall with `touch: true` (it counts accesses) is not retried then: it throws `ConnectionFailed`
 * with `maybeApplied: true`. At most `maxRetries` retries, each wait capped by `maxRetryWait` seconds.
 */
import {
  ApiError,
  ConnectionFailed,
  EngramError,
  EpisodeForgotten,
  InvalidRequest,
  ResourceNotFound,
  WaitTimeout,
  apiError,
  type Problem,
} from "./errors.js";
import type { components, operations } from "./openapi.js";
import { DEFAULT_MAX_BODY_BYTES, requestBodies } from "./parts.js";

export * from "./errors.js";
export type { components, operations, paths } from "./openapi.js";
export { DEFAULT_MAX_BODY_BYTES, requestBodies, episodeParts } from "./parts.js";

export const VERSION = "0.1.0";
export const DEFAULT_URL = "http://127.0.0.1:8080";
/** The longest `wait` (seconds) the service holds a write or a forget for. */
export const MAX_WAIT = 30;

type S = components["schemas"];
type JsonBody<Op extends keyof operations> = operations[Op] extends {
  requestBody: { content: { "application/json": infer B } };
}
  ? B
  : never;
type Query<Op extends keyof operations> = NonNullable<operations[Op]["parameters"]["query"]>;

/** Fields holding an instant: ISO 8601 with an offset, epoch seconds, or a `Date` (sent as ISO 8601). */
type Instants = "since" | "until" | "as_of" | "completed_at" | "started_at" | "expires_at" | "timestamp";
type WithDates<T> = { [K in keyof T]: K extends Instants ? T[K] | Date : T[K] };

/** An episode to record: the API's `Episode` (`task` a description or a task object). */
export type EpisodeInput = WithDates<S["Episode"]>;
export type Action = S["Action"];
export type StoredEpisode = S["EpisodeOut"];
export type RecallOptions = WithDates<Partial<Omit<JsonBody<"recall">, "query">>>;
export type ContextOptions = Partial<Omit<JsonBody<"context">, "task">>;
export type StrategyOptions = Partial<Omit<JsonBody<"strategy">, "task">>;
export type SuggestOptions = Partial<Omit<JsonBody<"suggest">, "task">>;
export type FactSearchOptions = WithDates<Partial<Omit<JsonBody<"facts_search">, "query">>>;
export type ConsolidateOptions = Partial<JsonBody<"consolidate">>;
export type SkillsOptions = Query<"skills">;
export type CurveOptions = Query<"learning_curve">;
export type EpisodeListOptions = WithDates<Omit<Query<"list_episodes">, "cursor"> & { cursor?: string }>;
export type FactListOptions = WithDates<Query<"list_facts">>;
export type EpisodeChanges = WithDates<Partial<JsonBody<"update_episode">>>;
export type RecallAnswer = S["RecallAnswer"];
export type ContextAnswer = S["ContextAnswer"];
export type StrategyAnswer = S["StrategyAnswer"];
export type SuggestAnswer = S["SuggestAnswer"];
export type SkillsAnswer = S["SkillsAnswer"];
export type LearningCurveAnswer = S["LearningCurveAnswer"];
export type IngestAnswer = S["IngestAnswer"];
export type EpisodeAnswer = S["EpisodeAnswer"];
export type EpisodePage = S["EpisodePage"];
export type FactsAnswer = S["FactsAnswer"];
export type Fact = S["Fact"];
export type FactDetail = S["FactDetail"];
export type FactPage = S["FactPage"];
export type ConsolidateAnswer = S["ConsolidateAnswer"];
export type Updated = S["EpisodeUpdateAccepted"];
export type EpisodeForgetting = S["EpisodeForgotten"];
export type UserForgetting = S["UserForgotten"];
export type ForgetJob = S["ForgetJob"];
export type ForgetJobStarted = S["ForgetJobStarted"];
export type Summary = S["Summary"];
export type DeadLetterOptions = Query<"list_dead_letters">;
export type DeadLetterPage = S["DeadLetterPage"];
export type DeadLettersActed = S["DeadLettersActed"];

export interface EngramOptions {
  /** Bearer key of the caller's namespace (printable ASCII). */
  apiKey?: string | null;
  /** Seconds one attempt may take (a `wait` is added to it). Default 30. */
  timeout?: number;
  /** Retries after a 429/503, an unsent request or a lost answer of a harmless repeat. Default 3. */
  maxRetries?: number;
  /** The longest wait before a retry, seconds. Default 30. */
  maxRetryWait?: number;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** The largest request body (the service's ENGRAM_MAX_BODY_BYTES); larger episodes go in parts. */
  maxBodyBytes?: number;
}

export interface RecordOptions {
  /** Seconds (0..30) to hold the call until the episode is recallable; WaitTimeout if it is not. */
  wait?: number;
}

interface Call {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  path: string;
  body?: unknown;
  params?: Record<string, unknown>;
  /** A repeat after a lost answer is harmless. */
  idempotent: boolean;
  wait?: number;
}

/** A value in its JSON form: Dates as ISO 8601; NaN and infinities refused naming `name`. */
function wire(value: unknown, name: string): unknown {
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new InvalidRequest([{ field: name, reason: "must be finite (NaN and infinity are not JSON)" }]);
  }
  if (Array.isArray(value)) return value.map((v, i) => wire(v, `${name}[${i}]`));
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = wire(v, name ? `${name}.${k}` : k);
    return out;
  }
  return value;
}

/**
 * `value` as one URL path segment. `.` and `..` are valid ids but dot segments, which the WHATWG URL
 * parser of `fetch` removes even percent-encoded (`/v1/episodes/%2E` becomes `/v1/episodes/`), so no
 * request of this client can name them in a path: InvalidRequest says so (the Python client can).
 */
function segment(value: unknown, name: string): string {
  if (typeof value !== "string" || value === "") {
    throw new InvalidRequest([{ field: name, reason: "must be a non-empty string" }]);
  }
  if (value === "." || value === "..") {
    throw new InvalidRequest([
      { field: name, reason: `${JSON.stringify(value)} is a dot segment, which fetch's URL parser removes from a path; forgetEpisodes takes it in the body` },
    ]);
  }
  try {
    return encodeURIComponent(value);
  } catch {
    throw new InvalidRequest([{ field: name, reason: "must be valid Unicode text (it holds a lone surrogate)" }]);
  }
}

/** The `wait` query parameter: seconds in 0..MAX_WAIT, or nothing for 0/undefined. */
function waitParam(wait: number | undefined): Record<string, string> | undefined {
  if (wait === undefined || wait === null) return undefined;
  if (typeof wait !== "number" || !Number.isFinite(wait) || wait < 0 || wait > MAX_WAIT) {
    throw new InvalidRequest([
      { field: "wait", reason: `must be a number of seconds between 0 and ${MAX_WAIT}, not ${JSON.stringify(wait)}` },
    ]);
  }
  return wait ? { wait: String(wait) } : undefined;
}

function retryAfter(response: Response): number | null {
  const value = response.headers.get("Retry-After");
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

/** Connection errors by which the request never reached the service (Node's undici codes). */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "EHOSTUNREACH"]);

/** `error` and its causes, outermost first (fetch's "fetch failed" says why only in its `cause`). */
function causes(error: unknown): unknown[] {
  const chain: unknown[] = [];
  for (let cause = error; cause && chain.length < 4 && !chain.includes(cause); cause = (cause as { cause?: unknown }).cause) {
    chain.push(cause);
    if (typeof cause !== "object") break;
  }
  return chain;
}

function notSent(error: unknown): boolean {
  return causes(error).some((cause) => {
    const { code, message } = (cause ?? {}) as { code?: unknown; message?: unknown };
    // "bad port": fetch refuses a port of its blocked list (1, 22, 6000, ...) before connecting
    return (typeof code === "string" && NOT_SENT.has(code)) || message === "bad port";
  });
}

/** `error` with every cause's message and code: "TypeError: fetch failed: connect ECONNREFUSED 127.0.0.1:9". */
function explain(error: unknown): string {
  const parts: string[] = [];
  for (const cause of causes(error)) {
    if (!(cause instanceof Error)) {
      parts.push(String(cause));
      continue;
    }
    const code = (cause as { code?: unknown }).code;
    const text = parts.length ? cause.message : `${cause.name}: ${cause.message}`;
    parts.push(typeof code === "string" && !cause.message.includes(code) ? `${text} (${code})` : text);
  }
  return parts.join(": ");
}

const sleep = (seconds: number) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

function uuidHex(): string {
  return globalThis.crypto.randomUUID().replaceAll("-", "");
}

/** One answer per episode of the requests that published one list of episodes (the first of each). */
function joined(results: IngestAnswer[]): IngestAnswer {
  if (results.length === 1) return results[0]!;
  const late = new Set(results.flatMap((r) => r.results.filter((a) => a.projected === false).map((a) => a.episode_id)));
  const first = new Map<string, S["Accepted"]>();
  for (const r of results) {
    for (const a of r.results) {
      if (first.has(a.episode_id)) continue;
      if (late.has(a.episode_id)) {
        const reason = results.flatMap((x) => x.results).find((b) => b.episode_id === a.episode_id && b.reason)?.reason;
        first.set(a.episode_id, { ...a, projected: false, reason: reason ?? a.reason });
      } else first.set(a.episode_id, a);
    }
  }
  const flags = results.map((r) => r.projected);
  const projected = flags.some((f) => f === null || f === undefined) ? null : flags.every(Boolean);
  const accepted = [...first.values()];
  return { ...results[0]!, accepted: accepted.length, results: accepted, projected };
}

const WHY: Record<string, string> = {
  forgotten: "forgotten before, so not published (a forgotten episode_id is never stored again: publish under a new one)",
  dead_lettered: "dead-lettered by the consolidator (`engram-admin dead-letters` says why)",
  expired: "expired (past its expires_at: hidden from every read; publish under a new episode_id)",
};

/** `result` of a record with `wait`, or WaitTimeout / EpisodeForgotten when an episode is not projected. */
function waited(result: IngestAnswer, wait: number | undefined, episodeId: string | null): IngestAnswer {
  const mine = result.results.filter((a) => a.episode_id === episodeId);
  if (episodeId !== null && mine.length && mine.every((a) => a.reason === "forgotten")) throw new EpisodeForgotten(episodeId);
  if (wait && result.projected === false) {
    const late = result.results.filter((a) => a.projected === false);
    const parts: string[] = [];
    for (const [reason, what] of Object.entries(WHY)) {
      const ids = late.filter((a) => a.reason === reason).map((a) => a.episode_id);
      if (ids.length) parts.push(`${ids.slice(0, 10).join(", ")}: ${what}`);
    }
    const slow = late.filter((a) => !(a.reason && a.reason in WHY)).map((a) => a.episode_id);
    if (slow.length) parts.push(`not projected within ${wait}s: ${slow.slice(0, 10).join(", ")}`);
    // a forgotten id was not even published: "accepted" would say otherwise
    const lead = late.some((a) => a.reason !== "forgotten") ? "accepted, but " : "";
    const error = new WaitTimeout(lead + parts.join("; "));
    error.episodeIds = late.map((a) => a.episode_id);
    error.result = result;
    throw error;
  }
  return result;
}

type Prepared = Record<string, unknown> & { episode_id: string };

/**
 * `episode` in its JSON form with its id (a new one unless given) and `completed_at` (now unless given)
 * fixed, so that every attempt sends the same episode. InvalidRequest without an `outcome`.
 */
function prepare(episode: EpisodeInput): Prepared {
  if (episode === null || typeof episode !== "object" || Array.isArray(episode)) {
    throw new InvalidRequest([{ field: "episode", reason: "must be an object" }]);
  }
  const data = wire(episode, "") as Record<string, unknown>;
  if (typeof data.task === "string") data.task = { description: data.task };
  if (data.outcome == null) throw new InvalidRequest([{ field: "outcome", reason: "is required for a finished episode" }]);
  data.episode_id ??= uuidHex();
  data.completed_at ??= Date.now() / 1000;
  return data as Prepared;
}

/**
 * The Engram client. Every method is one operation of the API (docs/api.md); answers are the types of
 * the service's OpenAPI document; errors are `ApiError` subclasses carrying `status`, `title`,
 * `detail` and the field `errors` of the service's problem+json, or `ConnectionFailed`,
 * `InvalidRequest` (nothing sent), `WaitTimeout`, `EpisodeForgotten`.
 */
export class Engram {
  readonly baseUrl: string;
  readonly timeout: number;
  readonly maxRetries: number;
  readonly maxRetryWait: number;
  maxBodyBytes: number;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: typeof fetch;

  /** Throws TypeError for a base URL that is not http(s), a malformed key or a `maxBodyBytes` < 1024. */
  constructor(baseUrl: string = DEFAULT_URL, options: EngramOptions = {}) {
    if (!/^https?:\/\//.test(baseUrl)) {
      throw new TypeError(`baseUrl must start with http:// or https://, not ${JSON.stringify(baseUrl.slice(0, 40))}`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeout = options.timeout ?? 30;
    this.maxRetries = options.maxRetries ?? 3;
    this.maxRetryWait = options.maxRetryWait ?? 30;
    this.maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    if (this.maxBodyBytes < 1024) throw new TypeError(`maxBodyBytes must be at least 1024, not ${this.maxBodyBytes}`);
    this.headers = { ...(options.headers ?? {}) };
    const key = options.apiKey;
    if (key) {
      // the service compares keys exactly: padding or a non-ASCII byte would only ever be a 401
      if (!/^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/.test(key)) {
        throw new TypeError("apiKey must be printable ASCII without leading or trailing whitespace");
      }
      this.headers.Authorization = `Bearer ${key}`;
    }
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /**
   * A client from ENGRAM_URL (default http://127.0.0.1:$ENGRAM_PORT, port 8080), ENGRAM_API_KEY and
   * ENGRAM_MAX_BODY_BYTES. `env` defaults to `process.env` where there is one (Node, Bun, Deno with
   * its Node compatibility); pass it explicitly elsewhere. Throws TypeError for a bad ENGRAM_MAX_BODY_BYTES.
   */
  static fromEnv(env?: Record<string, string | undefined>, options: EngramOptions = {}): Engram {
    const source = env ?? (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env ?? {};
    const url = source.ENGRAM_URL || `http://127.0.0.1:${source.ENGRAM_PORT || "8080"}`;
    const config: EngramOptions = { apiKey: source.ENGRAM_API_KEY || null };
    const raw = source.ENGRAM_MAX_BODY_BYTES;
    if (raw) {
      if (!/^\d+$/.test(raw)) throw new TypeError(`ENGRAM_MAX_BODY_BYTES must be an integer (bytes), not ${JSON.stringify(raw.slice(0, 40))}`);
      config.maxBodyBytes = Number(raw);
    }
    return new Engram(url, { ...config, ...options });
  }

  // --- the request, with the retry rule ------------------------------------------------------------------
  private url(call: Call): string {
    let url = this.baseUrl + call.path;
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(call.params ?? {})) {
      if (value === undefined || value === null) continue;
      for (const v of Array.isArray(value) ? value : [value]) query.append(key, String(v));
    }
    const q = query.toString();
    if (q) url += `?${q}`;
    return url;
  }

  private delay(attempt: number, response?: Response): number {
    const hinted = response ? retryAfter(response) : null;
    const backoff = Math.min(this.maxRetryWait, 0.25 * 2 ** attempt) * (0.5 + Math.random() / 2);
    return Math.min(this.maxRetryWait, hinted ?? backoff);
  }

  /** Send one request with the retry rule; the parsed JSON answer, or the error it is. */
  private async send<T>(call: Call): Promise<T> {
    const body = call.body === undefined ? undefined : JSON.stringify(call.body);
    const headers: Record<string, string> = { Accept: "application/json", ...this.headers };
    if (body) headers["Content-Type"] = "application/json";
    const url = this.url(call);
    let lost = false; // an attempt was sent and its answer lost: it may have been applied
    for (let attempt = 0; ; attempt++) {
      let response: Response;
      try {
        response = await this.fetchImpl(url, {
          method: call.method,
          headers,
          body,
          // a `wait` call is held that long by the service before it answers: the answer is not late
          signal: AbortSignal.timeout((this.timeout + (call.wait ?? 0)) * 1000),
        });
      } catch (error) {
        const unsent = notSent(error);
        lost ||= !unsent;
        if (attempt < this.maxRetries && (unsent || call.idempotent)) {
          await sleep(this.delay(attempt));
          continue;
        }
        const what = explain(error);
        throw new ConnectionFailed(
          `${call.method} ${call.path}: ${unsent ? "the service could not be reached" : "no answer (the request may have been applied)"} (${what})`,
          { maybeApplied: lost, cause: error },
        );
      }
      if ((response.status === 429 || response.status === 503) && attempt < this.maxRetries) {
        await response.body?.cancel();
        await sleep(this.delay(attempt, response));
        continue;
      }
      const text = await response.text();
      if (response.status >= 400) {
        let problem: Problem;
        try {
          const parsed: unknown = JSON.parse(text);
          problem = parsed && typeof parsed === "object" && !Array.isArray(parsed) ? (parsed as Problem) : { detail: text.slice(0, 500) };
        } catch {
          problem = { detail: text.slice(0, 500) };
        }
        const error = apiError(response.status, problem, retryAfter(response));
        error.maybeApplied = lost;
        throw error;
      }
      try {
        return JSON.parse(text) as T;
      } catch {
        throw new ApiError(response.status, { detail: "the answer is not JSON" });
      }
    }
  }

  // --- reads ------------------------------------------------------------------------------------------------
  /** `POST /v1/recall`: the episodes most worth reusing for `query`, best first. */
  async recall(query: string, options: RecallOptions = {}): Promise<RecallAnswer> {
    const body = wire({ ...options, query }, "");
    return this.send({ method: "POST", path: "/v1/recall", body, idempotent: !options.touch });
  }

  /** `POST /v1/context`: a working-memory briefing for `task` (episodes, strategies, facts) as text. */
  async context(task: string, options: ContextOptions = {}): Promise<ContextAnswer> {
    return this.send({ method: "POST", path: "/v1/context", body: wire({ ...options, task }, ""), idempotent: true });
  }

  /** `POST /v1/strategy`: the strategy to use for `task`, from similar past successes. */
  async strategy(task: string, options: StrategyOptions = {}): Promise<StrategyAnswer> {
    return this.send({ method: "POST", path: "/v1/strategy", body: wire({ ...options, task }, ""), idempotent: true });
  }

  /** `POST /v1/suggest`: how similar tasks went, what worked and what failed. */
  async suggest(task: string, options: SuggestOptions = {}): Promise<SuggestAnswer> {
    return this.send({ method: "POST", path: "/v1/suggest", body: wire({ ...options, task }, ""), idempotent: true });
  }

  /** `GET /v1/skills`: the track record per task category. */
  async skills(options: SkillsOptions = {}): Promise<SkillsAnswer> {
    return this.send({ method: "GET", path: "/v1/skills", params: options, idempotent: true });
  }

  /** `GET /v1/learning-curve`: rolling success rate and reward over completed episodes. */
  async learningCurve(options: CurveOptions = {}): Promise<LearningCurveAnswer> {
    return this.send({ method: "GET", path: "/v1/learning-curve", params: options, idempotent: true });
  }

  /** `POST /v1/facts/search`: distilled facts, about `query` or the most confident ones. */
  async searchFacts(query?: string | null, options: FactSearchOptions = {}): Promise<Fact[]> {
    const body = wire(query == null ? options : { ...options, query }, "");
    const answer = await this.send<FactsAnswer>({ method: "POST", path: "/v1/facts/search", body, idempotent: true });
    return answer.results;
  }

  /** `GET /v1/facts/{fact_id}`: one fact with its evidence; ResourceNotFound if there is none. */
  async getFact(factId: string): Promise<FactDetail> {
    return this.send({ method: "GET", path: `/v1/facts/${segment(factId, "fact_id")}`, idempotent: true });
  }

  /** `GET /v1/facts`: one page of facts (`next_cursor` for the next). */
  async listFacts(options: FactListOptions = {}): Promise<FactPage> {
    return this.send({ method: "GET", path: "/v1/facts", params: wire(options, "") as Record<string, unknown>, idempotent: true });
  }

  /** `GET /v1/episodes/{episode_id}`: the stored episode and its status; ResourceNotFound if none. */
  async getEpisode(episodeId: string): Promise<EpisodeAnswer> {
    return this.send({ method: "GET", path: `/v1/episodes/${segment(episodeId, "episode_id")}`, idempotent: true });
  }

  /** `GET /v1/episodes`: one page (newest first unless `order: "asc"`; `next_cursor` for the next). */
  async listEpisodesPage(options: EpisodeListOptions = {}): Promise<EpisodePage> {
    return this.send({ method: "GET", path: "/v1/episodes", params: wire(options, "") as Record<string, unknown>, idempotent: true });
  }

  /**
   * Every episode matching `options`, page after page along the cursor (`for await (const e of
   * memory.listEpisodes({ agent_id }))`). Each episode comes once even while others are written.
   */
  async *listEpisodes(options: EpisodeListOptions = {}): AsyncGenerator<StoredEpisode, void, undefined> {
    let cursor = options.cursor;
    for (;;) {
      const page = await this.listEpisodesPage({ ...options, ...(cursor ? { cursor } : {}) });
      yield* page.results;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  /** `GET /readyz`: `{status: "ready", checks}`; ServiceUnavailable (503) while not ready. */
  async ready(): Promise<S["Readiness"]> {
    return this.send({ method: "GET", path: "/readyz", idempotent: true });
  }

  /** `GET /v1/summary`: what the namespace holds (episodes, agents, users, sessions, facts) and what expires soonest. */
  async summary(): Promise<Summary> {
    return this.send({ method: "GET", path: "/v1/summary", idempotent: true });
  }

  /** `GET /v1/dead-letters`: the namespace's dead letters, oldest first (`limit` 1..1000, default 100), and `total`. */
  async deadLetters(options: DeadLetterOptions = {}): Promise<DeadLetterPage> {
    return this.send({ method: "GET", path: "/v1/dead-letters", params: options, idempotent: true });
  }

  /**
   * `POST /v1/dead-letters/redrive`: publish the dead letters `ids` (1..1000) again, after a fix;
   * ResourceNotFound when none is the namespace's. Not repeated after a lost answer: a repeat would
   * find them gone and answer 404.
   */
  async redriveDeadLetters(ids: string[]): Promise<DeadLettersActed> {
    return this.send({ method: "POST", path: "/v1/dead-letters/redrive", body: { ids }, idempotent: false });
  }

  /** `POST /v1/dead-letters/discard`: delete the dead letters `ids` and their events; as `redriveDeadLetters`. */
  async discardDeadLetters(ids: string[]): Promise<DeadLettersActed> {
    return this.send({ method: "POST", path: "/v1/dead-letters/discard", body: { ids }, idempotent: false });
  }

  // --- writes -----------------------------------------------------------------------------------------------
  /**
   * Record a finished episode; returns its `episode_id`. The id (a new one unless given) and
   * `completed_at` (now unless given) are fixed before the first attempt, so a retry is the same
   * episode, never a copy. An episode larger than one request (`maxBodyBytes`, 1,000 actions) is sent
   * in parts. `episode.ttl` (seconds or "12h") expires it after completion. With `wait` (seconds, at
   * most 30) the call returns once the episode is recallable, or throws WaitTimeout. Throws
   * EpisodeForgotten for an id forgotten before; errors name the ids in `episodeIds`.
   */
  async record(episode: EpisodeInput, options: RecordOptions = {}): Promise<string> {
    const prepared = prepare(episode);
    await this.sendEpisodes([prepared], options.wait, true);
    return prepared.episode_id;
  }

  /**
   * Publish finished episodes (each as `record` prepares it) in as few requests as fit: one when they
   * fit one (applied all or none), else parts in order. Returns one answer per episode; with `wait`,
   * WaitTimeout names the episodes not projected in time. Errors name the ids in `episodeIds`.
   */
  async publish(episodes: EpisodeInput[], options: RecordOptions = {}): Promise<IngestAnswer> {
    if (!Array.isArray(episodes) || !episodes.length) {
      throw new InvalidRequest([{ field: "episodes", reason: "must be a list of at least one episode" }]);
    }
    const errors: { field: string; reason: string }[] = [];
    const prepared = episodes.flatMap((e, i) => {
      try {
        return [prepare(e)];
      } catch (error) {
        if (!(error instanceof InvalidRequest)) throw error;
        errors.push(...error.errors.map((f) => ({ field: `episodes[${i}].${f.field}`, reason: f.reason })));
        return [];
      }
    });
    const first = new Map<string, number>();
    prepared.forEach((e, i) => {
      const seen = first.get(e.episode_id);
      if (seen !== undefined) {
        errors.push({
          field: `episodes[${i}].episode_id`,
          reason: `repeats episodes[${seen}].episode_id (${JSON.stringify(e.episode_id)}); send one version of an episode`,
        });
      } else first.set(e.episode_id, i);
    });
    if (errors.length) throw new InvalidRequest(errors);
    return this.sendEpisodes(prepared, options.wait, false);
  }

  /** Send prepared episodes (a lone one that fits goes in the single-episode body); the joined answer. */
  private async sendEpisodes(prepared: Prepared[], wait: number | undefined, single: boolean): Promise<IngestAnswer> {
    const params = waitParam(wait);
    const sendAll = async (): Promise<IngestAnswer> => {
      const bodies = requestBodies(prepared, this.maxBodyBytes);
      const sent = single && bodies.length === 1 ? [prepared[0]] : bodies;
      const results: IngestAnswer[] = [];
      for (const body of sent) {
        results.push(await this.send<IngestAnswer>({ method: "POST", path: "/v1/episodes", body, params, wait, idempotent: true }));
      }
      return waited(joined(results), wait, single ? prepared[0]!.episode_id : null);
    };
    try {
      try {
        return await sendAll();
      } catch (error) {
        // a 413 naming a smaller limit: adopt it, for this call and every later one
        const limit = error instanceof ApiError && error.status === 413 ? error.body.max_body_bytes : undefined;
        if (typeof limit === "number" && Number.isInteger(limit) && limit >= 1024 && limit < this.maxBodyBytes) {
          this.maxBodyBytes = limit;
          return await sendAll();
        }
        throw error;
      }
    } catch (error) {
      if (error instanceof EngramError && !error.episodeIds.length) error.episodeIds = prepared.map((e) => e.episode_id);
      throw error;
    }
  }

  /**
   * An open episode: record its actions as they happen (`action`), then `complete(outcome, fields)`;
   * nothing is sent before. `run(fn)` completes it as a failure with the error if `fn` throws, and as
   * abandoned if `fn` returns without completing it.
   */
  episode(task: string | S["Task"], fields: Partial<EpisodeInput> = {}): OpenEpisode {
    return new OpenEpisode(this, task, fields);
  }

  /** @internal the completion of an OpenEpisode */
  async _complete(episode: Prepared): Promise<void> {
    await this.sendEpisodes([episode], undefined, true);
  }

  /**
   * `PATCH /v1/episodes/{id}`: `feedback` merges field by field, `metadata` key by key, the rest
   * replace; `expires_at: null` (or `ttl: null`) clears the expiry. With `wait`, returns once projected.
   */
  async patchEpisode(episodeId: string, changes: EpisodeChanges, options: RecordOptions = {}): Promise<Updated> {
    const body = wire(changes, "") as Record<string, unknown>;
    if (!Object.keys(body).length) throw new InvalidRequest([{ field: "changes", reason: "must change at least one field" }]);
    const params = waitParam(options.wait);
    const path = `/v1/episodes/${segment(episodeId, "episode_id")}`;
    return this.send({ method: "PATCH", path, body, params, wait: options.wait, idempotent: true });
  }

  /** `POST /v1/consolidate`: distil facts now (every scope, or one agent/category). */
  async consolidate(options: ConsolidateOptions = {}): Promise<ConsolidateAnswer> {
    const body = Object.keys(options).length ? wire(options, "") : { all_scopes: true };
    return this.send({ method: "POST", path: "/v1/consolidate", body, idempotent: true });
  }

  // --- forgetting -------------------------------------------------------------------------------------------
  /**
   * `DELETE /v1/episodes/{id}` (202); ResourceNotFound if the namespace has none. With `wait` (seconds,
   * at most 30) returns once the consolidator erased it, or at `wait`: `forgotten` says which.
   */
  async forgetEpisode(episodeId: string, options: RecordOptions = {}): Promise<EpisodeForgetting> {
    const path = `/v1/episodes/${segment(episodeId, "episode_id")}`;
    return this.send({ method: "DELETE", path, params: waitParam(options.wait), wait: options.wait, idempotent: true });
  }

  /** `DELETE /v1/users/{id}`: every episode of the user, as `forgetEpisode`. */
  async forgetUser(userId: string, options: RecordOptions = {}): Promise<UserForgetting> {
    const path = `/v1/users/${segment(userId, "user_id")}`;
    return this.send({ method: "DELETE", path, params: waitParam(options.wait), wait: options.wait, idempotent: true });
  }

  /**
   * `DELETE /v1/agents/{id}`: a job forgetting every episode of the agent. With `wait` (seconds, at
   * most 30) the job is polled until `done` or the wait ends (`status` says which).
   */
  async forgetAgent(agentId: string, options: RecordOptions = {}): Promise<ForgetJob | ForgetJobStarted> {
    return this.job(`/v1/agents/${segment(agentId, "agent_id")}`, options.wait);
  }

  /** `DELETE /v1/sessions/{id}`: every episode of the session, as `forgetAgent`. */
  async forgetSession(sessionId: string, options: RecordOptions = {}): Promise<ForgetJob | ForgetJobStarted> {
    return this.job(`/v1/sessions/${segment(sessionId, "session_id")}`, options.wait);
  }

  /** `POST /v1/forget`: up to 1,000 episodes by id; ids the namespace lacks come back in `unknown`. */
  async forgetEpisodes(episodeIds: string[], options: RecordOptions = {}): Promise<ForgetJob | ForgetJobStarted> {
    return this.job("/v1/forget", options.wait, { episode_ids: [...episodeIds] });
  }

  /** `GET /v1/forget/{job_id}`: a bulk forget's status (`done` once every episode is erased). */
  async forgetJob(jobId: string): Promise<ForgetJob> {
    return this.send({ method: "GET", path: `/v1/forget/${segment(jobId, "job_id")}`, idempotent: true });
  }

  private async job(path: string, wait: number | undefined, body?: unknown): Promise<ForgetJob | ForgetJobStarted> {
    waitParam(wait);
    const started = await this.send<ForgetJobStarted>(
      body === undefined ? { method: "DELETE", path, idempotent: true } : { method: "POST", path, body, idempotent: true },
    );
    if (!wait || started.status === "done") return started;
    const deadline = Date.now() + wait * 1000;
    let interval = 0.05;
    for (;;) {
      const job = await this.forgetJob(started.job_id);
      if (job.status === "done" || Date.now() >= deadline) return job;
      await sleep(Math.min(interval, (deadline - Date.now()) / 1000));
      interval = Math.min(interval * 2, 1);
    }
  }

  /** Poll `getEpisode` until it is completed and recallable; WaitTimeout after `timeout` seconds. */
  async waitUntilRecallable(episodeId: string, timeout = 30, interval = 0.1): Promise<EpisodeAnswer> {
    const deadline = Date.now() + timeout * 1000;
    for (;;) {
      try {
        const found = await this.getEpisode(episodeId);
        if (found.status === "completed") return found;
      } catch (error) {
        if (!(error instanceof ResourceNotFound)) throw error;
      }
      if (Date.now() > deadline) throw new WaitTimeout(`episode ${JSON.stringify(episodeId)} not recallable after ${timeout}s`);
      await sleep(interval);
    }
  }
}

/** The fields of an episode (the API's `Episode`): what `episode()` and `complete()` take, and nothing else. */
const EPISODE_FIELDS: Record<keyof EpisodeInput, true> = {
  episode_id: true, agent_id: true, user_id: true, session_id: true, task: true, context: true, observation: true,
  thoughts: true, action: true, result: true, solution: true, actions: true, feedback: true, outcome: true,
  outcome_details: true, importance: true, strategy_used: true, iterations: true, started_at: true,
  completed_at: true, duration_s: true, expires_at: true, source: true, metadata: true, vector: true, ttl: true,
};

/** InvalidRequest naming each key of `fields` that is not an episode field (the service would 422 it). */
function episodeFields(fields: object, call: string): void {
  const unknown = Object.keys(fields).filter((k) => !Object.hasOwn(EPISODE_FIELDS, k));
  if (!unknown.length) return;
  throw new InvalidRequest(
    unknown.map((field) => ({
      field,
      reason:
        field === "wait"
          ? `${call} takes episode fields only and does not wait (as in the Python client): call waitUntilRecallable(episode.episodeId) after it`
          : `not an episode field; ${call} takes the fields of an episode (${Object.keys(EPISODE_FIELDS).join(", ")})`,
    })),
  );
}

/** An episode in progress (see `Engram.episode`); actions are kept until `complete`. */
export class OpenEpisode {
  readonly episodeId: string;
  readonly actions: Action[] = [];
  private readonly start: Record<string, unknown>;
  private sent = false;
  private pending: Record<string, unknown> | null = null;
  /** What `complete` published, once it was accepted. */
  completed: Record<string, unknown> | null = null;

  constructor(
    private readonly client: Engram,
    task: string | S["Task"],
    fields: Partial<EpisodeInput>,
  ) {
    episodeFields(fields, "episode()");
    const data = wire(fields, "") as Record<string, unknown>;
    data.task = typeof task === "string" ? { description: task } : { ...task };
    data.episode_id ??= uuidHex();
    data.started_at ??= Date.now() / 1000;
    this.start = data;
    this.episodeId = data.episode_id as string;
  }

  /** Record one step (its `action_id` fresh, `timestamp` now unless given); nothing is sent. */
  action(actionType: string, fields: Omit<Action, "action_type" | "action_id"> = {}): Action {
    if (this.completed || this.sent) {
      throw new InvalidRequest([{ field: "action", reason: "the episode is already completed; record actions before complete()" }]);
    }
    const action = wire({ timestamp: Date.now() / 1000, ...fields, action_type: actionType, action_id: uuidHex() }, "action") as Action;
    this.actions.push(action);
    return action;
  }

  /**
   * Publish the finished episode with every action (in parts when large); returns what was sent.
   * If publishing fails, call `complete` again: the same id and completion make the repeat harmless.
   */
  async complete(outcome: EpisodeInput["outcome"], fields: Partial<EpisodeInput> = {}): Promise<Record<string, unknown>> {
    if (this.completed) throw new InvalidRequest([{ field: "outcome", reason: "episode already completed" }]);
    episodeFields(fields, "complete()");
    const extra = wire(fields, "") as Record<string, unknown>;
    // a retry after a failed completion sends the same snapshot: the same episode, never a copy
    const snapshot = this.pending ?? {
      ...this.start,
      ...extra,
      outcome,
      completed_at: extra.completed_at ?? Date.now() / 1000,
      actions: [...this.actions],
    };
    this.pending = snapshot;
    this.sent = true;
    await this.client._complete(snapshot as Prepared);
    this.completed = snapshot;
    return snapshot;
  }

  /**
   * Run `fn` with this episode: a throw completes it as a failure with the error (and rethrows), a
   * return without `complete` as abandoned. Returns what `fn` returned.
   */
  async run<T>(fn: (episode: OpenEpisode) => Promise<T> | T): Promise<T> {
    let result: T;
    try {
      result = await fn(this);
    } catch (error) {
      if (!this.sent) {
        const what = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
        await this.complete("failure", { outcome_details: what.slice(0, 10_000) });
      }
      throw error;
    }
    if (!this.sent) await this.complete("abandoned", { outcome_details: "episode block exited without complete()" });
    return result;
  }
}
