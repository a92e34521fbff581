/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * protocol violations from user code.
 * Run: node --import tsx --test __test__/protocol.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { describe, type TestContext, test } from "node:test";
import { assertOk, makeFixtureWithoutSpare as makeFixture, show } from "./helpers/sandbox-fixture.ts";
import { assertNoProcess } from "./helpers/host-procs.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

// ---------------------------------------------------------------------------------------------
describe("protocol violations from user code", { concurrency: CONCURRENCY }, () => {
  async function violation(t: TestContext, code: string, diagnostic: RegExp | null): Promise<void> {
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute(code, 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assert.equal(r.status, "worker_error", show(r));
    assert.equal(r.stateLost, true);
    if (diagnostic) assert.match(r.diagnostic ?? "", diagnostic);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.generation, r.generation + 1);
  }

  test("a malformed reply frame is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, 'import os\nos.write(4, b"\\x00\\x00\\x00\\x05hello")', /Protocol violation/);
  });

  test("an oversize reply frame length is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.write(4, (10**7).to_bytes(4, 'big'))", /Protocol violation.*exceeds/);
  });

  test("closing the reply fd (4) is a worker_error, not a hang", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.close(4)", null);
  });

  test("closing the request fd (3) ends the interpreter after its result; the next call says so", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute("import os\nos.close(3)", 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assertOk(r); // the code itself ran to completion; the worker dies when it reads the next request
    await assertNoProcess(runtimeRoot);
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.stateLost, true);
    assert.match(next.stateLostReason ?? "", /died while idle/);
    assert.equal(next.generation, r.generation + 1);
  });
});
