/**
 * What the model is told before it calls the tool: the description, pi's system-prompt line and
 * the guidelines follow the settings in force (rollback on or off, packages or the standard
 * library only) and the addon's limits. The builder is tested for each variant, and the
 * registration in a real pi session (helpers/pi-session.ts) for the environment it reads.
 * Run: node --import tsx --test __test__/describe.test.ts
 */
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { Limits } from "../index.d.ts";
import { type ToolFacts, toolWords } from "../js/describe.ts";
import { createPiHarness } from "./helpers/pi-session.ts";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const addon = createRequire(import.meta.url)("../index.cjs") as { sandboxLimits(): Limits };

function facts(over: Partial<ToolFacts> = {}): ToolFacts {
  const l = addon.sandboxLimits();
  return {
    rollback: true,
    pythonPackages: false,
    maxCodeBytes: l.maxCodeBytes,
    defaultTimeoutSeconds: l.defaultTimeoutSeconds,
    maxTimeoutSeconds: l.maxTimeoutSeconds,
    outputBudgetBytes: l.outputBudgetBytes,
    rlimitAsBytes: l.rlimitAsBytes,
    ...over,
  };
}

/** Every sentence the model reads before a call. */
const everything = (w: ReturnType<typeof toolWords>) => [w.description, w.promptSnippet, ...w.promptGuidelines].join("\n");

test("rollback on: a timeout, cancel, flood or crash rolls back; nothing says they lose state", () => {
  const text = everything(toolWords(facts({ rollback: true })));
  assert.match(text, /A failed call \(a timeout, a cancel, an output overflow or a crash\) is rolled back: the interpreter is as it was before the call/);
  assert.match(text, /a timeout rolls the interpreter back to its state before the call/);
  assert.doesNotMatch(text, /loses interpreter state|until a reset, a timeout/);
});

test("rollback off: a timeout, cancel, flood or crash loses state", () => {
  const text = everything(toolWords(facts({ rollback: false })));
  assert.match(text, /persists across calls until a reset, a timeout, a cancel, an output overflow or a crash/);
  assert.match(text, /a timeout loses interpreter state/);
  assert.doesNotMatch(text, /rolled back|rolls the interpreter back/);
});

test('"Standard library only" only without packages', () => {
  assert.match(toolWords(facts({ pythonPackages: false })).description, /- Standard library only; no network/);
  const withPackages = toolWords(facts({ pythonPackages: true })).description;
  assert.doesNotMatch(withPackages, /Standard library only/);
  assert.match(withPackages, /- The standard library and the user's installed packages \(read-only\); no network/);
});

test("the limits are the addon's", () => {
  const l = addon.sandboxLimits();
  const limits = toolWords(facts()).description.split("\n").find((line) => line.startsWith("- Limits: "));
  assert.equal(
    limits,
    `- Limits: ${l.maxCodeBytes / 1024} KiB of code, timeoutSeconds 1-${l.maxTimeoutSeconds} (default ${l.defaultTimeoutSeconds}), ` +
      `${l.outputBudgetBytes / (1024 * 1024)} MiB of output per call, ${l.rlimitAsBytes / (1024 * 1024)} MiB address space per process.`,
  );
  // Other values are shown as they are, not as the defaults.
  const other = toolWords(facts({ maxCodeBytes: 32 * 1024, maxTimeoutSeconds: 60, defaultTimeoutSeconds: 10, outputBudgetBytes: 2 * 1024 * 1024 }));
  assert.match(other.description, /- Limits: 32 KiB of code, timeoutSeconds 1-60 \(default 10\), 2 MiB of output per call/);
  assert.match(other.promptGuidelines.join("\n"), /under timeoutSeconds \(max 60\)/);
});

/** The python tool as a pi session registers it, with `env` set while the extension loads. */
async function registered(t: TestContext, env: Record<string, string | undefined>) {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  const restore = () => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  t.after(restore);
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  const cwd = await mkdtemp(join(tmpdir(), "pi-python-describe-"));
  t.after(() => rm(cwd, { recursive: true, force: true }));
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE_DIR] });
  t.after(() => h.dispose());
  assert.deepEqual(h.resourceLoader.getExtensions().errors, []);
  const [tool] = h.session.extensionRunner.getAllRegisteredTools().filter((r) => r.definition.name === "python");
  return { definition: tool.definition, systemPrompt: h.session.systemPrompt };
}

for (const rollback of [undefined, "0"]) {
  for (const venv of [undefined, "/opt/venv"]) {
    const name = `registered with PI_PYTHON_TOOL_ROLLBACK=${rollback ?? "(unset)"} and PI_PYTHON_TOOL_VENV=${venv ?? "(unset)"}`;
    test(`${name}: the description follows the settings; the system prompt names the tool once`, async (t) => {
      const { definition, systemPrompt } = await registered(t, {
        PI_PYTHON_TOOL_ROLLBACK: rollback,
        PI_PYTHON_TOOL_VENV: venv,
        PI_PYTHON_TOOL_SYSTEM_SITE: undefined,
      });
      const want = toolWords(facts({ rollback: rollback === undefined, pythonPackages: venv !== undefined }));
      assert.equal(definition.description, want.description);
      assert.equal(definition.promptSnippet, want.promptSnippet);
      assert.deepEqual(definition.promptGuidelines, want.promptGuidelines);
      assert.match(systemPrompt, /^- python: Run Python in a persistent sandboxed interpreter/m);
      assert.doesNotMatch(systemPrompt, /python: python:/);
      for (const guideline of want.promptGuidelines) assert.ok(systemPrompt.includes(guideline), `the system prompt has: ${guideline}`);
    });
  }
}
