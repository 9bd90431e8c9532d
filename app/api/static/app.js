// respool dashboard: polls GET /v1/dashboard and renders it. Read-only; no build step.
// Every value goes into the page through textContent, never as HTML.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "respool.token";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.setAttribute("style", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + Math.floor((s % 86400) / 3600) + "h";
}

function resources(map) {
  return Object.entries(map)
    .filter(([k]) => k !== "step_run")
    .map(([k, v]) => k + " " + v)
    .join(", ") || "step_run 1";
}

function shortId(id) { return id.slice(0, 8); }

// A time as the CLI prints it: UTC, ISO 8601, whole seconds (2026-11-25T14:03:12Z).
// UTC as the CLI prints it: 2026-11-25 14:03:12Z
function utc(value) { return new Date(value).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z"); }

// Labels as compact k=v chips (sorted by key); the cell's title lists them all.
function labelChips(labels) {
  const entries = Object.entries(labels || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (entries.length === 0) return el("td", { class: "labels" }, "—");
  const all = entries.map(([k, v]) => k + "=" + v);
  return el("td", { class: "labels", title: all.join("\n") }, ...all.map((t) => el("span", { class: "chip" }, t)));
}

// The engine's ETA of a queued request: "~p50" and the 90% bound; "—" when it has none.
function etaCell(eta) {
  if (!eta) {
    return el("td", { class: "eta", title: "no estimate yet: fewer than 10 finished holds recorded in this pool, or too deep in its queue" }, "—");
  }
  const p90 = eta.p90_seconds == null ? null : duration(eta.p90_seconds);
  return el("td", { class: "eta", title: "median ~" + duration(eta.p50_seconds) + (p90 ? "; 90%: within " + p90 : "") },
    el("span", { class: "p50" }, "~" + duration(eta.p50_seconds)),
    p90 ? el("span", { class: "p90" }, "90% ≤ " + p90) : null);
}

function fill(tbody, rows, columns, emptyText) {
  tbody.replaceChildren();
  if (rows.length === 0) {
    tbody.append(el("tr", {}, el("td", { class: "empty", colspan: String(columns) }, emptyText)));
    return;
  }
  for (const r of rows) tbody.append(r);
}

// A rate key's window (docs/rates.md) as 60s, 5m, 1h.
function windowText(seconds) {
  if (seconds % 3600 === 0) return seconds / 3600 + "h";
  if (seconds % 60 === 0) return seconds / 60 + "m";
  return seconds + "s";
}

function refillText(at) {
  if (!at) return "nothing charged";
  const left = Math.max(0, Math.round((new Date(at) - Date.now()) / 1000));
  return "next refill in " + left + "s";
}

function keyBlock(k) {
  const tracked = k.capacity !== null;
  const rate = k.per_seconds !== null && k.per_seconds !== undefined;
  const name = rate ? el("b", {}, k.key + " per " + windowText(k.per_seconds)) : el("b", {}, k.key);
  const detail = rate
    ? "free " + k.free + " · " + refillText(k.next_refill_at)
    : tracked ? "reserved " + k.reserved + " · borrowed " + k.borrowed + " · free " + k.free : "";
  const label = el("div", { class: "label" },
    el("span", {}, name, tracked ? " " + k.allocated + " / " + k.capacity : " " + k.allocated + " held (untracked)"),
    el("span", {}, detail));
  const block = el("div", { class: "key", "data-key": k.key }, label);
  if (tracked) {
    const pct = (n) => (100 * n / k.capacity).toFixed(2) + "%";
    const inShare = Math.max(0, k.allocated - k.borrowed);
    const bar = el("div", { class: "bar", title: k.key + ": " + k.allocated + "/" + k.capacity },
      el("div", { class: "seg inshare", style: "width:" + pct(inShare) }),
      el("div", { class: "seg borrowed", style: "width:" + pct(Math.min(k.borrowed, k.capacity - inShare)) }));
    if (k.reserved > 0) bar.append(el("div", { class: "reserved", style: "left:calc(" + pct(Math.min(k.reserved, k.capacity)) + " - 1px)", title: "reserved " + k.reserved }));
    block.append(bar);
  }
  if (k.queued_demand > 0) block.append(el("div", { class: "demand" }, "queued demand " + k.queued_demand));
  return block;
}

// A stable colour per request id (the same holder keeps its colour across polls and nodes).
function holderColour(id) {
  let h = 0;
  for (const ch of id) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return "hsl(" + (h % 360) + ", 62%, " + (46 + (h >>> 9) % 14) + "%)";
}

function holderName(d) { return d.subject + " (" + shortId(d.request_id) + ")"; }

// A shared device not held whole: a wider cell with one part per slice, its width the slice's
// part of the device's offer, coloured by its holder; the rest of the cell is its free memory.
// A holder of the whole device fills the cell.
function sharedCell(key, d, holders) {
  const parts = d.request_id
    ? [{ request_id: d.request_id, subject: d.subject, memory_mb: d.memory_mb, share: null, whole: true }]
    : d.slices;
  const held = parts.reduce((sum, s) => sum + s.memory_mb, 0);
  const free = d.memory_mb - held;
  const cell = el("div", {
    class: "cell shared" + (parts.length ? " held" : ""), "data-device": d.device,
    "data-sharing": d.sharing,
    title: key + " " + d.device + " (" + d.sharing + "): " + free + " of " + d.memory_mb + " MiB free",
  });
  for (const s of parts) {
    const width = d.memory_mb ? (100 * s.memory_mb / d.memory_mb).toFixed(2) + "%" : "0%";
    cell.append(el("div", {
      class: "slice", "data-holder": s.request_id,
      style: "width:" + width + ";background:" + holderColour(s.request_id),
      title: key + " " + d.device + ": " + holderName(s) + (s.whole ? ", whole" : ", " + s.memory_mb + " MiB" +
        (s.share === null ? "" : ", " + s.share + "%")),
    }));
    holders.set(s.request_id, s);
  }
  return cell;
}

// One node of a pool: a row of cells per key with named devices (one cell per device, coloured
// by its holder), a bar per key of anonymous units, and a legend naming each holder.
function nodeBlock(node) {
  const held = node.keys.filter((k) => k.key !== "step_run");
  const box = el("div", { class: "node", "data-node": node.name, "data-state": node.state },
    el("div", { class: "node-head" },
      el("b", {}, node.name),
      node.state !== "active" ? el("span", { class: "tag node-" + node.state }, node.state) : null,
      el("span", { class: "node-labels" }, Object.entries(node.labels).map(([k, v]) => k + "=" + v).join(" "))));
  const holders = new Map();
  for (const k of held) {
    const line = el("div", { class: "node-key", "data-key": k.key },
      el("span", { class: "node-key-name" }, k.key + " " + k.used + "/" + k.capacity));
    if (k.named) {
      const cells = el("div", { class: "cells" });
      for (const d of node.devices.filter((x) => x.key === k.key)) {
        if (d.sharing) {
          cells.append(sharedCell(k.key, d, holders));
          continue;
        }
        const attrs = { class: "cell" + (d.request_id ? " held" : ""), "data-device": d.device };
        if (d.request_id) {
          attrs["data-holder"] = d.request_id;
          attrs.style = "background:" + holderColour(d.request_id);
          attrs.title = k.key + " " + d.device + ": " + holderName(d);
          holders.set(d.request_id, d);
        } else {
          attrs.title = k.key + " " + d.device + ": free";
        }
        cells.append(el("div", attrs));
      }
      line.append(cells);
    } else {
      const pct = k.capacity ? (100 * Math.min(k.used, k.capacity) / k.capacity).toFixed(2) + "%" : "0%";
      line.append(el("div", { class: "bar node-bar", title: k.key + ": " + k.used + "/" + k.capacity + " (units without device ids)" },
        el("div", { class: "seg inshare", style: "width:" + pct })));
    }
    box.append(line);
  }
  if (holders.size > 0) {
    const legend = el("div", { class: "legend holders" });
    for (const [id, d] of holders) {
      legend.append(el("span", { class: "holder", "data-holder": id, title: id },
        el("i", { style: "background:" + holderColour(id) }), holderName(d)));
    }
    box.append(legend);
  }
  return box;
}

function policyTable(pool) {
  const bySubject = new Map();
  for (const p of pool.policies) {
    if (!bySubject.has(p.subject)) bySubject.set(p.subject, { priority: p.priority, keys: [] });
    bySubject.get(p.subject).keys.push(p);
  }
  const tbody = el("tbody");
  for (const [subject, s] of bySubject) {
    // A key the subject neither holds nor has a reservation or limit on says nothing (mcpu 0);
    // step_run (one per request) only when it is limited or reserved.
    const usage = s.keys
      .filter((p) => (p.used > 0 && p.key !== "step_run") || p.limit !== null || p.reserved > 0)
      .map((p) => p.key + " " + p.used + (p.reserved ? "/" + p.reserved + " res" : "") + (p.limit !== null ? ", limit " + p.limit : ""))
      .join("; ");
    const borrowed = s.keys.filter((p) => p.borrowed > 0).map((p) => p.key + " " + p.borrowed).join(", ");
    tbody.append(el("tr", {}, el("td", {}, subject), el("td", {}, s.priority), el("td", {}, usage || "nothing held"), el("td", {}, borrowed || "—")));
  }
  if (bySubject.size === 0) return el("p", { class: "empty" }, "No policies.");
  return el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "subject"), el("th", {}, "prio"), el("th", {}, "used / reserved"), el("th", {}, "borrowed"))), tbody);
}

