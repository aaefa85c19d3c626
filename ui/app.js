// loopwarden's dashboard: one page, five views chosen by the URL's fragment (#/,
// #/conversations, #/conversation/ID, #/pending, #/policies), each drawn from the admin
// API's JSON. Text from the log is only ever set as text (never parsed as HTML), and every
// write is a same-origin JSON POST, which the admin API's checks require.
"use strict";

const POLL_MS = 3000;
let timer = null;
let ticker = null;
// Bumped by each change of view: an answer that comes back for a view no longer shown
// writes nothing (no error of the last page on this one).
let generation = 0;
// Whom the session stands for (`/admin/api/access`): `team` is set for a team's token.
let me = { team: null };

// --- small helpers ---------------------------------------------------------------------

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onsubmit" || k === "onchange") node[k] = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { accept: "application/json" } });
  if (r.status === 401) { location.href = "/ui/login"; throw new Error("not logged in"); }
  if (!r.ok) {
    const answer = await r.json().catch(() => ({}));
    throw new Error(refusal(r.status, answer.error));
  }
  return r.json();
}

// A failed call in words, from the admin API's own error: never a bare status code.
function refusal(code, error) {
  if (code === 403) return "Not open to this login" + (error ? ": " + error : "");
  if (code === 404) {
    const what = error || "not found";
    return me.team ? `${what} (team ${me.team}'s login sees its own runs only)` : what;
  }
  return error || `the proxy could not answer (HTTP ${code})`;
}

async function postJson(path, body) {
  const r = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  const answer = await r.json().catch(() => ({}));
  status(r.ok ? "done" : (answer.error || ("failed: " + r.status)));
  return { ok: r.ok, answer };
}

function status(text, isError) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.classList.toggle("error", Boolean(isError));
}
// Clears an error the view showed, once it draws again; a button's "done" stays.
function clearError() {
  if (document.getElementById("status").classList.contains("error")) status("");
}
function when(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}
function dollars(x) { return x === null || x === undefined ? "" : "$" + Number(x).toFixed(x < 1 ? 4 : 2); }
function tag(text) { return el("span", { class: "tag " + text }, text); }
function tokensOf(spend) {
  return spend ? spend.input + spend.cached_input + spend.cache_write + spend.output : null;
}
function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map(h => el("th", { class: h.num ? "num" : null }, h.label || h)))),
    el("tbody", {}, rows));
}
function cell(text, num) { return el("td", { class: num ? "num" : null }, text); }

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
}

// Polls `draw` every few seconds while its view is shown; its errors are shown while it
// is, and cleared when it draws again.
function poll(draw) {
  const mine = generation;
  const run = () => draw().then(
    () => { if (mine === generation) clearError(); },
    e => { if (mine === generation) status(String(e.message || e), true); });
  run();
  timer = setInterval(run, POLL_MS);
}

// --- overview --------------------------------------------------------------------------

const COLORS = ["#2d6cdf", "#c0392b", "#e0a100", "#27ae60", "#8e44ad", "#16a085", "#d35400", "#7f8c8d"];

