/**
 * Publishing in parts, as the Python client does (`engram_episodic.parts`): one `POST /v1/episodes`
 * carries at most 1,000 episodes, 1,000 actions per episode and `maxBodyBytes` of JSON (the service's
 * ENGRAM_MAX_BODY_BYTES, 4 MiB by default). A larger episode is sent as several snapshots of itself:
 * each part carries its identity and every small field, and a share of its large fields (the text
 * fields and `context`) and of its actions. The service folds them field by field and unions actions,
 * so after the last part the stored episode is the whole one, and sending every part again changes
 * nothing.
 */
import { InvalidRequest } from "./errors.js";

export const DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024;
export const MAX_BATCH = 1000;
export const MAX_ACTIONS = 1000;
/** Fields a part may leave out (the fold keeps the stored value): the ones that can be large. */
export const SPLIT_FIELDS = [
  "observation",
  "thoughts",
  "action",
  "result",
  "solution",
  "outcome_details",
  "source",
  "context",
] as const;

type Json = Record<string, unknown>;
const encoder = new TextEncoder();
const ENVELOPE = encoder.encode('{"episodes":[]}').length;

/** `body` as the bytes sent: compact UTF-8 JSON (what the parts' sizes are counted in). */
export function encodeBody(body: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(body));
}

function size(value: unknown): number {
  return encodeBody(value).length;
}

const limit = (maxBytes: number) =>
  `one request carries at most ${maxBytes.toLocaleString("en-US")} bytes (the client's maxBodyBytes, the service's ENGRAM_MAX_BODY_BYTES)`;

/**
 * One episode (JSON-shaped) → its parts, each fitting one request of `maxBytes` alone with at most
 * `maxActions` actions. An episode that fits is one part, equal to it. Throws InvalidRequest naming
 * `episodes[index]` or the field or action that does not fit with the small fields.
 */
export function episodeParts(data: Json, index: number, maxBytes: number, maxActions = MAX_ACTIONS): Json[] {
  const budget = maxBytes - ENVELOPE;
  const split = new Set<string>(SPLIT_FIELDS);
  const core: Json = {};
  for (const [k, v] of Object.entries(data)) if (!split.has(k) && k !== "actions") core[k] = v;
  const coreSize = size(core);
  if (coreSize > budget) {
    throw new InvalidRequest([
      {
        field: `episodes[${index}]`,
        reason: `its fields other than the text fields, context and actions are ${coreSize.toLocaleString("en-US")} bytes as JSON; ${limit(maxBytes)}`,
      },
    ]);
  }
  const parts: Json[] = [];
  let fields: Json = {};
  let actions: unknown[] = [];
  let used = coreSize;
  const flush = () => {
    const part: Json = { ...core, ...fields };
    if (actions.length || (!parts.length && "actions" in data)) part.actions = actions;
    parts.push(part);
    fields = {};
    actions = [];
    used = coreSize;
  };
  const pieces: [string, unknown][] = SPLIT_FIELDS.filter((k) => data[k] != null).map((k) => [k, data[k]]);
  for (const a of (data.actions as unknown[] | null | undefined) ?? []) pieces.push(["actions", a]);
  let actionNo = 0;
  for (const [key, value] of pieces) {
    const isAction = key === "actions";
    const own = size(value);
    // a key adds `,"key":value`; an action `,` and itself, the first also `,"actions":[` and `]`
    const firstAction = 1 + '"actions":['.length + own + 1;
    let cost = isAction ? (actions.length ? 1 + own : firstAction) : 1 + size(key) + 1 + own;
    const hasAny = Object.keys(fields).length > 0 || actions.length > 0;
    if ((used + cost > budget || (isAction && actions.length >= maxActions)) && hasAny) {
      flush();
      if (isAction) cost = firstAction;
    }
    if (used + cost > budget) {
      const path = isAction ? `episodes[${index}].actions[${actionNo}]` : `episodes[${index}].${key}`;
      throw new InvalidRequest([
        {
          field: path,
          reason: `is ${own.toLocaleString("en-US")} bytes as JSON, ${coreSize.toLocaleString("en-US")} more with the episode's other fields; ${limit(maxBytes)}`,
        },
      ]);
    }
    if (isAction) {
      actions.push(value);
      actionNo += 1;
    } else {
      fields[key] = value;
    }
    used += cost;
  }
  flush();
  return parts;
}

/**
 * The `{"episodes": [...]}` bodies that publish `episodes` in order: each at most `maxBytes`,
 * `maxBatch` episodes, no episode twice in one body, every k-th part before any (k+1)-th. One body
 * when everything fits.
 */
export function requestBodies(episodes: Json[], maxBytes = DEFAULT_MAX_BODY_BYTES, maxBatch = MAX_BATCH): Json[] {
  const split = episodes.map((e, i) => episodeParts(e, i, maxBytes));
  const bodies: Json[] = [];
  const rounds = Math.max(0, ...split.map((p) => p.length));
  for (let round = 0; round < rounds; round++) {
    let batch: Json[] = [];
    let used = ENVELOPE;
    for (const parts of split) {
      if (round >= parts.length) continue;
      const part = parts[round]!;
      let cost = size(part) + (batch.length ? 1 : 0);
      if (batch.length && (used + cost > maxBytes || batch.length >= maxBatch)) {
        bodies.push({ episodes: batch });
        batch = [];
        used = ENVELOPE;
        cost -= 1;
      }
      batch.push(part);
      used += cost;
    }
    if (batch.length) bodies.push({ episodes: batch });
  }
  return bodies;
}