function renderPools(pools) {
  const box = document.getElementById("pools");
  box.replaceChildren();
  if (pools.length === 0) { box.append(el("p", { class: "empty" }, "No pools yet.")); return; }
  for (const pool of pools) {
    const card = el("div", { class: "pool", "data-pool": pool.name },
      el("h3", {}, pool.name),
      el("div", { class: "meta" }, pool.queueing + (pool.preemption_grace_seconds ? " · grace " + pool.preemption_grace_seconds + "s" : "") + " · " + pool.holding + " holding · " + pool.queued + " queued"));
    const keys = pool.keys.filter((k) => k.capacity !== null || k.allocated > 0 || k.queued_demand > 0);
    for (const k of keys) card.append(keyBlock(k));
    card.append(el("div", { class: "legend" }, el("i", { style: "background:var(--inshare)" }), "in share", el("i", { style: "background:var(--borrowed)" }), "borrowed", el("i", { style: "background:var(--reserved);width:2px" }), "reserved"));
    const nodes = pool.nodes || [];
    if (nodes.length > 0) {
      const list = el("div", { class: "nodes" }, el("div", { class: "nodes-title" }, nodes.length + (nodes.length === 1 ? " node" : " nodes")));
      for (const node of nodes) list.append(nodeBlock(node));
      card.append(list);
    }
    card.append(policyTable(pool));
    box.append(card);
  }
}

