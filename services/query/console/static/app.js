// Engram console: a client of the public HTTP API only (no build step, no library).
// The API key lives in memory, or in this tab's sessionStorage when the user asks; it is sent as the
// Authorization header of fetch calls, never in a URL, a cookie or a log line.
"use strict";

const KEY_STORE = "engram.console.key";
const COMPONENTS = ["similarity", "recency", "reward", "outcome", "importance"];
const LABELS = { similarity: "relevance", recency: "recency", reward: "reward", outcome: "outcome", importance: "importance" };
const OUTCOMES = ["success", "partial", "failure", "abandoned"];
const SNIPPET = `from engram_episodic import Engram
memory = Engram("${location.origin}", api_key="<your key>")
memory.record(task="fix the flaky login test", outcome="success",
              solution="freeze the clock", wait=10)`;

let key = sessionStorage.getItem(KEY_STORE);

// ---------------------------------------------------------------- DOM
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") Object.assign(el.style, v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k === "className" ? "class" : k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid !== null && kid !== undefined && kid !== false) el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}
const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const kid of kids.flat(Infinity)) if (kid) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}
const main = () => document.getElementById("main");
// Node.after / replaceChildren would render a null as the text "null": every insertion goes through these
const present = (nodes) => nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false);
function show(...nodes) {
  main().replaceChildren(...present(nodes));
}
function after(ref, ...nodes) {
  ref.after(...present(nodes));
}
// a task or fact text can be tens of thousands of characters: lists, hits, headings and dialogs show its
// start (the whole text in a tooltip only when short enough to read there); the episode page has it all
const CLIP = 160;
const clip = (text, n = CLIP) => {
  const t = String(text ?? "");
  return t.length <= n ? t : `${t.slice(0, n - 1).trimEnd()}…`;
};
const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : typeof x === "number" ? x.toFixed(d) : String(x));
const pct = (x) => (x === null || x === undefined ? "–" : `${Math.round(x * 100)} %`);
const when = (iso) => (iso ? iso.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC") : "–");
function field(label, input) {
  const id = input.id || `f-${label.replace(/\W+/g, "-").toLowerCase()}-${Math.random().toString(36).slice(2, 7)}`;
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), input);
}
const input = (name, value, attrs) => h("input", { name, value: value ?? "", ...attrs });
function select(name, options, value) {
  return h("select", { name }, options.map(([v, label]) => h("option", { value: v, selected: v === (value ?? "") }, label)));
}
const link = (href, text) => h("a", { href }, text);
const epLink = (id, text) => link(`#/episode/${encodeURIComponent(id)}`, clip(text ?? id));
const factLink = (f) => link(`#/fact/${encodeURIComponent(f.fact_id)}`, clip(f.text));

// ---------------------------------------------------------------- API
class ApiError extends Error {
  constructor(status, body) {
    const fields = (body?.errors || []).map((e) => `${e.field}: ${e.reason}`);
    super([body?.title || `HTTP ${status}`, body?.detail, ...fields].filter(Boolean).join(" — "));
    this.status = status;
    this.body = body;
    this.fields = (body?.errors || []).map((e) => e.field);
  }
}
/** A value refused in the page before any request: shown as an API 422 naming `field` would be. */
class FieldError extends ApiError {
  constructor(field, label, reason) {
    super(422, { title: "Invalid value", errors: [{ field: label, reason }] });
    this.fields = [field];
  }
}
/**
 * The number typed in `el` (an <input> named like the API field), or FieldError naming `label`: an
 * empty box is not 0. `min`/`max` bound it when given.
 */
function numberIn(el, label, { min, max } = {}) {
  const text = el.value.trim();
  const n = text === "" ? NaN : Number(text);
  if (!Number.isFinite(n)) throw new FieldError(el.name, label, text === "" ? "enter a number" : `${JSON.stringify(text)} is not a number`);
  if ((min !== undefined && n < min) || (max !== undefined && n > max)) throw new FieldError(el.name, label, `must be between ${min} and ${max}`);
  return n;
}
async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // relative: the console works behind a proxy that mounts the service under a prefix
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { title: text.slice(0, 200) };
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}
const get = (path, params) => api("GET", params ? `${path}?${query(params)}` : path);
const post = (path, body) => api("POST", path, body);
function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  return q.toString();
}