// Stacked bars of interventions per bucket, by `key` (detector or policy).
function chart(overview, key) {
  const { since_ms, bucket_ms } = overview.window;
  const buckets = 24;
  // A shadow policy's would-be interventions are a series of their own.
  const keyOf = c => c[key] + (shadow(c.action) ? " (shadow: would have)" : "");
  const keys = [...new Set(overview.interventions.map(keyOf))].sort();
  const counts = Array.from({ length: buckets + 1 }, () => ({}));
  for (const c of overview.interventions) {
    const i = Math.min(buckets, Math.max(0, Math.floor((c.bucket_ms - since_ms) / bucket_ms) + 1));
    counts[i][keyOf(c)] = (counts[i][keyOf(c)] || 0) + c.count;
  }
  const totals = counts.map(b => Object.values(b).reduce((a, n) => a + n, 0));
  const max = Math.max(1, ...totals);
  const W = 720, H = 180, left = 30, bottom = 20, barW = (W - left) / counts.length;
  const plot = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "chart", role: "img" });
  plot.append(svg("text", { x: 0, y: 10 }, String(max)), svg("text", { x: 0, y: H - bottom }, "0"));
  counts.forEach((b, i) => {
    let y = H - bottom;
    keys.forEach((k, j) => {
      const n = b[k] || 0;
      if (!n) return;
      const h = (n / max) * (H - bottom - 12);
      y -= h;
      const rect = svg("rect", { x: left + i * barW + 1, y, width: barW - 2, height: h, fill: COLORS[j % COLORS.length], class: "bar" });
      rect.append(svg("title", {}, `${k}: ${n}`));
      plot.append(rect);
    });
  });
  const hours = overview.window.hours;
  plot.append(svg("text", { x: left, y: H - 4 }, `${hours} h ago`), svg("text", { x: W - 30, y: H - 4 }, "now"));
  const legend = el("div", { class: "legend" }, keys.map((k, j) => {
    const swatch = svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: COLORS[j % COLORS.length] }));
    return el("span", {}, swatch, " ", k);
  }));
  return el("div", {}, plot, legend);
}

function precisionTable(rows) {
  if (!rows.length) return el("p", { class: "muted", id: "precision-none" }, "No feedback yet: mark alerts right or wrong in a conversation's timeline.");
  return table(["Detector", { label: "Right", num: 1 }, { label: "Wrong", num: 1 }, { label: "of them: halts a human lifted", num: 1 }, { label: "Precision", num: 1 }],
    rows.map(p => el("tr", { class: "precision", "data-detector": p.detector },
      cell(p.detector), cell(p.right, 1), cell(p.wrong, 1), cell(p.implied_wrong, 1),
      cell(p.precision === null ? "–" : (100 * p.precision).toFixed(0) + " %", 1))),
    { id: "precision" });
}

async function overview() {
  let by = "detector";
  let last = null;
  const draw = async () => {
    const o = last = await getJson("/admin/api/overview?hours=24");
    const card = (id, value, label) => el("div", { class: "card", id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
    const s = o.savings;
    const toggle = el("select", { id: "chart-by", onchange: e => { by = e.target.value; render(); } },
      el("option", { value: "detector", selected: by === "detector" }, "by detector"),
      el("option", { value: "policy", selected: by === "policy" }, "by policy"));
    // A team's token sees its team's figures, and not what memory holds for every team.
    const render = () => show(
      el("h1", {}, o.team ? "Overview: team " + o.team : "Overview"),
      el("div", { class: "cards" },
        card("requests", o.totals.requests_in_window, `requests in 24 h (${o.totals.requests} in all)`),
        o.live_conversations === null ? null : card("live", o.live_conversations, "live conversations"),
        card("conversations", o.totals.conversations_in_window, "conversations active in 24 h"),
        card("halted", o.halted_conversations, "halted now"),
        card("pending", o.pending, "waiting for a human"),
        card("saved-steps", "≈ " + Math.round(s.steps), `steps saved by ${s.halts} halts (estimate)`),
        card("saved-dollars", "≈ " + dollars(s.dollars), "dollars saved (estimate)")),
      el("p", { class: "estimate", id: "assumption" }, s.assumption),
      el("h2", {}, "Interventions over the last 24 hours ", toggle),
      chart(last, by),
      el("h2", {}, "Alert precision from your feedback"),
      precisionTable(o.precision));
    render();
  };
  poll(draw);
}

// --- conversations ---------------------------------------------------------------------

const FILTERS = ["policy", "team", "client", "model", "decision"];
// A shadow policy's runs are listed by what it would have done (`would_halt`...), never as
// a halt that did not happen.
const DECISIONS = ["", "observe", "nudge", "replan", "rollback", "pause", "halt", "block",
  "would_nudge", "would_replan", "would_roll_back", "would_hold", "would_halt"];
const shadow = action => action.startsWith("would_");

async function conversations(params) {
  const form = el("form", { class: "filters", id: "filters" },
    FILTERS.map(f => f === "decision"
      ? el("label", {}, "decision ", el("select", { name: f, id: "filter-" + f }, DECISIONS.map(d => el("option", { value: d, selected: params.get(f) === d }, d || "any"))))
      : el("label", {}, f + " ", el("input", { name: f, id: "filter-" + f, value: params.get(f) || "", size: 12 }))),
    el("button", { type: "submit", id: "apply-filters" }, "Filter"));
  form.onsubmit = e => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const f of FILTERS) { const v = form.elements[f].value.trim(); if (v) q.set(f, v); }
    location.hash = "#/conversations" + (q.toString() ? "?" + q : "");
  };
  const body = el("div", {});
  show(el("h1", {}, "Conversations"), form, body);
  poll(async () => {
    const q = new URLSearchParams();
    for (const f of FILTERS) if (params.get(f)) q.set(f, params.get(f));
    q.set("limit", "200");
    const [list, spend] = await Promise.all([getJson("/admin/api/conversations?" + q), getJson("/admin/api/spend?limit=10000")]);
    const spent = new Map(spend.conversations.map(c => [c.id, c]));
    const rows = list.conversations.map(c => {
      const sp = spent.get(c.id);
      return el("tr", { class: "conversation", "data-id": c.id },
        el("td", {}, el("a", { href: "#/conversation/" + encodeURIComponent(c.id), class: "mono" }, c.id)),
        cell(c.policy || ""), cell(c.team || ""), cell(c.client || ""), cell(c.model || ""),
        el("td", {}, c.last_decision ? tag(c.last_decision) : ""),
        cell(c.requests, 1), cell(c.interventions, 1),
        cell(sp ? dollars(sp.dollars) : "", 1), cell(sp ? tokensOf(sp) : "", 1),
        cell(ago(c.last_seen_ms)));
    });
    body.replaceChildren(rows.length
      ? table(["Conversation", "Policy", "Team", "Client", "Model", "Last decision", { label: "Requests", num: 1 }, { label: "Interventions", num: 1 }, { label: "Spend", num: 1 }, { label: "Tokens", num: 1 }, "Last seen"], rows, { id: "conversations" })
      : el("p", { class: "muted", id: "no-conversations" }, "No conversation matches."));
  });
}

