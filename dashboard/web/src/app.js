// airlock dashboard: a small single-page UI over the /v1 API. Every API
// call carries the session's CSRF token (X-Airlock-CSRF); the API key stays
// on the server (HttpOnly session cookie). All untrusted text is inserted
// with textContent, never as HTML.
import { Terminal } from "@xterm/xterm";
import { keysPage } from "./keys.js";
import { desktopPage } from "./desktop.js";

let csrf = "";
let timers = [];
let term = null;
let sock = null;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of kids.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(method, path, body, raw) {
  const headers = { "X-Airlock-CSRF": csrf };
  let b;
  if (body instanceof Blob || typeof body === "string") b = body;
  else if (body !== undefined) { b = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
  const r = await fetch(path, { method, headers, body: b, credentials: "same-origin" });
  if (r.status === 401 && !path.startsWith("/ui/")) { csrf = ""; route(); throw new Error("logged out"); }
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { const j = await r.json(); if (j.error) msg = j.error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  if (raw) return r;
  return r.json();
}

function clear() {
  timers.forEach(clearInterval);
  timers = [];
  if (term) { term.dispose(); term = null; }
  if (sock) { sock.close(1000, "left the page"); sock = null; }
  const m = document.getElementById("main");
  m.replaceChildren();
  return m;
}

function every(ms, fn) { fn(); timers.push(setInterval(fn, ms)); }

function fmtBytes(n) {
  if (!n) return "0";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

function fmtAge(t) {
  const s = Math.round((Date.now() - new Date(t).getTime()) / 1000);
  if (s < 0) return "in " + fmtDur(-s);
  return fmtDur(s);
}

function fmtDur(s) {
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
  return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
}

// sparkline draws the last values as an SVG polyline.
function sparkline(values) {
  const ns = "http://www.w3.org/2000/svg";
  const w = 90, h = 22;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
  const max = Math.max(...values, 1e-9);
  const pts = values.map((v, i) => `${(i * (w - 2)) / Math.max(values.length - 1, 1) + 1},${h - 1 - (v / max) * (h - 2)}`);
  const pl = document.createElementNS(ns, "polyline");
  pl.setAttribute("points", pts.join(" "));
  svg.append(pl);
  return svg;
}

// history keeps recent CPU (cores) and memory samples per sandbox.
const history = new Map();
function sample(id, m) {
  const h = history.get(id) || { cpu: [], mem: [], last: null };
  if (h.last) {
    const dt = (Date.now() - h.last.at) / 1000;
    h.cpu.push(dt > 0 ? Math.max(0, (m.cpu_seconds - h.last.cpu) / dt) : 0);
  } else h.cpu.push(0);
  h.mem.push(m.memory_bytes);
  h.last = { at: Date.now(), cpu: m.cpu_seconds };
  if (h.cpu.length > 30) { h.cpu.shift(); h.mem.shift(); }
  history.set(id, h);
  return h;
}

function showError(where, e) { where.replaceChildren(el("p", { class: "error" }, e.message || String(e))); }

// confirmButton is a destructive action's button: the first click asks
// ("Really …?", for 4 s), the second does it. No blocking dialog.
function confirmButton(label, cls, action, attrs) {
  const b = el("button", Object.assign({ class: cls }, attrs || {}), label);
  let armed = null;
  b.addEventListener("click", async () => {
    if (!armed) {
      b.textContent = "Really " + label.toLowerCase() + "?";
      b.classList.add("confirm");
      armed = setTimeout(() => { armed = null; b.textContent = label; b.classList.remove("confirm"); }, 4000);
      return;
    }
    clearTimeout(armed); armed = null;
    b.disabled = true;
    try { await action(); } finally { b.disabled = false; b.textContent = label; b.classList.remove("confirm"); }
  });
  return b;
}

// table builds a scrolling table; cols marked "~" are hidden on narrow screens.
function table(headers, tbody, id) {
  return el("div", { class: "scroll" }, el("table", id ? { id } : {}, el("thead", {}, el("tr", {}, headers.map((h) => h.startsWith("~") ? el("th", { class: "hide-narrow" }, h.slice(1)) : el("th", {}, h)))), tbody));
}

// placeholder fills tbody with one row saying it is loading, empty, or failed.
function placeholder(tbody, cols, text, cls) {
  tbody.replaceChildren(el("tr", { class: cls || "empty" }, el("td", { colspan: cols, class: cls === "error" ? "error" : "" }, text)));
}

function loginPage() {
  const m = clear();
  const input = el("input", { type: "password", id: "key", autocomplete: "off", placeholder: "al_..." });
  const msg = el("p", { class: "error", id: "login-error" });
  const form = el("form", { class: "login", id: "login" }, el("h2", {}, "Log in to airlock"),
    el("label", { for: "key" }, "API key"), input, el("button", { type: "submit" }, "Log in"), msg);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      csrf = "login"; // any value: the server checks the header is there and the Origin
      const s = await api("POST", "/ui/session", { key: input.value });
      input.value = "";
      csrf = s.csrf;
      session = s;
      location.hash = "#/";
      route();
    } catch (e) { msg.textContent = e.message; }
  });
  m.append(form);
}

