// `npm run bench`: speed and memory of the sandbox, each figure a median
// next to a baseline measured in the same run, printed as a table and
// written to bench/results.json. No test framework timing.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { prepare, root } from "./prepare.mjs";
import { hostPidsWithCmdline } from "./lib/procs.mjs";

prepare();
const { PythonSandbox, ToolPermissions } = createRequire(import.meta.url)(join(root, "index.cjs"));
const quick = process.argv.includes("--quick");
const runs = (n) => (quick ? Math.max(3, Math.ceil(n / 10)) : n);
const work = mkdtempSync(join(tmpdir(), "pps-bench-"));
const project = join(work, "project");
mkdirSync(project);
const results = [];

const now = () => Number(process.hrtime.bigint()) / 1e6;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function record(name, value, unit, baselineName, baseline, target) {
  const ratio = baseline ? value / baseline : undefined;
  results.push({ name, value, unit, baselineName, baseline, ratio, target });
  const fmt = (v) => (v === undefined ? "" : v < 10 ? v.toFixed(3) : v.toFixed(1));
  console.log(
    `${name.padEnd(46)} ${fmt(value).padStart(9)} ${unit.padEnd(5)} ${(baselineName ?? "").padEnd(34)} ${fmt(baseline).padStart(9)} ${ratio === undefined ? "" : `${ratio.toFixed(2)}x`.padStart(7)}  ${target ?? ""}`,
  );
}

async function timed(fn) {
  const t = now();
  const r = await fn();
  return [now() - t, r];
}

function mustOk(r, what) {
  if (r.status !== "ok") throw new Error(`${what}: ${r.status}\n${r.text}`);
  return r;
}

/** `n` cold first executes (`1` in a new sandbox, no spare), each in ms: the baseline of several rows. */
async function coldExecutes(n) {
  const cold = [];
  for (let i = 0; i < n; i++) {
    const sb = new PythonSandbox({ projectDir: project, prewarm: false });
    const [ms, r] = await timed(() => sb.execute("1"));
    mustOk(r, "cold");
    cold.push(ms);
    await sb.dispose();
  }
  return cold;
}

async function waitForSpare(sb) {
  for (let i = 0; i < 500 && sb.status().spare !== "ready"; i++) await sleep(5);
  if (sb.status().spare !== "ready") throw new Error("the spare sandbox never became ready");
}

// -- baselines ---------------------------------------------------------------

const BWRAP_BASE = [
  "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
  "--new-session", "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
  "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
  "--symlink", "usr/bin", "/bin", "--clearenv", "--", "/usr/bin/python3", "-I", "-S", "-c", "pass",
];

function bwrapPythonMs() {
  const t = now();
  const r = spawnSync("bwrap", BWRAP_BASE, { stdio: "ignore" });
  if (r.status !== 0) throw new Error("bwrap baseline failed");
  return now() - t;
}

/** A plain Python child (no sandbox) answering lines on a pipe. */
function rawChild() {
  const src = [
    "import sys",
    "out = sys.stdout.buffer",
    "big = b'x' * 1048576",
    "for line in sys.stdin.buffer:",
    "    if line == b'big\\n': out.write(big); out.write(b'\\n.\\n')",
    "    else: out.write(b'.\\n')",
    "    out.flush()",
  ].join("\n");
  const child = spawn("/usr/bin/python3", ["-I", "-S", "-u", "-c", src], { stdio: ["pipe", "pipe", "inherit"] });
  let buf = "";
  let waiting;
  child.stdout.setEncoding("latin1");
  child.stdout.on("data", (d) => {
    buf += d;
    if (waiting && buf.endsWith(".\n")) {
      const w = waiting;
      waiting = undefined;
      buf = "";
      w();
    }
  });
  return {
    ask: (line) =>
      new Promise((resolve) => {
        waiting = resolve;
        child.stdin.write(`${line}\n`);
      }),
    close: () => child.kill(),
  };
}

// -- 1. cold start -------------------------------------------------------------

async function coldStart() {
  const base = [];
  const ours = [];
  const fromSource = [];
  for (let i = 0; i < runs(20); i++) {
    base.push(bwrapPythonMs());
    // A runtime root that already holds the compiled worker (every start after the first).
    const sb = new PythonSandbox({ projectDir: project, prewarm: false });
    const [ms, r] = await timed(() => sb.execute("1+1"));
    mustOk(r, "cold execute");
    ours.push(ms);
    await sb.dispose();
    // A fresh runtime root: the worker is compiled from source (the first start ever).
    const runtimeRoot = mkdtempSync(join(work, "rt-"));
    const fresh = new PythonSandbox({ projectDir: project, prewarm: false, runtimeRoot });
    const [msSource, rSource] = await timed(() => fresh.execute("1+1"));
    mustOk(rSource, "cold execute from source");
    fromSource.push(msSource);
    await fresh.dispose();
    rmSync(runtimeRoot, { recursive: true, force: true });
  }
  const off = [];
  for (let i = 0; i < runs(20); i++) {
    const sb = new PythonSandbox({ projectDir: project, prewarm: false, rollback: false });
    const [ms, r] = await timed(() => sb.execute("1+1"));
    mustOk(r, "cold execute, rollback off");
    off.push(ms);
    await sb.dispose();
  }
  record("cold first execute (1+1, sandbox start)", median(ours), "ms", "bwrap + python3 -I -S -c pass", median(base), "<= 1.15x");
  record("  the same, rollback off", median(off), "ms", "bwrap + python3 -I -S -c pass", median(base), "<= 1.15x");
  record("  the same, worker compiled from source", median(fromSource), "ms", "bwrap + python3 -I -S -c pass", median(base), "(once per interpreter)");
}

// -- 1a. the bash tool: one sandbox per command ----------------------------------

const BWRAP_BASH = [...BWRAP_BASE.slice(0, BWRAP_BASE.indexOf("--")), "--", "/bin/bash", "-c", "true"];

function spawnMs(cmd, args) {
  const t = now();
  const r = spawnSync(cmd, args, { stdio: "ignore" });
  if (r.status !== 0) throw new Error(`${cmd} baseline failed`);
  return now() - t;
}

async function shellOnce(sb, cwd, command) {
  const t = now();
  const r = await sb.execShell(1, command, { cwd }, () => {});
  if (r.exitCode !== 0) throw new Error(`sandboxed ${command}: ${JSON.stringify(r)}`);
  return now() - t;
}

/** The seed's engine, pinned; installed by the bench into `.bench/` (it asks for Node 22.12+, so
 * it is not among the package's devDependencies, whose install must stay quiet on Node 20). */
const SEED_ENGINE = "@anthropic-ai/sandbox-runtime@0.0.83";

/** Import the seed's engine from `.bench/`, installing it there (npm, pinned) the first time. */
async function importSeedEngine() {
  const dir = join(root, ".bench");
  const entry = join(dir, "node_modules", "@anthropic-ai", "sandbox-runtime");
  if (!existsSync(entry)) {
    mkdirSync(dir, { recursive: true });
    const r = spawnSync("npm", ["install", "--prefix", dir, "--no-save", "--no-audit", "--no-fund", "--loglevel=error", SEED_ENGINE], {
      encoding: "utf8",
    });
    if (r.status !== 0) throw new Error(`npm install ${SEED_ENGINE} failed: ${(r.stderr || r.stdout || "").trim().split("\n")[0]}`);
  }
  return createRequire(join(dir, "package.json"))("@anthropic-ai/sandbox-runtime");
}

