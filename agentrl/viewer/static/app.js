// agentrl view: the single-page client. Hash routes: #/ (groups), #/infra, #/episode/ROW, #/group/STEP/UID,
// #/curves (training runs: curves.js), #/summary (eval directories: evalview.js). Everything is fetched from the
// JSON API of agentrl/viewer/server.py; nothing from the internet.
"use strict";

const app = document.getElementById("app");
const tip = document.getElementById("tip");
let runInfo = null;
let pollTimer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path) {
  const r = await fetch(path);
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${await r.text()}`);
  return r.json();
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

// an `agentrl eval` directory: no training steps, advantages, trainer logprobs or group variance to show
function isEval() {
  return runInfo.kind === "eval";
}

function rewardCell(r) {
  return h("td", { class: r > 0 ? "reward-pos" : "reward-zero" }, fmt(r));
}

// ------------------------------------------------------------------------------------------ groups and filters
const FILTER_KEYS = ["step_min", "step_max", "data_source", "reward_min", "reward_max", "finish_reason",
                     "error_kind", "zero_variance", "q"];
let filterState = {};
let page = 0;

function query(extra) {
  const p = new URLSearchParams();
  for (const k of FILTER_KEYS) if (filterState[k] !== undefined && filterState[k] !== "" && filterState[k] !== false)
    p.set(k, filterState[k]);
  for (const [k, v] of Object.entries(extra || {})) p.set(k, v);
  return p.toString();
}

function select(name, choices) {
  const s = h("select", { name }, h("option", { value: "" }, "any"),
              choices.map(c => h("option", { value: c }, c)));
  s.value = filterState[name] || "";
  return s;
}

function filterForm(onChange, { rewards = true } = {}) {
  const num = (name, step) => {
    const i = h("input", { type: "number", name, step: step || "any" });
    i.value = filterState[name] ?? "";
    return i;
  };
  const zv = h("input", { type: "checkbox", name: "zero_variance" });
  zv.checked = !!filterState.zero_variance;
  const q = h("input", { type: "search", name: "q", placeholder: "text in transcripts", size: 24 });
  q.value = filterState.q || "";
  const form = h("form", { class: "filters" },
    isEval() ? null : [h("label", {}, "step ≥", num("step_min", 1)), h("label", {}, "step ≤", num("step_max", 1))],
    h("label", {}, "data source", select("data_source", runInfo.data_sources)),
    rewards ? h("label", {}, "reward ≥", num("reward_min")) : null,
    rewards ? h("label", {}, "reward ≤", num("reward_max")) : null,
    h("label", {}, "finish reason", select("finish_reason", runInfo.finish_reasons)),
    h("label", {}, "tool error", select("error_kind", runInfo.error_kinds)),
    rewards && !isEval() ? h("label", {}, "zero-variance groups", zv) : null,
    h("label", {}, "search", q),
    h("button", { type: "submit" }, "apply"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const data = new FormData(form);
    filterState = {};
    for (const k of FILTER_KEYS) if (data.get(k)) filterState[k] = data.get(k);
    if (zv.checked) filterState.zero_variance = "true";
    page = 0;
    onChange();
  });
  return form;
}

async function showGroups() {
  const size = 20;
  const data = await api(`/api/groups?${query({ page, size })}`);
  const ev = isEval();
  // an eval directory: one group per task (its n samples); no step, advantage or reward spread to show
  const table = h("table", { id: "groups" },
    h("tr", {}, [ev ? null : "step", ev ? "task / sample" : "group / episode", ev ? null : "task", "source", "reward",
                 ev ? null : "advantage", "finish", "turns", "tool calls", "errors", "tokens (policy)"]
      .filter(t => t !== null).map(t => h("th", {}, t))));
  for (const g of data.groups) {
    table.append(h("tr", { class: "group-row" },
      ev ? null : h("td", {}, g.step),
      h("td", {}, h("a", { href: `#/group/${g.step}/${encodeURIComponent(g.uid)}` }, ev ? g.task_id : g.uid),
        " ", !ev && g.zero_variance ? h("span", { class: "badge zv" }, "zero variance") : null,
        g.infra_errors ? h("span", { class: "badge err" }, `${g.infra_errors} infra`) : null),
      ev ? null : h("td", {}, g.task_id), h("td", {}, g.data_source),
      h("td", {}, ev ? `mean ${fmt(g.reward_mean)}`
                     : `${fmt(g.reward_mean)} ± ${fmt(g.reward_std)}`),
      h("td", { colspan: ev ? 5 : 6 }, `${g.episodes.length} of ${g.size} ${ev ? "samples" : "episodes"} shown`)));
    for (const e of g.episodes) {
      table.append(h("tr", { class: "episode-row", "data-row": e.row,
                             onclick: () => { location.hash = `#/episode/${e.row}`; } },
        ev ? null : h("td", {}, ""),
        h("td", {}, h("a", { href: `#/episode/${e.row}` }, `#${e.sample_index}`),
          h("span", { class: "muted" }, ` ${e.episode_id}`)),
        ev ? null : h("td", {}, ""), h("td", {}, ""), rewardCell(e.reward), ev ? null : h("td", {}, fmt(e.advantage)),
        h("td", {}, e.finish_reason), h("td", {}, e.num_turns), h("td", {}, e.num_tool_calls),
        h("td", {}, e.error_kinds.map(k => h("span", { class: "badge err" }, k))),
        h("td", {}, `${e.response_tokens} (${e.policy_tokens})`)));
    }
  }
  const pages = Math.max(1, Math.ceil(data.total_groups / size));
  const pager = h("div", { class: "pager" },
    h("button", { disabled: page === 0, onclick: () => { page--; render(); } }, "◀ prev"),
    `page ${page + 1} of ${pages}`,
    h("button", { disabled: page + 1 >= pages, onclick: () => { page++; render(); } }, "next ▶"));
  app.replaceChildren(
    filterForm(render),
    h("div", { class: "summary", id: "summary" },
      ev ? `${data.total_groups} tasks, ${data.total_episodes} matching samples`
         : `${data.total_groups} groups, ${data.total_episodes} matching episodes`,
      data.indexing ? " (still indexing the run…)" : ""),
    pager, table);
  if (data.indexing) schedule(render, 1000);
}

