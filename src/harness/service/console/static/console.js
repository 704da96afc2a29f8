// harness console: keyboard navigation, actions through the JSON API, live updates over SSE.
// No build step, no dependencies. Pages are server-rendered; live updates re-fetch the page and swap <main>.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

async function api(method, url, body) {
  const res = await fetch(url, {
    method, credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let doc = {};
  try { doc = await res.json(); } catch (_) { /* empty body */ }
  if (!res.ok) throw new Error(doc.detail || `request failed (${res.status})`);
  return doc;
}

// ------------------------------------------------------------------ relative times

function relative(iso) {
  const s = (Date.now() - Date.parse(iso)) / 1000;
  const future = s < 0, a = Math.abs(s);
  const text = a < 45 ? "just now" : a < 3600 ? `${Math.round(a / 60)} min` : a < 86400 ? `${Math.round(a / 3600)} h`
    : `${Math.round(a / 86400)} d`;
  if (text === "just now") return text;
  return future ? `in ${text}` : `${text} ago`;
}
function localTime(iso) {
  return new Date(iso).toLocaleString([], { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" });
}
function refreshTimes(root = document) {
  root.querySelectorAll("time[data-rel]").forEach((t) => {
    const iso = t.getAttribute("datetime");
    // a deadline: how far off, and when in the reader's own time zone ("in 59 min · Tue 1 Dec, 17:51")
    t.textContent = t.dataset.rel === "deadline" ? `${relative(iso)} · ${localTime(iso)}` : relative(iso);
    t.title = new Date(iso).toLocaleString();
  });
}

// ------------------------------------------------------------------ approvals waiting

function setWaiting(count) {
  const nav = document.querySelector("header nav a[href='/ui/approvals']");
  if (nav) nav.innerHTML = "Approvals" + (count > 0 ? ` <span class="count" data-testid="pending-count">${count}</span>` : "");
  const head = document.querySelector("[data-testid=waiting-count]");
  if (head) { head.dataset.waiting = String(count); head.textContent = `${count} waiting`; }
}

// ------------------------------------------------------------------ keyboard

function navItems() { return [...document.querySelectorAll("[data-nav-item]")]; }
function move(delta) {
  const items = navItems();
  if (!items.length) return;
  const i = items.indexOf(document.activeElement);
  const next = items[Math.max(0, Math.min(items.length - 1, i < 0 ? 0 : i + delta))];
  next.focus(); next.scrollIntoView({ block: "nearest" });
}
let goPrefix = false;
document.addEventListener("keydown", (e) => {
  const typing = e.target.closest("input, textarea, select, [contenteditable]");
  if (e.key === "Escape" && typing) { e.target.blur(); return; }
  if (typing || e.metaKey || e.ctrlKey || e.altKey) return;
  if (goPrefix) {
    goPrefix = false;
    if (e.key === "r") location.href = "/ui/runs";
    if (e.key === "a") location.href = "/ui/approvals";
    return;
  }
  if (e.key === "j") { move(1); e.preventDefault(); }
  else if (e.key === "k") { move(-1); e.preventDefault(); }
  else if (e.key === "g") { goPrefix = true; setTimeout(() => { goPrefix = false; }, 1200); }
  else if (e.key === "n") { const t = document.querySelector("[data-new-run] input"); if (t) { t.focus(); e.preventDefault(); } else location.href = "/ui/runs#new"; }
  else if (e.key === "Enter" && e.target.matches("[data-nav-item]")) { location.href = e.target.dataset.href; }
});
document.addEventListener("click", (e) => {
  const row = e.target.closest("tr[data-nav-item]");
  if (row && !e.target.closest("a, button")) location.href = row.dataset.href;
});

// ------------------------------------------------------------------ actions

document.addEventListener("submit", async (e) => {
  const form = e.target;
  if (form.matches("[data-new-run]")) {
    e.preventDefault();
    const err = document.querySelector("[data-new-run-error]");
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const run = await api("POST", "/api/v1/runs", { task: form.task.value });
      location.href = `/ui/runs/${run.run_id}`;
    } catch (ex) { err.hidden = false; err.textContent = ex.message; button.disabled = false; }
  } else if (form.matches("[data-decide]")) {
    e.preventDefault();
    const which = e.submitter ? e.submitter.value : "approve";
    const out = form.querySelector("[data-outcome]");
    const reason = form.reason.value.trim();
    if (which === "break_glass" && !reason) { out.className = "outcome err"; out.textContent = "Break-glass needs a reason."; form.reason.focus(); return; }
    form.querySelectorAll("button").forEach((b) => { b.disabled = true; });
    try {
      const doc = await api("POST", `/api/v1/approvals/${form.dataset.decide}/decision`, {
        decision: which === "reject" ? "reject" : "approve", reason, break_glass: which === "break_glass",
        actions_hash: form.dataset.actionsHash,
      });
      out.className = "outcome ok";
      out.textContent = doc.effect === "recorded"
        ? `Approval recorded (${doc.approvals} of ${doc.required_approvals}); waiting for another approver.`
        : `${doc.effect === "approved" ? "Approved" : "Rejected"} — the run continues.`;
      const link = document.createElement("a");
      link.href = `/ui/runs/${doc.run.run_id}`;
      link.textContent = " Open the run →";
      out.append(link);
      form.closest(".card")?.classList.add("done");
      form.dataset.done = "1";
      if (doc.effect !== "recorded") {  // the request no longer waits: count it out now, not at the next reload
        const badge = document.querySelector("[data-testid=pending-count]");
        setWaiting(Math.max(0, (badge ? Number(badge.textContent) : 1) - 1));
      }
      scheduleSwap();
    } catch (ex) {
      out.className = "outcome err"; out.textContent = ex.message;
      form.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    }
  }
});
document.addEventListener("click", async (e) => {
  const button = e.target.closest("[data-redeliver]");
  if (!button) return;
  button.disabled = true;
  try { await api("POST", `/api/v1/webhooks/deliveries/${button.dataset.redeliver}/redeliver`); location.reload(); }
  catch (ex) { alert(ex.message); button.disabled = false; }
});
document.addEventListener("click", async (e) => {
  const button = e.target.closest("[data-cancel]");
  if (!button) return;
  if (!confirm("Cancel this run? It will close as CLOSED_CANCELLED.")) return;
  button.disabled = true;
  try { await api("POST", `/api/v1/runs/${button.dataset.cancel}/cancel`, { reason: "cancelled from the console" }); }
  catch (ex) { alert(ex.message); button.disabled = false; }
});

// ------------------------------------------------------------------ live updates

let swapTimer = null;
function busyEditing() {
  if (!document.body.hasAttribute("data-keep-forms")) return false;
  // a decided form's reason no longer holds the page: only forms still to be decided do
  return [...document.querySelectorAll("form[data-decide]:not([data-done]) textarea")]
    .some((t) => t.value.trim() || t === document.activeElement);
}
async function swapMain() {
  if (busyEditing()) { swapTimer = setTimeout(swapMain, 2000); return; }
  const res = await fetch(location.href, { credentials: "same-origin" });
  if (!res.ok) return;
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  const fresh = doc.querySelector("main"), current = document.querySelector("main");
  if (!fresh || !current) return;
  const focusedHref = document.activeElement?.dataset?.href;
  // keep what the reader opened or closed, matched by key (sections come and go as the Run moves)
  const opened = new Map([...current.querySelectorAll("details[data-key]")].map((d) => [d.dataset.key, d.open]));
  current.innerHTML = fresh.innerHTML;
  current.querySelectorAll("details[data-key]").forEach((d) => { if (opened.has(d.dataset.key)) d.open = opened.get(d.dataset.key); });
  const badge = doc.querySelector("[data-testid=pending-count]");
  setWaiting(badge ? Number(badge.textContent) : 0);
  if (focusedHref) document.querySelector(`[data-nav-item][data-href="${focusedHref}"]`)?.focus();
  refreshTimes(current);
}
function scheduleSwap() { clearTimeout(swapTimer); swapTimer = setTimeout(swapMain, 150); }
function follow(url) {
  const status = document.querySelector("[data-live-status]");
  const source = new EventSource(url, { withCredentials: true });
  source.addEventListener("state", scheduleSwap);
  source.addEventListener("end", () => { source.close(); if (status) { status.textContent = "run closed"; status.classList.add("off"); } });
  source.onerror = () => { if (status) { status.textContent = "reconnecting…"; status.classList.add("off"); } };
  source.onopen = () => { if (status) { status.textContent = "live updates on"; status.classList.remove("off"); } };
}

document.addEventListener("DOMContentLoaded", () => {
  refreshTimes();
  setInterval(refreshTimes, 15000);
  const run = document.body.dataset.liveRun, after = document.body.dataset.liveAfter || "0";
  if (run) follow(`/api/v1/runs/${run}/events?after=${after}`);
  else if (document.body.hasAttribute("data-live-tenant")) follow(`/api/v1/events?after=${after}`);
  if (location.hash === "#new") document.querySelector("[data-new-run] input")?.focus();
  // a webhook's approve / reject link: open that request's card with the decision at hand
  const wanted = new URLSearchParams(location.search);
  const card = wanted.get("request") && document.querySelector(`[data-request-id="${CSS.escape(wanted.get("request"))}"]`);
  if (card) {
    card.scrollIntoView({ block: "center" }); card.focus();
    card.querySelector(`button[value="${wanted.get("decision") === "reject" ? "reject" : "approve"}"]`)?.classList.add("suggested");
  }
});
