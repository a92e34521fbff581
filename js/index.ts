/**
 * pi extension entry: registers the `python` tool and ties each pi session
 * to one sandbox session of the native addon.
 *
 * The wrapper stays small: it checks parameters, forwards calls, aborts and
 * lifecycle events to the addon, and hands pi the text the addon renders.
 * Nothing is started at load time, and nothing here throws at load time: a
 * missing addon, bubblewrap or interpreter is reported by the tool itself.
 */
import { realpathSync } from "node:fs";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { Text } from "@mariozechner/pi-tui";
import { Type } from "typebox";
import { loadAddon, type PythonSandbox } from "./addon.ts";
import { ACTIONS, parseParams } from "./params.ts";

const TOOL = "python";

const DESCRIPTION = `Run Python code in a persistent, sandboxed interpreter (Linux, bubblewrap + seccomp).
- State (variables, imports, functions, classes) persists across calls until a reset, a timeout, a cancel, an output overflow or a crash; ordinary exceptions keep it (execution is not transactional).
- The project is mounted at /workspace (read-only unless the permission mode allows edits); /scratch is writable and kept across calls and resets; /tmp is private.
- Standard library only; no network and no sockets; input() gets EOF; no top-level await.
- The final expression's repr is shown automatically; print json.dumps(...) for JSON.
- Limits: 64 KiB of code, timeoutSeconds 1-120 (default 30), 1 MiB of output per call, 512 MiB address space per process.
- action "reset" discards interpreter state (scratch is kept); action "status" reports the sandbox without starting it.`;

/** One registration's state (pi evaluates the module again on /reload). */
interface State {
  sandbox?: PythonSandbox;
  projectDir?: string;
  nextCallId: number;
}

function textResult(text: string, details: Record<string, unknown>) {
  return { content: [{ type: "text" as const, text }], details };
}

function unavailable(action: string, diagnostic: string) {
  return textResult(`status: unavailable\n\npython tool unavailable: ${diagnostic}`, {
    action,
    status: "unavailable",
    isError: true,
    diagnostic,
  });
}

