// Runs the official E2B SDKs (e2b, @e2b/code-interpreter), unchanged,
// against an airlock server. Needs E2B_API_URL and E2B_SANDBOX_URL (the
// server's base URL) and E2B_API_KEY (an airlock API key). Every step
// asserts its result; the first failure exits non-zero naming the step.
// Steps that cannot run on this server are listed on a "SKIPPED:" line with
// the reason. Driven by e2b/e2e_linux_test.go, once per SDK release.
//
// E2B_SDK_PACKAGE names the `e2b` release to drive: "e2b" (the newest,
// 2.51.0) or one of the npm aliases of older releases in package.json
// ("e2b-2-45", "e2b-2-39"). Sandboxes are created, and commands, files and
// the control plane driven, through that release; code cells go through
// @e2b/code-interpreter (which brings its own e2b), connected to the same
// sandbox.
//
// E2B_RUNTIME names the server's --default-runtime ("native", the default,
// or "gvisor"); the scenario checks its sandboxes run on it. Every step
// runs on both: a step gVisor could not do would be skipped here by an
// explicit runtime condition and listed in docs/gvisor.md, never silently.
import { readFileSync } from 'node:fs'
import { Sandbox } from '@e2b/code-interpreter'
import { StepError, assert, eq, progress, step } from './steps.mjs'

const sdkPackage = process.env.E2B_SDK_PACKAGE || 'e2b'
const runtime = process.env.E2B_RUNTIME || 'native'
if (!['native', 'gvisor'].includes(runtime)) {
  console.error(`e2b-scenario: E2B_RUNTIME=${runtime}: want native or gvisor`)
  process.exit(2)
}
const { ALL_TRAFFIC, Sandbox: BaseSandbox, CommandExitError, FileNotFoundError, NotFoundError } = await import(sdkPackage)
const sdkVersion = JSON.parse(readFileSync(new URL(`./node_modules/${sdkPackage}/package.json`, import.meta.url))).version
// Releases before 2.46 send allow_internet_access: true unless told
// otherwise (E2B's default: internet access); later ones send nothing.
const internetByDefault = { '2.39.0': true, '2.45.0': true, '2.51.0': false }[sdkVersion]
if (internetByDefault === undefined) {
  console.error(`e2b-scenario: no expectations recorded for e2b ${sdkVersion}`)
  process.exit(2)
}
console.log(`e2b-scenario: e2b ${sdkVersion} (${sdkPackage}), @e2b/code-interpreter for code cells, runtime ${runtime}`)

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) {
    console.error(`e2b-scenario: ${v} is not set`)
    process.exit(2)
  }
}

const skipped = []
const cleanup = []


// rejects awaits p and returns its error, which must be an instance of cls.
async function rejects(p, cls, what) {
  let err
  try {
    await p
  } catch (e) {
    err = e
  }
  assert(err !== undefined, `${what}: expected ${cls.name}, but it succeeded`)
  assert(err instanceof cls, `${what}: expected ${cls.name}, got ${err?.name}: ${err?.message}`)
  return err
}