/**
 * The seed's own engine (SEED_ENGINE): its proxies started once (`initialize`), then per command
 * `wrapWithSandbox` and the wrapped command run through a shell, as the seed runs each Bash
 * command. Resolves a function timing one command, or why the row is skipped (it cannot be
 * installed, no socat or ripgrep, its sandbox does not start).
 */
async function seedEngine(cwd) {
  let SandboxManager;
  try {
    ({ SandboxManager } = await importSeedEngine());
  } catch (err) {
    return { skip: `${SEED_ENGINE} could not be loaded: ${err.message.split("\n")[0]}` };
  }
  const missing = ["socat", "rg"].filter((tool) => spawnSync("sh", ["-c", `command -v ${tool}`], { stdio: "ignore" }).status !== 0);
  if (missing.length) return { skip: `the seed's engine needs ${missing.join(" and ")} on PATH (apt-get install socat ripgrep)` };
  try {
    await SandboxManager.initialize({
      network: { allowedDomains: [], deniedDomains: [] },
      filesystem: { denyRead: ["~/.ssh"], allowWrite: [cwd, "/tmp"], denyWrite: [".env"] },
    });
  } catch (err) {
    return { skip: `the seed's engine did not start: ${err.message.split("\n")[0]}` };
  }
  const once = async () => {
    const t = now();
    const wrapped = await SandboxManager.wrapWithSandbox("true");
    const code = await new Promise((resolve) => spawn(wrapped, { shell: true, cwd, stdio: "ignore" }).on("exit", resolve));
    if (code !== 0) throw new Error(`the seed's engine ran true with exit code ${code}`);
    return now() - t;
  };
  return { once, stop: () => SandboxManager.reset() };
}

/**
 * CPU milliseconds of a Node child running `kind` ("bare": bare bwrap + bash -c true; "ours": a
 * sandboxed `true`) `n` times, with everything it started, counted by a Python parent that is a
 * child subreaper (PR_SET_CHILD_SUBREAPER) and reaps every process left to it. Bubblewrap's own
 * child (PID 1 of the sandbox, where every mount is made) outlives bubblewrap, which exits as soon
 * as it has the exit code: no `wait` of this process ever counts it, so /proc/self/stat's children
 * times miss the mounts. Microseconds, from getrusage.
 */
function treeCpuMs(kind, n) {
  const child = [
    `const { PythonSandbox } = require(${JSON.stringify(join(root, "index.cjs"))});`,
    `const { spawnSync } = require("node:child_process");`,
    `const [kind, n, project] = [process.argv[1], Number(process.argv[2]), process.argv[3]];`,
    `const BWRAP = ${JSON.stringify(BWRAP_BASH)};`,
    `(async () => {`,
    `  const sb = new PythonSandbox({ projectDir: project });`,
    `  const once = async () => { const r = await sb.execShell(1, "true", { cwd: project }, () => {}); if (r.exitCode !== 0) throw new Error(JSON.stringify(r)); };`,
    `  await once();`,
    `  for (let i = 0; i < n; i++) {`,
    `    if (kind === "bare") { if (spawnSync("bwrap", BWRAP, { stdio: "ignore" }).status !== 0) throw new Error("bwrap"); }`,
    `    else { await sb.awaitShellSpare(); await once(); }`,
    `  }`,
    `  await sb.dispose();`,
    `})().catch((e) => { console.error(e); process.exit(1); });`,
  ].join("\n");
  const reaper = [
    "import ctypes, os, resource, subprocess, sys",
    "if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0: sys.exit('prctl(PR_SET_CHILD_SUBREAPER) failed')",
    "rc = subprocess.call(sys.argv[1:])",
    "while True:",
    "    try: os.wait()",
    "    except ChildProcessError: break",
    "r = resource.getrusage(resource.RUSAGE_CHILDREN)",
    "print(rc, (r.ru_utime + r.ru_stime) * 1000)",
  ].join("\n");
  const r = spawnSync("python3", ["-c", reaper, process.execPath, "-e", child, kind, String(n), project], { encoding: "utf8" });
  const [rc, ms] = (r.stdout || "").trim().split(" ");
  if (r.status !== 0 || rc !== "0") throw new Error(`CPU count of ${kind} failed: ${(r.stderr || r.stdout || "").trim().slice(0, 500)}`);
  return Number(ms);
}

/** CPU milliseconds per command of `kind`, whole process tree (see treeCpuMs): n commands less none. */
function cpuPerCommand(kind, n) {
  return (treeCpuMs(kind, n) - treeCpuMs(kind, 0)) / n;
}

