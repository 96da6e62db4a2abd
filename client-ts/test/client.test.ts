// The client against the real stack that tests/integration/test_ts_client.py starts (ENGRAM_URL, ENGRAM_API_KEY;
// ENGRAM_LAG_URL: a service whose consolidator never reads, so ingest answers 429 past ENGRAM_MAX_LAG).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  BadRequest,
  ConnectionFailed,
  Engram,
  EpisodeForgotten,
  InvalidRequest,
  RateLimited,
  ResourceNotFound,
  Unauthorized,
  type StoredEpisode,
} from "engram-episodic";

const env = process.env;
if (!env.ENGRAM_URL) throw new Error("ENGRAM_URL is not set: run these tests through tests/integration/test_ts_client.py");
const memory = Engram.fromEnv();
const run = Math.random().toString(36).slice(2, 8);
const id = (name: string) => `${name}-${run}`;

/** Poll `probe` until it returns a truthy value (or `seconds` pass). */
async function until<T>(probe: () => Promise<T>, seconds = 15): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await probe();
    if (value || Date.now() > deadline) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("types", () => {
  test("the checked-in types are those openapi-typescript makes of the running service's /openapi.json", () => {
    const cli = fileURLToPath(new URL("../../node_modules/openapi-typescript/bin/cli.js", import.meta.url));
    const fresh = execFileSync(process.execPath, [cli, `${env.ENGRAM_URL}/openapi.json`, "--empty-objects-unknown"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
    const checkedIn = readFileSync(new URL("../../src/openapi.ts", import.meta.url), "utf8");
    assert.ok(
      fresh.trim() === checkedIn.trim(),
      "src/openapi.ts differs from the service's /openapi.json: regenerate it with `npm run gen` (ENGRAM_URL set)",
    );
  });
});

describe("every method", () => {
  test("record, episode, recall, context, strategy, suggest, skills, learningCurve, facts, patch, get", async () => {
    const agent = id("ops");
    const first = await memory.record(
      {
        task: "rotate the tls certificate of the api gateway",
        outcome: "success",
        solution: "certbot renew, then reload nginx",
        agent_id: agent,
        user_id: id("ann"),
        strategy_used: "iterative",
        feedback: { reward: 1.0 },
        importance: 6,
      },
      { wait: 10 },
    );
    for (let i = 0; i < 3; i++) {
      await memory.record(
        {
          task: { description: `rotate the tls certificate of service ${i}`, category: "ops" },
          outcome: i === 2 ? "failure" : "success",
          agent_id: agent,
          user_id: id("bob"),
          feedback: { reward: i === 2 ? 0 : 0.9, message: i === 2 ? "certbot rate limit" : null },
          strategy_used: "iterative",
        },
        { wait: 10 },
      );
    }
    const ep = memory.episode("rotate the tls certificate by hand", { agent_id: agent });
    await ep.run(async (e) => {
      e.action("run", { input: "openssl x509 -noout -dates", output: "notAfter=...", success: true });
      await e.complete("partial", { feedback: { reward: 0.5 } });
    });
    const stored = await memory.waitUntilRecallable(ep.episodeId, 10);
    assert.equal(stored.episode!.outcome, "partial");
    assert.deepEqual(stored.episode!.actions?.map((a) => a.action_type), ["run"]);

    const recall = await memory.recall("renew the tls certificate", { top_k: 5, agent_id: agent });
    assert.equal(recall.results.length, 5);
    const priorities = recall.results.map((h) => h.priority);
    assert.deepEqual(priorities, [...priorities].sort((a, b) => b - a));
    assert.ok(recall.results.some((h) => h.episode.episode_id === first));
    const onlyBob = await memory.recall("tls certificate", { user_id: id("bob"), outcome: ["failure"] });
    assert.deepEqual(onlyBob.results.map((h) => h.episode.feedback?.message), ["certbot rate limit"]);

    const context = await memory.context("renew the tls certificate", { agent_id: agent, max_chars: 2000 });
    assert.ok(context.prompt.includes("tls certificate") && context.prompt.length <= 2000 && context.results.length);
    const choice = await memory.strategy("renew the tls certificate", { agent_id: agent, min_similarity: 0 });
    assert.equal(choice.strategy, "iterative");
    const suggestion = await memory.suggest("renew the tls certificate", { agent_id: agent, min_similarity: 0 });
    assert.equal(suggestion.failures, 1);
    const skills = await memory.skills({ agent_id: agent });
    assert.deepEqual(new Set(skills.results.map((p) => p.category)), new Set(["unknown", "ops"]));
    const curve = await memory.learningCurve({ agent_id: agent });
    assert.equal(curve.results.length, 5);

    const consolidation = await memory.consolidate();
    assert.ok(consolidation.results.length);
    const facts = await until(async () => {
      const found = await memory.searchFacts("tls certificate", { agent_id: agent });
      return found.length ? found : null;
    });
    assert.ok(facts && facts[0]!.support >= 3);
    const detail = await memory.getFact(facts[0]!.fact_id);
    assert.equal(detail.fact.fact_id, facts[0]!.fact_id);
    const evidenced = detail.fact.evidence[0]!;
    const ofEpisode = await memory.listFacts({ episode_id: evidenced, limit: 1000 });
    assert.ok(ofEpisode.results.some((f) => f.fact_id === detail.fact.fact_id));
    assert.ok(ofEpisode.results.every((f) => f.evidence.includes(evidenced)));
    assert.equal((await memory.listFacts({ episode_id: id("never-recorded") })).results.length, 0);

    const updated = await memory.patchEpisode(first, { feedback: { reward: 0.25 }, metadata: { reviewed: true } }, { wait: 10 });
    assert.equal(updated.projected, true);
    const patched = await memory.getEpisode(first);
    assert.equal(patched.episode!.feedback?.reward, 0.25);
    assert.deepEqual(patched.episode!.metadata, { reviewed: true });
    assert.equal(patched.episode!.solution, "certbot renew, then reload nginx");
  });

  test("an episode whose block throws is recorded as a failure naming the error", async () => {
    const ep = memory.episode("migrate the database", { agent_id: id("db") });
    await assert.rejects(
      ep.run(async (e) => {
        e.action("shell", { input: "alembic upgrade head", success: false, error: "lock timeout" });
        throw new Error("lock timeout");
      }),
      /lock timeout/,
    );
    const stored = await memory.waitUntilRecallable(ep.episodeId, 10);
    assert.equal(stored.episode!.outcome, "failure");
    assert.match(stored.episode!.outcome_details ?? "", /Error: lock timeout/);
  });

  test("ttl counts from completion; a repeated record is the same episode", async () => {
    const episodeId = id("ttl-é✓");
    const episode = { episode_id: episodeId, task: "short-lived", outcome: "success" as const, ttl: "1h", agent_id: id("ttl") };
    await memory.record(episode, { wait: 10 });
    await memory.record(episode, { wait: 10 });
    const got = await memory.getEpisode(episodeId);
    const expires = Date.parse(String(got.episode!.expires_at)) / 1000;
    const completed = Date.parse(String(got.episode!.completed_at)) / 1000;
    assert.ok(Math.abs(expires - completed - 3600) < 2, `${got.episode!.expires_at} vs ${got.episode!.completed_at}`);
    const listed = [];
    for await (const e of memory.listEpisodes({ agent_id: id("ttl") })) listed.push(e.episode_id);
    assert.deepEqual(listed, [episodeId]);
    const dated = await memory.record({ task: "dated", outcome: "success", agent_id: id("ttl"), completed_at: new Date("2026-01-02T03:04:05Z") }, { wait: 10 });
    assert.equal(Date.parse(String((await memory.getEpisode(dated)).episode!.completed_at)), Date.parse("2026-01-02T03:04:05Z"));
    const since = [];
    for await (const e of memory.listEpisodes({ agent_id: id("ttl"), until: new Date("2026-01-03T00:00:00Z") })) since.push(e.episode_id);
    assert.deepEqual(since, [dated], "Dates are sent as ISO 8601 instants");
  });
});

describe("the console's routes", () => {
  test("summary counts the namespace; dead letters are listed, re-driven and discarded", async () => {
    await memory.record({ task: "count me", outcome: "success", agent_id: id("counted") }, { wait: 10 });
    const summary = await memory.summary();
    assert.ok(summary.episodes >= 1 && summary.agents >= 1 && Array.isArray(summary.expiring));

    // two events of the wrong vector dimension, published past the service by the suite's stack
    const dead = await until(async () => {
      const page = await memory.deadLetters({ limit: 100 });
      return page.total >= 2 ? page : null;
    });
    assert.ok(dead);
    const ours = dead.results.filter((d) => d.episode_id.startsWith("ts-dead-"));
    assert.deepEqual(ours.map((d) => d.episode_id).sort(), ["ts-dead-1", "ts-dead-2"]);
    assert.ok(ours[0]!.reason.includes("vector") && ours[0]!.at.endsWith("Z"));
    assert.deepEqual(await memory.redriveDeadLetters([ours[0]!.id, "0-1"]), { done: 1, unknown: ["0-1"] });
    assert.deepEqual(await memory.discardDeadLetters([ours[1]!.id]), { done: 1, unknown: [] });
    await assert.rejects(memory.discardDeadLetters(["0-1"]), ResourceNotFound);
  });
});

describe("ids", () => {
  test("Unicode, slashes, dots and spaces in ids round-trip through every path", async () => {
    const ids = [id("épisode/ünïcode ✓ 中文"), id(".."), id("a?b#c%d&e=f"), id("emoji 🦀"), id("sp ace+plus")];
    const user = id("user/ñ 🦀");
    for (const episodeId of ids) {
      assert.equal(await memory.record({ episode_id: episodeId, task: "odd ids", outcome: "success", user_id: user }, { wait: 10 }), episodeId);
      assert.equal((await memory.getEpisode(episodeId)).episode!.episode_id, episodeId);
    }
    const forgot = await memory.forgetEpisode(ids[0]!, { wait: 10 });
    assert.equal(forgot.episode_id, ids[0]);
    assert.equal(forgot.forgotten, true);
    await assert.rejects(memory.getEpisode(ids[0]!), ResourceNotFound);
    const gone = await memory.forgetUser(user, { wait: 10 });
    assert.equal(gone.user_id, user);
    assert.equal(gone.forgotten, true);
    for (const episodeId of ids) await assert.rejects(memory.getEpisode(episodeId), ResourceNotFound);
  });

  test("an id JSON or a URL cannot carry is refused naming the field, nothing sent", async () => {
    await assert.rejects(memory.getEpisode(""), (e: unknown) => e instanceof InvalidRequest && e.errors[0]!.field === "episode_id");
    for (const dots of [".", ".."]) {
      await assert.rejects(memory.getEpisode(dots), (e: unknown) => e instanceof InvalidRequest && /dot segment/.test(e.errors[0]!.reason));
    }
    await assert.rejects(memory.getEpisode("bad\ud800"), (e: unknown) => e instanceof InvalidRequest && e.errors[0]!.field === "episode_id");
    await assert.rejects(memory.forgetUser("u", { wait: 31 }), (e: unknown) => e instanceof InvalidRequest && e.errors[0]!.field === "wait");
  });
});

describe("forgetting", () => {
  test("forgetEpisode/User/Agent/Session with wait erase before they answer", async () => {
    const agent = id("forget-agent"), session = id("forget-session"), user = id("forget-user");
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push(await memory.record({ task: `agent task ${i}`, outcome: "success", agent_id: agent }, { wait: 10 }));
    for (let i = 0; i < 2; i++) ids.push(await memory.record({ task: `session task ${i}`, outcome: "success", session_id: session }, { wait: 10 }));
    const agentJob = await memory.forgetAgent(agent, { wait: 10 });
    assert.equal(agentJob.status, "done");
    assert.equal(agentJob.episodes, 3);
    const sessionJob = await memory.forgetSession(session, { wait: 10 });
    assert.equal(sessionJob.status, "done");
    for (const episodeId of ids) await assert.rejects(memory.getEpisode(episodeId), ResourceNotFound);
    const recalled = await memory.recall("agent task", { agent_id: agent });
    assert.equal(recalled.results.length, 0);

    const kept = await memory.record({ task: "a user's task", outcome: "success", user_id: user }, { wait: 10 });
    const forgotten = await memory.forgetEpisode(kept, { wait: 10 });
    assert.equal(forgotten.forgotten, true);
    await assert.rejects(memory.record({ episode_id: kept, task: "again", outcome: "success" }), EpisodeForgotten);
    await assert.rejects(memory.forgetEpisode(id("never-stored")), ResourceNotFound);
    assert.equal((await memory.forgetUser(user, { wait: 10 })).user_id, user);
  });
});

describe("pagination", () => {
  test("listEpisodes walks the cursor: every episode once while others are written", async () => {
    const agent = id("pages");
    const before: string[] = [];
    for (let i = 0; i < 25; i++) before.push(await memory.record({ task: `page task ${i}`, outcome: "success", agent_id: agent, completed_at: 1_700_000_000 + i }));
    await until(async () => (await memory.listEpisodesPage({ agent_id: agent, limit: 1000 })).results.length === 25);
    const seen: StoredEpisode[] = [];
    const writes: Promise<string>[] = [];
    let n = 0;
    for await (const e of memory.listEpisodes({ agent_id: agent, limit: 4 })) {
      seen.push(e);
      // concurrent writes: newer than the cursor (newest first), so never on a later page
      writes.push(memory.record({ task: `late task ${n++}`, outcome: "success", agent_id: agent }));
    }
    await Promise.all(writes);
    const listed = seen.map((e) => e.episode_id);
    assert.equal(new Set(listed).size, listed.length, "an episode came twice");
    for (const episodeId of before) assert.ok(listed.includes(episodeId), `${episodeId} missing`);
    assert.deepEqual(listed, [...before].reverse());
  });
});

describe("large episodes", () => {
  test("a ~4.5 MB episode goes in parts and is stored whole", async () => {
    const big = (c: string) => c.repeat(990_000);
    const actions = Array.from({ length: 1200 }, (_, i) => ({ action_type: "step", input: `step ${i} ` + "x".repeat(300), success: true }));
    const episodeId = await memory.record(
      { task: "index the whole monorepo", outcome: "success", solution: big("s"), observation: big("o"), thoughts: big("t"), result: big("ü"), actions, agent_id: id("big") },
      { wait: 20 },
    );
    const got = await memory.getEpisode(episodeId);
    assert.equal(got.episode!.solution?.length, 990_000);
    assert.equal(got.episode!.result, big("ü"));
    assert.equal(got.episode!.actions?.length, 1200);
  });
});

describe("errors", () => {
  test("a 422 problem+json becomes BadRequest with status, title, detail and field errors", async () => {
    await assert.rejects(
      memory.record({ task: "bad reward", outcome: "success", feedback: { reward: "high" as unknown as number } }),
      (e: unknown) => {
        assert.ok(e instanceof BadRequest);
        assert.equal(e.status, 422);
        assert.ok(e.title.length > 0 && typeof e.detail === "string");
        assert.ok(e.errors.some((f) => f.field === "feedback.reward"), JSON.stringify(e.errors));
        assert.equal(e.body.status, 422);
        assert.equal(e.episodeIds.length, 1);
        return true;
      },
    );
    await assert.rejects(memory.recall("x", { top_k: 0 }), (e: unknown) => e instanceof BadRequest && e.errors[0]!.field === "top_k");
  });

  test("a wrong key is Unauthorized; an unreachable service ConnectionFailed, not applied", async () => {
    const stranger = new Engram(env.ENGRAM_URL, { apiKey: "not-a-key-0000000000000000000000" });
    await assert.rejects(stranger.recall("anything"), (e: unknown) => e instanceof Unauthorized && e.status === 401);
    const closed = await new Promise<number>((resolve) => {
      const server = createServer().listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo;
        server.close(() => resolve(port));
      });
    });
    const nowhere = new Engram(`http://127.0.0.1:${closed}`, { maxRetries: 1, maxRetryWait: 0.05 });
    await assert.rejects(nowhere.recall("anything"), (e: unknown) => e instanceof ConnectionFailed && e.maybeApplied === false);
  });

  test("a request that never left says why (refused, unknown host, a port fetch blocks), not applied", async () => {
    const closed = await new Promise<number>((resolve) => {
      const server = createServer().listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo;
        server.close(() => resolve(port));
      });
    });
    const cases: [string, RegExp][] = [
      [`http://127.0.0.1:${closed}`, /ECONNREFUSED/],
      ["http://engram.invalid:8080", /ENOTFOUND|EAI_AGAIN/],
      ["http://127.0.0.1:1", /bad port/],
    ];
    for (const [url, why] of cases) {
      const client = new Engram(url, { maxRetries: 0 });
      await assert.rejects(client.record({ task: "never sent", outcome: "success" }), (e: unknown) => {
        assert.ok(e instanceof ConnectionFailed, String(e));
        assert.equal(e.maybeApplied, false, `${url}: ${e.message}`);
        assert.match(e.message, why);
        assert.match(e.message, /could not be reached/);
        return true;
      });
    }
  });

  test("episode() and complete() refuse a name that is not an episode field, before sending", async () => {
    let sent = 0;
    const counting: typeof fetch = async (input, init) => {
      sent++;
      return fetch(input, init);
    };
    const client = new Engram(env.ENGRAM_URL!, { apiKey: env.ENGRAM_API_KEY, fetch: counting });
    const ep = client.episode("a draft that asks to wait", { agent_id: id("fields") });
    const wrong = { wait: 10 } as never; // what a caller without types may pass
    await assert.rejects(ep.complete("success", wrong), (e: unknown) => {
      assert.ok(e instanceof InvalidRequest);
      assert.equal(e.errors[0]!.field, "wait");
      assert.match(e.message, /waitUntilRecallable/);
      return true;
    });
    assert.throws(() => client.episode("typo", { agentid: "a" } as never), (e: unknown) => e instanceof InvalidRequest && e.errors[0]!.field === "agentid");
    assert.equal(sent, 0);
    await ep.complete("success", { solution: "the fields it knows" });
    assert.equal(sent, 1);
    assert.equal((await client.waitUntilRecallable(ep.episodeId, 10)).episode!.solution, "the fields it knows");
  });

  test("a timeout is ConnectionFailed that may have been applied; a recall with touch is not retried", async () => {
    let calls = 0;
    const slow: typeof fetch = async (input, init) => {
      calls++;
      return new Promise((_, reject) => init?.signal?.addEventListener("abort", () => reject(init.signal!.reason)));
    };
    const alive = setInterval(() => {}, 1000); // AbortSignal.timeout's timer does not keep Node running
    const impatient = new Engram(env.ENGRAM_URL, { timeout: 0.05, maxRetries: 2, maxRetryWait: 0.01, fetch: slow });
    await assert.rejects(impatient.recall("x", { touch: true }), (e: unknown) => e instanceof ConnectionFailed && e.maybeApplied);
    assert.equal(calls, 1);
    calls = 0;
    await assert.rejects(impatient.recall("x"), ConnectionFailed);
    assert.equal(calls, 3);
    clearInterval(alive);
  });

  test("an answer lost after the service applied a record is retried, and the episode is stored once", async () => {
    let posts = 0;
    const lossy: typeof fetch = async (input, init) => {
      const response = await fetch(input, init);
      if (init?.method === "POST" && ++posts === 1) {
        await response.arrayBuffer(); // applied by the service; the answer never reaches the caller
        throw new TypeError("fetch failed", { cause: Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }) });
      }
      return response;
    };
    const agent = id("lossy");
    const client = new Engram(env.ENGRAM_URL, { apiKey: env.ENGRAM_API_KEY, fetch: lossy, maxRetryWait: 0.05 });
    const episodeId = await client.record({ task: "charge the card once", outcome: "success", agent_id: agent }, { wait: 10 });
    assert.equal(posts, 2);
    const stored = [];
    for await (const e of memory.listEpisodes({ agent_id: agent })) stored.push(e.episode_id);
    assert.deepEqual(stored, [episodeId]);

    posts = 0;
    await assert.rejects(client.recall("charge the card", { touch: true }), (e: unknown) => e instanceof ConnectionFailed && e.maybeApplied);
    assert.equal(posts, 1, "a recall that counts accesses is not repeated after a lost answer");
  });

  test("429 past ENGRAM_MAX_LAG: RateLimited with its problem fields, retried after Retry-After within the bound", async () => {
    const options = { apiKey: env.ENGRAM_LAG_API_KEY };
    const strict = new Engram(env.ENGRAM_LAG_URL, { ...options, maxRetries: 0 });
    let refused: unknown = null;
    for (let i = 0; i < 6 && !refused; i++) {
      await strict.record({ episode_id: id(`queued-${i}`), task: `queued ${i}`, outcome: "success" }).catch((e: unknown) => (refused = e));
    }
    assert.ok(refused instanceof RateLimited, String(refused));
    assert.equal(refused.status, 429);
    assert.ok(refused.retryAfter !== null && refused.retryAfter >= 1);
    assert.equal(refused.body.max_lag, 2);
    assert.match(refused.detail, /behind/);
    assert.equal(refused.episodeIds.length, 1);

    const patient = new Engram(env.ENGRAM_LAG_URL, { ...options, maxRetries: 2, maxRetryWait: 0.2 });
    const started = Date.now();
    await assert.rejects(patient.record({ episode_id: id("refused"), task: "one too many", outcome: "success" }), (e: unknown) => {
      assert.ok(e instanceof RateLimited);
      assert.deepEqual(e.episodeIds, [id("refused")]);
      return true;
    });
    const waited = (Date.now() - started) / 1000;
    assert.ok(waited >= 0.35 && waited < 3, `two retries, each wait capped at 0.2 s, took ${waited}s`);

    const honouring = new Engram(env.ENGRAM_LAG_URL, { ...options, maxRetries: 1, maxRetryWait: 30 });
    const before = Date.now();
    await assert.rejects(honouring.record({ task: "still too many", outcome: "success" }), RateLimited);
    const slept = (Date.now() - before) / 1000;
    assert.ok(slept >= refused.retryAfter! - 0.05 && slept < refused.retryAfter! + 3, `one retry after Retry-After ${refused.retryAfter}s took ${slept}s`);
  });
});