let session = null;

async function sandboxesPage() {
  const m = clear();
  const filter = el("input", { id: "filter", type: "search", placeholder: "filter by id, state, runtime, profile…" });
  const onlyRunning = el("input", { type: "checkbox", id: "running", checked: true });
  const status = el("span", { class: "muted" });
  const allow = el("input", { id: "allow", placeholder: "e.g. pypi.org, api.github.com (empty: no network)" });
  const image = el("input", { id: "new-image", placeholder: "default root, or an image/template" });
  const runtime = el("select", { id: "new-runtime" }, el("option", { value: "" }, "server default"));
  const profile = el("select", { id: "new-profile" }, ["", "strict", "standard", "light"].map((p) => el("option", { value: p }, p || "server default")));
  const memory = el("input", { id: "new-memory", type: "number", min: "16", placeholder: "profile's" });
  const ttl = el("input", { id: "new-timeout", type: "number", min: "1", placeholder: "server's" });
  api("GET", "/v1/info").then((i) => {
    for (const r of i.runtimes || []) runtime.append(el("option", { value: r }, r));
  }).catch(() => { /* the default stays */ });
  const create = el("button", { id: "create", type: "submit" }, "New sandbox");
  const form = el("form", { class: "create", id: "create-form" },
    el("label", {}, "Image or template", image), el("label", {}, "Runtime", runtime), el("label", {}, "Profile", profile),
    el("label", {}, "Memory (MiB)", memory), el("label", {}, "Timeout (s)", ttl), el("label", {}, "Allowed hosts", allow), create);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    create.disabled = true;
    const hosts = allow.value.split(",").map((h) => h.trim()).filter(Boolean);
    const req = hosts.length ? { network: { mode: "allowlist", allow: hosts } } : {};
    if (image.value.trim()) req.image = image.value.trim();
    if (runtime.value) req.runtime = runtime.value;
    if (profile.value) req.profile = profile.value;
    if (Number(memory.value) > 0) req.limits = { memory_bytes: Number(memory.value) * 1048576 };
    if (Number(ttl.value) > 0) req.timeout = Number(ttl.value);
    status.textContent = "creating";
    status.className = "loading";
    try { const sb = await api("POST", "/v1/sandboxes", req); status.textContent = "created " + sb.id; refresh(); } catch (e) { status.textContent = e.message; }
    status.className = "muted";
    create.disabled = false;
  });
  const tbody = el("tbody", { id: "sandboxes" });
  placeholder(tbody, 11, "loading", "loading");
  m.append(form, el("div", { class: "toolbar" }, filter, el("label", {}, onlyRunning, " running only"), status),
    table(["ID", "State", "Runtime", "~Image", "~Profile", "~Owner key", "~Age", "TTL left", "~CPU", "Memory", ""], tbody));
  let list = [];
  const images = new Map();
  const render = () => {
    const q = filter.value.toLowerCase();
    const rows = list.filter((s) => (!onlyRunning.checked || s.state === "running") &&
      (!q || [s.id, s.state, s.runtime, s.profile, images.get(s.id), JSON.stringify(s.metadata)].join(" ").toLowerCase().includes(q)));
    if (!rows.length) {
      placeholder(tbody, 11, list.length ? "no sandbox matches" : onlyRunning.checked ? "no running sandboxes: create one above" : "no sandboxes yet");
      return;
    }
    tbody.replaceChildren(...rows.map((s) => {
      const h = history.get(s.id);
      const last = h && h.mem.length ? fmtBytes(h.mem[h.mem.length - 1]) : "";
      return el("tr", { "data-id": s.id },
        el("td", {}, el("a", { href: "#/sb/" + encodeURIComponent(s.id) }, s.id)),
        el("td", { class: "state-" + s.state }, s.paused ? "paused" : s.state),
        el("td", {}, s.runtime || ""), el("td", { class: "hide-narrow" }, images.get(s.id) || ""), el("td", { class: "hide-narrow" }, s.profile),
        el("td", { class: "hide-narrow" }, session && session.key_id ? session.key_id : "(no auth)"),
        el("td", { class: "hide-narrow" }, fmtAge(s.created_at)),
        el("td", {}, s.expires_at && s.state === "running" ? fmtDur(Math.max(0, Math.round((new Date(s.expires_at) - Date.now()) / 1000))) : ""),
        el("td", { class: "hide-narrow" }, h ? sparkline(h.cpu) : "", " ", h ? (h.cpu[h.cpu.length - 1] * 100).toFixed(0) + "%" : ""),
        el("td", {}, h ? sparkline(h.mem) : "", " ", last),
        el("td", {}, s.state === "running" ? [
          el("button", { class: s.paused ? "resume" : "pause", onclick: () => act("POST", s.id, s.paused ? "/resume" : "/pause") }, s.paused ? "Resume" : "Pause"), " ",
          confirmButton("Kill", "kill", () => act("DELETE", s.id, ""))] : ""));
    }));
  };
  const act = async (method, id, suffix) => {
    try { await api(method, "/v1/sandboxes/" + encodeURIComponent(id) + suffix); refresh(); } catch (e) { status.textContent = e.message; }
  };
  const refresh = async () => {
    try {
      const states = onlyRunning.checked ? "running" : "running,exited,killed,expired,lost";
      list = (await api("GET", "/v1/sandboxes?limit=200&state=" + states)).sandboxes || [];
      // The image each was created from is in its sandbox.create record.
      if (list.some((s) => !images.has(s.id))) {
        for (const ev of (await api("GET", "/v1/audit?action=sandbox.create&limit=1000")).events || []) {
          images.set(ev.sandbox_id, (ev.detail && ev.detail.image) || "(default)");
        }
      }
      await Promise.all(list.filter((s) => s.state === "running" && !s.paused).map(async (s) => {
        try { sample(s.id, await api("GET", "/v1/sandboxes/" + encodeURIComponent(s.id) + "/metrics")); } catch (_) { /* ended meanwhile */ }
      }));
      render();
    } catch (e) { status.textContent = e.message; }
  };
  filter.addEventListener("input", render);
  onlyRunning.addEventListener("change", refresh);
  every(2000, refresh);
}