export default function pythonSandboxExtension(pi: ExtensionAPI): void {
  const state: State = { nextCallId: 1 };

  /** Dispose the current sandbox (its scratch and logs go with it). */
  async function disposeSandbox(reason: string): Promise<void> {
    const sandbox = state.sandbox;
    state.sandbox = undefined;
    state.projectDir = undefined;
    if (sandbox) await sandbox.dispose(reason);
  }

  /** The sandbox for `cwd`, replacing the current one when the project changed. */
  function sandboxFor(cwd: string): PythonSandbox | { error: string } {
    const addon = loadAddon();
    if (!addon.binding) return { error: addon.error ?? "the native addon is unavailable" };
    let projectDir: string;
    try {
      projectDir = realpathSync(cwd);
    } catch (err) {
      return { error: `Working directory ${cwd} is not accessible: ${(err as Error).message}` };
    }
    if (state.sandbox && state.projectDir === projectDir) return state.sandbox;
    if (state.sandbox) void disposeSandbox("project_dir_changed");
    state.sandbox = new addon.binding.PythonSandbox({ projectDir });
    state.projectDir = projectDir;
    return state.sandbox;
  }

  pi.registerTool({
    name: TOOL,
    label: "Python (sandboxed)",
    description: DESCRIPTION,
    promptSnippet: "python: run Python in a persistent sandboxed interpreter (state persists; /workspace, /scratch)",
    promptGuidelines: [
      "Write files to /scratch; /workspace is read-only unless the permission mode allows edits.",
      "Keep long-running work under timeoutSeconds (max 120); a timeout loses interpreter state.",
    ],
    executionMode: "sequential",
    parameters: Type.Object({
      action: Type.Optional(
        Type.Unsafe<"execute" | "reset" | "status">({
          type: "string",
          enum: [...ACTIONS],
          description: "Operation to perform. Default: execute.",
        }),
      ),
      code: Type.Optional(
        Type.String({ description: "Python source to run. Required for action=execute; at most 64 KiB UTF-8." }),
      ),
      timeoutSeconds: Type.Optional(
        Type.Integer({ minimum: 1, maximum: 120, description: "Wall-time limit for execute (1 to 120 seconds). Default 30." }),
      ),
    }),

    async execute(_toolCallId, rawParams, signal, _onUpdate, ctx) {
      const params = parseParams(rawParams);
      const target = sandboxFor(ctx.cwd);
      if ("error" in target) return unavailable(params.action, target.error);

      if (params.action === "status") {
        const report = target.status();
        return textResult(report.text, { action: "status", status: "ok", isError: false, report });
      }
      if (params.action === "reset") {
        const reset = await target.reset();
        return textResult(reset.text, { action: "reset", status: "ok", isError: false, scratchDir: reset.scratchDir });
      }

      const callId = state.nextCallId++;
      const onAbort = () => target.cancel(callId);
      if (signal?.aborted) target.cancel(callId);
      else signal?.addEventListener("abort", onAbort, { once: true });
      try {
        const r = await target.execute(params.code, params.timeoutSeconds, callId);
        return textResult(r.text, {
          action: "execute",
          status: r.status,
          isError: r.isError,
          durationMs: r.durationMs,
          generation: r.generation,
          stateLost: r.stateLost,
          stateLostReason: r.stateLostReason,
          reprTruncated: r.reprTruncated,
          stdoutBytes: r.stdoutBytes,
          stderrBytes: r.stderrBytes,
          excerptTruncated: r.excerptTruncated,
          outputLimitExceeded: r.outputLimitExceeded,
          logPaths: r.logPaths,
          logComplete: r.logComplete,
          diagnostic: r.diagnostic,
          exceptionType: r.exception?.type,
          permissionPath: r.permissionPath,
        });
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
    },

    renderCall(args, theme) {
      const a = (args ?? {}) as { action?: string; code?: string; timeoutSeconds?: number };
      if (a.action === "status" || a.action === "reset") return new Text(theme.bold(`python ${a.action}`), 0, 0);
      const lines = String(a.code ?? "").split("\n");
      const more = lines.length > 1 ? " …" : "";
      const limit = a.timeoutSeconds !== undefined ? theme.fg("muted", ` (${a.timeoutSeconds}s)`) : "";
      return new Text(`${theme.bold("python>")} ${lines[0]}${more}${limit}`, 0, 0);
    },

    renderResult(result, { expanded }, theme) {
      const details = (result.details ?? {}) as { status?: string; isError?: boolean; durationMs?: number };
      const first = result.content.find((c) => c.type === "text");
      const body = (first && "text" in first ? first.text : "").split("\n").slice(1);
      while (body[0] === "") body.shift();
      const mark = details.isError ? theme.fg("error", "✗") : theme.fg("success", "✓");
      const label = details.status === "runtime_error" ? "error" : (details.status ?? "");
      const secs = typeof details.durationMs === "number" ? ` ${(details.durationMs / 1000).toFixed(1)}s` : "";
      const shown = expanded ? body : body.slice(0, 10);
      const hidden = body.length - shown.length;
      const tail = hidden > 0 ? `\n${theme.fg("muted", `... (${hidden} more lines, expand to see all)`)}` : "";
      return new Text(`${mark} python ${label}${secs}\n${shown.join("\n")}${tail}`, 0, 0);
    },
  });

  // pi 0.73 ignores an `isError` returned by execute; this marks failures
  // on every version while keeping the details.
  pi.on("tool_result", (event) => {
    if (event.toolName !== TOOL) return undefined;
    const details = event.details as { isError?: boolean } | undefined;
    return details?.isError ? { isError: true } : undefined;
  });

  pi.on("session_shutdown", async () => {
    await disposeSandbox("session_shutdown");
  });
  pi.on("session_tree", async () => {
    await disposeSandbox("session_tree");
  });
}
