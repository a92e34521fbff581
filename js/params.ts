/**
 * Parameter checks for the python tool. pi validates arguments against the
 * schema before `execute`, but a direct `execute` call skips that, so the
 * tool checks again here; every rejection happens before any sandbox work.
 */

export const MAX_CODE_BYTES = 64 * 1024;
export const DEFAULT_TIMEOUT_SECONDS = 30;
export const MAX_TIMEOUT_SECONDS = 120;
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
  const bytes = Buffer.byteLength(p.code, "utf8");
  if (bytes > MAX_CODE_BYTES) {
    throw new Error(`Code exceeds the 64 KiB UTF-8 limit (${bytes} bytes); write long programs in parts or to /scratch.`);
  }
  const t = p.timeoutSeconds === undefined ? DEFAULT_TIMEOUT_SECONDS : p.timeoutSeconds;
  if (typeof t !== "number" || !Number.isInteger(t) || t < 1 || t > MAX_TIMEOUT_SECONDS) {
    throw new Error("timeoutSeconds must be an integer between 1 and 120.");
  }
  return { action: "execute", code: p.code, timeoutSeconds: t };
}