async function sandboxPage(id) {
  const m = clear();
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  const head = el("div", { class: "toolbar" }, el("h2", {}, id));
  m.append(head);
  let info;
  try { info = await api("GET", base); } catch (e) { showError(m, e); return; }
  head.append(el("span", { class: "state-" + info.state }, info.state), el("span", { class: "muted" }, (info.runtime || "") + " · " + info.profile),
    el("a", { href: "#/desktop/" + encodeURIComponent(id), id: "desktop-link" }, "Desktop"),
    info.state === "running" ? confirmButton("Kill", "kill", async () => { await api("DELETE", base); location.hash = "#/"; }, { id: "kill" }) : "");
  const sec = (title, id, ...kids) => el("section", { id }, el("h2", {}, title), ...kids);

  // Terminal: a shell on a pseudo-terminal over the PTY WebSocket
  // (GET .../pty); line mode over POST exec where that cannot open.
  const termBox = el("div", { id: "terminal" });
  const termTitle = el("h2", {}, "Terminal");
  m.append(el("section", { id: "term" }, termTitle, termBox));
  // As many columns as the box holds (a phone's screen too), at least 20.
  term = new Terminal({ rows: 14, fontSize: 13, cols: Math.max(20, Math.floor((termBox.clientWidth || 640) / 8)) });
  term.open(termBox);
  const t = term;
  sock = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + base + "/pty?cols=" + t.cols + "&rows=" + t.rows);
  sock.binaryType = "arraybuffer";
  const ws = sock;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    termBox.dataset.mode = "pty";
    termTitle.textContent = "Terminal (PTY)";
    const enc = new TextEncoder();
    t.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
    t.onResize(({ cols, rows }) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols, rows })); });
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { t.write(new Uint8Array(ev.data)); return; }
    const msg = JSON.parse(ev.data);
    if (msg.type === "exit") t.write("\r\n\x1b[33m[exited " + (msg.signal || msg.exit_code) + "]\x1b[0m\r\n");
    else if (msg.type === "error") t.write("\r\n\x1b[31m[" + msg.message + "]\x1b[0m\r\n");
  };
  ws.onclose = () => {
    if (term !== t) return; // the page was left
    if (opened) t.write("\r\n\x1b[33m[terminal closed; reload for a new one]\x1b[0m\r\n");
    else lineMode(t, base, id, termBox, termTitle);
  };
  t.focus();

  // Code cells in the sandbox's stateful contexts (POST .../code).
  const lang = el("select", { id: "code-lang" }, ["python", "javascript", "bash"].map((l) => el("option", { value: l }, l)));
  const src = el("textarea", { id: "code-src", rows: 4, cols: 80, spellcheck: "false", placeholder: "print(6 * 7)" });
  const codeOut = el("div", { id: "code-output" });
  const ctxs = el("span", { id: "contexts", class: "muted" });
  const runBtn = el("button", { id: "code-run", onclick: async () => {
    runBtn.disabled = true;
    codeOut.replaceChildren(el("p", { class: "muted" }, "running…"));
    try {
      const r = await api("POST", base + "/code", { code: src.value, language: lang.value });
      const kids = [el("p", { class: "muted" }, "[" + r.execution_count + "] " + r.context_id + " · " + r.duration_ms.toFixed(0) + " ms")];
      if (r.stdout) kids.push(el("pre", {}, r.stdout));
      if (r.stderr) kids.push(el("pre", { class: "error" }, r.stderr));
      for (const res of r.results || []) {
        // Images as images (data: URLs); everything else, HTML included, as text.
        if (res["image/png"]) kids.push(el("img", { src: "data:image/png;base64," + res["image/png"], alt: "result" }));
        else if (res["text/plain"] !== undefined) kids.push(el("pre", {}, res["text/plain"]));
      }
      if (r.error) kids.push(el("pre", { class: "error" }, r.error.name + ": " + r.error.value + "\n" + (r.error.traceback || []).join("\n")));
      codeOut.replaceChildren(...kids);
    } catch (e) { codeOut.replaceChildren(el("p", { class: "error" }, e.message)); }
    runBtn.disabled = false;
    loadContexts();
  } }, "Run");
  m.append(sec("Code", "codesec", el("div", { class: "toolbar" }, lang, runBtn, ctxs), src, codeOut));
  const loadContexts = async () => {
    try {
      const cs = (await api("GET", base + "/contexts")).contexts || [];
      ctxs.textContent = cs.length ? "contexts: " + cs.map((c) => c.id + " (" + c.language + ")").join(", ") : "no contexts yet";
    } catch (e) { ctxs.textContent = e.message; }
  };
  loadContexts();

  // Processes and their output.
  const procs = el("tbody", { id: "processes" });
  const logs = el("pre", { id: "proc-output", class: "muted" }, "select a process to see its output");
  m.append(sec("Processes", "procs", table(["PID", "Command", "~Tag", "Running", "~Exit", ""], procs), logs));
  const loadProcs = async () => {
    try {
      const ps = (await api("GET", base + "/processes")).processes || [];
      if (!ps.length) { placeholder(procs, 6, "no processes yet"); return; }
      procs.replaceChildren(...ps.map((p) => el("tr", { "data-tag": p.tag || "" }, el("td", {}, p.pid), el("td", {}, (p.argv || []).join(" ")), el("td", { class: "hide-narrow" }, p.tag || ""),
        el("td", {}, p.running ? "yes" : "no"), el("td", { class: "hide-narrow" }, p.exit_code ?? ""),
        el("td", {}, p.running ? confirmButton("Kill", "sigkill", async () => {
          try { await api("POST", base + "/processes/" + p.pid + "/signal", { signal: "SIGKILL" }); loadProcs(); } catch (e) { logs.textContent = e.message; }
        }) : "", " ", el("button", { class: "output", onclick: async () => {
          try { const l = await api("GET", base + "/processes/" + p.pid + "/logs"); logs.textContent = l.stdout + (l.stderr ? "\n[stderr]\n" + l.stderr : ""); } catch (e) { logs.textContent = e.message; }
        } }, "Output")))));
    } catch (e) { procs.replaceChildren(el("tr", {}, el("td", { class: "error" }, e.message))); }
  };

  // Files.
  let dir = "/workspace";
  const files = el("tbody", { id: "files" });
  const here = el("code", { id: "cwd" });
  const upload = el("input", { type: "file", id: "upload" });
  const fstatus = el("span", { class: "muted" });
  upload.addEventListener("change", async () => {
    for (const f of upload.files) {
      try { await api("PUT", base + "/files?path=" + encodeURIComponent(dir.replace(/\/$/, "") + "/" + f.name), f); fstatus.textContent = "uploaded " + f.name; } catch (e) { fstatus.textContent = e.message; }
    }
    upload.value = "";
    loadFiles();
  });
  m.append(sec("Files", "filesec", el("div", { class: "toolbar" }, here, el("button", { onclick: () => { dir = dir.replace(/\/[^/]*$/, "") || "/"; loadFiles(); } }, "Up"), el("label", {}, "Upload: ", upload), fstatus),
    table(["Name", "~Type", "Size", "~Modified", ""], files)));
  const loadFiles = async () => {
    here.textContent = dir;
    try {
      const es = (await api("GET", base + "/files/list?path=" + encodeURIComponent(dir))).entries || [];
      files.replaceChildren(...es.map((f) => el("tr", {},
        el("td", {}, f.type === "dir" ? el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); dir = f.path; loadFiles(); } }, f.name + "/") : f.name),
        el("td", { class: "hide-narrow" }, f.type), el("td", {}, fmtBytes(f.size)), el("td", { class: "hide-narrow" }, new Date(f.mtime).toLocaleString()),
        el("td", {}, f.type === "file" ? el("button", { onclick: async () => {
          try {
            const r = await api("GET", base + "/files?path=" + encodeURIComponent(f.path), undefined, true);
            const a = el("a", { href: URL.createObjectURL(await r.blob()), download: f.name });
            a.click(); setTimeout(() => URL.revokeObjectURL(a.href), 10000);
          } catch (e) { fstatus.textContent = e.message; }
        } }, "Download") : ""))));
    } catch (e) { files.replaceChildren(el("tr", {}, el("td", { class: "error" }, e.message))); }
  };

  // Network.
  const netPolicy = el("p", { id: "net-policy", class: "muted" });
  const net = el("tbody", { id: "netlog" });
  m.append(sec("Network", "network", netPolicy, table(["~Time", "Host", "~Port", "Verdict", "~Up", "~Down"], net)));
  const loadNet = async () => {
    try {
      const p = await api("GET", base + "/network");
      netPolicy.textContent = "mode " + p.mode + (p.allow && p.allow.length ? " · allow " + p.allow.join(", ") : "") + (p.deny && p.deny.length ? " · deny " + p.deny.join(", ") : "");
      const cs = (await api("GET", base + "/network/log")).connections || [];
      if (!cs.length) { placeholder(net, 6, "no connections yet"); return; }
      net.replaceChildren(...cs.slice().reverse().map((c) => el("tr", {}, el("td", { class: "hide-narrow" }, new Date(c.time).toLocaleTimeString()), el("td", {}, c.host), el("td", { class: "hide-narrow" }, c.port),
        el("td", { class: c.allowed ? "allowed" : "denied", title: c.reason || "" }, c.allowed ? "allowed" : "denied"), el("td", { class: "hide-narrow" }, fmtBytes(c.bytes_up)), el("td", { class: "hide-narrow" }, fmtBytes(c.bytes_down)))));
    } catch (e) { netPolicy.textContent = e.message; }
  };

  // Audit trail and policy (the sandbox.create record holds the policy).
  const policy = el("pre", { id: "policy" });
  const audit = el("tbody", { id: "audit" });
  m.append(sec("Policy (as created)", "policysec", policy), sec("Audit trail", "auditsec", auditTable(audit)));
  const loadAudit = async () => {
    try {
      const evs = (await api("GET", "/v1/audit?sandbox=" + encodeURIComponent(id) + "&limit=200")).events || [];
      fillAudit(audit, evs);
      const created = evs.find((e) => e.action === "sandbox.create");
      if (created) policy.textContent = JSON.stringify(created.detail, null, 2);
    } catch (e) { audit.replaceChildren(el("tr", {}, el("td", { class: "error" }, e.message))); }
  };
  loadFiles();
  every(2000, () => { loadProcs(); loadNet(); loadAudit(); });
}

