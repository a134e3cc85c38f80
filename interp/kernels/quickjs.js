// airlock JavaScript kernel for QuickJS (the wasm tier's javascript).
//
// Evaluated by airlock's QuickJS host (scripts/quickjs/host.c), a WASI
// module run by the in-sandbox airlock (`airlock wasm-kernel`) on wazero.
// The host hands this source over as its first request and gives it
// `__host` (see host.c): poll for requests, write to the output streams
// (1, 2), the message stream (4) and the sync-marker streams (5, 6), and
// evaluate code as a global script under an interrupt handler. The message
// protocol is the node kernel's (kernels/javascript.js): JSON lines with
// sync counts, ready, result, error, end.
//
// Cells are global scripts in one realm, so their top-level declarations
// persist. A cell that only parses with `await` runs as an async function;
// its simple top-level declarations (`const x = ...`, `let`, `var`,
// `function f`, `class C` at the start of a line) become properties of
// globalThis so that they persist too. Timeouts and interrupts stop
// synchronous code (QuickJS's interrupt handler) as well as a cell that
// awaits; the kernel and its state survive both.
(function (host) {
  'use strict';
  if (!host) throw new Error('airlock: not started by the QuickJS host');
  const OUT = 1, ERR = 2, MSG = 4, SYNC = [5, 6];
  const state = { token: '', n: 0, synced: [0, 0], maxResult: 16 << 20, cell: null };
  const stringify = JSON.stringify, parse = JSON.parse;

  // send writes a sync marker on each output stream, then the messages,
  // each with the cell's number and the markers before it. The framing is
  // built as text around each message's own JSON (one JSON.stringify of a
  // message, not of a copy with n and sync: QuickJS's stringify was a fifth
  // of a warm cell's time), and `end` is a constant.
  function send(msgs) {
    const marker = '\0airlock-sync:' + state.token + '\0';
    const synced = state.synced;
    if (host.write(SYNC[0], marker)) synced[0]++;
    if (host.write(SYNC[1], marker)) synced[1]++;
    const tail = ',"n":' + state.n + ',"sync":[' + synced[0] + ',' + synced[1] + ']}\n';
    let text = '';
    for (let i = 0; i < msgs.length; i++) {
      const m = msgs[i];
      const json = m === END ? '{"type":"end"}' : m.json || stringify(m);
      text += json.slice(0, -1) + tail;
    }
    if (!host.write(MSG, text)) throw new Error('airlock: the message stream is gone');
  }
  const END = { type: 'end' };

  // ---- inspect: node's util.inspect, for the values cells usually show
  function inspect(v, depth, seen) {
    depth = depth === undefined ? 2 : depth;
    seen = seen || [];
    switch (typeof v) {
      case 'string': return seen.length ? quote(v) : quote(v);
      case 'number': return Object.is(v, -0) ? '-0' : String(v);
      case 'bigint': return String(v) + 'n';
      case 'undefined': return 'undefined';
      case 'boolean': return String(v);
      case 'symbol': return v.toString();
      case 'function': {
        const name = v.name ? ': ' + v.name : ' (anonymous)';
        return /^class\b/.test(Function.prototype.toString.call(v)) ? '[class ' + (v.name || '(anonymous)') + ']' : '[Function' + name + ']';
      }
    }
    if (v === null) return 'null';
    if (seen.indexOf(v) >= 0) return '[Circular]';
    if (v instanceof Error) return v.stack ? String(v.name) + ': ' + v.message + '\n' + String(v.stack).replace(/\n$/, '') : String(v);
    if (v instanceof Date) return isNaN(v) ? 'Invalid Date' : v.toISOString();
    if (v instanceof RegExp) return String(v);
    if (v instanceof Promise) return 'Promise { <pending> }';
    if (depth < 0) return Array.isArray(v) ? '[Array]' : '[Object]';
    const inner = seen.concat([v]);
    const item = (x) => inspect(x, depth - 1, inner);
    let parts, open, close;
    if (Array.isArray(v)) {
      parts = v.slice(0, 100).map(item);
      if (v.length > 100) parts.push('... ' + (v.length - 100) + ' more items');
      open = '['; close = ']';
    } else if (v instanceof Map) {
      parts = Array.from(v).slice(0, 100).map(([k, x]) => item(k) + ' => ' + item(x));
      open = 'Map(' + v.size + ') {'; close = '}';
    } else if (v instanceof Set) {
      parts = Array.from(v).slice(0, 100).map(item);
      open = 'Set(' + v.size + ') {'; close = '}';
    } else if (ArrayBuffer.isView(v)) {
      parts = Array.prototype.slice.call(v, 0, 100).map(item);
      open = v.constructor.name + '(' + v.length + ') ['; close = ']';
    } else {
      parts = Object.keys(v).map((k) => (/^[A-Za-z_$][\w$]*$/.test(k) ? k : quote(k)) + ': ' + item(v[k]));
      const proto = Object.getPrototypeOf(v);
      const name = proto && proto.constructor && proto.constructor.name;
      open = (proto === null ? '[Object: null prototype] ' : name && name !== 'Object' ? name + ' ' : '') + '{';
      close = '}';
      if (parts.length === 0) return open + '}';
    }
    if (parts.length === 0) return open + close;
    const flat = open + ' ' + parts.join(', ') + ' ' + close;
    if (flat.length <= 72 && flat.indexOf('\n') < 0) return flat;
    return open + '\n' + parts.map((p) => '  ' + p.replace(/\n/g, '\n  ')).join(',\n') + '\n' + close;
  }

  function quote(s) {
    const q = s.indexOf("'") >= 0 && s.indexOf('"') < 0 ? '"' : "'";
    let out = q;
    for (const ch of s) {
      const c = ch.codePointAt(0);
      if (ch === q || ch === '\\') out += '\\' + ch;
      else if (ch === '\n') out += '\\n';
      else if (ch === '\t') out += '\\t';
      else if (ch === '\r') out += '\\r';
      else if (c < 0x20 || c === 0x7f) out += '\\x' + c.toString(16).padStart(2, '0');
      else out += ch;
    }
    return out + q;
  }

  function format(args) {
    return args.map((a) => (typeof a === 'string' ? a : inspect(a))).join(' ') + '\n';
  }

  // ---- the globals a cell expects: console, process, timers
  const env = host.env();
  const timers = new Map();
  let timerSeq = 0;
  function addTimer(fn, ms, args, repeat) {
    if (typeof fn !== 'function') throw new TypeError('the callback must be a function');
    const id = ++timerSeq;
    ms = Math.max(0, Number(ms) || 0);
    timers.set(id, { fn, args, at: Date.now() + ms, every: repeat ? Math.max(1, ms) : 0 });
    return id;
  }
  const g = globalThis;
  g.setTimeout = (fn, ms, ...args) => addTimer(fn, ms, args, false);
  g.setInterval = (fn, ms, ...args) => addTimer(fn, ms, args, true);
  g.setImmediate = (fn, ...args) => addTimer(fn, 0, args, false);
  g.clearTimeout = g.clearInterval = g.clearImmediate = (id) => { timers.delete(id); };
  g.queueMicrotask = (fn) => { Promise.resolve().then(fn); };
  const out = (fd) => (...args) => { host.write(fd, format(args)); };
  g.console = {
    log: out(OUT), info: out(OUT), debug: out(OUT), dir: (v) => host.write(OUT, inspect(v) + '\n'),
    warn: out(ERR), error: out(ERR), trace: out(ERR),
    table: (v) => host.write(OUT, inspect(v) + '\n'),
  };
  g.print = out(OUT);
  g.process = {
    env, argv: ['quickjs'], platform: 'wasi', version: 'QuickJS 2021-03-27',
    versions: { quickjs: '2021-03-27' },
    stdout: { write: (s) => host.write(OUT, String(s)) },
    stderr: { write: (s) => host.write(ERR, String(s)) },
    memoryUsage: () => ({ heapUsed: host.memoryUsage() }),
    exit: () => { throw new Error('process.exit() is not available in a code context (restart the context instead)'); },
  };

  // runTimers runs the timers that are due, as cell code (a timeout or an
  // interrupt stops them: then it returns that completion); otherwise it
  // returns ms until the next one (-1: none).
  function runTimers() {
    if (timers.size === 0) return -1;
    const now = Date.now();
    for (const [id, t] of Array.from(timers)) {
      if (t.at > now) continue;
      if (t.every) t.at = now + t.every;
      else timers.delete(id);
      const r = host.call(t.fn, t.args || []);
      if (r.stopped) return r;
      if (r.error !== undefined) host.write(ERR, 'Uncaught ' + inspect(r.error) + '\n');
    }
    let next = -1;
    for (const t of timers.values()) {
      const d = Math.max(0, t.at - Date.now());
      if (next < 0 || d < next) next = d;
    }
    return next;
  }

  function runJobs() {
    const errs = host.runJobs();
    for (let i = 0; i < errs.length; i++) {
      const rec = errs[i];
      if (rec.stopped) return rec;
      host.write(ERR, 'Unhandled error: ' + inspect(rec.error) + '\n');
    }
    return null;
  }

  // ---- cells
  const IDENT = '[A-Za-z_$][\\w$]*';
  function asyncWrap(code) {
    // Persist simple top-level declarations (see the header).
    const hoisted = code
      .replace(new RegExp('^(const|let|var)\\s+(' + IDENT + ')\\s*=', 'gm'), 'globalThis.$2 =')
      .replace(new RegExp('^(async\\s+)?function(\\s*\\*)?\\s+(' + IDENT + ')', 'gm'), 'globalThis.$3 = $1function$2 $3')
      .replace(new RegExp('^class\\s+(' + IDENT + ')', 'gm'), 'globalThis.$1 = class $1');
    // Return the last statement's value if it is an expression.
    const at = lastStatement(hoisted);
    const last = hoisted.slice(at).replace(/[\s;]+$/, '');
    if (last && !/^(return|const|let|var|if|for|while|do|switch|try|throw|function|async\s+function|class|import|export|globalThis\.[\w$]+ = )\b/.test(last) && !/^[})\]]/.test(last)) {
      return ['(async () => {\n' + hoisted.slice(0, at) + '\nreturn (' + last + '\n);\n})()', '(async () => {\n' + hoisted + '\n})()'];
    }
    return ['(async () => {\n' + hoisted + '\n})()'];
  }

  // lastStatement returns where the code's last top-level statement starts:
  // after the last `;` or line break outside brackets, strings, template
  // literals and comments (a line break inside an expression that goes on
  // makes this guess wrong: the cell then runs without a value).
  function lastStatement(code) {
    let depth = 0, start = 0, i = 0;
    const n = code.length;
    while (i < n) {
      const c = code[i];
      if (c === '/' && code[i + 1] === '/') {
        const e = code.indexOf('\n', i);
        i = e < 0 ? n : e;
        continue;
      }
      if (c === '/' && code[i + 1] === '*') {
        const e = code.indexOf('*/', i + 2);
        i = e < 0 ? n : e + 2;
        continue;
      }
      if (c === '"' || c === "'" || c === '`') {
        i++;
        while (i < n && code[i] !== c) i += code[i] === '\\' ? 2 : 1;
        i++;
        continue;
      }
      if (c === '(' || c === '[' || c === '{') depth++;
      else if (c === ')' || c === ']' || c === '}') depth--;
      else if (depth === 0 && (c === ';' || c === '\n') && code.slice(i + 1).trim() !== '') start = i + 1;
      i++;
    }
    while (start < n && /\s/.test(code[start])) start++;
    return start;
  }

  function describe(e, stopped) {
    if (stopped === 'interrupted') {
      return { type: 'error', name: 'KeyboardInterrupt', value: 'the cell was interrupted', traceback: [], interrupted: true };
    }
    if (stopped === 'timeout') {
      return { type: 'error', name: 'TimeoutError', value: 'the cell did not finish within its timeout', traceback: [], interrupted: true };
    }
    if (e instanceof Error || (e !== null && typeof e === 'object' && typeof e.stack === 'string')) {
      const tb = [String(e.name || 'Error') + ': ' + String(e.message === undefined ? '' : e.message)];
      for (const line of String(e.stack || '').split('\n')) {
        if (!line.trim()) continue;
        if (/airlock-kernel|<timer>/.test(line)) break;
        tb.push(line);
      }
      return { type: 'error', name: String(e.name || 'Error'), value: String(e.message === undefined ? '' : e.message), traceback: tb };
    }
    const value = inspect(e);
    return { type: 'error', name: 'Error', value: 'Uncaught ' + value, traceback: ['Uncaught ' + value] };
  }

  function resultOf(value) {
    const text = inspect(value);
    if (text.length > state.maxResult) {
      return { type: 'result', truncated: true, data: { 'text/plain': '<result of ' + text.length + ' characters omitted: larger than the limit of ' + state.maxResult + '>' } };
    }
    // Serialized here: only the string needs JSON.stringify (see send).
    return { json: '{"type":"result","main":true,"data":{"text/plain":' + stringify(text) + '}}' };
  }

  const keepEnv = () => {};
  function setEnv(vars) {
    if (!vars) return keepEnv;
    const old = [];
    for (const k of Object.keys(vars)) {
      old.push([k, Object.prototype.hasOwnProperty.call(env, k) ? env[k] : undefined]);
      env[k] = String(vars[k]);
    }
    return () => {
      for (const [k, v] of old) {
        if (v === undefined) delete env[k];
        else env[k] = v;
      }
    };
  }

  // bracedObject: the code starts with `{` and ends with `}` (white space
  // aside), so it may be an object literal.
  // (No regular expression: QuickJS makes a RegExp object each time a
  // literal is evaluated.)
  function bracedObject(code) {
    const t = code.trim();
    return t.length > 1 && t[0] === '{' && t[t.length - 1] === '}';
  }

  // runCell runs one cell to its end: its synchronous part, then, for a
  // cell that awaits, the jobs and timers until its promise settles, it is
  // interrupted or its deadline passes.
  function runCell(req) {
    const n = state.n;
    const deadline = req.timeout_ms > 0 ? Date.now() + Math.ceil(req.timeout_ms) : 0;
    const restoreEnv = setEnv(req.env);
    const file = '<cell-' + n + '>';
    const code = req.code || '';
    let msgs = [];
    try {
      host.arm(n, deadline);
      let r = null;
      if (bracedObject(code)) {
        const obj = host.evalScript('(' + code.trim() + ')\n', file); // `{a: 1}` is an object
        if (!obj.error || obj.stopped) r = obj;
      }
      if (r === null) r = host.evalScript(code, file);
      let isAsync = false;
      if (r.error instanceof SyntaxError && !r.stopped && /\bawait\b/.test(code)) {
        for (const wrapped of asyncWrap(code)) {
          const w = host.evalScript(wrapped, file);
          if (w.error instanceof SyntaxError && !w.stopped) continue;
          r = w;
          isAsync = !w.error;
          break;
        }
      }
      if (r.error !== undefined || r.stopped) {
        msgs.push(describe(r.error, r.stopped));
      } else if (isAsync) {
        const settled = awaitCell(r.value, n, deadline);
        if (settled.stopped || settled.rejected) msgs.push(describe(settled.error, settled.stopped));
        else if (settled.value !== undefined) msgs.push(resultOf(settled.value));
      } else {
        const stopped = runJobs();
        if (stopped) msgs.push(describe(stopped.error, stopped.stopped));
        else if (r.value !== undefined) msgs.push(resultOf(r.value));
      }
    } catch (e) {
      msgs = [describe(e)];
    } finally {
      host.disarm();
      restoreEnv();
    }
    msgs.push(END);
    send(msgs);
  }

  function awaitCell(promise, n, deadline) {
    const box = { done: false };
    promise.then((v) => { box.done = true; box.value = v; }, (e) => { box.done = true; box.rejected = true; box.error = e; });
    for (;;) {
      const stopped = runJobs();
      if (stopped) return stopped;
      if (box.done) return box;
      const next = runTimers();
      if (typeof next === 'object') return next;
      const stoppedT = runJobs();
      if (stoppedT) return stoppedT;
      if (box.done) return box;
      if (deadline && Date.now() >= deadline) return { stopped: 'timeout' };
      let wait = next < 0 ? 50 : Math.min(next, 50);
      if (deadline) wait = Math.max(0, Math.min(wait, deadline - Date.now()));
      const line = host.poll(wait);
      if (line === null) return { stopped: 'interrupted' };
      if (typeof line === 'string' && line) {
        let req = null;
        try { req = parse(line); } catch (e) { /* not a request */ }
        if (req && req.interrupt === n) return { stopped: 'interrupted' };
      }
    }
  }

  function handle(line) {
    let req;
    try {
      req = parse(line);
    } catch (e) {
      send([describe(e), END]);
      return;
    }
    if (req.interrupt) return; // for a cell that has ended
    state.token = req.token || '';
    state.n = req.n || 0;
    state.synced = [0, 0];
    if (req.max_result) state.maxResult = req.max_result;
    if (req.init) {
      send([{ type: 'ready', pid: 0, version: 'QuickJS 2021-03-27' }]);
      return;
    }
    runCell(req);
  }

  // The loop: requests, and between them what cells left running (timers,
  // promise jobs) keeps running.
  for (;;) {
    host.disarm();
    runJobs();
    let next = runTimers();
    if (typeof next === 'object') next = 0;
    runJobs();
    const line = host.poll(next < 0 ? -1 : next);
    if (line === null) return;
    if (typeof line === 'string' && line) handle(line);
  }
})((() => {
  // Cells must not reach the host's primitives.
  const h = globalThis.__host;
  delete globalThis.__host;
  return h;
})());
