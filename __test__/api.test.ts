/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * sessions and the JS API (argument checks, status, dispose).
 * Run: node --import tsx --test __test__/api.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { describe, test } from "node:test";
import {
  assertOk,
  hostPidsWithCmdline,
  makeFixtureWithoutSpare as makeFixture,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { assertNoProcess } from "./helpers/host-procs.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;
const MiB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
describe("sessions and the JS API", { concurrency: CONCURRENCY }, () => {
  test("two sessions are independent, have their own scratch and run concurrently", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const a = fx.sb;
    const b = fx.open();
    assertOk(await a.execute("only_in_a = 1\nopen('/scratch/a.txt', 'w').write('a')"));
    const missing = await b.execute("only_in_a");
    assert.equal(missing.status, "runtime_error", show(missing));
    assert.equal(missing.exception?.type, "NameError");
    assert.equal((await b.execute("import os\nos.path.exists('/scratch/a.txt')")).repr, "False");
    assert.notEqual(a.status().paths.scratchDir, b.status().paths.scratchDir);
    const window = "import time\nstart = time.time()\ntime.sleep(1)\n[start, time.time()]";
    const [ra, rb] = await Promise.all([a.execute(window), b.execute(window)]);
    const [sa, ea] = JSON.parse(ra.repr ?? "null") as number[];
    const [sb2, eb] = JSON.parse(rb.repr ?? "null") as number[];
    assert.ok(sa < eb && sb2 < ea, `executions did not overlap: A ${sa}-${ea}, B ${sb2}-${eb}`);
  });

  test("four sandboxes in one process each keep their own value", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sandboxes = [fx.sb, fx.open(), fx.open(), fx.open()];
    const set = await Promise.all(sandboxes.map((s, i) => s.execute(`value = "session-${i}"`)));
    set.forEach(assertOk);
    const got = await Promise.all(sandboxes.map((s) => s.execute("value")));
    assert.deepEqual(got.map((r) => r.repr), ["'session-0'", "'session-1'", "'session-2'", "'session-3'"]);
  });

  test("concurrent execute calls on one sandbox are queued, their outputs not interleaved", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const code = (tag: string) =>
      `import time\nstart = time.time()\nfor i in range(200):\n    print("${tag}", i)\n    time.sleep(0.002)\n[start, time.time()]`;
    const [a, b] = await Promise.all([sb.execute(code("A")), sb.execute(code("B"))]);
    for (const [r, tag] of [[a, "A"], [b, "B"]] as const) {
      assertOk(r);
      const lines = r.stdout.trimEnd().split("\n");
      assert.equal(lines.length, 200);
      assert.deepEqual(lines, Array.from({ length: 200 }, (_, i) => `${tag} ${i}`));
    }
    const [sa, ea] = JSON.parse(a.repr ?? "null") as number[];
    const [sb2, eb] = JSON.parse(b.repr ?? "null") as number[];
    assert.ok(ea <= sb2 || eb <= sa, `executions overlapped: A ${sa}-${ea}, B ${sb2}-${eb}`);
    assert.equal(a.generation, b.generation);
  });

  test("status before any execute starts nothing", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, runtimeRoot } = await makeFixture(t);
    const s = sb.status();
    assert.equal(s.available, "unverified");
    assert.equal(s.workerRunning, false);
    assert.equal(s.busy, false);
    assert.equal(s.generation, 0);
    assert.equal(s.executions, 0);
    assert.equal(s.disposed, false);
    assert.equal(s.workspaceMode, "read-only");
    assert.equal(s.paths.projectDir, project);
    assert.equal(s.paths.scratchDir, undefined);
    assert.equal(s.paths.logDir, undefined);
    assert.equal(s.paths.sandboxProject, "/workspace");
    assert.equal(s.paths.sandboxScratch, "/scratch");
    assert.equal(s.limits.maxCodeBytes, 65536);
    assert.equal(s.limits.outputBudgetBytes, MiB);
    assert.equal(s.limits.maxTimeoutSeconds, 120);
    assert.match(s.text, /not started yet/);
    await sleep(200);
    assert.equal(existsSync(runtimeRoot), false, "runtimeRoot was created");
    assert.deepEqual(hostPidsWithCmdline(runtimeRoot), []);
    assert.equal(sb.status().workerRunning, false);
  });

  test("code over 64 KiB rejects with InvalidArg and leaves state alone; 64 KiB exactly runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 1"));
    const before = sb.status();
    await assert.rejects(sb.execute(`#${"a".repeat(65536)}`), { code: "InvalidArg" });
    // 32769 JS characters but 65537 UTF-8 bytes: the limit counts bytes.
    await assert.rejects(sb.execute(`#${"é".repeat(32768)}`), { code: "InvalidArg" });
    const after = sb.status();
    assert.equal(after.executions, before.executions);
    assert.equal(after.generation, before.generation);
    const x = await sb.execute("x");
    assert.equal(x.repr, "1");
    assert.equal(x.generation, 1);
    const exact = await sb.execute(`#${"a".repeat(65535)}`);
    assertOk(exact);
    const exactMultibyte = await sb.execute(`#${"é".repeat(32767)}a`);
    assertOk(exactMultibyte);
  });

  test("64 KiB of newlines runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("\n".repeat(65536));
    assertOk(r);
    assert.equal(r.repr, undefined);
  });

  test("invalid timeouts reject with InvalidArg; 1 and 120 are accepted", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    for (const bad of [0, 121, 1.5, Number.NaN, -1, Number.POSITIVE_INFINITY]) {
      await assert.rejects(sb.execute("1", bad), { code: "InvalidArg" }, `timeoutSeconds ${bad}`);
    }
    assert.equal(sb.status().generation, 0, "a rejected call starts nothing");
    assertOk(await sb.execute("1", 1));
    assertOk(await sb.execute("1", 120));
    assertOk(await sb.execute("1", undefined));
  });

  test("dispose during a running call settles it, deletes the directories and kills the sandbox", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    const pending = sb.execute("import time\ntime.sleep(30)", 60);
    assert.ok(await waitUntil(() => sb.status().busy && sb.status().workerRunning, 5000));
    await sleep(200);
    const { scratchDir, logDir } = sb.status().paths;
    assert.ok(scratchDir && logDir && existsSync(scratchDir) && existsSync(logDir));
    assert.ok(hostPidsWithCmdline(runtimeRoot).length > 0, "the sandbox was not visible before dispose");
    const disposedAt = Date.now();
    await sb.dispose();
    const r = await pending;
    assert.ok(Date.now() - disposedAt < 3000, `pending call settled after ${Date.now() - disposedAt} ms`);
    assert.equal(r.status, "cancelled", show(r));
    assert.equal(r.stateLost, true);
    assert.equal(existsSync(scratchDir), false, "scratch dir remains");
    assert.equal(existsSync(logDir), false, "log dir remains");
    await assertNoProcess(runtimeRoot);
    const s = sb.status();
    assert.equal(s.disposed, true);
    assert.equal(s.workerRunning, false);
    assert.equal(s.paths.scratchDir, undefined);
    await sb.dispose(); // idempotent
    const later = await sb.execute("1");
    assert.equal(later.isError, true, show(later));
    assert.equal(later.status, "unavailable", show(later));
    assert.equal(sb.status().generation, s.generation, "nothing started after dispose");
    assert.equal(existsSync(scratchDir), false);
    assert.deepEqual(hostPidsWithCmdline(runtimeRoot), []);
  });

  test(
    "every execute after dispose answers unavailable",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb } = await makeFixture(t);
      assertOk(await sb.execute("1"));
      await sb.dispose();
      const statuses = [];
      for (let i = 0; i < 20; i++) statuses.push((await sb.execute("1")).status);
      assert.deepEqual(statuses, Array(20).fill("unavailable"));
    },
  );
});