function problem(err, form) {
  // a 401/403 asks for a key; any other problem shows its title and the fields it names
  if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
    keyForm(err.status === 401 && key ? "This key is not valid here." : "This console needs an API key.");
    return h("span");
  }
  if (form && err.fields) {
    for (const name of err.fields) {
      const el = form.querySelector(`[name="${CSS.escape(name.split(".")[0])}"]`);
      if (el) el.setAttribute("aria-invalid", "true");
    }
  }
  return h("p", { class: "error", role: "alert" }, err.message || String(err));
}
/** Show `node` as the one status line of `form` (replacing its previous success or error line). */
function note(form, node) {
  form._note?.remove();
  form._note = node;
  after(form, node);
}
async function guarded(render, form) {
  form?._note?.remove();
  for (const el of form?.querySelectorAll("[aria-invalid]") || []) el.removeAttribute("aria-invalid");
  try {
    await render();
  } catch (err) {
    const node = problem(err, form);
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) return;
    if (form?.parentNode) note(form, node);
    else show(node);
  }
}

// ---------------------------------------------------------------- key
function keyForm(message) {
  const box = h("input", { type: "password", name: "key", autocomplete: "off", required: true });
  const keep = h("input", { type: "checkbox", name: "keep" });
  const form = h(
    "form",
    { class: "card key", "aria-labelledby": "key-title" },
    h("h1", { id: "key-title" }, "API key"),
    h("p", {}, message || "Enter the API key of the namespace to open."),
    field("API key", box),
    h("div", { class: "check" }, keep, h("label", { for: (keep.id = "keep") }, "Remember in this tab (session storage)")),
    h("button", { type: "submit" }, "Open"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = box.value.trim();
    sessionStorage.removeItem(KEY_STORE);
    if (keep.checked) sessionStorage.setItem(KEY_STORE, key);
    route();
  });
  show(form);
  box.focus();
}

// ---------------------------------------------------------------- charts (hand-drawn SVG)
function lineChart(title, series, { yMin = 0, yMax = 1, height = 180 } = {}) {
  const W = 600, H = height, L = 40, B = 22, T = 8;
  const n = Math.max(1, ...series.map((x) => x.points.length));
  const xs = (i) => L + (n <= 1 ? 0 : (i / (n - 1)) * (W - L - 8));
  const ys = (v) => T + (1 - (v - yMin) / (yMax - yMin || 1)) * (H - T - B);
  const ticks = [yMin, (yMin + yMax) / 2, yMax];
  return h(
    "figure",
    { class: "chart" },
    s(
      "svg",
      { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title },
      ticks.map((t) => [s("line", { x1: L, x2: W - 8, y1: ys(t), y2: ys(t), class: "grid" }), s("text", { x: L - 4, y: ys(t) + 4, "text-anchor": "end" }, fmt(t, 1))]),
      s("text", { x: L, y: H - 4 }, "1"),
      s("text", { x: W - 8, y: H - 4, "text-anchor": "end" }, `${n} episodes`),
      series.map((x, k) =>
        s("polyline", {
          class: `line c${k}`,
          fill: "none",
          points: x.points.map((v, i) => (v === null ? null : `${xs(i).toFixed(1)},${ys(Math.max(yMin, Math.min(yMax, v))).toFixed(1)}`)).filter(Boolean).join(" "),
        }),
      ),
    ),
    h("figcaption", {}, title, " — ", series.map((x, k) => h("span", { class: `key c${k}` }, x.name))),
  );
}
function bar(components, scale = 1) {
  // the weighted components of a hit, stacked: together as long as its priority
  const total = COMPONENTS.reduce((a, c) => a + components[c], 0);
  return h(
    "div",
    { class: "bar", role: "img", "aria-label": COMPONENTS.map((c) => `${LABELS[c]} ${fmt(components[c])}`).join(", ") + `; sum ${fmt(total)}` },
    COMPONENTS.map((c, k) => h("span", { class: `seg c${k}`, title: `${LABELS[c]} ${fmt(components[c])}`, "data-part": c, "data-value": components[c], style: { width: `${Math.max(0, (components[c] / scale) * 100)}%` } })),
  );
}
const legend = () => h("p", { class: "legend" }, COMPONENTS.map((c, k) => h("span", { class: `key c${k}` }, LABELS[c])));

// ---------------------------------------------------------------- views
function empty() {
  return h(
    "section",
    { class: "card" },
    h("h2", {}, "No episodes yet"),
    h("p", {}, "Record a first episode with the Python client (pip install ./client), then reload:"),
    h("pre", {}, h("code", {}, SNIPPET)),
  );
}

