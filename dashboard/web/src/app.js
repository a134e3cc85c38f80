// airlock dashboard: a small single-page UI over the /v1 API. Every API
// call carries the session's CSRF token (X-Airlock-CSRF); the API key stays
// on the server (HttpOnly session cookie). All untrusted text is inserted
// with textContent, never as HTML.
import { Terminal } from "@xterm/xterm";

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
  const allow = el("input", { id: "allow", placeholder: "allowed hosts (comma-separated; empty: no network)" });
  const create = el("button", { id: "create", onclick: async () => {
    create.disabled = true;
    const hosts = allow.value.split(",").map((h) => h.trim()).filter(Boolean);
    const req = hosts.length ? { network: { mode: "allowlist", allow: hosts } } : {};
    try { const sb = await api("POST", "/v1/sandboxes", req); status.textContent = "created " + sb.id; refresh(); } catch (e) { status.textContent = e.message; }
    create.disabled = false;
  } }, "New sandbox");
  const tbody = el("tbody", { id: "sandboxes" });
  m.append(el("div", { class: "toolbar" }, create, allow, filter, el("label", {}, onlyRunning, " running only"), status),
    el("table", {}, el("thead", {}, el("tr", {}, ["ID", "State", "Runtime", "Image", "Profile", "Owner key", "Age", "TTL left", "CPU", "Memory", ""].map((h) => el("th", {}, h)))), tbody));
  let list = [];
  const images = new Map();
  const render = () => {
    const q = filter.value.toLowerCase();
    const rows = list.filter((s) => (!onlyRunning.checked || s.state === "running") &&
      (!q || [s.id, s.state, s.runtime, s.profile, images.get(s.id), JSON.stringify(s.metadata)].join(" ").toLowerCase().includes(q)));
    tbody.replaceChildren(...rows.map((s) => {
      const h = history.get(s.id);
      const last = h && h.mem.length ? fmtBytes(h.mem[h.mem.length - 1]) : "";
      return el("tr", { "data-id": s.id },
        el("td", {}, el("a", { href: "#/sb/" + encodeURIComponent(s.id) }, s.id)),
        el("td", { class: "state-" + s.state }, s.paused ? "paused" : s.state),
        el("td", {}, s.runtime || ""), el("td", {}, images.get(s.id) || ""), el("td", {}, s.profile),
        el("td", {}, session && session.key_id ? session.key_id : "(no auth)"),
        el("td", {}, fmtAge(s.created_at)),
        el("td", {}, s.expires_at && s.state === "running" ? fmtDur(Math.max(0, Math.round((new Date(s.expires_at) - Date.now()) / 1000))) : ""),
        el("td", {}, h ? sparkline(h.cpu) : "", " ", h ? (h.cpu[h.cpu.length - 1] * 100).toFixed(0) + "%" : ""),
        el("td", {}, h ? sparkline(h.mem) : "", " ", last),
        el("td", {}, s.state === "running" ? [
          el("button", { class: s.paused ? "resume" : "pause", onclick: () => act("POST", s.id, s.paused ? "/resume" : "/pause") }, s.paused ? "Resume" : "Pause"), " ",
          el("button", { class: "kill", onclick: () => act("DELETE", s.id, "") }, "Kill")] : ""));
    }));
  };
  const act = async (method, id, suffix) => {
    try { await api(method, "/v1/sandboxes/" + encodeURIComponent(id) + suffix); refresh(); } catch (e) { status.textContent = e.message; }
  };
  const refresh = async () => {
    try {
      list = (await api("GET", "/v1/sandboxes?limit=200")).sandboxes || [];
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
  onlyRunning.addEventListener("change", render);
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
    info.state === "running" ? el("button", { id: "kill", onclick: async () => { await api("DELETE", base); location.hash = "#/"; } }, "Kill") : "");
  const sec = (title, id, ...kids) => el("section", { id }, el("h2", {}, title), ...kids);

  // Terminal: a shell on a pseudo-terminal over the PTY WebSocket
  // (GET .../pty); line mode over POST exec where that cannot open.
  const termBox = el("div", { id: "terminal" });
  const termTitle = el("h2", {}, "Terminal");
  m.append(el("section", { id: "term" }, termTitle, termBox));
  term = new Terminal({ rows: 14, fontSize: 13 });
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
  m.append(sec("Processes", "procs", el("table", {}, el("thead", {}, el("tr", {}, ["PID", "Command", "Tag", "Running", "Exit", ""].map((h) => el("th", {}, h)))), procs), logs));
  const loadProcs = async () => {
    try {
      const ps = (await api("GET", base + "/processes")).processes || [];
      procs.replaceChildren(...ps.map((p) => el("tr", { "data-tag": p.tag || "" }, el("td", {}, p.pid), el("td", {}, (p.argv || []).join(" ")), el("td", {}, p.tag || ""),
        el("td", {}, p.running ? "yes" : "no"), el("td", {}, p.exit_code ?? ""),
        el("td", {}, p.running ? el("button", { class: "sigkill", onclick: async () => {
          try { await api("POST", base + "/processes/" + p.pid + "/signal", { signal: "SIGKILL" }); loadProcs(); } catch (e) { logs.textContent = e.message; }
        } }, "Kill") : "", " ", el("button", { onclick: async () => {
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
    el("table", {}, el("thead", {}, el("tr", {}, ["Name", "Type", "Size", "Modified", ""].map((h) => el("th", {}, h)))), files)));
  const loadFiles = async () => {
    here.textContent = dir;
    try {
      const es = (await api("GET", base + "/files/list?path=" + encodeURIComponent(dir))).entries || [];
      files.replaceChildren(...es.map((f) => el("tr", {},
        el("td", {}, f.type === "dir" ? el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); dir = f.path; loadFiles(); } }, f.name + "/") : f.name),
        el("td", {}, f.type), el("td", {}, fmtBytes(f.size)), el("td", {}, new Date(f.mtime).toLocaleString()),
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
  m.append(sec("Network", "network", netPolicy, el("table", {}, el("thead", {}, el("tr", {}, ["Time", "Host", "Port", "Verdict", "Up", "Down"].map((h) => el("th", {}, h)))), net)));
  const loadNet = async () => {
    try {
      const p = await api("GET", base + "/network");
      netPolicy.textContent = "mode " + p.mode + (p.allow && p.allow.length ? " · allow " + p.allow.join(", ") : "") + (p.deny && p.deny.length ? " · deny " + p.deny.join(", ") : "");
      const cs = (await api("GET", base + "/network/log")).connections || [];
      net.replaceChildren(...cs.slice().reverse().map((c) => el("tr", {}, el("td", {}, new Date(c.time).toLocaleTimeString()), el("td", {}, c.host), el("td", {}, c.port),
        el("td", { class: c.allowed ? "allowed" : "denied", title: c.reason || "" }, c.allowed ? "allowed" : "denied"), el("td", {}, fmtBytes(c.bytes_up)), el("td", {}, fmtBytes(c.bytes_down)))));
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
  return el("table", {}, el("thead", {}, el("tr", {}, ["#", "Time", "Sandbox", "Action", "Detail"].map((h) => el("th", {}, h)))), tbody);
}

function fillAudit(tbody, evs) {
  tbody.replaceChildren(...evs.map((e) => el("tr", {}, el("td", {}, e.id), el("td", {}, new Date(e.time).toLocaleString()), el("td", {}, e.sandbox_id || ""),
    el("td", {}, e.action), el("td", {}, el("code", {}, JSON.stringify(e.detail || {}))))));
}

async function serverPage() {
  const m = clear();
  const cap = el("tbody", { id: "capacity" });
  const layers = el("tbody", { id: "layers" });
  m.append(el("section", {}, el("h2", {}, "Server"), el("table", {}, cap)), el("section", {}, el("h2", {}, "Isolation layers"), el("table", {}, layers)));
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
  m.append(el("section", {}, el("h2", {}, "Totals (since this page opened, every 2 s)"), el("table", {}, totals)));
  const series = new Map();
  every(2000, async () => {
    try {
      const text = await (await api("GET", "/metrics", undefined, true)).text();
      const now = new Map();
      for (const l of text.split("\n")) {
        const mm = /^(airlock_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$/.exec(l);
        if (mm) now.set(mm[1], (now.get(mm[1]) || 0) + Number(mm[3]));
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
  const h = location.hash.replace(/^#/, "") || "/";
  if (h.startsWith("/sb/")) sandboxPage(decodeURIComponent(h.slice(4)));
  else if (h === "/server") serverPage();
  else sandboxesPage();
}

document.getElementById("logout").addEventListener("click", async () => {
  try { await api("DELETE", "/ui/session"); } catch (_) { /* already gone */ }
  csrf = ""; session = null; route();
});
window.addEventListener("hashchange", route);
route();