// lineMode runs each typed line as POST exec (/bin/sh -c LINE), carrying
// the working directory between lines.
function lineMode(t, base, id, termBox, termTitle) {
  termBox.dataset.mode = "line";
  termTitle.textContent = "Terminal (line mode: each line runs in /bin/sh -c)";
  t.options.convertEol = true;
  let line = "", cwd = "/workspace", busy = false;
  const prompt = () => t.write("\x1b[32m" + cwd + "\x1b[0m$ ");
  t.writeln("airlock " + id + " (line mode over exec)");
  prompt();
  t.onData(async (d) => {
    if (busy) return;
    for (const ch of d) {
      if (ch === "\r") {
        t.write("\r\n");
        const cmd = line; line = "";
        if (cmd.trim()) {
          busy = true;
          try {
            const r = await api("POST", base + "/exec", { shell: cmd + "\necho \"\x1e$PWD\"", cwd, timeout: 60 });
            let out = r.stdout;
            const mark = out.lastIndexOf("\x1e");
            if (mark >= 0) { cwd = out.slice(mark + 1).trim() || cwd; out = out.slice(0, mark); }
            t.write(out); if (r.stderr) t.write("\x1b[31m" + r.stderr + "\x1b[0m");
            if (r.exit_code) t.writeln("\x1b[33m[exit " + r.exit_code + "]\x1b[0m");
          } catch (e) { t.writeln("\x1b[31m" + e.message + "\x1b[0m"); }
          busy = false;
        }
        prompt();
      } else if (ch === "\x7f") {
        if (line) { line = line.slice(0, -1); t.write("\b \b"); }
      } else if (ch >= " ") { line += ch; t.write(ch); }
    }
  });
}