// --- one conversation ------------------------------------------------------------------

// A spent budget's alerts (`intervene::ruling::BUDGET_DETECTOR`): a cap the policy set,
// not a detector's judgement, so there is no right or wrong to say of them.
const BUDGET_CAP = "budget_cap";

function feedbackButtons(kind, alert, redraw) {
  if (alert.detector === BUDGET_CAP) {
    return el("span", { class: "verdict budget-cap" }, "a budget cap: the policy's limit, nothing to judge");
  }
  const give = verdict => async () => {
    const body = { verdict, note: "" };
    body[kind + "_id"] = alert.id;
    await postJson("/admin/api/feedback", body);
    redraw();
  };
  const said = alert.verdict || (alert.resumed ? "wrong (a human resumed it)" : null);
  return el("span", { class: "feedback" },
    el("button", { class: "right" + (alert.verdict === "right" ? " chosen" : ""), "data-kind": kind, "data-id": alert.id, onclick: give("right") }, "right"),
    " ",
    el("button", { class: "wrong" + (alert.verdict === "wrong" ? " chosen" : ""), "data-kind": kind, "data-id": alert.id, onclick: give("wrong") }, "wrong"),
    said ? el("span", { class: "verdict" }, "said: " + said) : null);
}

async function conversation(id) {
  const body = el("div", {});
  show(body);
  const draw = async () => {
    const t = await getJson("/admin/api/conversations/" + encodeURIComponent(id));
    const c = t.conversation;
    const act = what => async () => { await postJson(`/admin/api/conversations/${encodeURIComponent(id)}/${what}`, what === "halt" ? { reason: "halted from the dashboard" } : {}); draw(); };
    const spend = t.spend;
    const head = el("div", {},
      el("h1", {}, "Conversation ", el("span", { class: "mono", id: "conversation-id" }, id), " ", standing(t)),
      el("p", {}, `${c.client || "unknown client"} · ${c.model || ""} · ${c.requests} requests · first seen ${when(c.first_seen_ms)} · `,
        spend ? `spent ${dollars(spend.dollars)}, ${tokensOf(spend)} tokens` : "no spend recorded"),
      el("p", {},
        el("button", { class: "danger", id: "halt", onclick: act("halt") }, "Halt"), " ",
        el("button", { class: "primary", id: "resume", onclick: act("resume") }, "Resume")));

    // Steps, each with its calls, the findings whose evidence ends there, and the
    // interventions made on the request that carried it.
    const steps = new Map();
    const at = s => { if (!steps.has(s)) steps.set(s, { calls: [], findings: [], interventions: [], compactions: [] }); return steps.get(s); };
    for (const call of t.tool_calls) at(call.step).calls.push(call);
    // A summary request carries the run's steps so far: the run went on from its summary
    // after the last of them.
    for (const r of t.requests) if (r.compaction) at(r.steps === null ? -1 : r.steps - 1).compactions.push(r);
    for (const f of t.alerts.findings) at(f.step === null ? -1 : f.step).findings.push(f);
    const requestSteps = new Map(t.requests.map(r => [r.id, r.steps]));
    for (const i of t.alerts.interventions) {
      const s = i.request_id !== null && requestSteps.has(i.request_id) ? requestSteps.get(i.request_id) : null;
      i.nextStep = s;
      at(s === null ? Infinity : s - 1).interventions.push(i);
    }
    const callsOf = s => (steps.get(s) || { calls: [] }).calls;
    const order = [...steps.keys()].sort((a, b) => a - b);
    const stepNodes = order.map(s => {
      const st = steps.get(s);
      const title = s === -1 ? "Findings" : s === Infinity ? "Operator and human actions" : "Step " + s;
      return el("div", { class: "step", "data-step": s },
        el("h3", {}, title),
        st.calls.map(call => el("div", { class: "call" },
          el("code", {}, call.summary),
          call.result_summary !== null
            ? el("div", { class: "result" + (call.is_error ? " error" : "") }, "→ " + call.result_summary)
            : el("div", { class: "result muted" }, "→ (no result yet)"))),
        st.compactions.map(r => el("div", { class: "compaction", "data-request": r.id },
          tag("compaction"), ` the client summarized the history here (${r.compaction}); the run goes on from the summary, its memory and budgets with it`)),
        st.findings.map(f => el("div", { class: "finding", "data-id": f.id },
          el("strong", {}, f.detector), ` (confidence ${Number(f.confidence).toFixed(2)}): `, f.summary,
          f.suggestion ? el("div", { class: "muted" }, "Suggested: " + f.suggestion) : null,
          feedbackButtons("finding", f, draw))),
        st.interventions.map(i => {
          const next = i.nextStep === null ? [] : callsOf(i.nextStep);
          const mild = ["nudge", "replan", "rollback", "resume"].includes(i.action) || shadow(i.applied);
          return el("div", { class: "intervention" + (mild ? " mild" : ""), "data-id": i.id },
            shadow(i.applied) ? tag(i.applied) : [tag(i.action), " ", tag(i.applied)], ` by ${i.source}`, i.detector ? ` (${i.detector})` : "", i.policy ? `, policy ${i.policy}` : "",
            ": ", i.reason,
            i.finding ? el("div", { class: "muted" }, "Finding: " + i.finding) : null,
            i.nextStep !== null ? el("div", { class: "next" }, "The agent next: ",
              next.length ? next.map(n => el("code", {}, n.summary + " ")) : "no further tool call") : null,
            i.source === "operator" || i.source === "human" ? null : feedbackButtons("intervention", i, draw));
        }));
    });
    const requests = table(["Started", "Steps", "Decision", "Applied", "Status", { label: "Input", num: 1 }, { label: "Output", num: 1 }, { label: "Cost", num: 1 }],
      t.requests.map(r => el("tr", { class: "request" },
        cell(when(r.started_ms)), cell(r.steps === null ? "" : r.steps), el("td", {}, r.compaction ? tag("compaction") : shadow(r.applied) ? tag(r.applied) : r.decision ? tag(r.decision) : ""), cell(r.applied), cell(r.status),
        cell(r.input_tokens === null ? "" : r.input_tokens + (r.cached_input_tokens || 0) + (r.cache_write_tokens || 0), 1),
        cell(r.output_tokens === null ? "" : r.output_tokens, 1), cell(dollars(r.cost_usd), 1))), { id: "requests" });
    body.replaceChildren(head, el("h2", {}, "Timeline"), el("div", { id: "timeline" }, stepNodes), el("h2", {}, "Requests"), requests);
  };
  poll(draw);
}