async function overview() {
  const [ready, sum, skills, curve] = await Promise.all([
    get("readyz").catch((e) => e.body || {}),
    get("v1/summary"),
    get("v1/skills"),
    get("v1/learning-curve", { window: 20, limit: 10000 }),
  ]);
  const total = skills.results.reduce((a, x) => a + x.episodes, 0);
  const wins = skills.results.reduce((a, x) => a + x.successes, 0);
  const stat = (label, value) => h("div", { class: "stat" }, h("dt", {}, label), h("dd", {}, value));
  show(
    h("h1", {}, "Overview"),
    sum.episodes === 0 ? empty() : null,
    h(
      "dl",
      { class: "stats" },
      stat("Episodes", sum.episodes.toLocaleString()),
      stat("Success rate", total ? pct(wins / total) : "–"),
      stat("Agents", sum.agents.toLocaleString()),
      stat("Users", sum.users.toLocaleString()),
      stat("Sessions", sum.sessions.toLocaleString()),
      stat("Facts", sum.facts.toLocaleString()),
      stat("Consumer lag", fmt(ready.lag, 0)),
      stat("Dead letters", fmt(ready.dead_letters, 0)),
    ),
    curve.results.length
      ? lineChart(`Success rate and reward over the last ${curve.window} episodes, oldest first`, [
          { name: "success rate", points: curve.results.map((p) => p.success_rate) },
          { name: "average reward", points: curve.results.map((p) => p.avg_reward) },
        ])
      : null,
    h("h2", {}, "Expiring soonest"),
    sum.expiring.length
      ? h("ul", {}, sum.expiring.map((e) => h("li", {}, when(e.expires_at), " — ", epLink(e.episode_id))))
      : h("p", { class: "muted" }, "No episode has an expiry."),
  );
}

const EPISODE_FILTERS = ["agent_id", "user_id", "session_id", "category", "outcome", "since", "until", "order"];
async function episodes(_, params) {
  const form = h(
    "form",
    { class: "filters", "aria-label": "Episode filters" },
    field("Agent", input("agent_id", params.get("agent_id"))),
    field("User", input("user_id", params.get("user_id"))),
    field("Session", input("session_id", params.get("session_id"))),
    field("Category", input("category", params.get("category"))),
    field("Outcome", select("outcome", [["", "any"], ...OUTCOMES.map((o) => [o, o])], params.get("outcome"))),
    field("Since", input("since", params.get("since"), { placeholder: "2026-01-01T00:00:00Z" })),
    field("Until", input("until", params.get("until"), { placeholder: "2026-12-31T00:00:00Z" })),
    field("Order", select("order", [["desc", "newest first"], ["asc", "oldest first"]], params.get("order") || "desc")),
    h("button", { type: "submit" }, "Filter"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = `#/episodes?${query(Object.fromEntries(new FormData(form)))}`;
  });
  show(h("h1", {}, "Episodes"), form);
  await guarded(async () => {
    const filters = Object.fromEntries(EPISODE_FILTERS.map((f) => [f, params.get(f)]));
    const page = await get("v1/episodes", { ...filters, limit: 50, cursor: params.get("cursor") });
    if (!page.results.length && !params.toString()) {
      after(form, empty());
      return;
    }
    const table = h(
      "table",
      {},
      h("caption", { class: "muted" }, `${page.results.length} episodes on this page`),
      h("thead", {}, h("tr", {}, ["Completed", "Task", "Category", "Agent", "Outcome", "Reward"].map((c) => h("th", { scope: "col" }, c)))),
      h(
        "tbody",
        {},
        page.results.map((e) =>
          h(
            "tr",
            { "data-episode": e.episode_id },
            h("td", {}, when(e.completed_at)),
            h("td", {}, epLink(e.episode_id, e.task.description)),
            h("td", {}, e.task.category),
            h("td", {}, e.agent_id || "–"),
            h("td", {}, h("span", { class: `outcome ${e.outcome}` }, e.outcome)),
            h("td", {}, fmt(e.feedback?.reward, 2)),
          ),
        ),
      ),
    );
    const nav = h(
      "p",
      { class: "pager" },
      params.get("cursor") ? link(`#/episodes?${query(filters)}`, "First page") : null,
      page.next_cursor ? link(`#/episodes?${query({ ...filters, cursor: page.next_cursor })}`, "Next page") : null,
    );
    after(form, h("div", { class: "scroll" }, table), nav);
  }, form);
}