function skip(name, reason) {
  skipped.push(`${name}: ${reason}`)
  console.log(`skip ${name}: ${reason}`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function main() {
  const run = `${process.pid}-${Date.now()}`
  const meta = { purpose: 'airlock-e2b-scenario', run }
  let sbx

  await step('create a code-interpreter sandbox with metadata and env vars', async () => {
    const opts = { metadata: meta, envs: { GREETING: 'hello from envVars' }, timeoutMs: 180_000 }
    // The code interpreter's Sandbox is the newest e2b's, with its template.
    sbx = sdkPackage === 'e2b' ? await Sandbox.create(opts) : await BaseSandbox.create('code-interpreter-v1', opts)
    cleanup.push(() => sbx.kill())
    assert(typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0, 'no sandbox id')
    assert(await sbx.isRunning(), 'isRunning() is false right after create')
  })

  await step(`the sandbox runs on the server's default runtime (${runtime})`, async () => {
    // gVisor's Sentry reports its own kernel release; airlock's runsc
    // configuration names it (as the MCP test checks).
    const r = await sbx.commands.run('uname -r')
    eq(r.stdout.includes('gvisor'), runtime === 'gvisor', `uname -r says ${JSON.stringify(r.stdout)}`)
  })

  await step('commands.run: stdout and the sandbox env vars', async () => {
    const r = await sbx.commands.run('echo "$GREETING"; echo second line')
    eq(r.exitCode, 0, 'exit code')
    eq(r.stdout, 'hello from envVars\nsecond line\n', 'stdout')
    eq(r.stderr, '', 'stderr')
  })

  await step('commands.run: stderr, per-command envs and streaming callbacks', async () => {
    const seen = { out: '', err: '' }
    const r = await sbx.commands.run('echo "out:$ONE"; echo "err:$ONE" >&2', {
      envs: { ONE: '1' },
      onStdout: (d) => { seen.out += d },
      onStderr: (d) => { seen.err += d },
    })
    eq(r.stdout, 'out:1\n', 'stdout')
    eq(r.stderr, 'err:1\n', 'stderr')
    eq(seen, { out: 'out:1\n', err: 'err:1\n' }, 'callbacks')
  })

  await step('commands.run: a non-zero exit raises CommandExitError with the exit code', async () => {
    const err = await rejects(sbx.commands.run('echo partial; echo failing >&2; exit 3'), CommandExitError, 'exit 3')
    eq(err.exitCode, 3, 'exitCode')
    eq(err.stdout, 'partial\n', 'stdout')
    eq(err.stderr, 'failing\n', 'stderr')
    assert(/exit status 3/.test(err.message), `message ${JSON.stringify(err.message)}`)
  })

  await step('commands.run: cwd and relative paths resolve in /home/user', async () => {
    await sbx.commands.run('mkdir -p sub && echo made > sub/by-shell.txt')
    eq(await sbx.files.read('/home/user/sub/by-shell.txt'), 'made\n', 'file written by a shell in the home')
    const r = await sbx.commands.run('cat by-shell.txt', { cwd: '/home/user/sub' })
    eq(r.stdout, 'made\n', 'cat in cwd /home/user/sub')
  })

  await step('home: pwd, $HOME and a command\'s cwd are /home/user', async () => {
    const r = await sbx.commands.run('pwd; echo "$HOME"; cd sub && pwd; cd ~ && pwd')
    eq(r.stdout, '/home/user\n/home/user\n/home/user/sub\n/home/user\n', 'pwd, $HOME, cd')
    eq((await sbx.commands.run('pwd', { cwd: '/home/user/sub' })).stdout, '/home/user/sub\n', 'pwd with cwd')
    eq((await sbx.commands.run('pwd', { cwd: 'sub' })).stdout, '/home/user/sub\n', 'pwd with a relative cwd')
  })

  await step('commands.run: python is on PATH, as in E2B images', async () => {
    const r = await sbx.commands.run("python -c 'import sys; print(1, sys.version_info[0])'")
    eq(r.stdout, '1 3\n', 'python -c')
  })

  await step('commands.run as root: refused with an error naming the cause', async () => {
    let err
    try {
      await sbx.commands.run('id -u', { user: 'root' })
    } catch (e) {
      err = e
    }
    assert(err !== undefined, 'commands.run as root succeeded')
    assert(/user "root" is not available/.test(err.message) && /no root/.test(err.message), `error: ${err?.name}: ${err?.message}`)
  })

  await step('commands.run background: true, list, then kill', async () => {
    const h = await sbx.commands.run('echo started; sleep 600', { background: true })
    assert(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    const procs = await sbx.commands.list()
    const p = procs.find((x) => x.pid === h.pid)
    assert(p, `pid ${h.pid} not in commands.list(): ${JSON.stringify(procs)}`)
    eq(p.args, ['-l', '-c', 'echo started; sleep 600'], 'args')
    eq(p.cmd, '/bin/bash', 'cmd')
    for (let i = 0; i < 100 && h.stdout === ''; i++) await sleep(50)
    eq(await h.kill(), true, 'kill()')
    const err = await rejects(h.wait(), CommandExitError, 'wait() after kill')
    eq(err.exitCode, -1, 'exit code of a killed command')
    assert(/signal: killed/.test(err.message), `message ${JSON.stringify(err.message)}`)
    eq(h.stdout, 'started\n', 'output before the kill')
    const after = await sbx.commands.list()
    assert(!after.some((x) => x.pid === h.pid), 'killed process still listed')
    eq(await sbx.commands.kill(h.pid), false, 'killing it again')
  })

  await step('commands: sendStdin to a background command, closeStdin, connect', async () => {
    const h = await sbx.commands.run('read a; echo "got:$a"; cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'hello\n')
    await h.sendStdin('rest of the input\n')
    // A second client attaches to the running process.
    const other = await sbx.commands.connect(h.pid)
    await h.closeStdin()
    const r = await h.wait()
    eq(r.stdout, 'got:hello\nrest of the input\n', 'stdout')
    const r2 = await other.wait()
    eq(r2.exitCode, 0, 'exit code seen by the connected handle')
  })

  await step('files: write, read, exists, getInfo', async () => {
    const info = await sbx.files.write('/home/user/dir/a.txt', 'alpha')
    eq(info.path, '/home/user/dir/a.txt', 'written path')
    eq(info.name, 'a.txt', 'written name')
    eq(await sbx.files.read('/home/user/dir/a.txt'), 'alpha', 'read back')
    eq(await sbx.files.read('dir/a.txt'), 'alpha', 'read by a relative path')
    eq(await sbx.files.exists('/home/user/dir/a.txt'), true, 'exists')
    eq(await sbx.files.exists('/home/user/dir/missing.txt'), false, 'exists (missing)')
    const st = await sbx.files.getInfo('/home/user/dir/a.txt')
    eq([st.type, st.size, st.path], ['file', 5, '/home/user/dir/a.txt'], 'getInfo')
    const bytes = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write('/home/user/dir/bin.dat', bytes.buffer)
    const back = await sbx.files.read('/home/user/dir/bin.dat', { format: 'bytes' })
    eq(Array.from(back), Array.from(bytes), 'binary round trip')
    eq(await sbx.files.read('/home/user/empty.txt').catch(() => 'missing'), 'missing', 'reading a missing file fails')
    await sbx.files.write('/home/user/empty.txt', '')
    eq(await sbx.files.read('/home/user/empty.txt'), '', 'empty file')
    await sbx.files.write([
      { path: '/home/user/multi/one.txt', data: '1' },
      { path: '/home/user/multi/two.txt', data: '2' },
    ])
    eq(await sbx.files.read('/home/user/multi/two.txt'), '2', 'writeFiles')
  })

  await step('uploadUrl/downloadUrl: signed URLs work without the access token; tampered, expired or misused ones are 401', async () => {
    // Under E2B_SANDBOX_URL the URL names no sandbox (with --e2b-domain its
    // host does), so only the routing headers are added: no token.
    const route = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }
    const up = await sbx.uploadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
    assert(new URL(up).searchParams.get('signature')?.startsWith('v1_'), `upload URL without a v1_ signature: ${up}`)
    const form = new FormData()
    form.append('file', new Blob(['signed upload']), 'signed.txt')
    let res = await fetch(up, { method: 'POST', headers: route, body: form })
    eq(res.status, 200, `upload through the signed URL (${await res.clone().text()})`)
    const down = await sbx.downloadUrl('/home/user/signed.txt')
    res = await fetch(down, { headers: route })
    eq([res.status, await res.text()], [200, 'signed upload'], 'download through the signed URL')
    const bad = new URL(down)
    const sig = bad.searchParams.get('signature')
    bad.searchParams.set('signature', sig.slice(0, -1) + (sig.endsWith('A') ? 'B' : 'A'))
    res = await fetch(bad, { headers: route })
    eq(res.status, 401, 'tampered signature')
    const other = new URL(down)
    other.searchParams.set('path', '/home/user/dir/a.txt')
    eq((await fetch(other, { headers: route })).status, 401, 'signature of another path')
    eq((await fetch(down, { method: 'POST', headers: route, body: form })).status, 401, 'download URL used to upload')
    res = await fetch(await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -5 }), { headers: route })
    eq(res.status, 401, 'expired signature')
    assert((await res.json()).message.startsWith('signature is already expired'), 'the expired URL\'s error is envd\'s')
    eq(await sbx.files.read('/home/user/signed.txt'), 'signed upload', 'file read back through the SDK')
  })

  await step('files: metadata in getInfo and list, symlinks with absolute targets', async () => {
    await sbx.commands.run('mkdir -p meta && printf 12345 > meta/f.txt && chmod 640 meta/f.txt && ln -s f.txt meta/link')
    const st = await sbx.files.getInfo('/home/user/meta/f.txt')
    eq([st.owner, st.group, st.mode, st.permissions], ['user', 'user', 0o640, '-rw-r-----'], 'owner, group, mode, permissions')
    assert(st.modifiedTime instanceof Date && Math.abs(st.modifiedTime.getTime() - Date.now()) < 120_000, `modifiedTime ${st.modifiedTime}`)
    const link = await sbx.files.getInfo('/home/user/meta/link')
    eq([link.type, link.symlinkTarget], ['symlink', '/home/user/meta/f.txt'], 'symlink type and target')
    const listed = (await sbx.files.list('/home/user/meta')).find((e) => e.name === 'f.txt')
    eq([listed.owner, listed.group, listed.permissions, listed.size], ['user', 'user', '-rw-r-----', 5], 'listed metadata')
  })

  await step('files: read of a missing file raises FileNotFoundError', async () => {
    const err = await rejects(sbx.files.read('/home/user/nope.txt'), FileNotFoundError, 'read missing')
    assert(err instanceof NotFoundError, 'FileNotFoundError is a NotFoundError')
  })

  await step('files: list, makeDir, rename, remove', async () => {
    const names = (await sbx.files.list('/home/user/dir')).map((e) => `${e.name}:${e.type}`).sort()
    eq(names, ['a.txt:file', 'bin.dat:file'], 'list')
    eq(await sbx.files.makeDir('/home/user/newdir/deep'), true, 'makeDir')
    eq(await sbx.files.makeDir('/home/user/newdir/deep'), false, 'makeDir of an existing directory')
    const deep = await sbx.files.list('/home/user/newdir', { depth: 2 })
    eq(deep.map((e) => e.path), ['/home/user/newdir/deep'], 'list depth 2')
    const moved = await sbx.files.rename('/home/user/dir/a.txt', '/home/user/newdir/b.txt')
    eq([moved.path, moved.type], ['/home/user/newdir/b.txt', 'file'], 'rename')
    eq(await sbx.files.exists('/home/user/dir/a.txt'), false, 'old name gone')
    eq(await sbx.files.read('/home/user/newdir/b.txt'), 'alpha', 'content after rename')
    await sbx.files.remove('/home/user/newdir/b.txt')
    eq(await sbx.files.exists('/home/user/newdir/b.txt'), false, 'removed file')
    await sbx.files.remove('/home/user/newdir')
    eq(await sbx.files.exists('/home/user/newdir'), false, 'removed directory')
  })

  await step('files: a recursive watchDir reports creations and writes, in new subdirectories too', async () => {
    await sbx.files.makeDir('/home/user/watched/sub')
    const events = []
    const seen = (name, type) => events.some((e) => e.name === name && e.type === type)
    const handle = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e), { recursive: true })
    const until = async (want) => {
      for (let i = 0; i < 100 && !want.every(([n, t]) => seen(n, t)); i++) await sleep(50)
      for (const [n, t] of want) assert(seen(n, t), `no ${t} of ${n} among ${JSON.stringify(events)}`)
    }
    await sbx.files.write('/home/user/watched/new.txt', 'x')
    await sbx.commands.run('printf more >> watched/new.txt; mkdir -p watched/sub/deeper')
    // Once the new directory is reported, it is watched too.
    await until([['new.txt', 'create'], ['new.txt', 'write'], ['sub/deeper', 'create']])
    await sbx.commands.run('echo y > watched/sub/deeper/f.txt; echo z >> watched/sub/deeper/f.txt; rm watched/new.txt')
    const want = [['sub/deeper/f.txt', 'create'], ['sub/deeper/f.txt', 'write'], ['new.txt', 'remove']]
    await until(want)
    await handle.stop()
    for (const [n, t] of want) assert(seen(n, t), `no ${t} of ${n} among ${JSON.stringify(events)}`)
  })

  await step('pty: a terminal with colours, resize, Ctrl-C and kill', async () => {
    let out = ''
    const dec = new TextDecoder()
    const enc = new TextEncoder()
    const until = async (re, what) => {
      for (let i = 0; i < 200 && !re.test(out); i++) await sleep(25)
      assert(re.test(out), `${what}: no ${re} in ${JSON.stringify(out)}`)
    }
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
    await sbx.pty.sendInput(t.pid, enc.encode('ls --color=always -d /usr; tty\n'))
    await until(/\x1b\[[0-9;]*m\/usr\x1b\[0m/, 'ls --color')
    await until(/\/dev\/pts\/\d+/, 'tty')
    await sbx.pty.resize(t.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(t.pid, enc.encode('stty size\n'))
    await until(/30 100/, 'stty size after resize')
    // The job prints once it runs (the echoed command line shows $((6*7))).
    await sbx.pty.sendInput(t.pid, enc.encode("sh -c 'echo running-$((6*7)); exec sleep 100'; echo slept\n"))
    await until(/running-42/, 'the foreground job runs')
    await sbx.pty.sendInput(t.pid, enc.encode('\x03'))
    await sbx.pty.sendInput(t.pid, enc.encode('echo "status $?"\n'))
    await until(/status 130/, 'Ctrl-C ends the foreground job')
    assert(!/(^|\n)slept\r?\n/.test(out), 'the interrupted job went on')
    eq(await sbx.pty.kill(t.pid), true, 'kill')
    const err = await rejects(t.wait(), CommandExitError, 'wait() after kill')
    assert(/signal: killed/.test(err.message), `message ${err.message}`)
  })

  await step('Sandbox.connect from a second client', async () => {
    const again = await BaseSandbox.connect(sbx.sandboxId)
    const r = await again.commands.run('cat /home/user/multi/one.txt 2>/dev/null || cat multi/one.txt')
    eq(r.stdout, '1', 'command through the connected instance')
  })

  const interpreter = await runCodeSteps(await Sandbox.connect(sbx.sandboxId))

  await step('pause(), then Sandbox.connect resumes it: a file, a background process and a Python variable survive', async () => {
    await sbx.files.write('/home/user/paused.txt', 'written before pause')
    const bg = await sbx.commands.run('sleep 600', { background: true })
    eq(await sbx.pause(), true, 'pause()')
    eq(await BaseSandbox.pause(sbx.sandboxId), false, 'pausing a paused sandbox')
    eq((await sbx.getInfo()).state, 'paused', 'state after pause()')
    const paused = await BaseSandbox.list({ query: { metadata: { run }, state: ['paused'] } }).nextItems()
    eq(paused.map((s) => s.sandboxId), [sbx.sandboxId], 'listed as paused')
    const again = await BaseSandbox.connect(sbx.sandboxId)
    eq((await again.getInfo()).state, 'running', 'state after connect')
    eq((await again.commands.run('cat /home/user/paused.txt')).stdout, 'written before pause', 'the file')
    const pids = (await again.commands.list()).map((p) => p.pid)
    assert(pids.includes(bg.pid), `background process ${bg.pid} not among ${JSON.stringify(pids)}`)
    eq((await again.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout.trim(), 'alive', 'the background process')
    await again.commands.kill(bg.pid)
    if (interpreter) eq((await (await Sandbox.connect(sbx.sandboxId)).runCode('x')).text, '41', 'the Python variable x of the default context')
  })

  await step('lifecycle onTimeout: pause with autoResume: the timeout pauses it, a command resumes it', async () => {
    const lc = await BaseSandbox.create('base', { timeoutMs: 2_000, metadata: { purpose: 'airlock-e2b-lifecycle' },
      lifecycle: { onTimeout: 'pause', autoResume: true } })
    cleanup.push(() => lc.kill())
    await lc.files.write('/home/user/lc.txt', 'kept')
    const info = await lc.getInfo()
    if (info.lifecycle) eq(info.lifecycle, { onTimeout: 'pause', autoResume: true }, 'lifecycle in getInfo')
    for (let i = 0; (await lc.getInfo()).state !== 'paused'; i++) {
      assert(i < 300, 'not paused 60 s after its timeout')
      await sleep(200)
    }
    eq((await lc.commands.run('cat /home/user/lc.txt')).stdout, 'kept', 'a command in the paused sandbox (auto-resumed)')
    eq((await lc.getInfo()).state, 'running', 'state after the command')
    eq(await lc.kill(), true, 'kill()')
  })

  await step('setTimeout and getInfo', async () => {
    await sbx.setTimeout(300_000)
    const info = await sbx.getInfo()
    eq(info.sandboxId, sbx.sandboxId, 'sandboxId')
    eq(info.templateId, 'code-interpreter-v1', 'templateId')
    eq(info.metadata, meta, 'metadata')
    eq(info.state, 'running', 'state')
    const left = info.endAt.getTime() - Date.now()
    assert(left > 270_000 && left <= 301_000, `endAt is ${left} ms away, want about 300 s`)
    assert(info.startedAt.getTime() <= Date.now(), 'startedAt in the future')
  })

  await step('getMetrics: samples, and the start/end range', async () => {
    const t0 = new Date()
    const first = await sbx.getMetrics()
    assert(first.length >= 1 && first.every((m) => m.memTotal > 0 && m.cpuCount > 0), `metrics ${JSON.stringify(first)}`)
    const all = await sbx.getMetrics({ start: new Date(t0.getTime() - 60_000), end: new Date(Date.now() + 60_000) })
    assert(all.length >= 2, `two calls, ${all.length} samples in range`)
    eq(await sbx.getMetrics({ start: new Date(Date.now() + 3_600_000), end: new Date(Date.now() + 7_200_000) }), [], 'a range in the future')
    eq(await sbx.getMetrics({ end: new Date(Date.now() - 3_600_000) }), [], 'a range before the sandbox')
  })

  let other
  await step('Sandbox.list with a metadata filter and paging', async () => {
    other = await BaseSandbox.create({
      metadata: { purpose: 'airlock-e2b-scenario', run: `${run}-other` },
      network: { denyOut: [ALL_TRAFFIC], allowOut: ['pypi.org', '*.pythonhosted.org'] },
    })
    cleanup.push(() => other.kill())
    const page = await BaseSandbox.list({ query: { metadata: { run } } }).nextItems()
    eq(page.map((s) => s.sandboxId), [sbx.sandboxId], 'sandboxes with metadata run')
    eq(page[0].metadata, meta, 'listed metadata')
    const both = BaseSandbox.list({ query: { metadata: { purpose: 'airlock-e2b-scenario' } }, limit: 1 })
    const seen = []
    for (let pages = 0; both.hasNext; pages++) {
      assert(pages < 5, `paging does not end: ${JSON.stringify(seen)}`)
      seen.push(...(await both.nextItems()).map((s) => s.sandboxId))
    }
    eq(seen.slice().sort(), [sbx.sandboxId, other.sandboxId].sort(), 'two pages of one')
    const infoOther = await other.getInfo()
    eq(infoOther.templateId, 'base', 'template of a base sandbox')
    eq(infoOther.network?.allowOut, ['pypi.org', '*.pythonhosted.org'], 'allowOut of an allowlisted sandbox')
    eq((await sbx.getInfo()).allowInternetAccess, internetByDefault,
      `allowInternetAccess of a sandbox created without network settings by e2b ${sdkVersion}`)
  })

  await step('a sandbox killed during a cell and a command: the calls say it was killed', async () => {
    const ci = await Sandbox.connect(other.sandboxId)
    let cellStarted, cmdStarted
    const cellGo = new Promise((r) => { cellStarted = r })
    const cmdGo = new Promise((r) => { cmdStarted = r })
    const cellErrors = []
    const cell = ci.runCode('print("started", flush=True)\nimport time\ntime.sleep(60)',
      { onStdout: () => cellStarted(), onError: (e) => cellErrors.push(e) }).catch((e) => e)
    const cmd = other.commands.run('echo started; sleep 60', { onStdout: () => cmdStarted() }).catch((e) => e)
    await Promise.all([cellGo, cmdGo])
    eq(await BaseSandbox.kill(other.sandboxId), true, 'kill')
    // As on E2B the connection goes with the sandbox: runCode rejects with
    // E2B's TimeoutError (killedSandbox.test.ts), after an error saying why.
    const r = await cell
    assert(r instanceof Error && r.name === 'TimeoutError' && /sandbox was killed while the request was in progress/.test(r.message),
      `cell: ${r?.name}: ${r?.message}`)
    eq(cellErrors[0]?.name, 'SandboxEnded', `cell error ${JSON.stringify(cellErrors)}`)
    assert(/was killed/.test(cellErrors[0].value), `cell error value ${cellErrors[0].value}`)
    const e = await cmd
    assert(e instanceof Error && /was killed/.test(e.message), `command: ${e?.name}: ${e?.message}`)
    // E2B's wording, which its own tests look for (sandboxKilledDuringRun).
    assert(e.name === 'TimeoutError' && /sandbox was killed or reached its end of life/.test(e.message), `command: ${e?.name}: ${e?.message}`)
  })

  await step('kill, then calls on the killed sandbox fail with NotFoundError', async () => {
    eq(await sbx.kill(), true, 'kill()')
    eq(await BaseSandbox.kill(sbx.sandboxId), false, 'killing it again')
    await rejects(sbx.getInfo(), NotFoundError, 'getInfo() of a killed sandbox')
    await rejects(sbx.setTimeout(60_000), NotFoundError, 'setTimeout() of a killed sandbox')
    await rejects(sbx.commands.run('true'), NotFoundError, 'commands.run() in a killed sandbox')
    eq(await sbx.isRunning(), false, 'isRunning()')
    const left = await BaseSandbox.list({ query: { metadata: { run } } }).nextItems()
    eq(left.length, 0, 'killed sandbox still listed')
    eq(await other.kill(), false, 'kill() of the second sandbox, killed already')
  })
}

async function runCodeSteps(sbx) {
  // The code interpreter needs interpreter kernels inside the sandbox;
  // find out whether this server has them before asserting on results.
  let first, fresh
  try {
    fresh = await sbx.listCodeContexts()
    first = await sbx.runCode('x = 41\nx + 1')
  } catch (e) {
    const reason = `the server's code interpreter is unavailable (${e.name}: ${e.message})`
    for (const s of ['runCode: state across cells', 'runCode: matplotlib chart as PNG',
      'runCode: exception as ExecutionError', 'runCode: JavaScript context']) skip(s, reason)
    return false
  }
  await step('runCode: a fresh sandbox lists the default python and javascript contexts', async () => {
    eq(fresh.map((c) => [c.language, c.cwd]).sort(), [['javascript', '/home/user'], ['python', '/home/user']], 'contexts')
    const js = fresh.find((c) => c.language === 'javascript')
    eq((await sbx.runCode('20 + 22', { context: js })).text, '42', 'a cell in the default javascript context')
  })
  await step('runCode: state across cells', async () => {
    eq(first.error, undefined, 'error')
    eq(first.text, '42', 'x + 1')
    const r = await sbx.runCode('x * 2')
    eq(r.text, '82', 'x * 2 in the next cell')
    const out = await sbx.runCode('print("printed", x)')
    eq(out.logs.stdout, ['printed 41\n'], 'stdout')
  })
  await step('cwd: code contexts and commands work in /home/user, by getcwd(2) too (E2B\'s cwd tests)', async () => {
    // /home/user is a second mount of the workspace (on gVisor, made by
    // the agent), not a link, which getcwd would resolve to /workspace.
    const real = '/home/user'
    eq((await sbx.runCode('from pathlib import Path; print(Path.cwd())', { language: 'python' })).logs.stdout.join().trim(),
      real, 'python Path.cwd()')
    eq((await sbx.runCode('process.cwd()', { language: 'js' })).text, real, 'javascript process.cwd()')
    eq((await sbx.runCode('process.cwd()', { language: 'ts' })).text, real, 'typescript process.cwd()')
    eq((await sbx.runCode('pwd', { language: 'bash' })).logs.stdout.join().trim(), real, 'bash pwd')
    eq((await sbx.runCode('!pwd')).logs.stdout.join().trim(), real, 'python !pwd')
    const ctx = await sbx.createCodeContext({ language: 'python' })
    eq(ctx.cwd, '/home/user', 'a new context\'s cwd')
    eq((await sbx.runCode('import os; print(os.getcwd())', { context: ctx })).logs.stdout.join().trim(), real, 'its os.getcwd()')
    eq((await sbx.commands.run('pwd -P')).stdout.trim(), real, 'a command\'s pwd -P')
    await sbx.commands.run('mkdir -p sub2')
    eq((await sbx.commands.run('pwd -P', { cwd: 'sub2' })).stdout.trim(), real + '/sub2', 'pwd -P with a relative cwd')
    await sbx.files.write('/home/user/sub2/seen.txt', 'through the files API')
    eq((await sbx.commands.run('cat sub2/seen.txt; cat /workspace/sub2/seen.txt')).stdout,
      'through the files API'.repeat(2), '/home/user and /workspace are the same files')
    // The workload cannot take the second mount away.
    eq((await sbx.commands.run('umount /home/user 2>/dev/null && echo unmounted || echo refused; cat /home/user/sub2/seen.txt')).stdout,
      'refused\nthrough the files API', 'umount /home/user')
  })
  await step('runCode: matplotlib chart as PNG', async () => {
    const r = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()')
    eq(r.error, undefined, 'error')
    const png = r.results.find((x) => x.png)
    assert(png, `no PNG among ${JSON.stringify(r.results.map((x) => x.formats()))}`)
    const bytes = Buffer.from(png.png, 'base64')
    eq(Array.from(bytes.subarray(0, 8)), [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature')
  })
  await step('runCode: result.chart for a line and a bar chart', async () => {
    const r = await sbx.runCode(`import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label='squares')
plt.title('growth')
plt.xlabel('n')
plt.ylabel('size (MB)')
plt.show()
fig, ax = plt.subplots()
ax.bar(['a', 'b'], [3, 1])
ax.set_title('bars')
plt.show()`)
    eq(r.error, undefined, 'error')
    const [line, bar] = r.results.map((x) => x.chart)
    eq([line?.type, line?.title, line?.x_label, line?.y_label, line?.y_unit], ['line', 'growth', 'n', 'size (MB)', 'MB'], 'line chart')
    eq(line.elements.map((e) => [e.label, e.points]), [['squares', [[1, 1], [2, 4], [3, 9]]]], 'line elements')
    eq([bar?.type, bar?.title], ['bar', 'bars'], 'bar chart')
    eq(bar.elements.map((e) => [e.label, e.value]), [['a', 3], ['b', 1]], 'bar elements')
    assert(r.results.every((x) => x.png), 'figures keep their PNG')
  })
  await step('runCode: PIL images are results on show(), save() and as a value, as in E2B\'s kernel', async () => {
    const make = 'import numpy\nfrom PIL import Image\nimage = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype("uint8")).convert("RGBA")\n'
    for (const [what, code] of [['show()', 'image.show()\nprint("done")'], ['save()', 'image.save("pil.png")'], ['value', 'image']]) {
      const r = await sbx.runCode(make + code)
      eq(r.error, undefined, `${what}: error`)
      assert(r.results[0]?.png, `${what}: no PNG among ${JSON.stringify(r.results.map((x) => x.formats()))}`)
    }
    eq((await sbx.files.exists('/home/user/pil.png')), true, 'save() still saves')
  })
  await step('runCode: IPython.display works without IPython installed (display, HTML, Markdown, raw bundles)', async () => {
    const r = await sbx.runCode('from IPython.display import display, HTML, Markdown\n' +
      "display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)\ndisplay(HTML('<b>bold</b>'))\nMarkdown('# title')")
    eq(r.error, undefined, 'error')
    eq(r.results.map((x) => x.formats()), [['latex'], ['html'], ['markdown']], 'formats')
    eq([r.results[1].html, r.results[2].markdown], ['<b>bold</b>', '# title'], 'contents')
  })
  await step('runCode: exception as ExecutionError', async () => {
    const r = await sbx.runCode('1 / 0')
    assert(r.error, 'no error')
    eq(r.error.name, 'ZeroDivisionError', 'error name')
    assert(/division by zero/.test(r.error.value), `value ${r.error.value}`)
    assert(r.error.traceback.includes('ZeroDivisionError'), 'traceback')
    const after = await sbx.runCode('x')
    eq(after.text, '41', 'state survives an exception')
  })
  await step('runCode: an indented cell is dedented', async () => {
    const r = await sbx.runCode(`
      y = 2
      if y:
          print("indented", y)
      y * 21`)
    eq(r.error, undefined, 'error')
    eq([r.text, r.logs.stdout], ['42', ['indented 2\n']], 'result and stdout')
  })
  await step('runCode: a DataFrame result carries data', async () => {
    const r = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", None]})')
    eq(r.error, undefined, 'error')
    eq(r.results[0].data, { a: [1, 2], b: ['x', null] }, 'data')
    assert(r.results[0].formats().includes('data'), `formats ${r.results[0].formats()}`)
  })
  await step('runCode: JavaScript ES module imports', async () => {
    const r = await sbx.runCode("import { join } from 'node:path'\nimport fs from 'fs'\njoin('a', 'b')", { language: 'javascript' })
    eq([r.error, r.text], [undefined, 'a/b'], 'error and result')
    eq((await sbx.runCode('typeof fs.existsSync', { language: 'javascript' })).text, 'function', 'the import in the next cell')
  })
  await step('runCode: TypeScript', async () => {
    const r = await sbx.runCode('interface P { x: number }\nconst p: P = { x: 41 }\np.x + 1', { language: 'typescript' })
    eq([r.error, r.text], [undefined, '42'], 'error and result')
    const ctx = await sbx.createCodeContext({ language: 'typescript' })
    eq(ctx.language, 'typescript', 'context language')
    const bad = await sbx.runCode('const a: number = ', { context: ctx })
    eq(bad.error?.name, 'SyntaxError', 'a cell that does not transpile')
    await sbx.removeCodeContext(ctx)
  })
  await step('runCode: a language that is not installed is an error the SDK shows', async () => {
    const r = await sbx.runCode('1 + 1', { language: 'r' })
    eq(r.error?.name, 'LanguageNotSupported', 'error name')
    assert(/"r" is not available/.test(r.error.value), `error value ${r.error.value}`)
  })
  await step('runCode: a context in a missing cwd is refused naming it', async () => {
    const err = await rejects(sbx.createCodeContext({ cwd: '/root' }), Error, 'cwd /root')
    assert(/cwd \/root/.test(err.message) && !/context not found/i.test(err.message), `message ${err.message}`)
  })
  await step('runCode: timeoutMs interrupts an endless loop', async () => {
    const err = await rejects(sbx.runCode('while True: pass', { timeoutMs: 1500 }), Error, 'endless loop')
    assert(/timed out|timeout/i.test(err.message), `message ${err.message}`)
    eq((await sbx.runCode('x')).text, '41', 'the context runs the next cell, with its state')
  })
  await step('runCode: JavaScript context', async () => {
    const ctx = await sbx.createCodeContext({ language: 'javascript' })
    assert(ctx.id, 'no context id')
    eq(ctx.language, 'javascript', 'language')
    await sbx.runCode('const y = 20', { context: ctx })
    const r = await sbx.runCode('y + 22', { context: ctx })
    eq(r.text, '42', 'y + 22')
    const listed = await sbx.listCodeContexts()
    eq(listed.slice(0, 2).map((c) => c.language), ['python', 'javascript'], 'the default contexts are listed first')
    assert(listed.map((c) => c.id).includes(ctx.id), 'context not listed')
    await sbx.removeCodeContext(ctx)
  })
  return true
}

try {
  await main()
  if (skipped.length) console.log(`SKIPPED: ${JSON.stringify(skipped)}`)
  console.log('e2b-scenario: all steps passed')
  // Exit now: a failed runCode leaves the SDK's 60 s request timer armed.
  process.exit(0)
} catch (e) {
  const what = e instanceof StepError ? e.message : `${e?.name}: ${e?.message}\n${e?.stack}`
  console.error(`FAIL ${progress.current}: ${what}`)
  for (const f of cleanup) await f().catch(() => {})
  process.exit(1)
}