async function shell() {
  const bare = [];
  const hostBash = [];
  const ours = [];
  const cold = [];
  const seedMs = [];
  const seed = await seedEngine(project);
  // The target: a command whose sandbox was started while the model thought (the spare made after
  // the last command). Every baseline is timed once that spare is ready, so that its start never
  // overlaps them; then the command. The cold row: back-to-back commands with no spare (today's
  // path for a command that finds none ready).
  const sb = new PythonSandbox({ projectDir: project });
  const noSpare = new PythonSandbox({ projectDir: project, prewarm: false });
  await shellOnce(sb, project, "true");
  await shellOnce(noSpare, project, "true");
  try {
    if (seed.once) await seed.once();
    for (let i = 0; i < runs(30); i++) {
      const spare = await sb.awaitShellSpare();
      if (spare.state !== "ready") throw new Error(`no spare ready: ${JSON.stringify(spare)}`);
      bare.push(spawnMs("bwrap", BWRAP_BASH));
      hostBash.push(spawnMs("/bin/bash", ["-c", "true"]));
      if (seed.once) seedMs.push(await seed.once());
      cold.push(await shellOnce(noSpare, project, "true"));
      const used = sb.shellSpare().used;
      ours.push(await shellOnce(sb, project, "true"));
      if (sb.shellSpare().used !== used + 1) throw new Error("the command did not run in the spare");
    }
  } finally {
    await sb.dispose();
    await noSpare.dispose();
    await seed.stop?.();
  }
  record("bash -c true, sandboxed, sandbox started while the model thought", median(ours), "ms", "bare bwrap + bash -c true", median(bare), "<= 1.3x");
  record("  the same", median(ours), "ms", "pi's host bash (bash -c true)", median(hostBash), "");
  record("bash -c true, sandboxed, back to back (no spare ready)", median(cold), "ms", "bare bwrap + bash -c true", median(bare), "");
  // CPU time of every process of a command (a wall time on a loaded machine is mostly waits for a
  // core, and a sandboxed command hands over between more processes than a bare one).
  const cpuRuns = runs(40);
  record("  CPU time per command (its spare's start included)", cpuPerCommand("ours", cpuRuns), "ms", "bare bwrap + bash -c true, CPU", cpuPerCommand("bare", cpuRuns), "(load-proof)");
  if (seed.once) {
    record("  the seed's engine (sandbox-runtime)", median(seedMs), "ms", "bare bwrap + bash -c true", median(bare), "");
    record("  the same", median(ours), "ms", "the seed's engine (sandbox-runtime)", median(seedMs), "");
  } else {
    console.log(`  (no row for the seed's engine: ${seed.skip})`);
  }
  // The project walk, per command: 20,000 files, and 200,000 entries read-only (the walk kept).
  for (const [count, label, writable, env] of [
    [20_000, "20,000 files, read-only", false, {}],
    [20_000, "20,000 files, yolo", true, {}],
    [200_000, "200,000 entries, read-only", false, {}],
    [200_000, "200,000 entries, yolo, past a bound of 100,000 (read-only)", true, { PI_SANDBOX_SCAN_ENTRIES: "100000" }],
  ]) {
    const big = bigProject(count);
    const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
    Object.assign(process.env, env);
    try {
      const s = new PythonSandbox({ projectDir: big, workspaceWritable: writable, prewarm: false });
      await shellOnce(s, big, "true");
      const xs = [];
      for (let i = 0; i < runs(10); i++) xs.push(await shellOnce(s, big, "true"));
      await s.dispose();
      record(`bash -c true, ${label}`, median(xs), "ms", "bare bwrap + bash -c true", median(bare), "(walk cost)");
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  }

  // A large repository, writable (yolo): the first command walks it, the next ones keep the walk
  // (a command that makes or changes a name, touch, keeps it too).
  for (const count of [200_000, 300_000]) {
    const big = repository(count);
    const s = new PythonSandbox({ projectDir: big, workspaceWritable: true, prewarm: false });
    try {
      const first = await shellOnce(s, big, "true");
      const xs = [];
      const touched = [];
      for (let i = 0; i < runs(10); i++) {
        xs.push(await shellOnce(s, big, "true"));
        touched.push(await shellOnce(s, big, `touch x${i}`));
      }
      const n = `${count / 1000},000 entries in a repository, yolo`;
      record(`bash -c true, ${n}: first command (the walk)`, first, "ms", "bare bwrap + bash -c true", median(bare), "once a session");
      record(`bash -c true, ${n}: next commands`, median(xs), "ms", "bare bwrap + bash -c true", median(bare), "(walk kept)");
      record(`touch x, ${n}: next commands`, median(touched), "ms", "bare bwrap + bash -c true", median(bare), "(walk kept)");
    } finally {
      await s.dispose();
    }
  }
}

/** A repository of about `entries` entries, shaped like a real one (made once a run): a .git with
 * hooks, refs and 256 loose-object directories of 40 objects each, and a work tree of directories
 * three levels deep, 18 files each. */
function repository(entries) {
  const dir = join(work, `repo-${entries}`);
  if (existsSync(dir)) return dir;
  const git = join(dir, ".git");
  for (const d of ["hooks", "refs/heads", "info", "objects/pack"]) mkdirSync(join(git, d), { recursive: true });
  writeFileSync(join(git, "config"), "[core]\n\tbare = false\n");
  writeFileSync(join(git, "HEAD"), "ref: refs/heads/main\n");
  for (let i = 0; i < 256; i++) {
    const objects = join(git, "objects", i.toString(16).padStart(2, "0"));
    mkdirSync(objects);
    for (let j = 0; j < 40; j++) writeFileSync(join(objects, (i * 1000 + j).toString(16).padStart(38, "0")), "");
  }
  let made = 256 * 41 + 10;
  for (let i = 0; made < entries; i++) {
    const sub = join(dir, `src${i % 30}`, `pkg${Math.floor(i / 30) % 40}`, `m${i}`);
    mkdirSync(sub, { recursive: true });
    for (let f = 0; f < 18; f++) writeFileSync(join(sub, `f${f}.c`), "");
    made += 19;
  }
  return dir;
}

// -- 1b. writable workspace: the protected-path scan --------------------------------

/** A project of `files` files in 1,000 directories, with a .git and a nested repository (made once a run). */
// -- 1b. the bash tool's network: the proxy against a direct connection ------------

/** Runs in the sandbox (through its proxy) and on the host (direct) alike: `rtt` prints the median
 * ms of N requests, each on a new connection (the proxy serves one request per connection);
 * `bulk` reads what the origin streams after "GO" (through a CONNECT tunnel when proxied) and
 * prints MiB/s and the CPU seconds the client itself spent on the transfer. */
const NET_CLIENT = `
import socket, sys, time
mode, host, port, n, via = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def conn():
    s = socket.create_connection(("127.0.0.1", 3128) if via == "proxy" else (host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s
if mode == "rtt":
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        s = conn()
        target = f"http://{host}:{port}/" if via == "proxy" else "/"
        s.sendall(f"GET {target} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\nConnection: close\\r\\n\\r\\n".encode())
        while s.recv(65536):
            pass
        s.close()
        xs.append((time.perf_counter() - t) * 1000)
    xs.sort()
    print(xs[len(xs) // 2])
else:
    s = conn()
    if via == "proxy":
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            head += s.recv(1)
    buf = bytearray(1 << 18)
    t, c = time.perf_counter(), time.process_time()
    s.sendall(b"GO\\n")
    got = 0
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        got += k
    print(got / (1 << 20) / (time.perf_counter() - t), time.process_time() - c)
`;

/** The origins, in their own Node process (not the event loop of the process whose threads run
 * the proxy), the same for the direct and the proxied clients: an HTTP server answering "ok", and
 * a bulk server that streams \`mib\` MiB after the first bytes of each connection, then prints the
 * CPU seconds it spent on that connection. The first line printed is the two ports. */
const NET_ORIGINS = `
const net = require("node:net");
const web = require("node:http").createServer((_req, res) => res.end("ok\\n"));
const mib = Number(process.argv[1]);
const chunk = Buffer.alloc(1 << 20, 120);
const server = net.createServer((c) => {
  c.on("error", () => {});
  c.once("data", async () => {
    const cpu = process.cpuUsage();
    for (let i = 0; i < mib; i++) if (!c.write(chunk)) await new Promise((r) => c.once("drain", r));
    c.end(() => {
      const u = process.cpuUsage(cpu);
      process.stdout.write((u.user + u.system) / 1e6 + "\\n");
    });
  });
});
web.listen(0, "127.0.0.1", () =>
  server.listen(0, "127.0.0.1", () => process.stdout.write(web.address().port + " " + server.address().port + "\\n")),
);
`;

/** CPU seconds of this process's tokio workers (the addon's threads: the proxy's relay runs there). */
function addonThreadsCpu() {
  let ticks = 0;
  for (const t of readdirSync("/proc/self/task")) {
    try {
      if (readFileSync(`/proc/self/task/${t}/comm`, "utf8").trim() !== "tokio-rt-worker") continue;
      const f = readFileSync(`/proc/self/task/${t}/stat`, "utf8").split(") ")[1].split(" ");
      ticks += Number(f[11]) + Number(f[12]);
    } catch {}
  }
  return ticks / 100;
}

/** A child process whose stdout lines are taken one at a time. */
function lineChild(cmd, args) {
  const c = spawn(cmd, args, { stdio: ["ignore", "pipe", "inherit"] });
  const lines = [];
  const waiting = [];
  let buf = "";
  c.stdout.on("data", (d) => {
    buf += d;
    for (let i; (i = buf.indexOf("\n")) >= 0; buf = buf.slice(i + 1)) {
      const l = buf.slice(0, i);
      if (waiting.length) waiting.shift()(l);
      else lines.push(l);
    }
  });
  return { child: c, next: () => (lines.length ? Promise.resolve(lines.shift()) : new Promise((r) => waiting.push(r))) };
}

async function shellOut(sb, cwd, command) {
  let out = "";
  const r = await sb.execShell(1, command, { cwd }, (t) => {
    out += t;
  });
  if (r.exitCode !== 0) throw new Error(`sandboxed ${command}: ${JSON.stringify(r)}\n${out}`);
  return out;
}

/** `connectOnly`: the CONNECT throughput rows alone (`--only=connect`). */
async function network(connectOnly = false) {
  const BULK_MIB = quick ? 128 : 512;
  const origins = lineChild(process.execPath, ["-e", NET_ORIGINS, String(BULK_MIB)]);
  const [webPort, bulkPort] = (await origins.next()).split(" ").map(Number);
  const script = join(project, "net-client.py");
  writeFileSync(script, NET_CLIENT);
  const networkConfig = {
    mode: "proxy", allowedDomains: [], deniedDomains: [], allowPrivate: [`127.0.0.1:${webPort}`, `127.0.0.1:${bulkPort}`],
  };
  const withNet = new PythonSandbox({ projectDir: project });
  withNet.setShellConfig({ network: networkConfig });
  const without = new PythonSandbox({ projectDir: project });
  // Not spawnSync: this process must keep serving the sandbox's proxy meanwhile.
  const host = (args) =>
    new Promise((resolve, reject) => {
      const c = spawn("/usr/bin/python3", ["-I", script, ...args], { stdio: ["ignore", "pipe", "inherit"] });
      let out = "";
      c.stdout.on("data", (d) => {
        out += d;
      });
      c.on("exit", (code) => {
        if (code !== 0) return reject(new Error(`host client exited ${code}`));
        const xs = out.trim().split(" ").map(Number);
        resolve(xs.length === 1 ? xs[0] : xs);
      });
    });
  try {
    if (connectOnly) return await throughput(withNet, host, script, bulkPort, origins, BULK_MIB);
    await shellOnce(withNet, project, "true");
    await shellOnce(without, project, "true");
    const on = [];
    const off = [];
    for (let i = 0; i < runs(30); i++) {
      off.push(await shellOnce(without, project, "true"));
      on.push(await shellOnce(withNet, project, "true"));
    }
    record("bash -c true with the network proxy", median(on), "ms", "bash -c true, no network", median(off), "(setup cost)");
    // The python tool's: a cold first execute whose sandbox gets the listener and the proxy
    // (network.python), against the same start without a network, alternated in this run.
    const pyOn = [];
    const pyOff = [];
    for (let i = 0; i < runs(20); i++) {
      for (const [python, into] of [[false, pyOff], [true, pyOn]]) {
        const sb = new PythonSandbox({ projectDir: project, prewarm: false });
        sb.setShellConfig({ network: { ...networkConfig, python } });
        const [ms, r] = await timed(() => sb.execute("1+1"));
        mustOk(r, `cold execute, network.python ${python}`);
        into.push(ms);
        await sb.dispose();
      }
    }
    record("python cold first execute with network.python", median(pyOn), "ms", "the same start, no network", median(pyOff), "(setup cost)");
    const n = runs(200);
    const rtt = [];
    const direct = [];
    for (let i = 0; i < (quick ? 1 : 3); i++) {
      direct.push(await host(["rtt", "127.0.0.1", String(webPort), String(n), "direct"]));
      rtt.push(Number((await shellOut(withNet, project, `/usr/bin/python3 -I ${script} rtt 127.0.0.1 ${webPort} ${n} proxy`)).trim()));
    }
    const [r, d] = [median(rtt), median(direct)];
    record("HTTP round trip through the proxy", r, "ms", "direct to the same origin (host)", d, `<= 1.5x + 1 ms (${r <= 1.5 * d + 1 ? "met" : "NOT met"})`);
    await throughput(withNet, host, script, bulkPort, origins, BULK_MIB);
  } finally {
    await withNet.dispose();
    await without.dispose();
    origins.child.kill();
  }
}

/** CONNECT throughput: the same Python client reads `mib` MiB from the same origin process,
 * on the host straight from the origin (direct) and in a sandboxed bash through a CONNECT tunnel
 * of its proxy; the two alternate (which goes first alternates too), and each figure is the
 * median of the runs. Beside the rate, the CPU that moved the bytes, per GiB: the client's own
 * (measured by the client), the origin's (measured by the origin), and, proxied, the addon's
 * tokio threads over the whole sandboxed command (the proxy's relay, plus the command's own
 * bookkeeping). CPU is the figure the machine's load moves least. */
async function throughput(withNet, host, script, bulkPort, origins, mib) {
  const rates = { direct: [], proxy: [] };
  const cpu = { direct: [], proxy: [] };
  const parts = { direct: { client: [], origin: [], proxy: [] }, proxy: { client: [], origin: [], proxy: [] } };
  const one = {
    direct: async () => {
      const [rate, client] = await host(["bulk", "127.0.0.1", String(bulkPort), "0", "direct"]);
      return [rate, { client, origin: Number(await origins.next()), proxy: 0 }];
    },
    proxy: async () => {
      const before = addonThreadsCpu();
      const out = await shellOut(withNet, project, `/usr/bin/python3 -I ${script} bulk 127.0.0.1 ${bulkPort} 0 proxy`);
      const proxy = addonThreadsCpu() - before;
      const [rate, client] = out.trim().split(" ").map(Number);
      return [rate, { client, origin: Number(await origins.next()), proxy }];
    },
  };
  for (let i = 0; i < (quick ? 3 : 9); i++) {
    for (const way of i % 2 ? ["proxy", "direct"] : ["direct", "proxy"]) {
      const [rate, seconds] = await one[way]();
      rates[way].push(rate);
      for (const k of ["client", "origin", "proxy"]) parts[way][k].push((seconds[k] * 1024) / mib);
      cpu[way].push(((seconds.client + seconds.origin + seconds.proxy) * 1024) / mib);
    }
  }
  record("CONNECT throughput through the proxy", median(rates.proxy), "MiB/s", "direct to the same origin (host)", median(rates.direct), ">= 0.5x");
  record("CPU per GiB, CONNECT (client+origin+proxy)", median(cpu.proxy), "s", "direct (client+origin)", median(cpu.direct));
  const each = (way) => ["client", "origin", "proxy"].map((k) => `${k} ${median(parts[way][k]).toFixed(3)}`).join(", ");
  console.log(`  CPU s/GiB, medians: proxied ${each("proxy")}; direct ${each("direct")}`);
}

function bigProject(files) {
  const dir = join(work, `big-${files}`);
  if (existsSync(dir)) return dir;
  for (let d = 0; d < 1000; d++) {
    const sub = join(dir, `pkg${d % 20}`, `mod${d}`);
    mkdirSync(sub, { recursive: true });
    for (let f = 0; f < files / 1000; f++) writeFileSync(join(sub, `f${f}.py`), "");
  }
  mkdirSync(join(dir, ".git"), { recursive: true });
  writeFileSync(join(dir, ".git", "config"), "[core]\n");
  mkdirSync(join(dir, "pkg3", ".git"), { recursive: true });
  return dir;
}

/** One cold start of a session over `dir` in `mode`, with `env` set for the start. */
async function startIn(dir, mode, env = {}) {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    const sb = new PythonSandbox({ projectDir: dir, prewarm: false });
    sb.applyModeEvent({ mode, readRoots: [] });
    const [ms, r] = await timed(() => sb.execute("1+1"));
    mustOk(r, `cold execute (${mode})`);
    await sb.dispose();
    return ms;
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

const NO_MASKS = { PI_PYTHON_TOOL_SECRETS: "" };

async function writableStart() {
  const big = bigProject(20_000);
  // The baseline walks nothing: read-only, masking off.
  const start = (dir, mode) => startIn(dir, mode, mode === "manual" ? NO_MASKS : {});
  const ro = [];
  const rw = [];
  const rwBig = [];
  for (let i = 0; i < runs(20); i++) {
    ro.push(await start(big, "manual"));
    rw.push(await start(project, "yolo"));
    rwBig.push(await start(big, "yolo"));
  }
  record("cold first execute, yolo (small project)", median(rw), "ms", "read-only, no masks (no walk)", median(ro), "");
  record("cold first execute, yolo, 20,000 files", median(rwBig), "ms", "read-only, no masks (no walk)", median(ro), "(scan cost)");
  const sb = new PythonSandbox({ projectDir: project });
  sb.applyModeEvent({ mode: "yolo", readRoots: [] });
  mustOk(await sb.execute("1"), "warm-up");
  const ours = [];
  for (let i = 0; i < runs(1000); i++) ours.push((await timed(() => sb.execute("x = 1")))[0]);
  await sb.dispose();
  const roSb = new PythonSandbox({ projectDir: project });
  mustOk(await roSb.execute("1"), "warm-up");
  const base = [];
  for (let i = 0; i < runs(1000); i++) base.push((await timed(() => roSb.execute("x = 1")))[0]);
  await roSb.dispose();
  record("warm execute x = 1, yolo, median", median(ours), "ms", "the same, read-only", median(base), "");
}

// -- 1c. secret masks: the same walk in every mode --------------------------------------

async function secretScan() {
  const big = bigProject(20_000);
  for (const p of ["pkg1/mod1/.env", "pkg2/mod2/deploy.pem", ".env", "pkg4/mod4/credentials.json"]) {
    writeFileSync(join(big, p), "secret\n");
  }
  const masked = [];
  const off = [];
  const smallMasked = [];
  const smallOff = [];
  for (let i = 0; i < runs(20); i++) {
    off.push(await startIn(big, "manual", NO_MASKS));
    masked.push(await startIn(big, "manual"));
    smallOff.push(await startIn(project, "manual", NO_MASKS));
    smallMasked.push(await startIn(project, "manual"));
  }
  record("cold first execute, secret masks, 20,000 files", median(masked), "ms", "PI_PYTHON_TOOL_SECRETS='' (no walk)", median(off), "(scan cost)");
  record("  the same, small project", median(smallMasked), "ms", "PI_PYTHON_TOOL_SECRETS='' (no walk)", median(smallOff), "");
}

// -- 2. warm round trip ----------------------------------------------------------

async function warm() {
  const n = runs(1000);
  const raw = rawChild();
  await raw.ask("warm");
  const base = [];
  for (let i = 0; i < n; i++) base.push((await timed(() => raw.ask("x")))[0]);
  const sb = new PythonSandbox({ projectDir: project });
  mustOk(await sb.execute("1"), "warm-up");
  const ours = [];
  for (let i = 0; i < n; i++) ours.push((await timed(() => sb.execute("x = 1")))[0]);
  record("warm execute x = 1, median", median(ours), "ms", "pipe round trip, plain python", median(base), "<= 0.3 ms");
  const off = new PythonSandbox({ projectDir: project, rollback: false });
  mustOk(await off.execute("1"), "warm-up, rollback off");
  const offMs = [];
  for (let i = 0; i < n; i++) offMs.push((await timed(() => off.execute("x = 1")))[0]);
  record("  the same, rollback off", median(offMs), "ms", "rollback on", median(ours), "<= 0.1 ms");
  record("warm execute x = 1, p99", pct(ours, 0.99), "ms", "pipe round trip, plain python, p99", pct(base, 0.99));
  // As a model calls: a pause between calls, in which the interpreter makes the next call's
  // rollback point (the loop above leaves it none).
  const pausedBase = [];
  const paused = [];
  // Pages the interpreter copies during the call (its minor faults: after the copy's fork each
  // first write to a shared page is one), a figure the machine's load does not move.
  const { interp } = sandboxTree(sb);
  const faults = [];
  for (let i = 0; i < runs(200); i++) {
    await sleep(2);
    pausedBase.push((await timed(() => raw.ask("x")))[0]);
    await sleep(2);
    const before = minorFaults(interp);
    paused.push((await timed(() => sb.execute("x = 1")))[0]);
    faults.push(minorFaults(interp) - before);
  }
  record("  the same, 2 ms between calls", median(paused), "ms", "pipe round trip, the same pauses", median(pausedBase), "<= 0.3 ms");
  {
    const { interp: offInterp } = sandboxTree(off);
    const offFaults = [];
    for (let i = 0; i < runs(50); i++) {
      const before = minorFaults(offInterp);
      mustOk(await off.execute("x = 1"), "rollback off");
      offFaults.push(minorFaults(offInterp) - before);
    }
    record("  pages copied by the interpreter in the call", median(faults), "pages", "rollback off", median(offFaults), "");
  }
  await off.dispose();

  // -- 4. 1 MiB of stdout
  const bigBase = [];
  const bigOurs = [];
  for (let i = 0; i < runs(30); i++) {
    bigBase.push((await timed(() => raw.ask("big")))[0]);
    const [ms, r] = await timed(() => sb.execute("import sys; sys.stdout.write('x' * 1048576)"));
    mustOk(r, "1 MiB");
    if (r.stdoutBytes !== 1048576) throw new Error(`captured ${r.stdoutBytes} bytes`);
    bigOurs.push(ms);
  }
  const mib = (ms) => 1000 / ms; // MiB/s for 1 MiB
  record("1 MiB stdout captured, throughput", mib(median(bigOurs)), "MiB/s", "plain python writing 1 MiB to a pipe", mib(median(bigBase)), ">= 0.5x");
  raw.close();
  await sb.dispose();
}

// -- grants that keep the interpreter -------------------------------------------

/**
 * Time to apply a grant: from the user's answer arriving (the `ask` callback returns "allow", an
 * allow once) to the rerun's result, minus the rerun's own execution (the same code run again once
 * the path is readable). Baseline: a cold first execute in the same run.
 */
async function liveGrant() {
  const cold = await coldExecutes(runs(10));
  const outside = mkdtempSync("/var/tmp/pps-bench-outside-");
  try {
    const permissions = new ToolPermissions();
    permissions.setMode({ mode: "manual", readRoots: [] });
    const sb = new PythonSandbox({ projectDir: project, prewarm: false }, permissions);
    mustOk(await sb.execute("state = 1"), "first");
    const apply = [];
    for (let i = 0; i < runs(20); i++) {
      const file = join(outside, `f${i}.txt`);
      writeFileSync(file, "x\n");
      const code = `state += 1\nopen('${file}').read()`;
      let answered = 0;
      const ask = async () => {
        answered = now();
        return "allow";
      };
      const r = await sb.execute(code, 30, undefined, undefined, ask, true);
      const total = now() - answered;
      mustOk(r, "rerun after the grant");
      if (r.stateLost || !answered) throw new Error(`the grant did not keep the state: ${r.text}`);
      const [own] = await timed(() => sb.execute(code));
      apply.push(total - own);
    }
    record("apply a grant (allow once, answer to rerun)", median(apply), "ms", "cold first execute", median(cold), "<= 0.2x");
    await sb.dispose();
  } finally {
    rmSync(outside, { recursive: true, force: true });
  }
}

/**
 * A permission-mode change made in the running sandbox (the project's mount replaced in place,
 * the interpreter kept). To writable: it is made at the next execute, timed as that execute minus
 * the same execute without a change. To read-only: it is made when the mode event arrives, timed
 * as `applyModeEvent`. Baseline: a cold first execute in yolo mode (what a restart costs at
 * least), in the same run.
 */
async function liveMode() {
  const cold = [];
  for (let i = 0; i < runs(10); i++) cold.push(await startIn(project, "yolo"));
  const sb = new PythonSandbox({ projectDir: project, prewarm: false });
  sb.applyModeEvent({ mode: "manual", readRoots: [] });
  mustOk(await sb.execute("state = 0"), "first");
  const toWritable = [];
  const toReadOnly = [];
  for (let i = 0; i < runs(20); i++) {
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const [ms, r] = await timed(() => sb.execute("state += 1"));
    mustOk(r, "execute after the change to yolo");
    if (r.stateLost) throw new Error(`the change to yolo did not keep the state: ${r.text}`);
    const [own] = await timed(() => sb.execute("state += 1"));
    toWritable.push(ms - own);
    const began = now();
    const change = sb.applyModeEvent({ mode: "manual", readRoots: [] });
    toReadOnly.push(now() - began);
    if (change.discarded) throw new Error(`the change to manual restarted the sandbox: ${change.notification}`);
  }
  const r = await sb.execute("state");
  mustOk(r, "last");
  if (r.stateLost) throw new Error(`the state was lost: ${r.text}`);
  await sb.dispose();
  record("mode change to writable in place", median(toWritable), "ms", "cold first execute, yolo", median(cold), "");
  record("mode change to read-only in place", median(toReadOnly), "ms", "cold first execute, yolo", median(cold), "");
}

// -- 2b. through a real pi session, on both majors ------------------------------

/**
 * `pi --mode rpc` (the shipped CLI) with this package and the scripted faux model: per fresh
 * session, the first execute, an execute after a reset and one after a timeout that rolled back,
 * each timed from pi's tool_execution_start line to its tool_execution_end line as they arrive on
 * pi's stdout (pi's own tool handling included). The first execute is measured twice: with the
 * defaults (the sandbox begun at session_start, the spare the first call takes; the faux model
 * calls the tool a few tens of milliseconds after session_start, so most of the start is still
 * on the call's path here, where a real model's first answer would hide all of it), and cold
 * (PI_SANDBOX_PREWARM=0: nothing begun before the call). Each pair of sessions is interleaved
 * with a bare bwrap + python run. pi 0.73 runs on this Node; pi 1.x on
 * the Node 22 of .hosts/pi1 (installed from the pinned lockfile if it is missing).
 */
async function piSessions() {
  const { piCli, startRpcPi, toolText } = await import(join(root, "__test__", "helpers", "rpc-client.mjs"));
  const { ensurePi1Host } = await import(join(root, "scripts", "pi1-host.mjs"));
  const pi1 = ensurePi1Host();
  const hosts = [
    { label: "pi 0.73", node: process.execPath, cli: piCli(join(root, "node_modules", "@mariozechner", "pi-coding-agent")) },
    { label: `pi ${pi1.version()}`, node: pi1.node, cli: pi1.cli },
  ];
  const py = (args) => ({ toolCalls: [{ name: "python", arguments: args }] });
  const script = [
    py({ code: "1+1" }),
    py({ action: "reset" }),
    py({ code: "1+1" }),
    py({ code: "y = 1" }),
    py({ code: "while True: pass", timeoutSeconds: 1 }),
    py({ code: "1+1" }),
    { text: "done" },
  ];
  // One TMPDIR (so one runtime root) for every session: the worker is compiled once, in the
  // warm-up session, as it is for a user after their first session.
  const childTmp = join(work, "pi-tmp");
  mkdirSync(childTmp, { recursive: true });
  async function session(host, extraEnv = {}) {
    const base = mkdtempSync(join(work, "pi-"));
    const agentDir = join(base, "agent");
    const cwd = join(base, "project");
    mkdirSync(agentDir);
    mkdirSync(cwd);
    const pi = startRpcPi({
      node: host.node,
      cli: host.cli,
      extensions: [root],
      script,
      cwd,
      env: { ...process.env, PI_CODING_AGENT_DIR: agentDir, TMPDIR: childTmp, ...extraEnv },
    });
    try {
      pi.send({ id: "bench", type: "prompt", message: "bench" });
      await pi.waitFor((l) => l.type === "agent_end", "agent_end", 120_000);
      const calls = new Map();
      pi.lines.forEach((l, i) => {
        if (l.type !== "tool_execution_start" && l.type !== "tool_execution_end") return;
        const c = calls.get(l.toolCallId) ?? {};
        if (l.type === "tool_execution_start") c.start = pi.arrivals[i];
        else Object.assign(c, { end: pi.arrivals[i], result: l.result, isError: l.isError });
        calls.set(l.toolCallId, c);
      });
      const list = [...calls.values()];
      if (list.length !== 6 || list.some((c) => c.end === undefined)) throw new Error(`${host.label}: ${list.length} tool calls\n${pi.context()}`);
      const status = list.map((c) => c.result?.details?.status);
      const want = ["ok", "ok", "ok", "ok", "timeout", "ok"];
      if (status.join() !== want.join()) throw new Error(`${host.label}: statuses ${status.join()}\n${list.map((c) => toolText(c.result)).join("\n---\n")}`);
      if (list[4].result.details.rolledBack !== true) throw new Error(`${host.label}: the timeout did not roll back`);
      const ms = list.map((c) => c.end - c.start);
      return { cold: ms[0], afterReset: ms[2], afterTimeout: ms[5] };
    } finally {
      await pi.kill();
      rmSync(base, { recursive: true, force: true, maxRetries: 3 });
    }
  }
  for (const host of hosts) {
    await session(host); // warm-up: the worker compiled, pi's own caches filled
    const base = [];
    const got = [];
    const cold = [];
    for (let i = 0; i < runs(7); i++) {
      base.push(bwrapPythonMs());
      got.push(await session(host));
      cold.push((await session(host, { PI_SANDBOX_PREWARM: "0" })).cold);
    }
    const m = (k) => median(got.map((g) => g[k]));
    record(`${host.label}: first execute (begun at start)`, m("cold"), "ms", "bwrap + python3 -I -S -c pass", median(base), "<= 1.2x");
    record(`${host.label}: cold first execute, prewarm off`, median(cold), "ms", "bwrap + python3 -I -S -c pass", median(base), "<= 1.2x");
    record(`${host.label}: execute after reset`, m("afterReset"), "ms", undefined, undefined, "<= 1.5 ms");
    record(`${host.label}: execute after timeout`, m("afterTimeout"), "ms", undefined, undefined, "<= 1.5 ms");
  }
}

// -- 3. recovery with and without the spare -------------------------------------

async function recovery() {
  // With rollback (the default): a fresh interpreter in the same sandbox.
  const cold = await coldExecutes(runs(10));
  {
    const sb = new PythonSandbox({ projectDir: project, prewarm: false });
    mustOk(await sb.execute("1"), "first");
    const afterReset = [];
    const afterTimeout = [];
    const loop = [];
    const resetPages = [];
    for (let i = 0; i < runs(20); i++) {
      await sb.reset();
      // Pages the fresh interpreter copies from PID 1 during its first call (its minor
      // faults), a figure the machine's load does not move.
      const { interp } = sandboxTree(sb);
      const before = minorFaults(interp);
      afterReset.push((await timed(() => sb.execute("1")))[0]);
      resetPages.push(minorFaults(interp) - before);
      mustOk(await sb.execute("y = 1"), "state");
      const t = await sb.execute("while True: pass", 1);
      if (t.status !== "timeout" || !t.rolledBack) throw new Error(`expected a rollback, got ${t.status}`);
      afterTimeout.push((await timed(() => sb.execute("1")))[0]);
    }
    // A tight reset -> execute loop, no pause anywhere.
    for (let i = 0; i < runs(50); i++) {
      const [ms] = await timed(async () => {
        await sb.reset();
        return sb.execute("1");
      });
      loop.push(ms);
    }
    record("execute after reset (rollback on)", median(afterReset), "ms", "cold first execute", median(cold), "<= 0.15x");
    record("  pages copied by the interpreter in it", median(resetPages), "pages", undefined, undefined, "");
    record("execute after timeout (rollback on)", median(afterTimeout), "ms", "cold first execute", median(cold), "<= 0.15x");
    record("  reset + execute, tight loop", median(loop), "ms", "cold first execute", median(cold), "<= 0.1x");
    await sb.dispose();
  }
  for (const prewarm of [false, true]) {
    const sb = new PythonSandbox({ projectDir: project, prewarm, rollback: false });
    mustOk(await sb.execute("1"), "first");
    const afterReset = [];
    const afterTimeout = [];
    for (let i = 0; i < runs(20); i++) {
      if (prewarm) await waitForSpare(sb);
      await sb.reset();
      afterReset.push((await timed(() => sb.execute("1")))[0]);
      if (prewarm) await waitForSpare(sb);
      const t = await sb.execute("while True: pass", 1);
      if (t.status !== "timeout") throw new Error(`expected a timeout, got ${t.status}`);
      afterTimeout.push((await timed(() => sb.execute("1")))[0]);
    }
    const label = prewarm ? "rollback off, with spare" : "rollback off, cold";
    record(`execute after reset (${label})`, median(afterReset), "ms", prewarm ? "" : undefined, undefined, prewarm ? "<= 3 ms" : undefined);
    record(`execute after timeout (${label})`, median(afterTimeout), "ms", undefined, undefined, prewarm ? "<= 3 ms" : undefined);
    await sb.dispose();
  }
}

// -- 3b. rollback: the cost of a rollback point, and of rolling back, by heap size ----

/** The host pids of a session's sandbox processes: PID 1 (the keeper), its
 * children (the interpreter), and theirs (the rollback point while a call runs). */
function sandboxTree(sb) {
  const scratch = sb.status().paths.scratchDir;
  const children = (pid) => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(" ").filter(Boolean).map(Number);
    } catch {
      return [];
    }
  };
  const bwrap = hostPidsWithCmdline(scratch).find((pid) => readFileSync(`/proc/${pid}/cmdline`, "utf8").startsWith("bwrap") || readFileSync(`/proc/${pid}/comm`, "utf8").startsWith("bwrap"));
  // Right after a reset the killed interpreter may still be listed beside the new one.
  const alive = (pid) => {
    try {
      return !"ZX".includes(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1][0]);
    } catch {
      return false;
    }
  };
  const keeper = bwrap ? children(bwrap)[0] : undefined;
  const interp = keeper ? children(keeper).find(alive) : undefined;
  return { keeper, interp, copies: interp ? children(interp) : [] };
}

