/**
 * The shipped pi CLI, not the SDK: `pi --mode rpc` (the package's `bin`) is spawned with this
 * package and a scripted faux model (fixtures/faux-provider) loaded with `-e`, and driven over its
 * JSON-lines protocol on stdin/stdout. The model calls the python tool with `print(6*7)`; the test
 * reads the tool result from stdout, then closes stdin and expects pi to exit cleanly, leaving no
 * sandbox process and no session directory behind.
 *
 * Host: pi 0.73 from the repository's node_modules, or pi 1.x from .hosts/pi1 when the tests run
 * under that host (`node scripts/pi1-host.mjs --test`). The CLI runs on the Node running this test.
 *
 * Run: node --import tsx --test __test__/rpc.test.ts
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { piCli, processesMentioning, type RpcPi, startRpcPi, toolText } from "./helpers/rpc-client.mjs";
import { sessionDirs } from "../scripts/lib/runtime-root.mjs";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

type Line = Record<string, any>;

const ROOT = fileURLToPath(new URL("..", import.meta.url));
/** Set by helpers/pi1-host.mjs (no SDK import needed here: the test only spawns the CLI). */
const PI_HOST = process.env.PI_HOST === "pi1" ? "pi1" : "pi0";
const PI_PACKAGE =
  PI_HOST === "pi1"
    ? join(ROOT, ".hosts", "pi1", "node_modules", "@earendil-works", "pi-coding-agent")
    : join(ROOT, "node_modules", "@mariozechner", "pi-coding-agent");

test(`pi --mode rpc (${PI_HOST}): the faux model calls python, 42 arrives on stdout, pi exits cleanly`, async (t) => {
  if (skipWithoutSandbox(t)) return;
  const base = mkdtempSync(join(tmpdir(), "pi-python-rpc-"));
  let pi: RpcPi | undefined;
  // One hook, in this order: a failed assertion leaves pi running, and its files are in `base`.
  t.after(async () => {
    await pi?.kill();
    rmSync(base, { recursive: true, force: true, maxRetries: 3 });
  });
  const agentDir = join(base, "agent");
  const cwd = join(base, "project");
  // The child's own TMPDIR: the sandbox's runtime root (<TMPDIR>/pi-python-sandbox-<uid>) is its alone.
  const childTmp = join(base, "tmp");
  for (const dir of [agentDir, cwd, childTmp]) mkdirSync(dir);
  writeFileSync(join(cwd, "f.txt"), "from the project\n");
  const runtimeRoot = join(childTmp, `pi-python-sandbox-${process.getuid!()}`);

  const code = "print(6*7)\nopen('/workspace/f.txt').read()";
  pi = startRpcPi({
    cli: piCli(PI_PACKAGE),
    extensions: [ROOT],
    script: [{ toolCalls: [{ name: "python", arguments: { code } }] }, { text: "done" }],
    cwd,
    env: { ...process.env, PI_CODING_AGENT_DIR: agentDir, TMPDIR: childTmp },
  });

  const end = await pi.runPrompt("compute six times seven");
  const start = pi.lines.find((l) => l.type === "tool_execution_start");
  assert.equal(start?.toolName, "python");
  assert.deepEqual(start?.args, { code });
  const text = toolText(end.result);
  assert.equal(end.toolName, "python");
  assert.equal(end.isError, false, text);
  assert.match(text, /^status: ok/);
  assert.match(text, /--- stdout ---\n42(\n|$)/, "a header over stdout beside a result");
  assert.match(text, /result: 'from the project\\n'/, "the cwd is /workspace");
  assert.equal(end.result.details?.status, "ok");

  // The session's sandbox is alive between calls, in this pi's runtime root.
  const dirs = sessionDirs(runtimeRoot);
  assert.equal(dirs.length, 1, `one session dir in ${runtimeRoot}`);
  assert.ok(processesMentioning(join(runtimeRoot, dirs[0])).length > 0, "the sandbox runs");

  // The model got the result and finished the run.
  const toolResult = await pi.waitFor((l: Line) => l.type === "message_end" && l.message?.role === "toolResult", "the tool result message");
  assert.equal(toolResult.message.isError, false);
  assert.match(toolText(toolResult.message), /\n42(\n|$)/);
  const agentEnd = await pi.waitFor((l: Line) => l.type === "agent_end", "agent_end");
  const final = agentEnd.messages.at(-1);
  assert.equal(final.role, "assistant");
  assert.deepEqual(final.content, [{ type: "text", text: "done" }]);
  assert.deepEqual(pi.lines.filter((l) => l.type === "extension_error"), [], "no extension errors");
  assert.deepEqual(pi.lines.filter((l) => l.type === "(not json)"), [], "stdout holds only JSON lines");

  // Clean shutdown: end of stdin ends pi, which disposes the sandbox and its session dir.
  const exit = await pi.close();
  assert.ok(exit, `pi did not exit within 10 s of stdin closing\n${pi.context()}`);
  assert.deepEqual(exit, { code: 0, signal: null }, pi.stderr);
  assert.deepEqual(processesMentioning(runtimeRoot), [], "no sandbox process is left");
  assert.deepEqual(sessionDirs(runtimeRoot), [], "no session dir is left");
  assert.doesNotMatch(pi.stderr, /error|failed to load/i, "stderr is clean");
});