async function showInfra() {
  const data = await api(`/api/infra?${query({ page: 0, size: 200 })}`);
  const table = h("table", { id: "infra" },
    h("tr", {}, [isEval() ? null : "step", "episode", "task", "finish", "stop detail", "what failed"]
      .filter(t => t !== null).map(t => h("th", {}, t))));
  for (const e of data.episodes) {
    table.append(h("tr", { class: "episode-row", onclick: () => { location.hash = `#/episode/${e.row}`; } },
      isEval() ? null : h("td", {}, e.step), h("td", {}, h("a", { href: `#/episode/${e.row}` }, e.episode_id)),
      h("td", {}, e.task_id), h("td", {}, e.finish_reason), h("td", {}, e.stop_detail || ""),
      h("td", {}, e.infra_detail || "")));
  }
  app.replaceChildren(filterForm(render, { rewards: false }),
    h("div", { class: "summary" }, `${data.total} infra-error episodes ` +
      (isEval() ? "(excluded from the success rates)" : "(not trained on, not in group statistics)")),
    table);
}

// ------------------------------------------------------------------------------------------------- one episode
let colourMode = "mask";
// one colour per weight version of an episode, oldest first (repeats after six versions)
const VERSION_COLOURS = ["#8ec5ff", "#ffb866", "#96dba0", "#e7a3dc", "#f4dc6a", "#86d9d4"];

function versionColour(data, version) {
  const k = data.weight_versions.indexOf(version);
  return k < 0 ? "" : VERSION_COLOURS[k % VERSION_COLOURS.length];
}

function colourFor(tok, mode, data) {
  if (tok.kind !== "policy" || mode === "mask") return "";
  if (mode === "version") return tok.ver === undefined ? "" : versionColour(data, tok.ver);
  if (mode === "advantage") {
    const advantage = data.advantage;
    if (advantage === null || advantage === undefined) return "";
    const a = Math.max(-1, Math.min(1, advantage / 2));
    return a >= 0 ? `rgba(40,160,70,${0.15 + 0.6 * a})` : `rgba(220,60,50,${0.15 - 0.6 * a})`;
  }
  if (tok.tlp === null || tok.tlp === undefined) return "";
  const d = Math.min(1, Math.abs(tok.lp - tok.tlp) / 0.5);
  return `rgba(230,120,0,${0.08 + 0.8 * d})`;
}

