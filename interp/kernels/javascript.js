// airlock JavaScript kernel.
//
// Started by github.com/airlock-dev/airlock/interp as `node --expose-internals -e <bootstrap>`; the
// bootstrap reads this source from fd 3 and calls the function it evaluates
// to with node's require. File descriptors are as for the Python kernel:
// 0 /dev/null, 1 and 2 user output, 3 requests (JSON lines), 4 messages
// (JSON lines), 5 and 6 duplicates of 1 and 2 for sync markers.
//
// Cells run in one persistent vm context. A cell that does not compile as a
// script but contains `await` is rewritten by node's own REPL transform
// (internal/repl/await, hence --expose-internals), which hoists top-level
// declarations out of an async wrapper so that they persist.
//
// Interrupts use no signals. node's breakOnSigint is unsafe against signals
// from outside: one that lands as a run ends is remembered by node's watchdog
// and aborts the next run, and between runs node's SIGINT handler exits the
// process. So the synchronous part of a cell runs under vm's `timeout` (the
// cell's timeout), and an interrupt request ({"interrupt": n} on fd 3) ends a
// cell that is awaiting; what the cell started keeps running in the
// background. Synchronous code cannot be interrupted otherwise, nor can code
// spinning in a callback after an await: the Go side kills the kernel.
(function kernel(require) {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const path = require('path');
  const util = require('util');
  const vm = require('vm');
  const { createRequire, builtinModules } = require('module');

  const REQ_FD = 3, MSG_FD = 4, SYNC_FDS = [5, 6];
  let processTopLevelAwait = null;
  try {
    ({ processTopLevelAwait } = require('internal/repl/await'));
  } catch {
    // Without --expose-internals top-level await falls back to a plain
    // async wrapper whose declarations do not persist.
  }

  let acorn = null;
  try {
    acorn = require('internal/deps/acorn/acorn/dist/acorn');
  } catch {
    // Without --expose-internals, static import statements stay refused.
  }

  const state = { token: '', n: 0, synced: [0, 0], maxResult: 16 << 20, cell: null };

  function writeAll(fd, buf) {
    let off = 0;
    while (off < buf.length) {
      try {
        off += fs.writeSync(fd, buf, off, buf.length - off);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
      }
    }
  }

  function send(msgs) {
    const marker = Buffer.from('\0airlock-sync:' + state.token + '\0');
    SYNC_FDS.forEach((fd, i) => {
      try {
        writeAll(fd, marker);
        state.synced[i]++;
      } catch {
        // user code closed or redirected the stream
      }
    });
    const lines = msgs.map((m) => JSON.stringify({ ...m, n: state.n, sync: state.synced.slice() }));
    try {
      writeAll(MSG_FD, Buffer.from(lines.join('\n') + '\n'));
    } catch {
      process.exit(70);
    }
  }

  // The context: a fresh global plus what node's own global offers
  // (process, Buffer, timers, fetch, builtin modules...), like node's REPL.
  const context = vm.createContext({});
  const own = new Set(vm.runInContext('Object.getOwnPropertyNames(globalThis)', context));
  const skip = new Set(['require', 'module', 'exports', '__filename', '__dirname', 'global', 'globalThis']);
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    if (own.has(name) || skip.has(name)) continue;
    Object.defineProperty(context, name, Object.getOwnPropertyDescriptor(globalThis, name));
  }
  for (const name of builtinModules) {
    if (name.includes('/') || name.startsWith('_') || name in context) continue;
    Object.defineProperty(context, name, {
      configurable: true, enumerable: false,
      get() { return require(name); },
      set(v) { Object.defineProperty(context, name, { value: v, writable: true, configurable: true }); },
    });
  }
  const cellFile = path.join(process.cwd(), '<cell>');
  const userModule = { id: '<cell>', filename: cellFile, exports: {}, paths: [] };
  context.require = createRequire(cellFile);
  context.module = userModule;
  context.exports = userModule.exports;
  context.__filename = cellFile;
  context.__dirname = process.cwd();
  vm.runInContext('globalThis.global = globalThis', context);

  const importModuleDynamically = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
  if (importModuleDynamically) {
    // node warns, on a cell's first import(), that the loader option
    // above is experimental: a message about the kernel, not the cell.
    const emitWarning = process.emitWarning;
    process.emitWarning = function (warning, ...rest) {
      if (String(warning && warning.message || warning).includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) return;
      return emitWarning.call(this, warning, ...rest);
    };
  }

  function compile(code, filename) {
    const opts = { filename };
    if (importModuleDynamically) opts.importModuleDynamically = importModuleDynamically;
    return new vm.Script(code, opts);
  }

  // Rewrites a cell's top-level ES module syntax for a script: each static
  // import becomes `const ... = await import(...)`, whose bindings then
  // persist like any top-level declaration (the await transform below
  // hoists them), and `export` before a declaration is dropped. Returns
  // null if the cell has none, or does not parse as a module.
  function esmToScript(code) {
    if (acorn === null || !/\b(import|export)\b/.test(code)) return null;
    let ast;
    try {
      ast = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'module', allowHashBang: true });
    } catch {
      return null;
    }
    const edits = [];
    for (const node of ast.body) {
      if (node.type === 'ImportDeclaration') {
        const src = code.slice(node.source.start, node.source.end);
        const names = [];
        let ns = null;
        for (const sp of node.specifiers) {
          if (sp.type === 'ImportNamespaceSpecifier') ns = sp.local.name;
          else if (sp.type === 'ImportDefaultSpecifier') names.push('default: ' + sp.local.name);
          else {
            const imported = sp.imported.type === 'Literal' ? JSON.stringify(sp.imported.value) : sp.imported.name;
            names.push(imported === sp.local.name ? imported : imported + ': ' + sp.local.name);
          }
        }
        let text;
        if (ns !== null) {
          text = `const ${ns} = await import(${src});` + (names.length ? ` const { ${names.join(', ')} } = ${ns};` : '');
        } else if (names.length) {
          text = `const { ${names.join(', ')} } = await import(${src});`;
        } else {
          text = `await import(${src});`;
        }
        edits.push([node.start, node.end, text]);
      } else if (node.type === 'ExportNamedDeclaration' && node.declaration) {
        edits.push([node.start, node.declaration.start, '']);
      } else if (node.type === 'ExportNamedDeclaration' || node.type === 'ExportDefaultDeclaration' || node.type === 'ExportAllDeclaration') {
        return null; // a cell exports nothing to anyone
      }
    }
    if (edits.length === 0) return null;
    let out = code;
    for (const [start, end, text] of edits.reverse()) out = out.slice(0, start) + text + out.slice(end);
    return out;
  }

  // Returns [script, async] for a cell, or throws its SyntaxError.
  function prepare(code, filename) {
    try {
      return prepareScript(code, filename);
    } catch (e) {
      const script = e instanceof SyntaxError ? esmToScript(code) : null;
      if (script === null) throw e;
      return prepareScript(script, filename);
    }
  }

  function prepareScript(code, filename) {
    if (/^\s*\{/.test(code) && /\}\s*$/.test(code)) {
      // `{a: 1}` is an object, not a block, as in node's REPL.
      try {
        return [compile('(' + code.trim() + ')\n', filename), false];
      } catch {
        // not an object literal
      }
    }
    try {
      return [compile(code, filename), false];
    } catch (e) {
      if (!(e instanceof SyntaxError) || !code.includes('await')) throw e;
      let wrapped = null;
      if (processTopLevelAwait) {
        try {
          wrapped = processTopLevelAwait(code);
        } catch {
          throw e;
        }
      } else {
        wrapped = '(async () => { ' + code + '\n})()';
      }
      if (wrapped === null) throw e;
      return [compile(wrapped, filename), processTopLevelAwait !== null];
    }
  }

  const INTERRUPT = new Error('interrupted');
  const TIMEOUT = new Error('timed out');

  function formatError(e) {
    if (e === INTERRUPT) {
      return { type: 'error', name: 'KeyboardInterrupt', value: 'the cell was interrupted', traceback: [], interrupted: true };
    }
    if (e === TIMEOUT || (e !== null && typeof e === 'object' && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT')) {
      return { type: 'error', name: 'TimeoutError', value: 'the cell did not finish within its timeout', traceback: [], interrupted: true };
    }
    return describe(e);
  }

  function describe(e) {
    if (e instanceof Error || (e !== null && typeof e === 'object' && typeof e.stack === 'string')) {
      const lines = String(e.stack || '').split('\n');
      const tb = [];
      for (const line of lines) {
        if (/^\s+at /.test(line) && /node:vm|airlock-kernel|node:internal\/(vm|process\/execution)/.test(line)) break;
        tb.push(line);
      }
      return { type: 'error', name: String(e.name || 'Error'), value: String(e.message === undefined ? '' : e.message), traceback: tb };
    }
    const value = util.inspect(e);
    return { type: 'error', name: 'Error', value: 'Uncaught ' + value, traceback: ['Uncaught ' + value] };
  }

  function resultOf(value) {
    const data = { 'text/plain': util.inspect(value) };
    let size = 0;
    for (const v of Object.values(data)) size += v.length;
    if (size > state.maxResult) {
      return { type: 'result', truncated: true, data: { 'text/plain': `<result of ${size} characters omitted: larger than the limit of ${state.maxResult}>` } };
    }
    return { type: 'result', main: true, data };
  }

  // setEnv sets a cell's environment variables and returns what restores
  // the previous values.
  function setEnv(env) {
    const old = [];
    for (const [k, v] of Object.entries(env || {})) {
      old.push([k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
      process.env[k] = v;
    }
    return () => {
      for (const [k, v] of old) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    };
  }

  function runCell(req) {
    const n = state.n;
    const cell = { n, done: false, interrupt: null, timer: null };
    state.cell = cell;
    const restoreEnv = setEnv(req.env);
    const finish = (err, value) => {
      if (cell.done) return;
      cell.done = true;
      restoreEnv();
      if (cell.timer) clearTimeout(cell.timer);
      if (state.cell === cell) state.cell = null;
      const msgs = [];
      if (err !== null) {
        msgs.push(formatError(err));
      } else if (value !== undefined) {
        try {
          msgs.push(resultOf(value));
        } catch (e) {
          msgs.push(formatError(e));
        }
      }
      msgs.push({ type: 'end' });
      send(msgs);
    };
    const started = Date.now();
    const timeout = req.timeout_ms > 0 ? Math.ceil(req.timeout_ms) : 0;
    let script, isAsync, result;
    try {
      [script, isAsync] = prepare(req.code || '', `<cell-${n}>`);
      const opts = { displayErrors: false };
      if (timeout) opts.timeout = timeout;
      result = script.runInContext(context, opts);
    } catch (e) {
      finish(e);
      return;
    }
    if (!isAsync) {
      finish(null, result);
      return;
    }
    const stopped = new Promise((resolve, reject) => { cell.interrupt = reject; });
    if (timeout) {
      cell.timer = setTimeout(() => cell.interrupt(TIMEOUT), Math.max(0, timeout - (Date.now() - started)));
    }
    Promise.race([result, stopped]).then((r) => finish(null, r && r.value), (e) => finish(e));
  }

  process.on('SIGINT', () => {
    // Not sent by airlock (see above), but never let it kill the kernel.
    const cell = state.cell;
    if (cell && cell.interrupt) cell.interrupt(INTERRUPT);
  });
  // Errors thrown later by what cells started are reported, not fatal.
  process.on('uncaughtException', (e) => {
    try {
      process.stderr.write('Uncaught ' + util.inspect(e) + '\n');
    } catch {
      // stderr is gone
    }
  });
  process.on('unhandledRejection', (reason) => {
    try {
      process.stderr.write('Unhandled promise rejection: ' + util.inspect(reason) + '\n');
    } catch {
      // stderr is gone
    }
  });

  function handle(line) {
    let req;
    try {
      req = JSON.parse(line);
    } catch (e) {
      send([formatError(e), { type: 'end' }]);
      return;
    }
    if (req.interrupt) {
      const cell = state.cell;
      if (cell && cell.n === req.interrupt && cell.interrupt) cell.interrupt(INTERRUPT);
      return;
    }
    state.token = req.token || '';
    state.n = req.n || 0;
    state.synced = [0, 0];
    if (req.max_result) state.maxResult = req.max_result;
    if (req.init) {
      send([{ type: 'ready', pid: process.pid, version: process.version }]);
      return;
    }
    runCell(req);
  }

  const input = new net.Socket({ fd: REQ_FD, readable: true, writable: false });
  let buffered = '';
  input.setEncoding('utf8');
  input.on('data', (s) => {
    buffered += s;
    let i;
    while ((i = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, i);
      buffered = buffered.slice(i + 1);
      if (line) handle(line);
    }
  });
  input.on('end', () => process.exit(0));
  input.on('error', () => process.exit(0));
});