async function episode(id, _params, saved) {
  const [answer, facts] = await Promise.all([get(`v1/episodes/${encodeURIComponent(id)}`), get("v1/facts", { episode_id: id, include_superseded: true })]);
  const e = answer.episode;
  if (!e) {
    show(h("h1", {}, "Episode"), h("p", {}, `Episode ${id} is ${answer.status}.`));
    return;
  }
  const evidenceOf = facts.results;
  const row = (label, value) => [h("dt", {}, label), h("dd", {}, value ?? "–")];
  const reward = h("input", { name: "reward", type: "number", step: "any", value: e.feedback?.reward ?? "" });
  const patch = h("form", { class: "inline", "aria-label": "Change the reward" }, field("Reward", reward), h("button", { type: "submit" }, "Save reward"));
  patch.addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const value = numberIn(reward, "Reward");
      const done = await api("PATCH", `v1/episodes/${encodeURIComponent(id)}?wait=5`, { feedback: { reward: value } });
      // the PATCH answers no episode: show it as the API now reads it
      await episode(id, null, done.projected === false ? "Reward saved; the episode shows it once the consolidator has applied it." : "Reward saved.");
    }, patch);
  });
  const status = saved ? h("p", { class: "ok", role: "status" }, saved) : null;
  patch._note = status;
  const dialog = h(
    "dialog",
    { "aria-labelledby": "forget-title" },
    h("h2", { id: "forget-title" }, "Forget this episode?"),
    h("p", {}, `This erases episode ${id} ("${clip(e.task.description)}"): its actions, solution, feedback and vector, everywhere recall, lists and exports read.`),
    h(
      "form",
      { method: "dialog" },
      h("button", { value: "cancel" }, "Cancel"),
      h("button", { value: "forget", class: "danger" }, "Forget it"),
    ),
  );
  dialog.addEventListener("close", () => {
    if (dialog.returnValue !== "forget") return;
    guarded(async () => {
      await api("DELETE", `v1/episodes/${encodeURIComponent(id)}`);
      location.hash = "#/episodes";
    });
  });
  show(
    h("h1", {}, clip(e.task.description)),
    e.task.description.length > CLIP ? h("details", { class: "task" }, h("summary", {}, `The whole task (${e.task.description.length.toLocaleString()} characters)`), h("pre", {}, e.task.description)) : null,
    h(
      "dl",
      { class: "props" },
      row("Episode", e.episode_id),
      row("Outcome", h("span", { class: `outcome ${e.outcome}` }, e.outcome)),
      row("Category", e.task.category),
      row("Agent / user / session", [e.agent_id, e.user_id, e.session_id].map((x) => x || "–").join(" / ")),
      row("Strategy", e.strategy_used),
      row("Importance", e.importance),
      row("Reward", fmt(e.feedback?.reward, 2)),
      row("Feedback", e.feedback?.message),
      row("Started", when(e.started_at)),
      row("Completed", when(e.completed_at)),
      row("Duration", e.duration_s === null || e.duration_s === undefined ? "–" : `${fmt(e.duration_s, 1)} s`),
      row("Accessed", `${answer.access_count ?? 0} times, last ${when(answer.last_accessed)}`),
      row("Expires", when(e.expires_at)),
    ),
    h("h2", {}, "Actions"),
    e.actions?.length
      ? h(
          "ol",
          { class: "timeline" },
          e.actions.map((a) =>
            h(
              "li",
              { class: a.success === false ? "failed" : null },
              h("strong", {}, a.action_type),
              a.timestamp ? h("span", { class: "muted" }, ` ${when(a.timestamp)}`) : null,
              a.input ? h("div", {}, "in: ", a.input) : null,
              a.output ? h("div", {}, "out: ", a.output) : null,
              a.error ? h("div", { class: "error" }, a.error) : null,
            ),
          ),
        )
      : h("p", { class: "muted" }, "No actions recorded."),
    h("h2", {}, "Solution"),
    h("pre", {}, e.solution || "–"),
    h("h2", {}, "Evidence for facts"),
    evidenceOf.length ? h("ul", {}, evidenceOf.map((f) => h("li", {}, factLink(f)))) : h("p", { class: "muted" }, "No fact cites it (yet)."),
    h("h2", {}, "Change"),
    patch,
    status,
    h("p", {}, h("button", { type: "button", class: "danger", onclick: () => dialog.showModal() }, "Forget this episode…")),
    dialog,
  );
}