function tokenTip(tok) {
  const lines = [`token ${tok.i}  id ${tok.id}  ${tok.kind}${tok.turn >= 0 ? `  turn ${tok.turn}` : ""}`];
  if (tok.kind === "policy") {
    if (tok.ver !== undefined) lines.push(`weight version   ${tok.ver}`);
    lines.push(`rollout logprob  ${fmt(tok.lp, 5)}`);
    if (isEval()) return lines.join("\n");
    lines.push(`trainer logprob  ${fmt(tok.tlp, 5)}`);
    if (tok.tlp !== null && tok.tlp !== undefined) lines.push(`difference       ${fmt(tok.lp - tok.tlp, 5)}`);
  }
  return lines.join("\n");
}

function renderTokens(box, data) {
  box.replaceChildren();
  const frag = document.createDocumentFragment();
  for (const tok of data.tokens) {
    const span = document.createElement("span");
    span.className = `tok ${tok.kind}`;
    span.textContent = tok.text;
    span.dataset.i = tok.i;
    const bg = colourFor(tok, colourMode, data);
    if (bg) span.style.background = bg;
    frag.append(span);
  }
  box.append(frag);
}

function callBlock(c) {
  const resp = c.response || {};
  return h("div", { class: `call${c.error_kind ? " error" : ""}` },
    h("div", {}, h("b", {}, c.name), ` (turn ${c.turn}, ${c.call_id}) `,
      c.ok ? h("span", { class: "badge" }, "ok") : h("span", { class: "badge err" }, c.error_kind || "error"),
      ` ${fmt(c.latency_s)} s`, c.truncated ? h("span", { class: "badge" }, "truncated") : null),
    h("div", { class: "muted" }, "arguments"), h("pre", {}, JSON.stringify(c.arguments, null, 1)),
    c.raw ? [h("div", { class: "muted" }, "raw"), h("pre", {}, c.raw)] : null,
    resp.content !== undefined ? [h("div", { class: "muted" }, "response"), h("pre", {}, resp.content)] : null);
}

// the weight versions that sampled the episode's policy tokens, each in its colour (nothing for old episodes)
function versionsLine(data) {
  const versions = data.weight_versions;
  if (!versions.length) return null;
  return h("div", { class: "muted", id: "weight-versions", "data-versions": versions.join(",") },
    versions.length > 1 ? "sampled by weight versions " : "sampled by weight version ",
    versions.map(v => h("span", { class: "version", style: `background: ${versionColour(data, v)}` }, v)),
    versions.length > 1 ? " (new weights arrived while it ran)" : "");
}

async function showEpisode(row) {
  const data = await api(`/api/episode/${row}`);
  const s = data.summary;
  const versions = data.weight_versions;
  const box = h("div", { class: "tokens collapsed-prompt", id: "tokens" });
  box.addEventListener("mouseover", ev => {
    const i = ev.target.dataset && ev.target.dataset.i;
    if (i === undefined) return;
    tip.textContent = tokenTip(data.tokens[Number(i)]);
    tip.hidden = false;
  });
  box.addEventListener("mousemove", ev => { tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 12}px`; });
  box.addEventListener("mouseleave", () => { tip.hidden = true; });
  const modes = h("select", { id: "colour-mode", onchange: ev => { colourMode = ev.target.value; renderTokens(box, data); } },
    h("option", { value: "mask" }, "colour by response_mask"),
    isEval() ? null : h("option", { value: "advantage" }, "colour by advantage"),
    isEval() ? null : h("option", { value: "drift" }, "colour by drift |rollout − trainer logprob|"),
    versions.length ? h("option", { value: "version" }, "colour by weight version") : null);
  modes.value = [...modes.options].some(o => o.value === colourMode) ? colourMode : "mask";
  const promptToggle = h("label", {}, h("input", { type: "checkbox", id: "show-prompt",
    onchange: ev => box.classList.toggle("collapsed-prompt", !ev.target.checked) }), " show prompt tokens");
  const counts = { policy: 0, observation: 0, glue: 0 };
  for (const t of data.tokens) if (t.kind in counts) counts[t.kind]++;
  renderTokens(box, data);
  app.replaceChildren(
    h("div", { class: "panel" },
      h("h3", {}, `episode ${s.episode_id} `, h("a", { href: `#/group/${s.step}/${encodeURIComponent(s.uid)}` }, "(group)")),
      h("div", {}, isEval() ? "" : `step ${s.step} · `, `task ${s.task_id} · ${s.data_source} · reward `,
        h("b", {}, fmt(s.reward)), isEval() ? "" : ` · advantage ${fmt(data.advantage)}`,
        ` · ${s.finish_reason} (${data.metrics.stop_detail || ""})`,
        ` · ${s.num_turns} turns · ${s.num_tool_calls} tool calls`,
        s.infra_error ? h("span", { class: "badge err" }, `infra error: ${data.metrics.infra_detail || ""}`) : null),
      h("div", { class: "muted", id: "token-counts", "data-policy": counts.policy,
                 "data-mask-sum": data.sum_response_mask },
        `${data.prompt_tokens} prompt tokens · ${counts.policy} policy · ${counts.observation} observation · `,
        `${counts.glue} template glue · sum(response_mask) = ${data.sum_response_mask}`,
        data.has_trainer_logprobs || isEval() ? "" : " · trainer logprobs not recorded for this episode"),
      versionsLine(data)),
    h("div", { class: "panel" },
      h("div", { class: "legend" }, h("span", { class: "tok policy" }, "policy (mask 1)"),
        h("span", { class: "tok observation" }, "tool observation"), h("span", { class: "tok glue" }, "template glue"),
        h("span", { class: "tok prompt" }, "prompt"), " ", modes, " ", promptToggle),
      box),
    h("div", { class: "panel" }, h("h3", {}, "tool calls"),
      data.tool_calls.length ? data.tool_calls.map(callBlock) : h("div", { class: "muted" }, "none")));
}