/** A process's minor page faults so far (/proc/PID/stat, field 10). */
const minorFaults = (pid) => Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ")[7]);

const privateDirtyMiB = (pid) => {
  try {
    const m = /Private_Dirty:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
};

async function rollback() {
  const heaps = quick ? [0, 100] : [0, 10, 100, 400];
  for (const mib of heaps) {
    const on = new PythonSandbox({ projectDir: project, prewarm: false });
    const off = new PythonSandbox({ projectDir: project, prewarm: false, rollback: false });
    const heap = mib ? `big = bytearray(b"\\1") * (${mib} << 20)` : "big = b''";
    for (const sb of [on, off]) mustOk(await sb.execute(heap, 60), `a ${mib} MiB heap`);
    const n = runs(mib >= 100 ? 100 : 300);
    const onMs = [];
    const offMs = [];
    for (let i = 0; i < n; i++) {
      onMs.push((await timed(() => on.execute("x = 1")))[0]);
      offMs.push((await timed(() => off.execute("x = 1")))[0]);
    }
    // A bare fork of the same interpreter: until fork() returns in the parent.
    const fork = await on.execute(
      "import os, time\nts = []\nfor _ in range(21):\n    t = time.perf_counter(); p = os.fork()\n    if p == 0: os._exit(0)\n    ts.append(time.perf_counter() - t); os.waitpid(p, 0)\nsorted(ts)[10] * 1000",
      60,
    );
    mustOk(fork, "bare fork");
    const bareFork = Number(fork.repr);
    const label = `${mib} MiB heap`;
    record(`rollback point, warm x = 1 added (${label})`, median(onMs) - median(offMs), "ms", "bare fork() of the interpreter", bareFork, mib >= 100 ? "<= 1.2x" : "<= 1.5x");
    // The copy's own memory while a call that touches nothing runs.
    const running = on.execute("import time\ntime.sleep(0.4)");
    await sleep(200);
    const { copies } = sandboxTree(on);
    const extra = copies.length ? privateDirtyMiB(copies[copies.length - 1]) : NaN;
    mustOk(await running, "sleep");
    record(`  rollback point's own memory (${label})`, extra, "MiB", undefined, undefined, "");
    // Rolling back: a timeout that changed the heap, then the next call.
    const rolled = [];
    for (let i = 0; i < runs(mib >= 100 ? 5 : 10); i++) {
      const [ms, t] = await timed(() => on.execute("big = None\nwhile True: pass", 1));
      if (t.status !== "timeout" || !t.rolledBack) throw new Error(`expected a rollback: ${JSON.stringify(t).slice(0, 300)}`);
      const [after, r] = await timed(() => on.execute("len(big)"));
      if (r.repr !== String(mib << 20)) throw new Error(`rolled back to ${r.repr}`);
      rolled.push(ms - 1000 + after);
    }
    record(`  time to roll back and answer (${label})`, median(rolled), "ms", undefined, undefined, "");
    await on.dispose();
    await off.dispose();
  }
  // A full collection in a call, 100 MiB of objects the collector tracks: it writes to every one,
  // so with a copy sharing the pages each page is copied (what gc.freeze before the fork would
  // spare, by not collecting what the earlier calls left).
  const gcMs = {};
  const gcPages = {};
  for (const rollback of [true, false]) {
    const sb = new PythonSandbox({ projectDir: project, prewarm: false, rollback });
    mustOk(await sb.execute("import gc\nbig = [[i] for i in range(100 * 1024 * 1024 // 100)]"), "tracked heap");
    const { interp } = sandboxTree(sb);
    const ms = [];
    const pages = [];
    for (let i = 0; i < runs(10); i++) {
      await sleep(50);
      const before = minorFaults(interp);
      const [t, r] = await timed(() => sb.execute("gc.collect()"));
      mustOk(r, "gc.collect()");
      ms.push(t);
      pages.push(minorFaults(interp) - before);
    }
    gcMs[rollback] = median(ms);
    gcPages[rollback] = median(pages);
    await sb.dispose();
  }
  record("full collection in a call, 100 MiB tracked", gcMs[true], "ms", "rollback off", gcMs[false], "");
  record("  pages copied by the interpreter in the call", gcPages[true], "pages", "rollback off", gcPages[false], "");
}

// -- 5. timeout precision -----------------------------------------------------------

async function timeoutPrecision() {
  const sb = new PythonSandbox({ projectDir: project });
  const late = [];
  for (let i = 0; i < runs(10); i++) {
    const [ms, r] = await timed(() => sb.execute("while True: pass", 1));
    if (r.status !== "timeout") throw new Error(`expected a timeout, got ${r.status}`);
    late.push(ms - 1000);
  }
  record("timeout result after the deadline", median(late), "ms", undefined, undefined, "<= 100 ms");
  await sb.dispose();
}

// -- 6. many sessions ----------------------------------------------------------------

function rssMiB() {
  return process.memoryUsage().rss / (1024 * 1024);
}

async function manySessions() {
  global.gc?.();
  await sleep(100);
  const before = rssMiB();
  const one = new PythonSandbox({ projectDir: project });
  mustOk(await one.execute("1"), "one");
  const single = [];
  for (let i = 0; i < runs(200); i++) single.push((await timed(() => one.execute("x = 1")))[0]);
  const sessions = [one];
  for (let i = 1; i < 16; i++) {
    const sb = new PythonSandbox({ projectDir: project });
    mustOk(await sb.execute("1"), "session");
    sessions.push(sb);
  }
  const lat = [];
  for (let round = 0; round < runs(50); round++) {
    for (const sb of sessions) lat.push((await timed(() => sb.execute("x = 1")))[0]);
  }
  global.gc?.();
  await sleep(100);
  const after = rssMiB();
  // The same round robin over plain Python children on pipes: what waking 16 idle processes in
  // turn costs on this host, with no sandbox involved.
  const raws = Array.from({ length: 16 }, () => rawChild());
  for (const raw of raws) await raw.ask("warm");
  const rawSingle = [];
  for (let i = 0; i < runs(200); i++) rawSingle.push((await timed(() => raws[0].ask("x")))[0]);
  const rawLat = [];
  for (let round = 0; round < runs(50); round++) {
    for (const raw of raws) rawLat.push((await timed(() => raw.ask("x")))[0]);
  }
  for (const raw of raws) raw.close();
  record("16 sessions: warm call latency, median", median(lat), "ms", "1 session", median(single), "flat");
  record("  16 plain Python children, round trip", median(rawLat), "ms", "1 plain Python child", median(rawSingle), "(host baseline)");
  record("16 sessions: host RSS per session", (after - before) / 16, "MiB", undefined, undefined, "<= 2 MiB");
  await Promise.all(sessions.map((s) => s.dispose()));
}

// -- 7. Jupyter kernel ------------------------------------------------------------------

function jupyterKernel() {
  const venv = join(tmpdir(), "pps-bench-jupyter-venv");
  const py = join(venv, "bin", "python");
  if (!existsSync(py)) {
    const mk = spawnSync("/usr/bin/python3", ["-m", "venv", venv], { stdio: "inherit" });
    const pip = mk.status === 0 && spawnSync(join(venv, "bin", "pip"), ["install", "-q", "ipykernel", "jupyter_client"], { stdio: "inherit" });
    if (!pip || pip.status !== 0) {
      console.log("jupyter kernel: skipped (a venv with ipykernel and jupyter_client could not be installed from PyPI)");
      rmSync(venv, { recursive: true, force: true });
      return;
    }
  }
  const script = `
import json, time, statistics
from jupyter_client.manager import start_new_kernel
t = time.perf_counter(); km, kc = start_new_kernel(kernel_name="python3"); start = (time.perf_counter() - t) * 1000
kc.execute_interactive("None", timeout=30)
times = []
for _ in range(${runs(200)}):
    t = time.perf_counter(); kc.execute_interactive("x = 1", timeout=30); times.append((time.perf_counter() - t) * 1000)
kc.stop_channels(); km.shutdown_kernel(now=True)
print("\\nBENCH " + json.dumps({"start": start, "median": statistics.median(times)}))`;
  const r = spawnSync(py, ["-c", script], { encoding: "utf8", timeout: 120_000 });
  if (r.status !== 0) {
    console.log(`jupyter kernel: skipped (${(r.stderr || "").trim().split("\n").pop()})`);
    return;
  }
  const line = r.stdout.split("\n").find((l) => l.startsWith("BENCH "));
  return JSON.parse(line.slice("BENCH ".length));
}

async function jupyter() {
  const k = jupyterKernel();
  if (!k) return;
  const sb = new PythonSandbox({ projectDir: project });
  const [cold, r] = await timed(() => sb.execute("1"));
  mustOk(r, "cold");
  const ours = [];
  for (let i = 0; i < runs(200); i++) ours.push((await timed(() => sb.execute("x = 1")))[0]);
  record("warm execute vs a Jupyter kernel", median(ours), "ms", "jupyter kernel execute x = 1", k.median, ">= 15x faster");
  record("start + first execute vs a Jupyter kernel", cold, "ms", "jupyter kernel start", k.start);
  await sb.dispose();
}

console.log(`${"measure".padEnd(46)} ${"value".padStart(9)} ${"unit".padEnd(5)} ${"baseline".padEnd(34)} ${"value".padStart(9)} ${"ratio".padStart(7)}  target`);
// `--only=NAME` runs one section (coldStart, writableStart, secretScan, ...).
const only = process.argv.find((a) => a.startsWith("--only="))?.slice("--only=".length);
try {
  if (only) {
    const sections = { coldStart, shell, network, connect: () => network(true), writableStart, secretScan, warm, piSessions, liveGrant, liveMode, recovery, rollback, timeoutPrecision, manySessions };
    if (!sections[only]) throw new Error(`--only=${only}: no such section (${Object.keys(sections).join(", ")})`);
    await sections[only]();
  } else {
    await coldStart();
    await shell();
    await network();
    await writableStart();
    await secretScan();
    await warm();
    await piSessions();
    await liveGrant();
    await liveMode();
    await recovery();
    await rollback();
    await timeoutPrecision();
    await manySessions();
    if (!process.argv.includes("--no-jupyter")) await jupyter();
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
mkdirSync(join(root, "bench"), { recursive: true });
writeFileSync(
  join(root, "bench", "results.json"),
  `${JSON.stringify({ date: new Date().toISOString(), node: process.version, quick, results }, null, 2)}\n`,
);
console.log("\nwritten to bench/results.json");