// ---------------------------------------------------------------- recall playground
const PRESETS = ["", "auto", "early", "normal", "late"];
function settingsForm(side, params) {
  const p = (k) => params.get(`${side}.${k}`);
  const custom = p("weights") === "custom";
  const sliders = COMPONENTS.map((c) =>
    field(`${LABELS[c]} weight`, h("input", { type: "range", min: 0, max: 1, step: 0.05, name: `${side}.${c}`, value: p(c) ?? "0.2" })),
  );
  const weights = h("fieldset", { class: "weights", disabled: !custom }, h("legend", {}, "Weights"), sliders);
  const mode = select(`${side}.mode`, [["", "service default"], ["vector", "vector"], ["keyword", "keyword"], ["hybrid", "hybrid"]], p("mode"));
  const kind = select(`${side}.weights`, [["preset", "preset"], ["custom", "custom weights"]], custom ? "custom" : "preset");
  kind.addEventListener("change", () => (weights.disabled = kind.value !== "custom"));
  return h(
    "fieldset",
    { class: "setting" },
    h("legend", {}, `Setting ${side}`),
    field("Mode", mode),
    field("Weights from", kind),
    field("Preset", select(`${side}.preset`, PRESETS.map((x) => [x, x || "service default"]), p("preset"))),
    weights,
  );
}
function recallBody(params, side) {
  const p = (k) => params.get(`${side}.${k}`);
  const body = { query: params.get("query") || "", top_k: Number(params.get("top_k") || 10) };
  for (const f of ["agent_id", "user_id", "session_id", "category", "outcome", "since", "until"]) if (params.get(f)) body[f] = params.get(f);
  if (p("mode")) body.mode = p("mode");
  if (p("weights") === "custom") body.weights = Object.fromEntries(COMPONENTS.map((c) => [c, Number(p(c) ?? 0.2)]));
  else if (p("preset")) body.preset = p("preset");
  return body;
}
function hitList(answer, other, top) {
  // `top`: the longest bar's priority, the same for both sides so that their bars compare
  const rankIn = new Map((other?.results || []).map((r, i) => [r.episode.episode_id, i]));
  return h(
    "ol",
    { class: "hits" },
    answer.results.map((r, i) => {
      const id = r.episode.episode_id;
      let move = null;
      if (other) {
        const j = rankIn.get(id);
        move = j === undefined ? "new" : j === i ? "=" : j > i ? `▲${j - i}` : `▼${i - j}`;
      }
      return h(
        "li",
        { "data-episode": id, "data-priority": r.priority },
        h("div", { class: "hit-head" }, epLink(id, r.episode.task.description), move ? h("span", { class: "move", "aria-label": `rank change ${move}` }, move) : null, h("span", { class: "prio" }, fmt(r.priority))),
        bar(r.components, top),
      );
    }),
  );
}
async function recall(_, params) {
  const form = h(
    "form",
    { class: "playground", "aria-label": "Recall request" },
    field("Query", h("input", { name: "query", value: params.get("query") || "", required: true, class: "wide" })),
    h(
      "div",
      { class: "row" },
      ["agent_id", "user_id", "session_id", "category"].map((f) => field(f.replace("_id", ""), input(f, params.get(f)))),
      field("Outcome", select("outcome", [["", "any"], ...OUTCOMES.map((o) => [o, o])], params.get("outcome"))),
      field("Since", input("since", params.get("since"), { placeholder: "2026-01-01T00:00:00Z" })),
      field("Until", input("until", params.get("until"), { placeholder: "2026-12-31T00:00:00Z" })),
      field("Top k", h("input", { name: "top_k", type: "number", min: 1, max: 100, value: params.get("top_k") || 10 })),
    ),
    h("div", { class: "row settings" }, settingsForm("A", params), params.get("compare") ? settingsForm("B", params) : null),
    h("div", { class: "check" }, h("input", { type: "checkbox", id: "compare", name: "compare", value: "1", checked: !!params.get("compare") }), h("label", { for: "compare" }, "Compare with a second setting")),
    h("button", { type: "submit" }, "Recall"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const q = new URLSearchParams();
    for (const [k, v] of data) if (v !== "") q.set(k, v);
    location.hash = `#/recall?${q}`;
  });
  // the second setting appears (or goes) at once; the next Recall runs both (no submit: the query may be empty yet)
  form.querySelector("#compare").addEventListener("change", (ev) => {
    const row = form.querySelector(".settings");
    if (ev.currentTarget.checked) row.append(settingsForm("B", params));
    else row.children[1]?.remove();
  });
  show(h("h1", {}, "Recall playground"), form);
  if (!params.get("query")) return;
  await guarded(async () => {
    const a = recallBody(params, "A");
    const scope = Object.fromEntries(["agent_id", "user_id", "session_id", "category"].filter((f) => a[f]).map((f) => [f, a[f]]));
    const started = performance.now();
    const [ra, rb, ctx] = await Promise.all([
      post("v1/recall", a),
      params.get("compare") ? post("v1/recall", recallBody(params, "B")) : null,
      post("v1/context", { task: a.query, ...scope }),
    ]);
    const top = Math.max(1e-9, ...[...ra.results, ...(rb?.results || [])].map((r) => r.priority));
    const weights = (w) => h("p", { class: "muted" }, "weights ", COMPONENTS.map((c) => `${LABELS[c]} ${fmt(w[c], 2)}`).join(" · "));
    const out = h(
      "section",
      { class: "results" },
      legend(),
      h(
        "div",
        { class: "row" },
        h("div", { class: "side", "data-side": "A" }, h("h2", {}, "Setting A"), weights(ra.weights), hitList(ra, null, top)),
        rb ? h("div", { class: "side", "data-side": "B" }, h("h2", {}, "Setting B"), weights(rb.weights), hitList(rb, ra, top)) : null,
      ),
      h("h2", {}, "Replay context"),
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, ["Strategy", "Priority", "Episodes", "Avg reward", "Success"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, ra.replay_context.strategies.map((x) => h("tr", {}, h("td", {}, x.strategy), h("td", {}, fmt(x.priority)), h("td", {}, x.episodes), h("td", {}, fmt(x.avg_reward, 2)), h("td", {}, pct(x.success_rate))))),
      ),
      h("h2", {}, "Prompt section (/v1/context)"),
      h("pre", { class: "prompt" }, ctx.prompt),
    );
    after(form, out);
    out.dataset.ms = String(Math.round(performance.now() - started)); // request to rendered hits (make bench)
  }, form);
}