// A running job and the last lines of its current attempt's output (stdout and stderr as they
// came), as text: whatever the job printed, HTML included, is shown, never interpreted.
function jobBlock(j) {
  const head = el("div", { class: "job-head" },
    el("b", {}, j.name), " ",
    el("span", { class: "mono", title: j.request_id }, shortId(j.request_id)), " ",
    el("span", { class: "meta" }, j.subject + " · " + j.pool + (j.node ? " on " + j.node : "") + " · attempt " + j.attempt), " ",
    el("span", { class: "st st-" + j.status }, j.status));
  const tail = j.tail === null
    ? el("p", { class: "empty" }, "no output yet")
    : el("pre", { class: "tail", title: "the last lines of its output; respool logs " + shortId(j.request_id) + " -f follows it" }, j.tail);
  return el("div", { class: "job", "data-job": j.request_id }, head, tail);
}

function renderJobs(jobs) {
  document.getElementById("jobs-section").hidden = jobs.length === 0;
  document.getElementById("jobs-count").textContent = "(" + jobs.length + ")";
  const box = document.getElementById("jobs");
  box.replaceChildren(...jobs.map(jobBlock));
  for (const pre of box.querySelectorAll("pre.tail")) pre.scrollTop = pre.scrollHeight;  // the end
}