test("status says which hardening is active and what is not contained", async (t) => {
  const { sb } = await makeFixture(t);
  const st = sb.status();
  assert.ok(st.seccompRules >= 40, `${st.seccompRules} rules`);
  assert.ok(st.protectedPaths.includes(".git") && st.protectedPaths.includes(".mcp.json") && st.protectedPaths.includes(".claude"));
  assert.match(
    st.text,
    /hardening: default-deny seccomp filter \(allowlist of \d{3} calls, \d+ refusals; other calls answer ENOSYS; native architecture only\); no nested user namespaces/,
  );
  // What contains the sandbox as a whole, or that nothing does (containment.test.ts has the rest).
  assert.match(st.text, /\ncontainment: (at most \d+ tasks|tasks NOT contained)/);
  assert.match(st.text, /\nscratch disk use: /);
  const saved = process.env.PI_PYTHON_TOOL_PROTECTED;
  process.env.PI_PYTHON_TOOL_PROTECTED = "";
  t.after(() => {
    if (saved === undefined) delete process.env.PI_PYTHON_TOOL_PROTECTED;
    else process.env.PI_PYTHON_TOOL_PROTECTED = saved;
  });
  assert.deepEqual(sb.status().protectedPaths, []);
  assert.match(sb.status().text, /protected paths when \/workspace is writable: none \(PI_SANDBOX_PROTECTED is empty\)/);
});
