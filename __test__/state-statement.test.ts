/**
 * What a result says about interpreter state: exactly one statement, and a true one, for every
 * way a call ends, with rollback on (the default) and off (`rollback: false`, as
 * PI_PYTHON_TOOL_ROLLBACK=0 gives). The truth is checked by the next call: a variable set
 * before the failing call is still there exactly when the result says the state was kept or
 * rolled back.
 * Run: node --import tsx --test __test__/state-statement.test.ts
 *
 * Every test skips loudly (never under CI=true) where bwrap cannot run, and owns its project
 * directory, runtime root and sandboxes (cleaned up in t.after).
 */
import assert from "node:assert/strict";
import { describe, test, type TestContext } from "node:test";
import { assertOk, type ExecResult, makeFixtureWithoutSpare, type PythonSandbox, show } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

/** How many sentences of `text` speak of interpreter state (each statement has one of these once). */
export function stateStatements(text: string): number {
  const t = text.toLowerCase();
  return ["interpreter state", "interpreter was rolled back"].reduce((n, m) => n + t.split(m).length - 1, 0);
}

type Said = "kept" | "rolled back" | "lost" | "discarded before";

/** What the one statement of `r` says became of the state from before the call. */
function said(r: ExecResult): Said {
  assert.equal(stateStatements(r.text), 1, `one statement of state:\n${r.text}`);
  if (/Interpreter state was LOST \(/.test(r.text)) return "lost";
  if (/Earlier interpreter state was discarded before this call \(/.test(r.text)) return "discarded before";
  if (/The interpreter was rolled back to its state before this call/.test(r.text)) return "rolled back";
  if (/Interpreter state kept: what ran before the error remains/.test(r.text)) return "kept";
  assert.fail(`no known statement of state:\n${r.text}`);
}

/** Whether `before`, set by the call before the failing one, is still there. */
async function survived(sb: PythonSandbox): Promise<boolean> {
  const r = await sb.execute("'before' in globals()");
  assertOk(r);
  return r.repr === "True";
}

async function setup(t: TestContext, rollback: boolean): Promise<PythonSandbox | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  const { sb } = await makeFixtureWithoutSpare(t, { rollback });
  assertOk(await sb.execute("before = 1"));
  // The second call is the first with a rollback point.
  assertOk(await sb.execute("warm = True"));
  return sb;
}

/**
 * Run `code` (the call `callId`) after a line `started`, and resolve once the call's progress
 * shows that line: the code is running, not queued or starting (bounded by the call itself, which
 * fails the test if it ends first).
 */
async function whenRunning(sb: PythonSandbox, code: string, callId?: number): Promise<{ call: Promise<ExecResult> }> {
  let seen: () => void = () => {};
  const started = new Promise<void>((resolve) => (seen = resolve));
  const call = sb.execute(`print("started", flush=True)\n${code}`, 60, callId, (p) => {
    if (p.stdoutTail.includes("started")) seen();
  });
  const first = await Promise.race([started.then(() => "running" as const), call]);
  assert.equal(first, "running", `the call ended before it was seen running: ${first === "running" ? "" : show(first)}`);
  return { call };
}

const FAILURES: Array<{ name: string; status: string; run(sb: PythonSandbox): Promise<ExecResult> }> = [
  { name: "a timeout", status: "timeout", run: (sb) => sb.execute("during = 1\nwhile True: pass", 1) },
  {
    name: "a cancel",
    status: "cancelled",
    run: async (sb) => {
      const { call } = await whenRunning(sb, "during = 1\nimport time\ntime.sleep(30)", 4242);
      assert.equal(sb.cancel(4242), true);
      return call;
    },
  },
  { name: "an output flood", status: "output_limit", run: (sb) => sb.execute("import sys\nwhile True: sys.stdout.write('x' * 65536)") },
  { name: "os._exit(3)", status: "worker_error", run: (sb) => sb.execute("import os\nos._exit(3)") },
  {
    // Back to read-only while a call runs: never made under the call (with rollback on, a change
    // between calls is made in place and keeps the state; see "a mode change between calls").
    name: "a mode change while the code runs",
    status: "worker_error",
    run: async (sb) => {
      sb.applyModeEvent({ mode: "edits", readRoots: [] });
      const { call } = await whenRunning(sb, "import time\ntime.sleep(30)");
      sb.applyModeEvent({ mode: "manual", readRoots: [] });
      return call;
    },
  },
];

for (const rollback of [true, false]) {
  describe(`one true statement of state, rollback ${rollback ? "on" : "off"}`, { concurrency: 3 }, () => {
    for (const f of FAILURES) {
      test(`${f.name}`, async (t) => {
        const sb = await setup(t, rollback);
        if (!sb) return;
        const r = await f.run(sb);
        assert.equal(r.status, f.status, show(r));
        const statement = said(r);
        // A mode change is the host stopping the sandbox: lost whether or not rollback is on.
        const undone = rollback && !f.name.startsWith("a mode change");
        assert.equal(statement, undone ? "rolled back" : "lost", show(r));
        assert.equal(r.rolledBack, undone, show(r));
        assert.equal(r.stateLost, !undone, show(r));
        if (!undone && !rollback && !f.name.startsWith("a mode change")) {
          assert.match(r.text, /rollback is off \(PI_PYTHON_TOOL_ROLLBACK=0\)/, "a loss says why");
        }
        // The addon's diagnostic (the TUI shows it whole) carries the same statement.
        assert.equal(stateStatements(r.diagnostic ?? ""), 1, show(r));
        assert.equal(await survived(sb), undone, `the statement "${statement}" is true`);
      });
    }

    test("an ordinary exception keeps what ran before it", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const r = await sb.execute("during = 1\nraise ValueError('boom')");
      assert.equal(r.status, "runtime_error", show(r));
      assert.equal(said(r), "kept");
      assert.equal(r.rolledBack, false);
      assert.equal(r.stateLost, false);
      const after = await sb.execute("(before, during)");
      assert.equal(after.repr, "(1, 1)", show(after));
    });

    test("a mode change between calls: with rollback on it is made in place and nothing is said of state; with it off the next result says the state was discarded before it, once", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      if (rollback) {
        sb.applyModeEvent({ mode: "edits", readRoots: [] });
        const ok = await sb.execute("during = 1");
        assertOk(ok);
        assert.equal(stateStatements(ok.text), 0, ok.text);
        assert.equal(ok.stateLost, false);
        assert.equal(await survived(sb), true, "the state from before the change is kept");
        sb.applyModeEvent({ mode: "manual", readRoots: [] });
        const failed = await sb.execute("raise ValueError('boom')");
        assert.equal(said(failed), "kept");
        assert.equal(await survived(sb), true);
        return;
      }
      sb.applyModeEvent({ mode: "edits", readRoots: [] });
      const ok = await sb.execute("during = 1");
      assertOk(ok);
      assert.equal(said(ok), "discarded before");
      assert.equal(ok.stateLost, true);
      assert.equal(await survived(sb), false, "the state from before the change is gone");
      sb.applyModeEvent({ mode: "manual", readRoots: [] });
      const failed = await sb.execute("during = 1\nraise ValueError('boom')");
      assert.equal(failed.status, "runtime_error", show(failed));
      assert.equal(said(failed), "discarded before");
      assert.match(failed.text, /this call ran on a fresh interpreter, and what ran before the error remains\./);
      assert.equal((await sb.execute("during")).repr, "1", "what ran before the error remains");
    });

    test("a clean result says nothing about state", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const r = await sb.execute("1 + 1");
      assertOk(r);
      assert.equal(stateStatements(r.text), 0, r.text);
    });
  });
}

