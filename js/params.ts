/**
 * Parameter checks for the python tool. pi validates arguments against the
 * schema before `execute`, but a direct `execute` call skips that, so the
 * tool checks again here; every rejection happens before any sandbox work.
 */

import { loadAddon } from "./addon.ts";
import type { ToolFacts } from "./describe.ts";

/**
 * The addon's limits are the source (`sandboxLimits()`); these are used where it does not load
 * (and for the schema, built before it is loaded), and a test pins that they agree.
 */
export const FALLBACK_LIMITS = {
  maxCodeBytes: 64 * 1024,
  defaultTimeoutSeconds: 30,
  maxTimeoutSeconds: 120,
  outputBudgetBytes: 1024 * 1024,
  rlimitAsBytes: 512 * 1024 * 1024,
};

let limits: typeof FALLBACK_LIMITS | undefined;

/**
 * The limits in force: the addon's when it loads. Read once: these are the addon's constants
 * (the addon reads the whole environment to answer: once, not at each call).
 */
export function toolLimits(): typeof FALLBACK_LIMITS {
  if (limits) return limits;
  const l = loadAddon().binding?.sandboxLimits?.();
  if (!l) return FALLBACK_LIMITS;
  limits = {
    maxCodeBytes: l.maxCodeBytes,
    defaultTimeoutSeconds: l.defaultTimeoutSeconds,
    maxTimeoutSeconds: l.maxTimeoutSeconds,
    outputBudgetBytes: l.outputBudgetBytes,
    rlimitAsBytes: l.rlimitAsBytes,
  };
  return limits;
}

/**
 * What the tool's description is built from: the addon's settings (read from the environment
 * now) and limits. Without the addon the tool is unavailable whatever it says; the defaults
 * are then the documented ones.
 */
export function toolFacts(): ToolFacts {
  const settings = loadAddon().binding?.toolSettings?.();
  return { rollback: settings?.rollback ?? true, pythonPackages: settings?.pythonPackages ?? false, ...toolLimits() };
}

export const MAX_CODE_BYTES = FALLBACK_LIMITS.maxCodeBytes;
export const DEFAULT_TIMEOUT_SECONDS = FALLBACK_LIMITS.defaultTimeoutSeconds;
export const MAX_TIMEOUT_SECONDS = FALLBACK_LIMITS.maxTimeoutSeconds;
export const ACTIONS = ["execute", "reset", "status"] as const;
export type Action = (typeof ACTIONS)[number];

/** One member per action, so that comparing `action` with any one of them narrows. */
export type PythonParams =
  | { action: "execute"; code: string; timeoutSeconds: number }
  | { action: "reset" }
  | { action: "status" };

/** Check raw tool arguments; throws an Error with a message the model can act on. */
export function parseParams(raw: unknown): PythonParams {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new Error("The python tool takes an object: { action?, code?, timeoutSeconds? }.");
  }
  const p = raw as Record<string, unknown>;
  const action = p.action === undefined ? "execute" : p.action;
  if (typeof action !== "string" || !(ACTIONS as readonly string[]).includes(action)) {
    throw new Error(`Unknown action ${JSON.stringify(action)}: use "execute" (default), "reset" or "status".`);
  }
  const unknown = Object.keys(p).filter((k) => !["action", "code", "timeoutSeconds"].includes(k));
  if (unknown.length > 0) {
    throw new Error(`The python tool does not take ${unknown.map((k) => JSON.stringify(k)).join(", ")}.`);
  }
  if (action !== "execute") {
    if ((p.code !== undefined && p.code !== "") || p.timeoutSeconds !== undefined) {
      throw new Error(`The python tool rejects \`code\` and \`timeoutSeconds\` when action is ${action}.`);
    }
    return { action: action as "reset" | "status" };
  }
  if (typeof p.code !== "string" || p.code.length === 0) {
    throw new Error("The python tool requires `code` (a non-empty string) when action is execute (or omitted).");
  }
  const limits = toolLimits();
  const bytes = Buffer.byteLength(p.code, "utf8");
  if (bytes > limits.maxCodeBytes) {
    throw new Error(`Code exceeds the ${limits.maxCodeBytes / 1024} KiB UTF-8 limit (${bytes} bytes); write long programs in parts or to /scratch.`);
  }
  const t = p.timeoutSeconds === undefined ? limits.defaultTimeoutSeconds : p.timeoutSeconds;
  if (typeof t !== "number" || !Number.isInteger(t) || t < 1 || t > limits.maxTimeoutSeconds) {
    throw new Error(`timeoutSeconds must be an integer between 1 and ${limits.maxTimeoutSeconds}.`);
  }
  return { action: "execute", code: p.code, timeoutSeconds: t };
}