// ---------------------------------------------------------------- learning
async function learning(_, params) {
  const form = h(
    "form",
    { class: "filters", "aria-label": "Learning scope" },
    field("Agent", input("agent_id", params.get("agent_id"))),
    field("Category", input("category", params.get("category"))),
    field("Task for suggest", input("task", params.get("task"), { class: "wide" })),
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = `#/learning?${query(Object.fromEntries(new FormData(form)))}`;
  });
  show(h("h1", {}, "Learning"), form);
  await guarded(async () => {
    const scope = { agent_id: params.get("agent_id"), category: params.get("category") };
    const task = params.get("task");
    const who = scope.agent_id ? { agent_id: scope.agent_id } : {};
    const [curve, skills, strategies, advice, choice] = await Promise.all([
      get("v1/learning-curve", { ...scope, window: 10 }),
      get("v1/skills", { agent_id: scope.agent_id }),
      get("v1/facts", { ...scope, kind: "strategy", include_superseded: true, limit: 200 }),
      task ? post("v1/suggest", { task, ...who }) : null,
      task ? post("v1/strategy", { task, ...who }) : null,
    ]);
    const perCategory = scope.category
      ? []
      : await Promise.all(
          skills.results.slice(0, 6).map(async (x) => [x.category, await get("v1/learning-curve", { agent_id: scope.agent_id, category: x.category, window: 10 })]),
        );
    after(
      form,
      lineChart(`Learning curve (rolling ${curve.window})`, [
        { name: "success rate", points: curve.results.map((p) => p.success_rate) },
        { name: "average reward", points: curve.results.map((p) => p.avg_reward) },
      ]),
      perCategory.length > 1
        ? h(
            "div",
            { class: "small-multiples" },
            perCategory.map(([category, c]) =>
              lineChart(category, [
                { name: "success rate", points: c.results.map((p) => p.success_rate) },
                { name: "average reward", points: c.results.map((p) => p.avg_reward) },
              ], { height: 140 }),
            ),
          )
        : null,
      h("h2", {}, "Skill profile"),
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, ["Category", "Episodes", "Success", "Avg reward", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, skills.results.map((x) => h("tr", { class: x.weak ? "weak" : null }, h("td", {}, x.category), h("td", {}, x.episodes), h("td", {}, pct(x.success_rate)), h("td", {}, fmt(x.avg_reward, 2)), h("td", {}, x.weak ? "weak" : "")))),
      ),
      h("h2", {}, "Strategies"),
      strategies.results.length
        ? h(
            "table",
            {},
            h("thead", {}, h("tr", {}, ["Strategy fact", "Support", "Success", "Avg reward", "Evidence until", "Status"].map((c) => h("th", { scope: "col" }, c)))),
            h(
              "tbody",
              {},
              strategies.results.map((f) =>
                h("tr", { class: f.status === "superseded" ? "weak" : null }, h("td", {}, factLink(f)), h("td", {}, f.support), h("td", {}, pct(f.success_rate)), h("td", {}, fmt(f.avg_reward, 2)), h("td", {}, when(f.last_at)), h("td", {}, f.status === "superseded" ? "stopped working" : f.status || "current")),
              ),
            ),
          )
        : h("p", { class: "muted" }, "No strategy facts yet (the consolidator distils them, or POST /v1/consolidate)."),
      choice ? h("p", { class: "card" }, h("strong", {}, `Use ${choice.strategy}`), ` (${choice.rule}): ${choice.reason}`) : null,
      advice
        ? h(
            "section",
            { class: "card" },
            h("h2", {}, "Suggest and failure analysis"),
            h("p", {}, `Confidence ${advice.confidence}: ${advice.similar} similar episodes, ${advice.successes} succeeded, ${advice.failures} failed.`),
            h("h3", {}, "Common failures"),
            h("ul", {}, advice.common_failures.map((f) => h("li", {}, `${clip(f.message)} (${f.count})`))),
            h("h3", {}, "Strategies that worked"),
            h("ul", {}, advice.successful_strategies.map((f) => h("li", {}, `${f.strategy} (${f.count})`))),
            advice.changed.length ? [h("h3", {}, "Stopped working"), h("ul", {}, advice.changed.map((c) => h("li", {}, `${c.strategy}: since ${when(c.changed_at)}`)))] : null,
          )
        : null,
    );
  }, form);
}