function auditTable(tbody) {
  placeholder(tbody, 5, "loading", "loading");
  return table(["~#", "Time", "~Sandbox", "Action", "Detail"], tbody);
}

function fillAudit(tbody, evs) {
  tbody.replaceChildren(...evs.map((e) => el("tr", {}, el("td", { class: "hide-narrow" }, e.id), el("td", {}, new Date(e.time).toLocaleString()), el("td", { class: "hide-narrow" }, e.sandbox_id || ""),
    el("td", {}, e.action), el("td", { class: "detail" }, detailOf(e.detail)))));
  if (!evs.length) placeholder(tbody, 5, "no audit records");
}

// detailOf shows a record's detail: short ones inline, long ones folded.
function detailOf(d) {
  const text = JSON.stringify(d || {});
  if (text.length <= 120) return el("code", {}, text);
  return el("details", {}, el("summary", {}, text.slice(0, 100) + "…"), el("pre", {}, JSON.stringify(d, null, 2)));
}

async function serverPage() {
  const m = clear();
  const cap = el("tbody", { id: "capacity" });
  const layers = el("tbody", { id: "layers" });
  m.append(el("section", {}, el("h2", {}, "Server"), el("div", { class: "scroll" }, el("table", {}, cap))), el("section", {}, el("h2", {}, "Isolation layers"), el("div", { class: "scroll" }, el("table", {}, layers))));
  try {
    const i = await api("GET", "/v1/info");
    const c = i.ceilings || {};
    const rows = [["Version", i.version], ["Runtimes", JSON.stringify(i.runtimes)], ["Default runtime", i.default_runtime], ["Authentication", i.auth ? "API keys" : "off (loopback --no-auth)"],
      ["Logged in as", session && session.key ? session.key.id + (session.key.name ? " (" + session.key.name + ")" : "") : "(no auth)"],
      ["Key quota: running sandboxes", session && session.key ? (session.key.max_sandboxes || "no cap of its own (the server's applies)") : ""],
      ["Key quota: per-sandbox limits", session && session.key && session.key.limits && Object.keys(session.key.limits).length ? JSON.stringify(session.key.limits) : "none of its own (the server's ceilings apply)"],
      ["Ceiling: memory", fmtBytes(c.memory_bytes)], ["Ceiling: CPUs", c.cpus], ["Ceiling: pids", c.pids], ["Ceiling: disk", fmtBytes(c.disk_bytes)]];
    for (const [k, v] of Object.entries(i)) if (!["version", "runtimes", "default_runtime", "auth", "ceilings", "enforced"].includes(k)) rows.push([k, typeof v === "object" ? JSON.stringify(v) : v]);
    cap.replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v ?? ""))));
    layers.replaceChildren(...(i.enforced || []).map((l) => el("tr", {}, el("th", {}, l.name), el("td", {}, l.state), el("td", {}, l.detail || ""))));
  } catch (e) { showError(cap, e); }
  // Totals over time: the server's Prometheus counters, polled while the
  // page is open (values summed over their labels).
  const totals = el("tbody", { id: "totals" });
  m.append(el("section", {}, el("h2", {}, "Totals (since this page opened, every 2 s)"), el("div", { class: "scroll" }, el("table", {}, totals))));
  const series = new Map();
  every(2000, async () => {
    try {
      const text = await (await api("GET", "/metrics", undefined, true)).text();
      const now = new Map();
      for (const l of text.split("\n")) {
        const mm = /^(airlock_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$/.exec(l);
        // Histograms' buckets, sums and counts are not totals.
        if (mm && !/_(bucket|sum|count)$/.test(mm[1])) now.set(mm[1], (now.get(mm[1]) || 0) + Number(mm[3]));
      }
      for (const [k, v] of now) {
        const arr = series.get(k) || [];
        arr.push(v); if (arr.length > 60) arr.shift();
        series.set(k, arr);
      }
      totals.replaceChildren(...[...series.keys()].sort().map((k) => {
        const arr = series.get(k);
        return el("tr", {}, el("th", {}, k), el("td", {}, arr[arr.length - 1]), el("td", {}, sparkline(arr)));
      }));
    } catch (e) { totals.replaceChildren(el("tr", {}, el("td", { class: "error" }, e.message))); }
  });
  const q = el("input", { id: "audit-q", type: "search", placeholder: "action (e.g. exec, sandbox.create) or sandbox id" });
  const tbody = el("tbody", { id: "server-audit" });
  const go = async () => {
    const v = q.value.trim();
    const qs = new URLSearchParams({ limit: "200" });
    if (v.startsWith("sb-")) qs.set("sandbox", v); else if (v) qs.set("action", v);
    try { fillAudit(tbody, (await api("GET", "/v1/audit?" + qs)).events || []); } catch (e) { tbody.replaceChildren(el("tr", {}, el("td", { class: "error" }, e.message))); }
  };
  q.addEventListener("change", go);
  m.append(el("section", {}, el("h2", {}, "Audit log"), el("div", { class: "toolbar" }, q, el("button", { onclick: go }, "Search")), auditTable(tbody)));
  go();
}

