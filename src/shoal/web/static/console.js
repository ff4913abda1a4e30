// shoal console: the little the pages do in the browser. Plain JS, no build step, no network
// beyond this console's own server. Everything taken from the server is put in the page as text
// (textContent, setAttribute), never as HTML.
"use strict";

(function () {
  const csrf = () => {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  };

  // -- times: the server writes UTC; show them in the browser's zone, UTC on hover -----------
  const pad = (n) => String(n).padStart(2, "0");
  function localTime(seconds) {
    const d = new Date(seconds * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function utcTime(seconds) {
    return new Date(seconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  // compact: the time alone today, month-day and minutes this year, else the date
  function compactTime(seconds) {
    const d = new Date(seconds * 1000), now = new Date(), full = localTime(seconds);
    if (d.toDateString() === now.toDateString()) return full.slice(11);
    if (d.getFullYear() === now.getFullYear()) return full.slice(5, 16);
    return full.slice(0, 10);
  }
  function localizeTimes(root) {
    root.querySelectorAll("time[data-ts]").forEach((el) => {
      const ts = parseFloat(el.dataset.ts);
      if (Number.isNaN(ts)) return;
      el.textContent = "compact" in el.dataset ? compactTime(ts) : localTime(ts);
      el.title = utcTime(ts);
    });
    const zone = document.getElementById("zone");
    if (zone) {
      try {
        zone.textContent = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
      } catch (e) { /* keep the server's words */ }
    }
  }

  // -- flash messages survive the reload that follows an action -----------------------------
  function flash(kind, text) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.className = `flash ${kind}`;
    box.textContent = text;
    box.hidden = false;
  }
  function flashAfterReload(kind, text) {
    try { sessionStorage.setItem("shoal.flash", JSON.stringify([kind, text])); } catch (e) {}
  }
  function showStoredFlash() {
    let stored = null;
    try {
      stored = sessionStorage.getItem("shoal.flash");
      sessionStorage.removeItem("shoal.flash");
    } catch (e) {}
    if (stored) {
      const [kind, text] = JSON.parse(stored);
      flash(kind, text);
    }
  }

  // -- actions: a confirmation dialog, then a POST to the JSON API with the CSRF token -------
  // A button <button data-act="/api/..." data-title="..." data-what="..." data-fields="id">
  // opens the dialog; data-fields names a <template> whose inputs the dialog shows.
  const dialog = () => document.getElementById("confirm");

  function openConfirm(button) {
    const dlg = dialog();
    const form = dlg.querySelector("form");
    dlg.querySelector("h2").textContent = button.dataset.title || "Confirm";
    dlg.querySelector(".what").textContent = button.dataset.what || "";
    const fields = dlg.querySelector(".fields");
    fields.replaceChildren();
    if (button.dataset.fields) {
      const tpl = document.getElementById(button.dataset.fields);
      if (tpl) fields.appendChild(tpl.content.cloneNode(true));
    }
    const by = fields.querySelector('[name="by"]');
    if (by && !by.value) {
      try { by.value = localStorage.getItem("shoal.operator") || ""; } catch (e) {}
    }
    const ok = dlg.querySelector("button[value=ok]");
    ok.textContent = button.dataset.ok || button.textContent.trim();
    ok.className = ["danger", "go"].find((k) => button.classList.contains(k)) || "primary";
    dlg.querySelector(".dialog-error").textContent = "";
    form.onsubmit = (event) => {
      event.preventDefault();
      if (event.submitter && event.submitter.value !== "ok") { dlg.close(); return; }
      submitAction(button, form, dlg);
    };
    dlg.showModal();
    const first = fields.querySelector("input, textarea");
    (first || ok).focus();
  }

  function bodyFrom(form, extra) {
    const body = Object.assign({}, extra);
    for (const [key, value] of new FormData(form).entries()) {
      if (key === "payload") {
        body.payload = value.trim() === "" ? null : JSON.parse(value);
      } else if (value !== "") {
        body[key] = value;
      }
    }
    return body;
  }

  async function submitAction(button, form, dlg) {
    const error = dlg.querySelector(".dialog-error");
    let body;
    try {
      body = bodyFrom(form, button.dataset.body ? JSON.parse(button.dataset.body) : {});
    } catch (e) {
      error.textContent = "The payload is not valid JSON: " + e.message;
      return;
    }
    if (body.by) {
      try { localStorage.setItem("shoal.operator", body.by); } catch (e) {}
    }
    const buttons = dlg.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    let response, answer = null;
    try {
      response = await fetch(button.dataset.act, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
        body: JSON.stringify(body),
      });
      try { answer = await response.json(); } catch (e) { answer = null; }
    } catch (e) {
      buttons.forEach((b) => { b.disabled = false; });
      error.textContent = "The console did not answer: " + e.message;
      return;
    }
    buttons.forEach((b) => { b.disabled = false; });
    dlg.close();
    if (response.ok) {
      const done = (answer && answer.message) || button.dataset.done || "Done.";
      flashAfterReload("ok", done);
      const next = button.dataset.next || (answer && answer.location);
      if (next) window.location.assign(next); else window.location.reload();
    } else {
      const why = (answer && (answer.error || answer.detail || answer.message)) ||
        `Refused (HTTP ${response.status}).`;
      flash("err", why);
      window.scrollTo(0, 0);
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-act]");
    if (!button) return;
    event.preventDefault();
    openConfirm(button);
  });

  // -- the overview: poll the JSON API and refresh the parts that move ---------------------
  function setText(root, key, value) {
    root.querySelectorAll(`[data-bind="${key}"]`).forEach((el) => {
      el.textContent = value;
    });
  }

  function startLive() {
    const live = document.querySelector("[data-live]");
    if (!live) return;
    const url = live.dataset.live;
    const period = parseFloat(live.dataset.every || "2") * 1000;
    const note = document.getElementById("live-note");
    let timer = null, failures = 0;
    async function tick() {
      timer = null;
      if (document.hidden) { timer = setTimeout(tick, period); return; }
      try {
        const response = await fetch(url, { credentials: "same-origin",
                                             headers: { Accept: "application/json" } });
        if (!response.ok) throw new Error(`HTTP ${response.status}`);
        const data = await response.json();
        const render = renderers[live.dataset.render || "overview"];
        if (render) render(live, data);
        failures = 0;
        if (note) {
          note.classList.remove("stale");
          note.textContent = "live · updated " + localTime(Date.now() / 1000).slice(11);
        }
      } catch (e) {
        failures += 1;
        if (note) {
          note.classList.add("stale");
          note.textContent = "not updating: " + e.message;
        }
      }
      timer = setTimeout(tick, Math.min(period * (1 + failures), 30000));
    }
    timer = setTimeout(tick, period);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && timer === null) tick();
    });
  }

  // -- the overview's renderer: the same parts overview.html draws, from /api/overview -------
  function h(tag, attrs, ...children) {
    const el = tag.startsWith("svg:")
      ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    for (const c of children) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }
  function duration(s) {
    if (s === null || s === undefined) return "—";
    const sign = s < 0 ? "-" : "";
    s = Math.abs(s);
    if (s < 1) return `${sign}${Math.round(s * 1000)} ms`;
    if (s < 60) return s < 10 ? `${sign}${s.toFixed(1)} s` : `${sign}${Math.round(s)} s`;
    let m = Math.floor(s / 60); const sec = Math.floor(s) % 60;
    if (m < 60) return sec ? `${sign}${m} min ${sec} s` : `${sign}${m} min`;
    let hr = Math.floor(m / 60); m %= 60;
    if (hr < 24) return m ? `${sign}${hr} h ${m} min` : `${sign}${hr} h`;
    const d = Math.floor(hr / 24); hr %= 24;
    return hr ? `${sign}${d} d ${hr} h` : `${sign}${d} d`;
  }
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  function rows(table, list, empty, cols, row) {
    const body = table.querySelector("tbody");
    body.replaceChildren(...(list.length ? list.map(row)
      : [h("tr", {}, h("td", { colspan: cols, class: "empty" }, empty))]));
  }
  function link(href, text, cls) {
    return h("a", cls ? { href, class: cls } : { href }, text);
  }

  function renderOverview(live, o) {
    const s = o.stats, root = live.dataset.root || "";
    const statuses = Object.keys(s.by_status);
    const values = {
      live: s.live, executing: s.executing,
      due: sum(Object.values(s.queued).map((q) => q.due)),
      oldest: duration(s.oldest_due_age),
      finished_minute: sum(Object.values(s.finished_last_minute)),
      pending_approvals: o.pending_approvals, dead_letters: o.dead_letters,
      outbox_backlog: s.outbox_backlog,
    };
    for (const st of statuses) values[`status.${st}`] = s.by_status[st];
    for (const [k, v] of Object.entries(values)) setText(live, k, v);
    document.getElementById("card-approvals").classList.toggle("warn", o.pending_approvals > 0);
    document.getElementById("card-dead").classList.toggle("bad", o.dead_letters > 0);

    const total = sum(Object.values(s.by_status));
    document.getElementById("stack").replaceChildren(...statuses.filter((st) => s.by_status[st])
      .map((st) => h("span", { class: `s-${st}`, title: `${st}: ${s.by_status[st]}`,
                               style: `width: ${100 * s.by_status[st] / total}%` })));

    const order = Array.from(document.querySelectorAll("#by-workflow thead th[title]"))
      .map((th) => th.title);
    const wfs = Object.keys(s.by_workflow).sort();
    const q = (params) => `${root}/runs?${new URLSearchParams(params)}`;
    rows(document.getElementById("by-workflow"), wfs, "No runs yet.", order.length + 1,
      (wf) => h("tr", {}, h("td", {}, link(q({ workflow: wf }), wf)),
        ...order.map((st) => {
          const n = s.by_workflow[wf][st];
          return h("td", { class: "num" }, n ? link(q({ workflow: wf, status: st }), n)
            : h("span", { class: "muted" }, "·"));
        })));

    const tenants = Object.keys(s.queued).sort();
    rows(document.getElementById("queues"), tenants, "Nothing queued.", 4,
      (t) => h("tr", {}, h("td", {}, link(q({ status: "queued", tenant: t }), t)),
        h("td", { class: "num" }, s.queued[t].due), h("td", { class: "num" }, s.queued[t].delayed),
        h("td", { class: "num" }, s.queued[t].held)));

    rows(document.getElementById("held-back"), s.held_back, "No rule holds a run back.", 4,
      (x) => h("tr", {}, h("td", {}, link(q({ workflow: x.workflow, status: "queued" }), x.workflow)),
        h("td", { class: "mono" }, x.reason),
        h("td", { class: "num" }, x.runs.toLocaleString("en-US") + (x.capped ? "+" : "")),
        h("td", {}, x.text)));
    rows(document.getElementById("paused"), s.paused, "No workflow is paused.", 3,
      (p) => h("tr", {}, h("td", {}, p.workflow),
        h("td", {}, p.tenant === null ? muted("every tenant") : p.tenant),
        h("td", {}, h("time", { "data-ts": p.paused_at }, utcTime(p.paused_at)))));

    renderInstances(o);

    rows(document.getElementById("circuits"), o.open_circuits, "Every circuit is closed.", 3,
      (p) => h("tr", {}, h("td", {}, p.name),
        h("td", {}, h("span", { class: `status s-${p.state.breaker}` }, p.state.breaker)),
        h("td", {}, p.open_until === null
          ? h("span", { class: "muted" }, "a trial call decides")
          : h("time", { "data-ts": p.open_until }, utcTime(p.open_until)))));

    renderChart(o.finished_per_minute.counts);
    localizeTimes(live);
  }

  // the live instances, as overview.html draws them; times relative to the server's clock
  const muted = (text) => h("span", { class: "muted" }, text);
  function ago(ts, now) {
    if (ts === null || ts === undefined) return muted("—");
    return h("span", {}, h("span", { class: "ago" }, `${duration(now - ts)} ago`), " · ",
      h("time", { "data-ts": ts, "data-compact": "" }, utcTime(ts)));
  }
  function liveness(live) {
    if (live === true) return h("span", { class: "status s-live" }, "live");
    if (live === false) return h("span", { class: "status s-no-heartbeat" }, "no heartbeat");
    return h("span", { class: "status s-unknown" }, "unknown");
  }
  function renderInstances(o) {
    const m = o.membership;
    setText(document, "instances",
      m.available ? o.instances.filter((i) => i.live === true).length : "?");
    const note = document.getElementById("membership-note");
    if (note) {
      note.hidden = m.available;
      note.textContent = "Membership unavailable" + (m.error ? `: ${m.error}` : "") +
        ". The instances are those the run store knows (registered, or holding runs); none " +
        "can be shown as live, and slots, locks and meters are not shown.";
    }
    rows(document.getElementById("instances"), o.instances,
      "No live instance: no App of this namespace is running.", 5,
      (i) => h("tr", {},
        h("td", { class: "nowrap" }, h("span", { class: "mono" }, i.id),
          i.live === true ? null : " ", i.live === true ? null : liveness(i.live)),
        h("td", {}, i.version === null ? muted("—") : i.version),
        h("td", {}, ago(i.last_heartbeat, o.at)),
        h("td", { class: "nowrap" }, i.slot ? h("span", { title: `owns slots ${i.slot.index}, ` +
          `${i.slot.index + i.slot.of}, … of any total` }, `${i.slot.index} of ${i.slot.of}`)
          : muted("none")),
        h("td", { class: "num" }, i.runs_held)));
  }

  function renderChart(counts) {
    const svg = document.getElementById("chart");
    const [, , width, height] = svg.getAttribute("viewBox").split(" ").map(Number);
    const top = Math.max(0, ...counts), slot = width / Math.max(counts.length, 1);
    const bars = counts.map((n, i) => {
      const bh = top === 0 ? 0 : n / top * (height - 4);
      return h("svg:rect", { class: "bar-ok", x: i * slot + 1, width: Math.max(slot - 2, 1),
                             y: height - bh, height: bh },
        h("svg:title", {}, `${n} finished, ${counts.length - 1 - i} min ago`));
    });
    svg.replaceChildren(svg.querySelector("line"), ...bars);
    setText(document, "chart_total", sum(counts));
    setText(document, "chart_max", top);
  }
  // -- a live run's progress (run.html's #progress), from /api/runs/{id} ----------------------
  function renderRun(live, d) {
    const r = d.run, p = r.progress;
    if (r.status !== live.dataset.status) {   // it moved on: the whole page shows where to
      window.location.reload();
      return;
    }
    if (!p) return;
    const part = (name) => live.querySelector(`[data-part="${name}"]`);
    part("detail").hidden = false;
    if (part("none")) part("none").hidden = true;
    const bar = part("bar"), pct = part("pct");
    if (p.fraction === null) {
      bar.hidden = true;
      pct.textContent = "";
    } else {
      const value = 100 * p.fraction;
      bar.hidden = false;
      bar.setAttribute("aria-valuenow", String(Math.round(value)));
      bar.firstElementChild.style.width = `${value.toFixed(1)}%`;
      pct.textContent = `${Math.round(value)}%`;
    }
    part("message").textContent = p.message || "";
    bar.parentElement.title = `${pct.textContent} ${p.message || ""}`.trim();
    const data = part("data");
    data.hidden = Object.keys(p.data || {}).length === 0;
    data.textContent = JSON.stringify(p.data, null, 2);
    part("ago").replaceChildren(ago(p.at, d.at));
    localizeTimes(live);
  }

  const renderers = { overview: renderOverview, run: renderRun };

  document.addEventListener("DOMContentLoaded", () => {
    localizeTimes(document);
    showStoredFlash();
    startLive();
  });
  window.shoal = { localizeTimes, localTime, utcTime, setText };
})();
