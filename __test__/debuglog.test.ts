/**
 * PI_PYTHON_TOOL_LOG=debug writes the engine's decisions to debug.log in the
 * session's log directory. The log is installed once per process (node:test
 * runs each file in its own), so this file sets the variable for all of it.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { makeFixture } from "./helpers/sandbox-fixture.ts";

process.env.PI_PYTHON_TOOL_LOG = "debug";

test("the debug log names the start, the calls, an interruption and the kill, escaped", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t, { prewarm: false });
  assert.equal((await sb.execute("x = 1")).status, "ok");
  const slow = await sb.execute("import time\nprint('\\x1b[2J')\ntime.sleep(30)", 1);
  assert.equal(slow.status, "timeout");
  const logDir = sb.status().paths.logDir!;
  await sb.reset();
  // Beside the log directory, which the sandbox reads at /logs: not in it.
  const log = join(dirname(logDir), "debug.log");
  assert.ok(existsSync(log), "debug.log is in the session's directory");
  assert.ok(!existsSync(join(logDir, "debug.log")), "not in the directory the sandbox reads");
  const text = readFileSync(log, "utf8");
  assert.match(text, /DEBUG pi_python_sandbox::worker: sandbox ready pid=\d+/);
  assert.match(text, /execution ended status=Ok/);
  assert.match(text, /execution interrupted interrupt=Timeout/);
  assert.match(text, /execution ended status=Timeout/);
  assert.match(text, /interpreter replaced|killing the sandbox/);
  assert.doesNotMatch(text, /\x1b/, "no control character reaches the file");
});