// imagesPage lists the key's images (named ones; "all" adds build steps)
// and deletes them.
async function imagesPage() {
  const m = clear();
  const tbody = el("tbody", { id: "images" });
  const all = el("input", { type: "checkbox", id: "images-all" });
  const status = el("span", { class: "muted", id: "images-status" });
  const ref = el("input", { id: "pull-ref", placeholder: "registry/name:tag" });
  const pull = el("button", { id: "pull", onclick: async () => {
    if (!ref.value.trim()) return;
    pull.disabled = true; status.textContent = "pulling " + ref.value; status.className = "loading";
    try { await api("POST", "/v1/images", { ref: ref.value.trim() }); status.textContent = "pulled " + ref.value; load(); } catch (e) { status.textContent = e.message; }
    status.className = "muted"; pull.disabled = false;
  } }, "Pull");
  placeholder(tbody, 5, "loading", "loading");
  m.append(el("h2", {}, "Images"), el("div", { class: "toolbar" }, ref, pull, el("label", {}, all, " build steps too"), status),
    table(["Name", "~Digest", "Size", "~Created", ""], tbody));
  const load = async () => {
    try {
      const imgs = ((await api("GET", "/v1/images")).images || []).filter((i) => all.checked || i.name);
      if (!imgs.length) { placeholder(tbody, 5, "no images: pull one, build a template, or snapshot a sandbox"); return; }
      tbody.replaceChildren(...imgs.map((i) => el("tr", { "data-name": i.name || "" }, el("td", {}, i.name || "<none>"), el("td", { class: "hide-narrow" }, el("code", {}, (i.digest || "").slice(0, 19))),
        el("td", {}, fmtBytes(i.size)), el("td", { class: "hide-narrow" }, i.created ? new Date(i.created).toLocaleString() : ""),
        el("td", {}, confirmButton("Delete", "delete", async () => {
          try { await api("DELETE", "/v1/images/" + encodeURI(i.name || i.digest)); load(); } catch (e) { status.textContent = e.message; }
        })))));
    } catch (e) { placeholder(tbody, 5, e.message, "error"); }
  };
  all.addEventListener("change", load);
  load();
}