// -------------------------------------------------------------------------------------------------- one group
function messageBlock(m) {
  const calls = (m.tool_calls || []).map(c => h("div", { class: "call" }, h("b", {}, c.function.name),
    h("pre", {}, JSON.stringify(c.function.arguments, null, 1))));
  return h("div", { class: `msg ${m.role}` }, h("div", { class: "role" }, m.role, m.name ? ` · ${m.name}` : ""),
    m.content ? h("pre", {}, m.content) : null, calls);
}

async function showGroup(step, uid) {
  const data = await api(`/api/group/${step}/${encodeURIComponent(uid)}`);
  const cols = data.episodes.map(e => h("div", { class: "panel", "data-row": e.row },
    h("div", {}, h("a", { href: `#/episode/${e.row}` }, `#${e.sample_index}`), " reward ", h("b", {}, fmt(e.reward)),
      isEval() ? "" : ` · adv ${fmt(e.advantage)}`, ` · ${e.finish_reason}`,
      e.infra_error ? h("span", { class: "badge err" }, "infra") : null),
    e.messages.filter(m => m.role !== "system").map(messageBlock)));
  const first = data.episodes[0];
  app.replaceChildren(h("h3", {}, isEval() ? `task ${first.task_id}: ${data.episodes.length} samples`
                                           : `group ${uid} (step ${step}): ${data.episodes.length} episodes`),
    h("div", { class: "side", id: "group" }, cols));
}

// -------------------------------------------------------------------------------------------------- routing
function schedule(fn, ms) {
  clearTimeout(pollTimer);
  const route = location.hash;
  pollTimer = setTimeout(() => { if (location.hash === route) fn(); }, ms);
}

async function render() {
  clearTimeout(pollTimer);
  try {
    runInfo = await api("/api/run");
    document.getElementById("run-info").textContent =
      `${runInfo.run_dir} · ${runInfo.kind} · ${runInfo.episodes} episodes${runInfo.indexing ? " (indexing…)" : ""}`;
    document.getElementById("infra-count").textContent = runInfo.infra_errors ? `(${runInfo.infra_errors})` : "";
    const tab = document.getElementById("curves-link");
    [tab.textContent, tab.href] = isEval() ? ["summary", "#/summary"] : ["curves", "#/curves"];
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    if (parts[0] === "episode") await showEpisode(Number(parts[1]));
    else if (parts[0] === "group") await showGroup(Number(parts[1]), decodeURIComponent(parts.slice(2).join("/")));
    else if ((parts[0] === "curves" || parts[0] === "summary") && isEval()) await showEvalSummary();
    else if (parts[0] === "curves") await showCurves();
    else if (parts[0] === "infra") await showInfra();
    else await showGroups();
    document.body.dataset.ready = location.hash || "#/";
  } catch (err) {
    app.replaceChildren(h("pre", { class: "panel" }, String(err)));
  }
}

window.addEventListener("hashchange", () => { tip.hidden = true; render(); });
render();