// ---------------------------------------------------------------- facts
async function facts(_, params) {
  const form = h("form", { class: "filters", "aria-label": "Fact search" }, field("Search", input("q", params.get("q"), { class: "wide" })), h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = `#/facts?${query(Object.fromEntries(new FormData(form)))}`;
  });
  show(h("h1", {}, "Facts"), form);
  await guarded(async () => {
    const q = params.get("q");
    const found = q ? await post("v1/facts/search", { query: q }) : await get("v1/facts", { limit: 100, cursor: params.get("cursor") });
    after(
      form,
      found.results.length
        ? h("ul", { class: "facts" }, found.results.map((f) => h("li", {}, factLink(f), h("span", { class: "muted" }, ` ${factSort(f)}`))))
        : h("p", { class: "muted" }, q ? `No fact matches "${clip(q, 80)}".` : "No facts yet: the consolidator distils them from recorded episodes."),
      found.next_cursor ? h("p", {}, link(`#/facts?${query({ cursor: found.next_cursor })}`, "Next page")) : null,
    );
  }, form);
}
/** Where a fact was distilled: the whole namespace, or one agent × category of it. */
const factScope = (f) =>
  f.level === "agent_category" ? `agent ${f.agent_id ?? f.agents?.[0] ?? "–"} × ${f.category ?? f.categories?.[0] ?? "–"}` : "whole namespace";
/** What tells two facts of the same text apart: kind, level, support, status. */
function factSort(f) {
  return [f.kind, factScope(f), `support ${f.support}`, f.status === "superseded" ? "superseded" : null].filter(Boolean).join(", ");
}
async function fact(id) {
  const d = await get(`v1/facts/${encodeURIComponent(id)}`);
  const f = d.fact;
  show(
    h("h1", {}, clip(f.text)),
    f.text.length > CLIP ? h("details", { class: "task" }, h("summary", {}, "The whole text"), h("pre", {}, f.text)) : null,
    h("dl", { class: "props" }, [["Kind", f.kind], ["Level", factScope(f)], ["Support", f.support], ["Success rate", pct(f.success_rate)], ["From", when(f.first_at)], ["To", when(f.last_at)], ["Status", f.status], ["Version", f.version]].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "–")])),
    h("h2", {}, "Evidence"),
    h("ul", {}, d.evidence.map((e) => h("li", {}, epLink(e.episode_id, e.task.description)))),
    h("h2", {}, "History"),
    d.history.length ? h("ol", {}, d.history.map((v) => h("li", {}, `${clip(v.text)} (v${v.version ?? "?"})`))) : h("p", { class: "muted" }, "No earlier version."),
  );
}