// templatesPage builds an image from a Dockerfile (POST /v1/templates) and
// shows the build log.
async function templatesPage() {
  const m = clear();
  const name = el("input", { id: "tpl-name", placeholder: "name, e.g. team/py:1", required: true });
  const runtime = el("select", { id: "tpl-runtime" }, el("option", { value: "" }, "server default"));
  api("GET", "/v1/info").then((i) => { for (const r of i.runtimes || []) if (r !== "wasm") runtime.append(el("option", { value: r }, r)); }).catch(() => {});
  const df = el("textarea", { id: "tpl-dockerfile", rows: 8, spellcheck: "false", placeholder: "FROM debian-with-python\nRUN pip install requests" });
  const build = el("button", { id: "tpl-build", type: "submit" }, "Build");
  const log = el("pre", { id: "tpl-log", class: "muted" }, "the build log appears here");
  const form = el("form", { class: "stack", id: "tpl-form" }, el("label", {}, "Name", name), el("label", {}, "RUN steps under", runtime), el("label", {}, "Dockerfile", df), build);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    build.disabled = true;
    log.className = "loading"; log.textContent = "building " + name.value;
    try {
      const r = await api("POST", "/v1/templates", { name: name.value.trim(), dockerfile: df.value, runtime: runtime.value || undefined });
      log.className = "";
      log.textContent = r.log + "\n" + r.steps + " steps, " + r.cached + " cached: " + (r.image.name || r.image.digest) + " (" + fmtBytes(r.image.size) + ")";
    } catch (e) { log.className = "error"; log.textContent = e.message; }
    build.disabled = false;
  });
  m.append(el("h2", {}, "Build a template"), el("p", { class: "muted" }, "Templates are images built from a Dockerfile; create sandboxes from them by name (Sandboxes, Image or template)."), form, log);
}

