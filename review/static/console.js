// The queue page. Everything shown is set with textContent: merchant names, reasons and notes
// are attacker-controlled text, and the Content-Security-Policy allows no inline script.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
let cases = [];
let selected = 0;
let current = null;
// One request at a time: a key pressed while a case loads or a verdict is sent would apply to
// the case on screen, which may not be the one the analyst is looking at any more.
let busy = false;

function text(tag, value, className) {
  const element = document.createElement(tag);
  element.textContent = value === null || value === undefined ? "" : String(value);
  if (className) element.className = className;
  return element;
}

function money(amount, currency) {
  return amount === null ? "?" : `${amount.toFixed(2)} ${currency}`;
}

function localTime(c) {
  const offset = c.utc_offset_minutes === null ? 0 : c.utc_offset_minutes;
  const when = new Date(c.event_time + offset * 60000).toISOString().replace("T", " ").slice(0, 19);
  return c.utc_offset_minutes === null ? `${when} UTC` : `${when} local`;
}

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (response.status === 401) { window.location = "/login"; throw new Error("logged out"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function loadQueue() {
  const body = await api("/api/cases?status=open");
  const keep = cases[selected] && cases[selected].transaction_id;
  cases = body.cases;
  const index = cases.findIndex((c) => c.transaction_id === keep);
  selected = index >= 0 ? index : Math.min(selected, Math.max(cases.length - 1, 0));
  renderQueue();
}

function renderQueue() {
  const tbody = document.querySelector("#queue tbody");
  tbody.replaceChildren();
  cases.forEach((c, i) => {
    const row = document.createElement("tr");
    row.dataset.transactionId = c.transaction_id;
    if (i === selected) row.className = "selected";
    row.append(
      text("td", c.expected_loss.toFixed(2), "number"),
      text("td", c.score.toFixed(3), "number"),
      text("td", money(c.amount, c.currency), "number"),
      text("td", c.merchant_id),
      text("td", c.card_id),
      text("td", localTime(c)),
    );
    row.addEventListener("click", () => { selected = i; renderQueue(); openCase(); });
    tbody.append(row);
  });
  document.getElementById("count").textContent = `(${cases.length})`;
}

async function openCase() {
  const c = cases[selected];
  if (!c) { document.getElementById("case-pane").hidden = true; current = null; return; }
  current = await api(`/api/cases/${encodeURIComponent(c.transaction_id)}`);
  document.getElementById("case-pane").hidden = false;
  document.getElementById("case-id").textContent = current.transaction_id;
  const fields = document.getElementById("case-fields");
  fields.replaceChildren();
  const shown = [
    ["Score", current.score.toFixed(4)], ["Decision", current.decision],
    ["Amount", money(current.amount, current.currency)], ["Merchant", current.merchant_id],
    ["Terminal", current.terminal_id], ["Country", current.country],
    ["Channel", current.channel], ["Time", localTime(current)], ["Card", current.card_id],
    ["Model", current.model_version],
  ];
  for (const [name, value] of shown) fields.append(text("dt", name), text("dd", value));
  const reasons = document.getElementById("case-reasons");
  // A reason's words are `text`; a case from a decision of release 0.1.0 may have only `label`.
  reasons.replaceChildren(...current.reasons.map((r) =>
    text("li", `${r.text || r.label} (+${r.contribution.toFixed(3)})`)));
  const rules = document.getElementById("case-rules");
  rules.replaceChildren(...current.rules.map((r) => text("li", r)));
  const timeline = document.getElementById("case-timeline");
  timeline.replaceChildren(...current.timeline.map((d) =>
    text("li", `${new Date(d.event_time).toISOString()} ${d.decision} ${d.score.toFixed(3)}`)));
  document.getElementById("note").value = "";
  document.getElementById("message").textContent = "";
}

async function verdict(fraud) {
  if (!current || busy) return;
  busy = true;
  const id = current.transaction_id;
  try {
    await api(`/api/cases/${encodeURIComponent(id)}/verdict`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify({ fraud, note: document.getElementById("note").value }),
    });
  } catch (error) {
    document.getElementById("message").textContent = error.message;
    busy = false;
    return;
  }
  cases = cases.filter((c) => c.transaction_id !== id);
  selected = Math.min(selected, Math.max(cases.length - 1, 0));
  renderQueue();
  try {
    await openCase();
  } finally {
    busy = false;
  }
  document.getElementById("message").textContent = `${id}: ${fraud ? "fraud" : "legitimate"}`;
}

async function move(step) {
  if (!cases.length || busy) return;
  busy = true;
  selected = Math.max(0, Math.min(cases.length - 1, selected + step));
  renderQueue();
  try {
    await openCase();
  } finally {
    busy = false;
  }
}

document.addEventListener("keydown", (event) => {
  if (event.target.tagName === "TEXTAREA" || event.target.tagName === "INPUT") {
    if (event.key === "Escape") event.target.blur();
    return;
  }
  const actions = { j: () => move(1), k: () => move(-1), f: () => verdict(true),
    l: () => verdict(false), n: () => document.getElementById("note").focus() };
  const action = actions[event.key];
  if (action) { event.preventDefault(); action(); }
});
document.getElementById("fraud").addEventListener("click", () => verdict(true));
document.getElementById("legitimate").addEventListener("click", () => verdict(false));

loadQueue().then(openCase);
setInterval(() => { loadQueue(); }, 5000);
