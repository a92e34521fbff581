/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * interpreter state and results.
 * Run: node --import tsx --test __test__/state.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { assertOk, makeFixtureWithoutSpare as makeFixture, show } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

// ---------------------------------------------------------------------------------------------
describe("interpreter state and results", { concurrency: CONCURRENCY }, () => {
  test("variables, imports, functions and classes persist across calls", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("counter = 41"));
    assertOk(await sb.execute("import math as m"));
    assertOk(await sb.execute("def double(v):\n    return v * 2"));
    assertOk(await sb.execute("class Box:\n    def __init__(self, v):\n        self.v = v"));
    const r = await sb.execute("counter += 1\n(counter, m.floor(2.5), double(21), Box(7).v)");
    assertOk(r);
    assert.equal(r.repr, "(42, 2, 42, 7)");
    assert.equal(r.generation, 1);
    assert.equal(r.stateLost, false);
  });

  test("only a final expression produces a repr", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const last = await sb.execute("1; 2");
    assertOk(last);
    assert.equal(last.repr, "2");
    const assignment = await sb.execute("x = 5");
    assertOk(assignment);
    assert.equal(assignment.repr, undefined);
    const printed = await sb.execute("print(1)");
    assertOk(printed);
    assert.equal(printed.repr, undefined, "print() returns None: no repr");
    assert.equal(printed.stdout, "1\n");
    const noneValue = await sb.execute("None");
    assert.equal(noneValue.repr, undefined);
    const earlier = await sb.execute("x * 10\ny = 3");
    assert.equal(earlier.repr, undefined, "an expression that is not last gives no repr");
    assert.equal((await sb.execute("x + y")).repr, "8");
  });

  test('code runs as __main__ (if __name__ == "__main__" blocks run)', async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('if __name__ == "__main__":\n    print("main block ran")\n__name__');
    assertOk(r);
    assert.equal(r.stdout, "main block ran\n");
    assert.equal(r.repr, "'__main__'");
  });

  test("input() meets EOF at once", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const started = Date.now();
    const r = await sb.execute("kept = 1\ninput()", 10);
    assert.ok(Date.now() - started < 5000, "input() waited");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "EOFError");
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a large repr is truncated to about 8 KiB with both ends kept", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("'x' * 100000");
    assertOk(r);
    assert.equal(r.reprTruncated, true);
    assert.ok(r.repr !== undefined);
    assert.ok(Buffer.byteLength(r.repr) <= 8 * 1024 + 64, `${Buffer.byteLength(r.repr)} bytes`);
    assert.ok(r.repr.startsWith("'xxxx") && r.repr.endsWith("xxxx'"), "head and tail kept");
    assert.match(r.repr, /bytes omitted/);
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024);
    const small = await sb.execute("'x' * 10");
    assert.equal(small.reprTruncated, false);
    assert.equal(small.repr, `'${"x".repeat(10)}'`);
  });
});