// What a shadow policy would have done, said as such: nothing was done.
const WOULD_HAVE = {
  would_halt: "would have halted", would_hold: "would have held it for a human",
  would_nudge: "would have nudged", would_replan: "would have asked for a new plan",
  would_roll_back: "would have rolled back",
};

// A run's standing: halted, or under a shadow policy what its last request would have
// met, or not halted.
function standing(t) {
  if (t.halted) return el("span", { class: "tag halted", id: "halted" }, "halted");
  const last = t.requests.reduce((a, r) => (a && a.started_ms > r.started_ms ? a : r), null);
  if (last && last.applied && shadow(last.applied)) {
    return el("span", { class: "tag " + last.applied, id: "shadow-standing",
      title: `policy ${last.policy || ""} is in shadow mode: it changes nothing and logs what it would have done` },
      "shadow: " + (WOULD_HAVE[last.applied] || last.applied) + " (nothing was done)");
  }
  return el("span", { class: "tag", id: "running" }, "not halted");
}

// --- pending approvals -----------------------------------------------------------------

async function pending() {
  const body = el("div", {});
  show(el("h1", {}, "Waiting for a human"), body);
  let list = [];
  let incomplete = null;
  const render = () => {
    // The list may lack other replicas' requests (their database could not be read).
    const warning = incomplete ? el("p", { class: "error", id: "pending-incomplete" }, "This list may be incomplete: " + incomplete) : null;
    body.replaceChildren(warning || "", list.length ? table(["Conversation", "Detector", "Why", "Time left", "Decide"], list.map(p => {
      const decide = d => async () => { await postJson("/admin/api/pending/" + encodeURIComponent(p.id), { decision: d }); draw(); };
      return el("tr", { class: "pending", "data-id": p.id },
        el("td", {}, el("a", { href: "#/conversation/" + encodeURIComponent(p.conversation_id), class: "mono" }, p.conversation_id)),
        cell(p.detector), el("td", {}, p.reason, p.findings.map(f => el("div", { class: "muted" }, f.summary))),
        el("td", { class: "time-left", "data-deadline": p.deadline_ms, "data-then": p.on_timeout }, timeLeft(p.deadline_ms, p.on_timeout)),
        el("td", {},
          el("button", { class: "primary continue", onclick: decide("continue") }, "Continue"), " ",
          el("button", { class: "nudge", onclick: decide("nudge") }, "Nudge"), " ",
          el("button", { class: "danger halt", onclick: decide("halt") }, "Halt")));
    }), { id: "pending" }) : el("p", { class: "muted", id: "no-pending" }, incomplete ? "No request is waiting here." : "No request is waiting."));
  };
  const draw = async () => {
    const answer = await getJson("/admin/api/pending");
    list = answer.pending;
    incomplete = answer.incomplete;
    render();
  };
  poll(draw);
  // The countdown, in place (redrawing the rows would move the buttons under the mouse).
  ticker = setInterval(() => {
    for (const td of document.querySelectorAll("td.time-left")) {
      td.textContent = timeLeft(Number(td.dataset.deadline), td.dataset.then);
    }
  }, 1000);
}

