/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * errors in user code are results and keep the interpreter.
 * Run: node --import tsx --test __test__/errors.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { assertOk, makeFixtureWithoutSpare as makeFixture, py, show } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

// ---------------------------------------------------------------------------------------------
describe("errors keep the interpreter", { concurrency: CONCURRENCY }, () => {
  test("an exception full of control characters is bounded, shown, and keeps the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    // JSON spells each of these as six bytes: unbounded, the result would overflow its frame.
    const r = await sb.execute('raise ValueError("\\x01" * 20000 + "\\x1b[31mend")');
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "ValueError");
    assert.match(r.exception?.message ?? "", /^\u2401{100}/);
    assert.ok(Buffer.byteLength(r.exception?.message ?? "") <= 8192, "the message stays within its bound");
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a display hook that raises SystemExit is a runtime_error and keeps the interpreter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import sys
      kept = 1
      class Shy:
          def _repr_markdown_(self):
              sys.exit(3)
      Shy()
    `);
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SystemExit");
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("kept")).repr, "1");
  });

  test("a write outside the mounts fails in the sandbox and is not a read prompt", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    for (const code of ["open('/srv/pps-out.csv', 'w')", "import os\nos.open('/srv/pps-out.csv', os.O_WRONLY | os.O_CREAT)"]) {
      const r = await sb.execute(code);
      assert.equal(r.status, "runtime_error", `${code}: ${show(r)}`);
      assert.match(r.exception?.type ?? "", /^(FileNotFoundError|OSError|PermissionError)$/, code);
    }
    const read = await sb.execute("open('/srv/pps-out.csv')");
    assert.equal(read.status, "permission_needed", "a read of the same path still asks");
  });

  test("SyntaxError is a runtime_error and keeps state", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("x = 10"));
    const r = await sb.execute("def broken(:\n    pass");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SyntaxError");
    // Executions are numbered per session: this is the second.
    assert.match(r.exception?.traceback ?? "", /File "<python-2>", line 1\n    def broken\(:\n/);
    assert.doesNotMatch(r.exception?.traceback ?? "", /worker\.py/);
    assert.equal(r.stateLost, false);
    const after = await sb.execute("x");
    assert.equal(after.repr, "10");
    assert.equal(after.generation, 1);
  });

  test("ValueError reports type, message and a traceback of user lines only; state kept", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('y = 2\ndef f():\n    raise ValueError("bad value")\nf()');
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.isError, true);
    assert.equal(r.exception?.type, "ValueError");
    assert.equal(r.exception?.message, "bad value");
    const tb = r.exception?.traceback ?? "";
    assert.match(tb, /File "<python-1>", line 4, in <module>\n    f\(\)\n/);
    assert.match(tb, /File "<python-1>", line 3, in f\n    raise ValueError\("bad value"\)\n/);
    assert.doesNotMatch(tb, /worker\.py/);
    assert.match(r.text, /\nValueError: bad value(\n|$)/);
    assert.equal(r.text.split("bad value").length - 1, 2, "the message once (and once in the code line)");
    const after = await sb.execute("(y, f.__name__)");
    assert.equal(after.repr, "(2, 'f')", "mutations before the error remain");
    assert.equal(after.generation, 1);
  });

  test("tracebacks show each line, from the execution that defined it, like a notebook", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("\ndef half(x):\n    return 1 / x\n"));
    const r = await sb.execute("\n\nhalf(0)");
    assert.equal(r.status, "runtime_error", show(r));
    const tb = r.exception?.traceback ?? "";
    assert.match(tb, /File "<python-2>", line 3, in <module>\n    half\(0\)\n/);
    assert.match(tb, /File "<python-1>", line 3, in half\n    return 1 \/ x\n/, "the line of a function an earlier call defined");
    // Code that imports traceback and prints its own traceback, in the same call, sees the sources.
    const own = await sb.execute(py`
      import traceback
      try:
          half(0)
      except ZeroDivisionError:
          traceback.print_exc()
    `);
    assertOk(own);
    assert.match(own.stderr, /File "<python-1>", line 3, in half\n    return 1 \/ x\n/);
    assert.match(own.stderr, /File "<python-3>", line 3, in <module>\n    half\(0\)\n/);
    assert.doesNotMatch(own.stderr + tb, /worker\.py/);
    // After the code cleared linecache, the next traceback has its sources again.
    assertOk(await sb.execute("import linecache\nlinecache.clearcache()"));
    // A chained exception loses the tool's frames in both parts.
    const chained = await sb.execute("try:\n    half(0)\nexcept Exception as e:\n    raise KeyError('k') from e");
    const ctb = chained.exception?.traceback ?? "";
    assert.match(ctb, /direct cause of the following exception/);
    assert.match(ctb, /return 1 \/ x/);
    assert.doesNotMatch(ctb, /worker\.py/);
  });

  test("a refused read's traceback ends at the user's line, never in the tool's read hook", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("import os\nos.listdir('/etc')");
    assert.equal(r.status, "permission_needed", show(r));
    const tb = r.exception?.traceback ?? "";
    assert.match(tb, /File "<python-1>", line 2, in <module>\n    os\.listdir\('\/etc'\)\n/);
    assert.doesNotMatch(tb + r.text, /worker\.py|in hook/);
  });

  test("SystemExit is a runtime_error and the interpreter survives", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 'yes'"));
    const r = await sb.execute("import sys\nsys.exit(3)");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "SystemExit");
    assert.equal(r.exception?.message, "3");
    assert.equal(r.stateLost, false);
    const after = await sb.execute("kept");
    assert.equal(after.repr, "'yes'");
    assert.equal(after.generation, 1);
  });

  test("a NUL byte in the code is a runtime_error, not a crash", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("x = 1\0");
    assert.equal(r.status, "runtime_error", show(r));
    assert.ok(["ValueError", "SyntaxError"].includes(r.exception?.type ?? ""), show(r));
    assert.match(r.exception?.message ?? "", /null bytes/);
    const after = await sb.execute("kept");
    assert.equal(after.repr, "1");
    assert.equal(after.generation, 1);
  });

  test("a lone surrogate in the code does not crash anything", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute('s = "\ud800"\nlen(s)');
    assertOk(r);
    assert.equal(r.repr, "1");
    const after = await sb.execute("print(repr(s))\n2");
    assertOk(after);
    assert.equal(after.repr, "2");
    assert.equal(after.generation, 1);
  });

  test("a huge exception message and a deep traceback are bounded runtime_errors", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import sys
      sys.setrecursionlimit(10000)
      def a(n):
          if n == 0:
              raise ValueError("m" * 100000)
          return b(n - 1)
      def b(n):
          return a(n - 1)
      a(3000)
    `);
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "ValueError");
    const { message, traceback } = r.exception ?? { message: "", traceback: "" };
    assert.ok(message.startsWith("mmmm"));
    assert.ok(Buffer.byteLength(message) <= 8 * 1024 + 64, `message is ${Buffer.byteLength(message)} bytes`);
    assert.ok(Buffer.byteLength(traceback) <= 16 * 1024 + 64, `traceback is ${Buffer.byteLength(traceback)} bytes`);
    assert.ok(traceback.length > 4096, "the traceback keeps a useful tail");
    assert.ok(Buffer.byteLength(r.text) <= 50 * 1024);
    assert.equal(r.stateLost, false);
    assert.equal((await sb.execute("a.__name__")).repr, "'a'");
  });

  test("infinite recursion is a RecursionError and the interpreter survives", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute("def g():\n    return g()\ng()");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "RecursionError");
    assert.equal(r.stateLost, false);
    const after = await sb.execute("g.__name__");
    assert.equal(after.repr, "'g'");
    assert.equal(after.generation, 1);
  });
});