// volumesPage lists, creates and deletes the key's volumes.
async function volumesPage() {
  const m = clear();
  const tbody = el("tbody", { id: "volumes" });
  const name = el("input", { id: "vol-name", placeholder: "name" });
  const size = el("input", { id: "vol-size", type: "number", min: "1", placeholder: "size (MiB)" });
  const status = el("span", { class: "muted", id: "vol-status" });
  const add = el("button", { id: "vol-create", onclick: async () => {
    try { await api("POST", "/v1/volumes", { name: name.value.trim(), size_bytes: Number(size.value || 0) * 1048576 }); status.textContent = "created " + name.value; name.value = ""; load(); } catch (e) { status.textContent = e.message; }
  } }, "Create volume");
  placeholder(tbody, 4, "loading", "loading");
  m.append(el("h2", {}, "Volumes"), el("div", { class: "toolbar" }, name, size, add, status), table(["Name", "Size", "~Created", ""], tbody));
  const load = async () => {
    try {
      const vs = (await api("GET", "/v1/volumes")).volumes || [];
      if (!vs.length) { placeholder(tbody, 4, "no volumes yet"); return; }
      tbody.replaceChildren(...vs.map((v) => el("tr", { "data-name": v.name }, el("td", {}, v.name), el("td", {}, v.size_bytes ? fmtBytes(v.size_bytes) : "no cap"),
        el("td", { class: "hide-narrow" }, new Date(v.created_at).toLocaleString()),
        el("td", {}, confirmButton("Delete", "delete", async () => {
          try { await api("DELETE", "/v1/volumes/" + encodeURIComponent(v.name)); load(); } catch (e) { status.textContent = e.message; }
        })))));
    } catch (e) { placeholder(tbody, 4, e.message, "error"); }
  };
  load();
}

// approvalsPage shows the actions waiting for a person (the approval
// gate) and answers them.
async function approvalsPage() {
  const m = clear();
  const tbody = el("tbody", { id: "approvals" });
  const status = el("span", { class: "muted" });
  placeholder(tbody, 5, "loading", "loading");
  m.append(el("h2", {}, "Approvals"), el("p", { class: "muted" }, "Actions held by the approval gate (docs/approvals.md) until someone answers or they expire."), status,
    table(["What", "~Sandbox", "~Asked", "Expires", ""], tbody));
  const answer = async (id, decision) => {
    try { await api("POST", "/v1/approvals/" + encodeURIComponent(id), { decision, id }); status.textContent = decision + "d " + id; load(); } catch (e) { status.textContent = e.message; }
  };
  const load = async () => {
    try {
      const ps = (await api("GET", "/v1/approvals")).approvals || [];
      if (!ps.length) { placeholder(tbody, 5, "nothing is waiting for an answer"); return; }
      tbody.replaceChildren(...ps.map((p) => el("tr", { "data-id": p.id }, el("td", {}, p.summary, p.reason ? el("div", { class: "muted" }, p.reason) : ""),
        el("td", { class: "hide-narrow" }, (p.action && p.action.sandbox_id) || ""), el("td", { class: "hide-narrow" }, fmtAge(p.created_at) + " ago"),
        el("td", {}, "in " + fmtDur(Math.max(0, Math.round((new Date(p.expires_at) - Date.now()) / 1000)))),
        el("td", {}, el("button", { class: "approve", onclick: () => answer(p.id, "approve") }, "Approve"), " ", confirmButton("Deny", "deny", () => answer(p.id, "deny"))))));
    } catch (e) { placeholder(tbody, 5, e.message, "error"); }
  };
  every(2000, load);
}

async function route() {
  if (!csrf) {
    try {
      const s = await (await fetch("/ui/session", { credentials: "same-origin" })).json();
      if (s.authenticated) { csrf = s.csrf; session = s; }
    } catch (_) { /* server down: show the login form */ }
  }
  const who = document.getElementById("who"), out = document.getElementById("logout");
  if (!csrf) { who.textContent = ""; out.hidden = true; loginPage(); return; }
  who.textContent = session.no_auth ? "no auth (loopback)" : "key " + session.key_id;
  out.hidden = !!session.no_auth;
  const navKeys = document.getElementById("nav-keys"); // keys.js's page: admin sessions only
  if (navKeys) navKeys.hidden = !(session.key && session.key.admin);
  const h = location.hash.replace(/^#/, "") || "/";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + (h.startsWith("/sb/") || h.startsWith("/desktop/") ? "/" : h));
  if (h.startsWith("/sb/")) sandboxPage(decodeURIComponent(h.slice(4)));
  else if (h.startsWith("/desktop/")) desktopPage(clear(), decodeURIComponent(h.slice(9)), { api, el });
  else if (h === "/server") serverPage();
  else if (h === "/images") imagesPage();
  else if (h === "/templates") templatesPage();
  else if (h === "/volumes") volumesPage();
  else if (h === "/approvals") approvalsPage();
  else if (h === "/keys") keysPage({ el, api, clear, table, placeholder, confirmButton }, session);
  else sandboxesPage();
}

document.getElementById("logout").addEventListener("click", async () => {
  try { await api("DELETE", "/ui/session"); } catch (_) { /* already gone */ }
  csrf = ""; session = null; route();
});
window.addEventListener("hashchange", route);
route();