function timeLeft(deadline, then) {
  return `${Math.max(0, Math.round((deadline - Date.now()) / 1000))} s, then ${then}`;
}

// --- policies --------------------------------------------------------------------------

// What each mode does, in a sentence.
const MODES = {
  enforce: "reminds the agent of a loop, then stops the run",
  "nudge-only": "reminds the agent, never stops the run",
  shadow: "changes nothing: logs what it would have done",
};

function budgetText(b) {
  const parts = [];
  if (b.steps) parts.push(`${b.steps} steps`);
  if (b.tokens) parts.push(`${b.tokens} tokens`);
  if (b.dollars) parts.push(dollars(b.dollars));
  if (b.wall_clock_secs) parts.push(`${Math.round(b.wall_clock_secs / 60)} min`);
  return parts.length ? parts.join(", ") + " per run" : "no cap";
}

// A team's login: its own policy, read-only (the file and its reloads are the
// operators').
function teamPolicies(p) {
  const title = el("h1", {}, `Team ${p.team}'s policy`);
  const note = el("p", { class: "muted", id: "team-policy-note" }, p.named
    ? `The policy team ${p.team}'s requests fall under. Read-only: the proxy's operators change it.`
    : `No policy names team ${p.team}: its requests fall under the default policy. Read-only: the proxy's operators change it.`);
  const rows = p.policies.map(x => el("tr", { class: "policy", "data-name": x.name },
    cell(x.name), el("td", {}, tag(x.mode), " ", el("span", { class: "muted" }, MODES[x.mode] || "")),
    el("td", { class: "budget" }, budgetText(x.budget)), el("td", { class: "mono" }, JSON.stringify(x.match))));
  return [title, note, table(["Policy", "Mode", "Budget", "Match"], rows, { id: "team-policies" })];
}

