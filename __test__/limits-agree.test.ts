/**
 * One source of truth for limits: the Rust constants. The worker gets its bounds from the host
 * on its command line, the TypeScript wrapper reads the addon's; this pins that all three agree.
 */
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { test } from "node:test";
import type { Limits } from "../index.d.ts";
import { FALLBACK_LIMITS, toolLimits } from "../js/params.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { jsonOut, makeFixture } from "./helpers/sandbox-fixture.ts";

const addon = createRequire(import.meta.url)("../index.cjs") as { sandboxLimits(): Limits };

test("the wrapper's limits are the addon's, and its fallback agrees with them", () => {
  const l = addon.sandboxLimits();
  const fromAddon = {
    maxCodeBytes: l.maxCodeBytes,
    defaultTimeoutSeconds: l.defaultTimeoutSeconds,
    maxTimeoutSeconds: l.maxTimeoutSeconds,
    outputBudgetBytes: l.outputBudgetBytes,
    rlimitAsBytes: l.rlimitAsBytes,
  };
  assert.deepEqual(toolLimits(), fromAddon);
  assert.deepEqual(FALLBACK_LIMITS, fromAddon, "js/params.ts's fallback differs from the addon");
});

test("the worker runs with the host's bounds", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb } = await makeFixture(t);
  const l = sb.status().limits;
  const worker = jsonOut(
    await sb.execute(
      'import json, sys\nw = sys.modules["__main__"]\nprint(json.dumps({"frame": w.MAX_FRAME, "repr": w.MAX_REPR, "protocol": w.PROTOCOL}))',
    ),
  );
  assert.equal(worker.frame, l.maxFrameBytes);
  assert.equal(worker.repr, l.maxReprBytes);
  assert.equal(worker.protocol, 4);
});