function render(data) {
  renderPools(data.pools);
  renderJobs(data.jobs || []);
  const q = data.queue.map((r) => el("tr", { "data-request": r.request_id, "data-queue-pool": r.pool },
    el("td", { class: "nowrap" }, r.pool), el("td", {}, r.position), el("td", {}, r.subject),
    el("td", { class: "mono" }, resources(r.resources)), el("td", {}, r.priority),
    el("td", {}, el("span", { class: "tag" + (r.preemptible ? "" : " np") }, r.preemptible ? "preemptible" : "non-preemptible"),
      r.in_share ? el("span", { class: "tag share" }, "in share") : null),
    labelChips(r.labels),
    el("td", { class: "nowrap" }, duration(r.waiting_seconds)), el("td", {}, r.waiting_for), etaCell(r.eta)));
  fill(document.querySelector("#queue tbody"), q, 10, "Nothing is waiting.");
  document.getElementById("queue-count").textContent = "(" + data.queue.length + ")";

  const h = data.holdings.map((r) => el("tr", {},
    el("td", { class: "nowrap" }, r.pool), el("td", {}, r.subject), el("td", { class: "mono", title: r.request_id }, shortId(r.request_id)),
    el("td", { class: "mono" }, resources(r.resources)),
    el("td", {}, el("span", { class: "st st-" + r.status }, r.status)), el("td", { class: "nowrap" }, duration(r.held_seconds)),
    labelChips(r.labels)));
  fill(document.querySelector("#holdings tbody"), h, 7, "Nothing is allocated.");
  document.getElementById("holdings-count").textContent = "(" + data.holdings.length + ")";

  const e = data.events.map((r) => el("tr", {},
    el("td", { class: "time mono", title: r.at }, utc(r.at)),
    el("td", { class: "mono", title: r.request_id }, shortId(r.request_id)), el("td", {}, r.subject), el("td", { class: "nowrap" }, r.pool || "—"),
    el("td", {}, (r.from_status || "new") + " → ", el("span", { class: "st st-" + r.to_status }, r.to_status)),
    el("td", { title: r.message }, r.reason || "")));
  fill(document.querySelector("#events tbody"), e, 6, "No events yet.");

  const vs = document.getElementById("violations-section");
  vs.hidden = data.violations.length === 0;
  fill(document.querySelector("#violations tbody"), data.violations.map((v) => el("tr", {},
    el("td", {}, v.invariant), el("td", {}, v.pool || ""), el("td", {}, v.subject || ""), el("td", {}, v.key || ""), el("td", {}, v.detail))), 5, "");
}

function setStatus(state, text) {
  const s = document.getElementById("status");
  s.dataset.state = state;
  s.textContent = text;
}

// Without a usable token the data is replaced by a prompt for one, never by empty tables:
// "needed" (auth is on and no token was given), "rejected" (401 for the token given),
// "forbidden" (403: a token that may not read every subject). null: the data is shown.
const LOCKED = {
  needed: ["Token needed", "This respool requires a token. Enter a reader (or admin) token to see its pools, queue and events."],
  rejected: ["Token rejected", "The server did not accept the token given. Enter another reader (or admin) token."],
  forbidden: ["Token not allowed", "This token may not read the dashboard: it shows every subject's requests. Enter a reader (or admin) token."],
};

function setLocked(state, detail) {
  const box = document.getElementById("locked");
  document.getElementById("data").hidden = state !== null;
  box.hidden = state === null;
  if (state === null) { delete document.body.dataset.auth; return; }
  document.body.dataset.auth = state;
  box.dataset.state = state;
  document.getElementById("locked-title").textContent = LOCKED[state][0];
  document.getElementById("locked-text").textContent = LOCKED[state][1];
  document.getElementById("locked-detail").textContent = detail && state !== "needed" ? "Server said: " + detail : "";
  const input = document.getElementById("token");
  if (document.activeElement !== input) input.value = "";
}

async function poll() {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  try {
    const resp = await fetch("/v1/dashboard", { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      const body = await resp.json().catch(() => ({}));
      const state = resp.status === 403 ? "forbidden" : token ? "rejected" : "needed";
      setLocked(state, body.detail);
      setStatus("error", { needed: "token needed", rejected: "token rejected", forbidden: "forbidden" }[state]);
      document.body.dataset.ready = "1";
      return;
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const data = await resp.json();
    setLocked(null);
    document.getElementById("forget").hidden = !token;
    render(data);
    setStatus("live", "live · " + utc(data.now));
    document.body.dataset.ready = "1";
  } catch (err) {
    setStatus("error", "cannot reach respool (" + err.message + ")");
  }
}

document.getElementById("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = document.getElementById("token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token").value = "";
  poll();
});

document.getElementById("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("forget").hidden = true;
  poll();
});

async function loop() {
  if (!document.hidden) await poll();
  setTimeout(loop, POLL_MS);
}
loop();