async function policies() {
  const body = el("div", {});
  show(body);
  poll(async () => {
    const p = await getJson("/admin/api/policies");
    if (p.team) return body.replaceChildren(...teamPolicies(p));
    const r = p.last_reload;
    const reload = r
      ? el("p", { id: "last-reload" }, `Last reload (${r.trigger}, ${when(r.at_ms)}): `, tag(r.outcome),
        r.error ? el("span", { class: "error" }, " " + r.error) : "",
        r.needs_restart && r.needs_restart.length ? " needs a restart: " + r.needs_restart.join(", ") : "")
      : el("p", { id: "last-reload", class: "muted" }, "No reload since start.");
    body.replaceChildren(
      el("h1", {}, "Policies in force"),
      el("p", { class: "muted" }, p.config ? "From " + p.config + ", tried in this order." : "Built-in settings (no config file)."),
      table(["Policy", "Mode", "Match", { label: "Requests matched", num: 1 }, "Budget"], p.policies.map(x => el("tr", { class: "policy", "data-name": x.name },
        cell(x.name), el("td", {}, tag(x.mode)), el("td", { class: "mono" }, JSON.stringify(x.match)),
        cell(x.matched, 1), el("td", { class: "mono" }, JSON.stringify(x.budget))))),
      reload);
  });
}

// --- routing ---------------------------------------------------------------------------

function route() {
  clearInterval(timer);
  clearInterval(ticker);
  generation += 1;
  status("");
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const view = path.startsWith("/conversation/") ? "conversations" : (path.slice(1) || "overview");
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.view === view);
  if (path.startsWith("/conversation/")) return conversation(decodeURIComponent(path.slice("/conversation/".length)));
  if (path === "/conversations") return conversations(params);
  if (path === "/pending") return pending();
  if (path === "/policies") return policies();
  return overview();
}

// The count of held requests in the header, on every view.
async function pendingBadge() {
  try {
    const n = (await getJson("/admin/api/pending")).pending.length;
    document.getElementById("pending-count").textContent = n ? `(${n})` : "";
  } catch (_) { /* shown by the view */ }
}

// Whom the login stands for: a team's is named in the header, and its views are its
// team's (every view is open to it; the Policies view shows its own policy).
async function whoAmI() {
  try {
    me = await getJson("/admin/api/access");
  } catch (_) { return; }
  document.getElementById("scope").textContent = me.team ? "team " + me.team : "";
  const policies = document.querySelector("header nav a[data-view=policies]");
  if (policies) policies.textContent = me.team ? "Policy" : "Policies";
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", async () => {
  await whoAmI();
  route();
  pendingBadge();
  setInterval(pendingBadge, POLL_MS);
});
