/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * output capture, the output budget and the per-execution logs.
 * Run: node --import tsx --test __test__/output.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  assertFailedCallState,
  assertOk,
  assertRecovers,
  lit,
  makeFixtureWithoutSpare as makeFixture,
  py,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { addonCpuOver, fdCount } from "./helpers/host-procs.ts";

const CONCURRENCY = 4;
const MiB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
describe("output capture", { concurrency: CONCURRENCY }, () => {
  test("print (with unicode) and sys.stderr.write land on separate streams with byte counts", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('import sys\nprint("héllo wörld ✓ 🐍")\nsys.stderr.write("err-line\\n")\nprint("second")');
    assertOk(r);
    assert.equal(r.stdout, "héllo wörld ✓ 🐍\nsecond\n");
    assert.equal(r.stderr, "err-line\n");
    assert.equal(r.stdoutBytes, Buffer.byteLength(r.stdout));
    assert.equal(r.stderrBytes, 9);
    assert.equal(r.excerptTruncated, false);
    assert.match(r.text, /--- stdout ---\nhéllo wörld ✓ 🐍/);
  });

  test("os.write to fds 1 and 2 and subprocess output are captured", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import os, subprocess
      os.write(1, b"fd1-out\n")
      os.write(2, b"fd2-err\n")
      subprocess.run(["echo", "from-echo"])
      subprocess.run(["sh", "-c", "echo sub-err >&2"])
      print("after")
    `);
    assertOk(r);
    assert.equal(r.stdout, "fd1-out\nfrom-echo\nafter\n");
    assert.equal(r.stderr, "fd2-err\nsub-err\n");
    assert.equal(r.stdoutBytes, Buffer.byteLength(r.stdout));
    assert.equal(r.stderrBytes, Buffer.byteLength(r.stderr));
  });

  test("trailing output of a subprocess stays with its own execution", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(
      'import subprocess\nsubprocess.Popen(["sh", "-c", "sleep 0.4; echo trailing"])\nprint("main")',
    );
    assertOk(r);
    assert.equal(r.stdout, "main\ntrailing\n");
    const next = await sb.execute('print("next")');
    assertOk(next);
    assert.equal(next.stdout, "next\n", "trailing output leaked into the next execution");
  });

  test("output a process of an earlier call writes after the drain window never reaches a later call", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    // It writes 1.5 s after its call began, past the 1 s wait for trailing output, while the next
    // call is running; and again between calls, and during the call after that.
    const first = await sb.execute(
      'import subprocess\nsubprocess.Popen(["sh", "-c", "sleep 1.5; echo late-out; echo late-err >&2; sleep 1; echo later"])\nprint("first")',
      10,
    );
    assertOk(first);
    assert.equal(first.stdout, "first\n");
    const during = await sb.execute('import time\ntime.sleep(1)\nprint("second")', 10);
    assertOk(during);
    assert.equal(during.stdout, "second\n", "an earlier call's process wrote into this call's stdout");
    assert.equal(during.stderr, "", "an earlier call's process wrote into this call's stderr");
    const after = await sb.execute('import time\ntime.sleep(1)\nprint("third")', 10);
    assertOk(after);
    assert.equal(after.stdout, "third\n");
  });

  test("pipes of earlier calls that the code keeps open do not pile up on the host", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    // A background process makes every call get pipes of its own; the interpreter keeps a
    // writer of each old one open, so none of them ever ends.
    assertOk(await sb.execute('import fcntl, subprocess\nsubprocess.Popen(["sleep", "60"])\nheld = []'));
    assertOk(await sb.execute("1"));
    const before = fdCount();
    // Copies well above the tool's own descriptor numbers.
    for (let i = 0; i < 40; i++) assertOk(await sb.execute("held += [fcntl.fcntl(1, fcntl.F_DUPFD, 30), fcntl.fcntl(2, fcntl.F_DUPFD, 30)]"));
    const grown = fdCount() - before;
    assert.ok(grown <= 2 * 16 + 4, `host descriptors grew by ${grown} over 40 calls`);
    const last = await sb.execute("print('still captured')");
    assert.equal(last.stdout, "still captured\n");
  });

  test("a background process left running does not hang later calls", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const first = await sb.execute('import subprocess\np = subprocess.Popen(["sleep", "30"])\n"started"', 10);
    assertOk(first);
    for (const code of ["1 + 1", "p.poll() is None"]) {
      const started = Date.now();
      const r = await sb.execute(code, 10);
      assertOk(r);
      // Only processes the call itself started are waited for (up to 1 s).
      assert.ok(Date.now() - started < 900, `call took ${Date.now() - started} ms`);
    }
    assert.equal((await sb.execute("p.poll() is None")).repr, "True", "the background process keeps running");
  });

  test("an endless output flood stops at output_limit with a partial log", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute('while True:\n    print("y" * 499)', 60);
    assert.ok(Date.now() - started < 15_000, "the flood was not stopped promptly");
    assert.equal(r.status, "output_limit", show(r));
    assert.equal(r.outputLimitExceeded, true);
    assert.equal(r.logComplete, false);
    assertFailedCallState(r);
    assert.ok(r.stdoutBytes <= MiB && r.stdoutBytes > 0, `${r.stdoutBytes}`);
    assert.ok(r.logPaths.stdout, "the stdout log path is reported");
    const size = statSync(r.logPaths.stdout).size;
    assert.ok(size > 0 && size <= MiB, `log is ${size} bytes`);
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024, `text is ${Buffer.byteLength(r.text)} bytes`);
    assert.ok(r.text.split("\n").length <= 2000);
    await assertRecovers(sb, r);
  });

  test("output of exactly the 1 MiB budget is ok; one byte more is output_limit", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const exact = await sb.execute(`import sys\nsys.stdout.write("a" * ${MiB - 10})\nsys.stderr.write("b" * 10)\nNone`);
    assertOk(exact);
    assert.equal(exact.outputLimitExceeded, false);
    assert.equal(exact.logComplete, true);
    assert.equal(exact.stdoutBytes + exact.stderrBytes, MiB);
    assert.ok(exact.logPaths.stdout && exact.logPaths.stderr, "both log paths are reported");
    assert.equal(statSync(exact.logPaths.stdout).size, MiB - 10);
    assert.equal(statSync(exact.logPaths.stderr).size, 10);
    const over = await sb.execute(`import sys\nsys.stdout.write("a" * ${MiB - 10})\nsys.stderr.write("b" * 11)\nNone`);
    assert.equal(over.status, "output_limit", show(over));
    assert.equal(over.stdoutBytes + over.stderrBytes, MiB);
  });

  test("each execution writes complete NNNN-out/err logs outside scratch; long output is an excerpt", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const first = await sb.execute('import sys\nprint("o" * 10)\nsys.stderr.write("e" * 5)\nNone');
    assertOk(first);
    const { logDir, scratchDir } = sb.status().paths;
    assert.ok(logDir && scratchDir);
    assert.ok(!logDir.startsWith(`${scratchDir}/`) && logDir !== scratchDir, "logs must not be under scratch");
    assert.deepEqual(first.logPaths, { stdout: join(logDir, "0001-out.log"), stderr: join(logDir, "0001-err.log") });
    assert.equal(await readFile(join(logDir, "0001-out.log"), "utf8"), `${"o".repeat(10)}\n`);
    assert.equal(await readFile(join(logDir, "0001-err.log"), "utf8"), "e".repeat(5));

    const big = await sb.execute('print("z" * 200000)');
    assertOk(big);
    assert.equal(big.stdoutBytes, 200001);
    assert.equal(big.excerptTruncated, true);
    assert.ok(big.stdout.length < 200001 / 2, `excerpt is ${big.stdout.length} chars`);
    assert.ok(big.stdout.startsWith("zzzz") && big.stdout.trimEnd().endsWith("zzzz"));
    assert.match(big.stdout, /bytes omitted/);
    assert.equal(big.logPaths?.stdout, join(logDir, "0002-out.log"));
    assert.equal(await readFile(join(logDir, "0002-out.log"), "utf8"), `${"z".repeat(200000)}\n`);
    assert.match(big.text, /Full output saved to: .*0002-out\.log/);
    assert.equal(big.logPaths?.stderr, undefined, "a quiet stream has no log file");
    assert.deepEqual((await readdir(logDir)).sort(), ["0001-err.log", "0001-out.log", "0002-out.log"]);

    const inside = await sb.execute(`import os\n(os.path.exists(${lit(logDir)}), sorted(os.listdir("/scratch")))`);
    assert.equal(inside.repr, "(False, [])", "the sandbox must not see its logs");
  });

  // Terminal output as a terminal shows it, each case once from print, once split into one write
  // per byte (state crosses reads), once from a subprocess on stderr; the log keeps the raw bytes.
  const terminal: [string, string, string][] = [
    ["colour sequences are dropped", "\x1b[31mred\x1b[0m and \x1b[1;38;5;208mbold\x1b[m\n", "red and bold\n"],
    ["\\r progress keeps its last state", "a\rb\rc\n", "c\n"],
    ["pip-style \\r progress with a CRLF end", "Downloading  10%\rDownloading  60%\rDownloading 100%\r\nInstalled\n", "Downloading 100%\nInstalled\n"],
    ["a title sequence is shown inert, no raw ESC or BEL", "\x1b]0;T\x07after\n", "\u241b]0;T\u2407after\n"],
  ];
  for (const [what, raw, want] of terminal) {
    test(`terminal output: ${what}`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      const r = await sb.execute(py`
        import os, subprocess, sys
        sys.stdout.write(${lit(raw)})
        sys.stdout.flush()
        for b in ${lit(raw)}.encode():
            os.write(1, bytes([b]))
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write(" + ${lit(JSON.stringify(raw))} + ")"])
        None
      `);
      assertOk(r);
      for (const text of [r.stdout, r.stderr, r.text]) assert.doesNotMatch(text, /[\x1b\x07\r]/, JSON.stringify(text));
      assert.equal(r.stdout, want + want, show(r));
      assert.equal(r.stderr, want, show(r));
      assert.ok(r.text.includes(`--- stdout ---\n${want}${want.trimEnd()}`), r.text);
      assert.equal(await readFile(r.logPaths.stdout!, "utf8"), raw + raw, "the log keeps the raw bytes");
      assert.equal(r.stdoutBytes, 2 * Buffer.byteLength(raw), "the byte count is of what was written");
    });
  }

  test("terminal output: the progress tail shows an unfinished \\r line as it stands, without colour", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const live: string[] = [];
    const code = "import sys, time\nsys.stdout.write('\\x1b[32mstep 1\\x1b[0m\\rstep 2')\nsys.stdout.flush()\ntime.sleep(1.5)";
    const r = await sb.execute(code, undefined, undefined, (p) => live.push(p.stdoutTail));
    assertOk(r);
    assert.ok(live.includes("step 2"), `the progress tail: ${JSON.stringify(live)}`);
    assert.equal(r.stdout, "step 2");
  });
});

// ---------------------------------------------------------------------------------------------
// Alone in its suite: it measures this process's CPU time, which a concurrent test would add to.
describe("host cost of output while idle", () => {
  /** CPU time (user + system, ms) this process spends over `ms` of wall time. */
  async function cpuOver(ms: number): Promise<number> {
    const before = process.cpuUsage();
    await sleep(ms);
    const used = process.cpuUsage(before);
    return (used.user + used.system) / 1000;
  }

  test("a background flood of an earlier call's streams costs the host little while no call runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    // It starts after its call returned (a flood during the call would end it at the output
    // limit) and writes to both streams of that call for as long as it can.
    const first = await sb.execute(py`
      import subprocess, sys
      flood = subprocess.Popen([sys.executable, "-c", "import os, time\ntime.sleep(1.5)\nb = b'x' * 65536\nwhile True:\n    os.write(1, b)\n    os.write(2, b)"])
      "started"
    `, 10);
    assertOk(first);
    await sleep(2000);
    // This call gets pipes of its own; the flooded ones are the host's to drop.
    const second = await sb.execute('print("second")', 10);
    assertOk(second);
    assert.equal(second.stdout, "second\n", "the flood reached a later call");
    assert.equal(second.stderr, "");
    await sleep(200);
    const idle = await addonCpuOver(1000);

    // Baseline: the same process reading a pipe flood as fast as it comes, for the same time.
    const flooder = spawn("python3", ["-c", "import os\nb = b'x' * 65536\nwhile True:\n    os.write(1, b)"], {
      stdio: ["ignore", "pipe", "ignore"],
    });
    t.after(() => flooder.kill("SIGKILL"));
    let read = 0;
    flooder.stdout.on("data", (chunk: Buffer) => (read += chunk.length));
    // Measured from the flood's first bytes: a loaded machine can take over a second to start python.
    assert.ok(await waitUntil(() => read > 0, 20_000), "baseline: the flooder never wrote");
    const baseline = await cpuOver(1000);
    flooder.kill("SIGKILL");
    t.diagnostic(`idle ${idle.toFixed(1)} ms, baseline ${baseline.toFixed(1)} ms of CPU in 1 s`);
    assert.ok(read > 10 * 1024 * 1024, `baseline: the flood was read (${read} bytes)`);
    // At least 2% of a core, with more than 10 MiB read (a loaded machine gives the reader far
    // less CPU than an idle one: 37 ms was seen); the claim is the ratio below.
    assert.ok(baseline > 20, `baseline: reading a flood costs CPU (${baseline.toFixed(0)} ms in 1 s)`);
    assert.ok(idle * 5 < baseline, `idle with a flooding background process: ${idle.toFixed(0)} ms of CPU in 1 s, baseline ${baseline.toFixed(0)} ms`);

    // The flood is held back, not ended; the next call still works and sees none of it.
    const after = await sb.execute('import time\ntime.sleep(0.3)\nprint("after")\nflood.poll() is None', 10);
    assertOk(after);
    assert.equal(after.stdout, "after\n", "the flood reached a later call");
    assert.equal(after.stderr, "");
    assert.equal(after.repr, "True", "the background writer still runs (it waits on its full pipe)");
  });
});