// ---------------------------------------------------------------- operations
function ingestShape(e) {
  // as `engram export` writes it (what `engram import` reads): without the derived fields and the vector
  const { duration_s, vector, ...rest } = e;
  if (rest.feedback) {
    const { pass_rate, ...feedback } = rest.feedback;
    rest.feedback = feedback;
  }
  return rest;
}
async function operations() {
  const [ready, dead] = await Promise.all([get("readyz").catch((e) => e.body || {}), get("v1/dead-letters", { limit: 200 })]);
  const status = h("p", { role: "status" });
  const exportButton = h("button", { type: "button" }, "Export the namespace as JSONL");
  exportButton.addEventListener("click", () =>
    guarded(async () => {
      const lines = [];
      let cursor = null;
      do {
        const page = await get("v1/episodes", { order: "asc", limit: 1000, cursor });
        for (const e of page.results) lines.push(JSON.stringify(ingestShape(e)));
        cursor = page.next_cursor;
        status.textContent = `${lines.length} episodes…`;
      } while (cursor);
      const url = URL.createObjectURL(new Blob([lines.join("\n") + (lines.length ? "\n" : "")], { type: "application/x-ndjson" }));
      const a = h("a", { href: url, download: "engram-export.jsonl" });
      document.body.append(a);
      a.click();
      a.remove();
      status.textContent = `Exported ${lines.length} episodes.`;
    }),
  );
  const act = (verb, letter) =>
    guarded(async () => {
      if (verb === "discard" && !confirm(`Discard dead letter ${letter.id} (episode ${letter.episode_id})? Its event is deleted and never projected.`)) return;
      await post(`v1/dead-letters/${verb}`, { ids: [letter.id] });
      route();
    });
  show(
    h("h1", {}, "Operations"),
    h("dl", { class: "stats" }, h("div", { class: "stat" }, h("dt", {}, "Dead letters (this namespace)"), h("dd", {}, dead.total)), h("div", { class: "stat" }, h("dt", {}, "Consumer lag (deployment)"), h("dd", {}, fmt(ready.lag, 0)))),
    h("h2", {}, "Dead letters"),
    dead.results.length
      ? h(
          "table",
          { class: "dead" },
          h("thead", {}, h("tr", {}, ["When", "Episode", "Why", ""].map((c) => h("th", { scope: "col" }, c)))),
          h(
            "tbody",
            {},
            dead.results.map((d) =>
              h(
                "tr",
                { "data-dead": d.id },
                h("td", {}, when(d.at)),
                h("td", {}, d.episode_id),
                h("td", {}, d.reason),
                h("td", {}, h("button", { type: "button", onclick: () => act("redrive", d) }, "Redrive"), " ", h("button", { type: "button", class: "danger", onclick: () => act("discard", d) }, "Discard")),
              ),
            ),
          ),
        )
      : h("p", { class: "muted" }, "None: the consolidator projected every event of this namespace."),
    h("h2", {}, "Index generation"),
    h(
      "p",
      { "data-generations": "" },
      ready.generations
        ? `Recall reads generation ${ready.generations.live}; ` +
            (ready.generations.building === null ? "no replay or reindex is running." : `a replay or reindex is building generation ${ready.generations.building}.`)
        : "Unknown: the service did not say (GET /readyz).",
    ),
    h("p", { class: "muted" }, "Replay and reindex rebuild the whole deployment: the operator runs them with ", h("code", {}, "engram-admin replay"), " or ", h("code", {}, "engram-admin reindex"), "."),
    h("h2", {}, "Export"),
    exportButton,
    status,
  );
}

// ---------------------------------------------------------------- router
const VIEWS = { overview, episodes, episode, recall, learning, facts, fact, operations };
async function route() {
  const raw = location.hash.replace(/^#\/?/, "") || "overview";
  const [path, qs] = raw.split("?");
  const [name, ...rest] = path.split("/");
  const view = VIEWS[name] || overview;
  const section = name === "episode" ? "episodes" : name === "fact" ? "facts" : name;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.view === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.body.classList.remove("nav-open");
  document.title = `${section[0].toUpperCase()}${section.slice(1)} · Engram console`;
  show(h("p", { class: "muted" }, "Loading…"));
  main().setAttribute("aria-busy", "true");
  await guarded(() => view(decodeURIComponent(rest.join("/")), new URLSearchParams(qs || "")));
  main().setAttribute("aria-busy", "false");
  // the new view is announced from <main>, unless it put the focus in itself (the key form's box)
  if (!main().contains(document.activeElement)) main().focus({ preventScroll: true });
}
window.addEventListener("hashchange", route);
document.getElementById("change-key").addEventListener("click", () => keyForm());
document.getElementById("menu").addEventListener("click", (ev) => {
  const open = document.body.classList.toggle("nav-open");
  ev.currentTarget.setAttribute("aria-expanded", String(open));
});
route();