for (const rollback of [true, false]) {
  describe(`a crash keeps its cause, rollback ${rollback ? "on" : "off"}`, { concurrency: 2 }, () => {
    test("os._exit(3) says the exit code", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const r = await sb.execute("import os\nos._exit(3)");
      assert.equal(r.status, "worker_error", show(r));
      assert.match(r.diagnostic ?? "", /exited with code 3\b/, show(r));
      assert.equal(said(r), rollback ? "rolled back" : "lost");
    });

    test("a segfault names the signal", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const r = await sb.execute("import ctypes\nctypes.string_at(0)");
      assert.equal(r.status, "worker_error", show(r));
      assert.match(r.diagnostic ?? "", /killed by signal 11 \(SIGSEGV/, show(r));
      assert.equal(said(r), rollback ? "rolled back" : "lost");
      assert.equal(await survived(sb), rollback, "the statement is true");
    });
  });
}

for (const rollback of [true, false]) {
  describe(`status and reset say what happened, rollback ${rollback ? "on" : "off"}`, { concurrency: 2 }, () => {
    test("after a timeout, status names a reset only when there was one", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const r = await sb.execute("while True: pass", 1);
      assert.equal(r.status, "timeout", show(r));
      const text = sb.status().text;
      if (rollback) {
        assert.doesNotMatch(text, /discarded/, text);
        assert.match(text, /^last failed call: a timeout, rolled back \(the interpreter kept its state from before that call\)$/m, text);
      } else {
        assert.match(text, /^interpreter state last discarded by: a timeout$/m, text);
        assert.doesNotMatch(text, /rolled back/, text);
      }
    });

    test("a reset says whether the sandbox was killed", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      const reset = await sb.reset();
      if (rollback) {
        assert.doesNotMatch(reset.text, /sandbox killed/, reset.text);
        assert.match(reset.text, /^Interpreter reset: interpreter state discarded; a fresh interpreter is ready in the same sandbox\./, reset.text);
      } else {
        assert.match(reset.text, /^Interpreter reset: sandbox killed, interpreter state discarded\./, reset.text);
      }
      const again = await sb.reset();
      if (rollback) assert.match(again.text, /^Interpreter reset: interpreter state discarded; a fresh interpreter is ready/, again.text);
      else assert.match(again.text, /^Interpreter reset: no interpreter was running;/, again.text);
      assert.equal(await survived(sb), false, "the reset discarded the state");
    });

    test("status names the permission mode", async (t) => {
      const sb = await setup(t, rollback);
      if (!sb) return;
      assert.match(sb.status().text, /^mode: none announced \(no permission extension\); \/workspace read-only; read roots: none$/m);
      sb.applyModeEvent({ mode: "edits", readRoots: [] });
      assert.match(sb.status().text, /^mode: edits; \/workspace read-write; read roots: none$/m);
      sb.applyModeEvent({ mode: "manual", readRoots: [] });
      assert.match(sb.status().text, /^mode: manual; \/workspace read-only; read roots: none$/m);
    });
  });
}
